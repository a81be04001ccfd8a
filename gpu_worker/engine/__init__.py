"""The engine: canvases, constraints, tokenizers, model backends, the sampler and the AR route.

It imports neither Django nor Celery, nor anything of Stencil above it (scripts/test checks
the contracts in pyproject.toml): the worker, the CLI, replay and the benchmarks all call it.
"""
