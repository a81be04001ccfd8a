"""The diffusion route's entry points: fill Canvas JSON with the denoiser.

``infill_request(loaded, request)`` parses Canvas JSON, denoises it, validates the result and
returns an :class:`InfillOutcome` (the AR route returns the same dataclass).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gpu_worker.engine.canvas import Canvas, parse_canvas
from gpu_worker.engine.config import SamplerConfig, config_from_request
from gpu_worker.engine.loaded import LoadedModel
from gpu_worker.engine.sampler import DenoiseResult, StepInfo, denoise_batch, model_int
from gpu_worker.engine.validation import validate

TRACE_GENESIS = hashlib.sha256(b"stencil-trace/1").hexdigest()


@dataclass
class InfillOutcome:
    """What one route produced for one request (diffusion here; the AR route fills the same)."""

    holes: dict[str, str]  # request hole name -> filled text
    document: str  # locked text and hole texts, in order
    forward_passes: int  # model forward passes spent
    steps: int  # sampler steps (diffusion: one forward pass each)
    timings: dict[str, float]  # seconds: encode, denoise, validate, total
    trace: list[dict[str, Any]]  # per-step entries, see trace_entry(); timings end in _ms
    trace_sha256: str  # head of the hash chain over the entries' non-timing content
    config: dict[str, Any]  # the SamplerConfig (or route config) as a dict
    config_sha256: str  # sha256 of the config's canonical JSON
    seed: int  # the request's seed (the torch.Generator's)
    route: str  # "diffusion" | "ar"
    cancelled: bool  # should_stop() ended the run early; holes may be partial
    violations: list[dict[str, str]]  # validation: {"name", "hole", "message"}; [] = valid
    model: dict[str, Any] = field(default_factory=dict)  # name, kind, hashes, placeholder
    device: str = "cpu"  # the torch device that ran the model

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return dataclasses.asdict(self)


# -- the trace ---------------------------------------------------------------------------------
def trace_entry(info: StepInfo) -> dict[str, Any]:
    """One step as hashed data: counts, sha256 of positions, confidence summary, timings."""
    return {
        "step": info.step,
        "block": info.block,
        "committed": len(info.committed),
        "committed_sha256": _json_sha256(info.committed),
        "padded": len(info.padded),
        "remasked": len(info.remasked),
        "remasked_sha256": _json_sha256(info.remasked),
        "confidence": {k: round(v, 6) for k, v in info.confidence.items()},
        "canvas_sha256": info.canvas_sha256,
        "masked_left": info.masked_left,
        "flush": info.flush,
        "forward_ms": round(info.forward_ms, 3),
        "step_ms": round(info.step_ms, 3),
    }


def trace_chain(entries: Sequence[dict[str, Any]]) -> str:
    """sha256 chain over the entries without their timings: equal runs give equal heads."""
    head = TRACE_GENESIS
    for entry in entries:
        content = {k: v for k, v in entry.items() if not k.endswith("_ms")}
        head = hashlib.sha256((head + _canonical(content)).encode()).hexdigest()
    return head


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _json_sha256(value: Any) -> str:
    return hashlib.sha256(_canonical(value).encode()).hexdigest()


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
    on_step: Callable[[dict[str, Any]], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    device: str | torch.device | None = None,
    on_snapshot: Callable[[int, dict[str, str], dict[str, str]], None] | None = None,
) -> InfillOutcome:
    """Fill ``request`` (Canvas JSON) with ``loaded``'s denoiser.

    ``config`` (e.g. a job's frozen config) is used as is; without it the request's
    ``sampler`` object gives the overrides of a preset (``"preset"`` key, default
    "balanced"). ``on_step`` receives each trace entry (a dict, see :func:`trace_entry`);
    ``should_stop`` is asked once per step. ``device`` moves the network there first.
    ``on_snapshot(step, provisional, stable)`` gets each hole's provisional text (masks left
    out) and its stable prefix (the text before its first still-masked position) for live
    previews and diagnostic sampling; that text is never put in the trace.
    Raises ``ValueError`` for a bad request; validation failures are in ``violations``.
    """
    outcome = infill_batch(
        loaded,
        [request],
        config=config,
        on_step=(lambda _row, entry: on_step(entry)) if on_step is not None else None,
        should_stop=(lambda _row: should_stop()) if should_stop is not None else None,
        device=device,
        on_snapshot=(
            (lambda _row, step, texts, stable: on_snapshot(step, texts, stable))
            if on_snapshot is not None
            else None
        ),
    )[0]
    if isinstance(outcome, ValueError):
        raise outcome
    return outcome


def infill_batch(
    loaded: LoadedModel,
    requests: Sequence[dict[str, Any]],
    *,
    config: SamplerConfig | None = None,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
    should_stop: Callable[[int], bool] | None = None,
    device: str | torch.device | None = None,
    on_snapshot: Callable[[int, int, dict[str, str], dict[str, str]], None] | None = None,
) -> list[InfillOutcome | ValueError]:
    """Fill several requests in one batch (one forward pass per step for all of them).

    Like :func:`infill_request`, with hooks that take the request's index first. A request
    that cannot be read comes back as its ``ValueError`` in its place; the others still run.
    Without ``config``, every request must resolve to the same config (a batch has one).
    ``timings["denoise"]`` is the batch's; each request has its own generator from its seed.
    """
    started = time.perf_counter()
    network = _denoiser_network(loaded, device)
    outcomes: list[InfillOutcome | ValueError] = []
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
            configs.add(config or config_from_request(canvas.sampler))
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
        if on_step is not None:
            on_step(good[row], entry)
        if on_snapshot is not None:
            canvas = canvases[row]
            texts = canvas.hole_texts(info.ids, loaded.tokenizer)
            stable = canvas.hole_texts(stable_prefix_ids(canvas, info.ids), loaded.tokenizer)
            on_snapshot(good[row], info.step, texts, stable)

    run_device = next(network.parameters()).device
    generators = [torch.Generator(device=run_device).manual_seed(c.seed) for c in canvases]
    results = denoise_batch(
        network,
        canvases,
        cfg,
        generators,
        on_step=record,
        should_stop=(lambda row: should_stop(good[row])) if should_stop is not None else None,
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
        outcome = _outcome(loaded, canvas, cfg, result, entries[row], timings)
        outcome.violations = [v.to_dict() for v in violations]
        outcome.device = str(run_device)
        outcomes[good[row]] = outcome
    return outcomes


def _denoiser_network(loaded: LoadedModel, device: str | torch.device | None) -> torch.nn.Module:
    if loaded.kind == "ar_fim":
        raise ValueError(f"model {loaded.name!r} is an AR-FIM model: use the AR route")
    if device is not None:
        loaded.network.to(torch.device(device))
    return loaded.network


def _outcome(
    loaded: LoadedModel,
    canvas: Canvas,
    cfg: SamplerConfig,
    result: DenoiseResult,
    entries: list[dict[str, Any]],
    timings: dict[str, float],
) -> InfillOutcome:
    return InfillOutcome(
        holes=result.hole_texts,
        document=result.document,
        forward_passes=result.forward_passes,
        steps=result.steps,
        timings=timings,
        trace=entries,
        trace_sha256=trace_chain(entries),
        config=cfg.to_dict(),
        config_sha256=cfg.sha256,
        seed=canvas.seed,
        route="diffusion",
        cancelled=result.cancelled,
        violations=[],
        model=loaded.identity(),
    )


def model_vocab_size(loaded: LoadedModel) -> int:
    """The network's output vocabulary (it may exceed the tokenizer's)."""
    model_config = getattr(loaded.network, "config", None)
    size = getattr(model_config, "vocab_size", None)
    return int(size) if size is not None else loaded.tokenizer.vocab_size



__all__ = [
    "InfillOutcome",
    "infill_batch",
    "infill_request",
    "trace_chain",
    "trace_entry",
]
