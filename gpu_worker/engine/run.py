"""One entry point for both routes: ``run(route, model, request, config, hooks) -> Outcome``.

The worker's pipeline, the CLI and replay choose a route by name and call :func:`run` (one
request) or :func:`run_batch` (several, one ``Hooks`` each); nothing else dispatches on the
route. The model runs on the device it was loaded on (``load_backend`` and the worker's
``model_get`` take the device).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gpu_worker.engine.ar import MODEL_KIND as AR_MODEL_KIND
from gpu_worker.engine.ar import infill_batch_ar
from gpu_worker.engine.config import SamplerConfig
from gpu_worker.engine.infill import infill_batch
from gpu_worker.engine.loaded import LoadedModel
from gpu_worker.engine.outcome import AR, DIFFUSION, ROUTES, Hooks, Outcome
from gpu_worker.engine.window import infill_batch_windowed

BatchRunner = Callable[..., list[Outcome | ValueError]]
_RUNNERS: dict[str, BatchRunner] = {DIFFUSION: infill_batch, AR: infill_batch_ar}


def run(
    route: str,
    model: LoadedModel,
    request: dict[str, Any],
    config: SamplerConfig | None = None,
    hooks: Hooks | None = None,
) -> Outcome:
    """Fill one Canvas-JSON ``request`` on ``route`` ("diffusion" or "ar") with ``model``.

    ``config`` (e.g. a job's frozen config) is used as is; without it the request's
    ``sampler`` object gives the overrides of a preset. Raises ``ValueError`` for an unknown
    route, a model that does not fit the route, or a bad request; validation failures are
    data, in ``Outcome.violations``.
    """
    outcome = run_batch(route, model, [request], config, [hooks or Hooks()])[0]
    if isinstance(outcome, ValueError):
        raise outcome
    return outcome


def run_batch(
    route: str,
    model: LoadedModel,
    requests: Sequence[dict[str, Any]],
    config: SamplerConfig | None = None,
    hooks: Sequence[Hooks] | None = None,
) -> list[Outcome | ValueError]:
    """Fill several requests on ``route``: the diffusion route denoises them in one batch.

    One outcome per request, in order; a request that cannot be read comes back as its
    ``ValueError`` in its place. ``hooks``, when given, holds one :class:`Hooks` per request.
    """
    runner = _RUNNERS.get(route)
    if runner is None:
        raise ValueError(f"route must be one of {list(ROUTES)}, got {route!r}")
    if route == DIFFUSION:  # a canvas longer than the model is filled window by window
        return infill_batch_windowed(runner, model, requests, config=config, hooks=hooks)
    return runner(model, requests, config=config, hooks=hooks)


def route_for(model: LoadedModel) -> str:
    """The route a model serves: AR for an AR-FIM model, diffusion for every denoiser."""
    return AR if model.kind == AR_MODEL_KIND else DIFFUSION


__all__ = ["AR", "DIFFUSION", "ROUTES", "Hooks", "Outcome", "route_for", "run", "run_batch"]
