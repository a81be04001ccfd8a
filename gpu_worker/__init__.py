"""The denoiser: a Django-free core (model, sampler, validation) and one Celery adapter."""
