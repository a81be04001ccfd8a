"""The diffusion route: fill Canvas JSON with the denoiser, validate, return an Outcome.

``infill_batch(loaded, requests)`` parses each request, denoises them all in one batch (one
forward pass per step for every row), validates each result and returns one
:class:`~gpu_worker.engine.outcome.Outcome` per request; ``infill_request`` is the same for one
request. Callers that choose between routes go through :func:`gpu_worker.engine.run.run`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from gpu_worker.engine.canvas import Canvas, parse_canvas
from gpu_worker.engine.confidence import outcome_confidence, route_calibration
from gpu_worker.engine.config import SamplerConfig, config_from_request
from gpu_worker.engine.loaded import LoadedModel
from gpu_worker.engine.outcome import DIFFUSION, Hooks, Outcome
from gpu_worker.engine.preamble import preamble_ids, with_preamble
from gpu_worker.engine.rescore import span_elbo
from gpu_worker.engine.sampler import DenoiseResult, StepInfo, denoise_batch, model_int
from gpu_worker.engine.trace import json_sha256
from gpu_worker.engine.validation import validate


# -- the trace ---------------------------------------------------------------------------------
def trace_entry(info: StepInfo) -> dict[str, Any]:
    """One step as hashed data: counts, sha256 of positions, confidence summary, timings."""
    return {
        "step": info.step,
        "block": info.block,
        "committed": len(info.committed),
        "committed_sha256": json_sha256(info.committed),
        "padded": len(info.padded),
        "remasked": len(info.remasked),
        "remasked_sha256": json_sha256(info.remasked),
        "confidence": {k: round(v, 6) for k, v in info.confidence.items()},
        "canvas_sha256": info.canvas_sha256,
        "masked_left": info.masked_left,
        "flush": info.flush,
        "forward_ms": round(info.forward_ms, 3),
        "step_ms": round(info.step_ms, 3),
    }


def stable_prefix_ids(canvas: Canvas, ids: torch.Tensor) -> torch.Tensor:
    """[L] ids with each hole cut (to pad) at its first still-masked position.

    A hole's text from these ids is its stable prefix: what is committed left of the first
    open position, the part a screen reader may announce.
    """
    cut = ids.clone()
    for hole in canvas.holes:
        masked = (cut[hole.start : hole.end] == canvas.mask_id).nonzero()
        if len(masked):
            cut[hole.start + int(masked[0]) : hole.end] = canvas.pad_id
    return cut


# -- the entry points --------------------------------------------------------------------------
def infill_request(
    loaded: LoadedModel,
    request: dict[str, Any],
    *,
    config: SamplerConfig | None = None,
    hooks: Hooks | None = None,
) -> Outcome:
    """Fill ``request`` (Canvas JSON) with ``loaded``'s denoiser, on the device it is loaded on.

    ``config`` (e.g. a job's frozen config) is used as is; without it the request's
    ``sampler`` object gives the overrides of a preset (``"preset"`` key, default
    "balanced"). Raises ``ValueError`` for a bad request; validation failures are in
    ``violations``.
    """
    outcome = infill_batch(loaded, [request], config=config, hooks=[hooks or Hooks()])[0]
    if isinstance(outcome, ValueError):
        raise outcome
    return outcome


def infill_batch(
    loaded: LoadedModel,
    requests: Sequence[dict[str, Any]],
    *,
    config: SamplerConfig | None = None,
    hooks: Sequence[Hooks] | None = None,
) -> list[Outcome | ValueError]:
    """Fill several requests in one batch (one forward pass per step for all of them).

    ``hooks`` gives one :class:`Hooks` per request (default: none). A request that cannot be
    read comes back as its ``ValueError`` in its place; the others still run. Without
    ``config``, every request must resolve to the same config (a batch has one).
    ``timings["denoise"]`` is the batch's; each request has its own generator from its seed.
    """
    started = time.perf_counter()
    network = _denoiser_network(loaded)
    row_hooks = _hooks_per_request(hooks, len(requests))
    outcomes: list[Outcome | ValueError] = []
    good: list[int] = []  # indexes of the requests that parsed
    canvases: list[Canvas] = []
    configs: set[SamplerConfig] = set()
    for index, request in enumerate(requests):
        try:
            canvas = parse_canvas(
                request,
                loaded.tokenizer,
                max_len=model_int(network, "max_len"),
                vocab_size=model_vocab_size(loaded),
            )
            if loaded.preamble is not None:  # an instruction model's chat turn, locked
                canvas = with_preamble(canvas, preamble_ids(loaded.preamble, canvas, loaded.tokenizer),
                                       max_len=model_int(network, "max_len"))  # fmt: skip
            configs.add(loaded.fit_config(config or config_from_request(canvas.sampler)))
        except ValueError as exc:
            outcomes.append(exc)
            continue
        outcomes.append(ValueError("not run"))  # replaced below
        good.append(index)
        canvases.append(canvas)
    if not good:
        return outcomes
    if len(configs) != 1:
        raise ValueError("requests in one batch must share one sampler config")
    cfg = configs.pop()
    encoded = time.perf_counter()
    entries: list[list[dict[str, Any]]] = [[] for _ in good]

    def record(row: int, info: StepInfo) -> None:
        entry = trace_entry(info)
        entries[row].append(entry)
        hook = row_hooks[good[row]]
        if hook.on_step is not None:
            hook.on_step(entry)
        if hook.on_snapshot is not None:
            canvas = canvases[row]
            texts = canvas.hole_texts(info.ids, loaded.tokenizer)
            stable = canvas.hole_texts(stable_prefix_ids(canvas, info.ids), loaded.tokenizer)
            hook.on_snapshot(info.step, texts, stable)

    run_device = next(network.parameters()).device
    generators = [torch.Generator(device=run_device).manual_seed(c.seed) for c in canvases]
    results = denoise_batch(
        network,
        canvases,
        cfg,
        generators,
        on_step=record,
        should_stop=lambda row: row_hooks[good[row]].stop_requested(),
    )
    denoised = time.perf_counter()
    for row, (canvas, result) in enumerate(zip(canvases, results, strict=True)):
        before = time.perf_counter()
        violations = validate(canvas, result.ids, loaded.tokenizer)
        checked = time.perf_counter()
        timings = {
            "encode": encoded - started,
            "denoise": denoised - encoded,
            "validate": checked - before,
            "total": (denoised - started) + (checked - before),
        }
        outcomes[good[row]] = _outcome(
            loaded, canvas, cfg, result, entries[row], timings,
            violations=[v.to_dict() for v in violations], device=str(run_device),
        )  # fmt: skip
    return outcomes


def _hooks_per_request(hooks: Sequence[Hooks] | None, count: int) -> list[Hooks]:
    if hooks is None:
        return [Hooks() for _ in range(count)]
    if len(hooks) != count:
        raise ValueError(f"hooks must give one Hooks per request: {len(hooks)} for {count}")
    return list(hooks)


def _denoiser_network(loaded: LoadedModel) -> torch.nn.Module:
    if loaded.kind == "ar_fim":
        raise ValueError(f"model {loaded.name!r} is an AR-FIM model: use the AR route")
    return loaded.network


def _outcome(
    loaded: LoadedModel,
    canvas: Canvas,
    cfg: SamplerConfig,
    result: DenoiseResult,
    entries: list[dict[str, Any]],
    timings: dict[str, float],
    *,
    violations: list[dict[str, str]],
    device: str,
) -> Outcome:
    probs = result.confidence if result.confidence is not None else torch.full_like(
        result.ids, float("nan"), dtype=torch.float32)  # fmt: skip
    calibration = route_calibration(loaded.directory, DIFFUSION)
    rescored = None
    if calibration is not None and calibration.rescores:  # the signal reads the span's ELBO
        before = time.perf_counter()
        rescored = span_elbo(loaded.network, canvas, result.ids, passes=calibration.elbo_passes)
        timings = {**timings, "rescore": time.perf_counter() - before}
        timings["total"] += timings["rescore"]
    confidence, domain = outcome_confidence(canvas, result.ids, probs, loaded.tokenizer,
                                            directory=loaded.directory, route=DIFFUSION,
                                            rescored=rescored)  # fmt: skip
    return Outcome(
        holes=result.hole_texts,
        document=result.document,
        forward_passes=result.forward_passes,
        steps=result.steps,
        timings=timings,
        trace=entries,
        config=cfg.to_dict(),
        config_sha256=cfg.sha256,
        seed=canvas.seed,
        route=DIFFUSION,
        cancelled=result.cancelled,
        violations=violations,
        model=loaded.identity(),
        device=device,
        confidence=confidence,
        domain=domain,
    )


def model_vocab_size(loaded: LoadedModel) -> int:
    """The network's output vocabulary (it may exceed the tokenizer's)."""
    model_config = getattr(loaded.network, "config", None)
    size = getattr(model_config, "vocab_size", None)
    return int(size) if size is not None else loaded.tokenizer.vocab_size


__all__ = ["infill_batch", "infill_request", "model_vocab_size", "stable_prefix_ids", "trace_entry"]
