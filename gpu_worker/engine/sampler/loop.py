"""The denoising loop: canvases advance in lockstep, one batched forward pass per step.

Per step: the rows still to go (``should_stop`` asked once each), one forward of them
(:class:`~gpu_worker.engine.sampler.forward.BatchForward`), then :func:`step` per row. A row
is done when no block is left or its budget's last pass ran; cancelled rows stop at once.
All randomness comes from each canvas's own ``torch.Generator``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from gpu_worker.engine.canvas import Canvas
from gpu_worker.engine.config import SamplerConfig
from gpu_worker.engine.sampler.forward import BatchForward
from gpu_worker.engine.sampler.results import (
    DenoiseResult,
    StepInfo,
    canvas_sha256,
    confidence_summary,
)
from gpu_worker.engine.sampler.state import RowState, start_state
from gpu_worker.engine.sampler.step import StepOutput, advance, step


def denoise(
    model: torch.nn.Module,
    canvas: Canvas,
    config: SamplerConfig,
    generator: torch.Generator,
    on_step: Callable[[StepInfo], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> DenoiseResult:
    """Fill ``canvas``'s holes. A pure function of its inputs and ``generator``'s state."""
    step_hook = (lambda _row, info: on_step(info)) if on_step is not None else None
    stop_hook = (lambda _row: should_stop()) if should_stop is not None else None
    return denoise_batch(model, [canvas], config, [generator], step_hook, stop_hook)[0]


def denoise_batch(
    network: torch.nn.Module,
    canvases: Sequence[Canvas],
    config: SamplerConfig,
    generators: Sequence[torch.Generator],
    on_step: Callable[[int, StepInfo], None] | None = None,
    should_stop: Callable[[int], bool] | None = None,
) -> list[DenoiseResult]:
    """Denoise several canvases (any lengths) in lockstep, one batched forward per step.

    Rows are right-padded with pad and hidden by the attention mask. A row's result equals
    its unbatched result up to float summation order (batched matrix products, padded
    attention): each row's cache rows and windows are its own (see ``sampler.cache``).
    Hooks get the row index.
    """
    _check_inputs(network, canvases, config, generators)
    ids, attention = _batch(network, canvases)  # [B, L] each, on the model's device
    states = [start_state(canvas, config, ids.device) for canvas in canvases]
    forward = BatchForward(network, canvases, config, ids.device, ids.shape[1])
    traces: list[list[StepInfo]] = [[] for _ in canvases]
    cancelled = [False] * len(canvases)
    while True:
        active = []
        for b, state in enumerate(states):
            if state.done or cancelled[b]:
                continue
            if should_stop is not None and should_stop(b):
                cancelled[b] = True
                continue
            active.append(b)
        if not active:
            break
        started = time.perf_counter()
        logits = forward(ids, attention, states, active)
        forward_ms = (time.perf_counter() - started) * 1000
        for row_logits, b in zip(logits, active, strict=True):
            out = step(row_logits, states[b], config, generators[b])
            block, states[b] = states[b].block, advance(states[b], out)
            ids[b, : canvases[b].length] = states[b].ids
            info = _step_info(states[b], block, out, forward_ms, started)
            traces[b].append(info)
            if on_step is not None:
                on_step(b, info)
    return [_result(s, t, c) for s, t, c in zip(states, traces, cancelled, strict=True)]


def _step_info(
    state: RowState, block: int, out: StepOutput, forward_ms: float, started: float
) -> StepInfo:
    """The trace entry of the step that led to ``state`` from the active ``block``."""
    return StepInfo(
        step=state.steps - 1,
        block=block,
        committed=out.committed,
        padded=out.padded,
        remasked=out.remasked,
        confidence=confidence_summary(out.probs),
        canvas_sha256=canvas_sha256(state.ids),
        ids=state.ids.detach().to("cpu", copy=True),
        masked_left=int((state.ids == state.plan.mask_id).sum()),
        flush=out.flush,
        forward_ms=forward_ms,
        step_ms=(time.perf_counter() - started) * 1000,
    )


def _check_inputs(
    network: torch.nn.Module,
    canvases: Sequence[Canvas],
    config: SamplerConfig,
    generators: Sequence[torch.Generator],
) -> None:
    if not isinstance(config, SamplerConfig):
        raise ValueError(f"config={config!r} must be a SamplerConfig")
    if not canvases:
        raise ValueError("canvases must hold at least one Canvas")
    if len(generators) != len(canvases):
        raise ValueError(
            f"generators has {len(generators)} entries for {len(canvases)} canvases: "
            "give one torch.Generator per canvas"
        )
    for g in generators:
        if not isinstance(g, torch.Generator):
            raise ValueError(f"generator={g!r} must be a torch.Generator")
    mask_id, max_len = model_int(network, "mask_id"), model_int(network, "max_len")
    block = int(getattr(network, "attention_block", 0))
    if block and (config.block_scope, config.block_length) != ("attention", block):
        raise ValueError(
            f"block_scope={config.block_scope!r}, block_length={config.block_length}: the model "
            f"attends causally across blocks of {block} positions, so its blocks must be the "
            f"sampler's: block_scope='attention', block_length={block} (LoadedModel.fit_config)"
        )
    for canvas in canvases:
        if canvas.mask_id != mask_id:
            raise ValueError(
                f"canvas mask id {canvas.mask_id} differs from the model's mask_id "
                f"{mask_id}: the canvas was built with another tokenizer"
            )
        if canvas.length > max_len:
            raise ValueError(f"canvas length {canvas.length} exceeds max_len={max_len}")


def model_int(model: torch.nn.Module, name: str) -> int:
    """An integer property of the backend protocol (mask_id, pad_id, eos_id, max_len)."""
    value = getattr(model, name)
    return int(value)


def _batch(network: torch.nn.Module, canvases: Sequence[Canvas]) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's ids [B, L] (short rows right-padded with pad) and attention [B, L] bool."""
    device = next((p.device for p in network.parameters()), torch.device("cpu"))
    length = max(c.length for c in canvases)
    ids = torch.full((len(canvases), length), model_int(network, "pad_id"), dtype=torch.long)
    attention = torch.zeros((len(canvases), length), dtype=torch.bool)
    for b, canvas in enumerate(canvases):
        ids[b, : canvas.length] = canvas.ids
        attention[b, : canvas.length] = True
    return ids.to(device), attention.to(device)


def _result(state: RowState, trace: list[StepInfo], cancelled: bool) -> DenoiseResult:
    canvas = state.plan.canvas
    ids = state.ids.detach().cpu().clone()
    tokenizer = canvas.tokenizer
    return DenoiseResult(
        ids=ids,
        hole_texts=canvas.hole_texts(ids, tokenizer) if tokenizer is not None else {},
        document=canvas.document(ids, tokenizer) if tokenizer is not None else "",
        steps=state.steps,
        forward_passes=state.steps,  # each step is one forward pass
        trace=trace,
        cancelled=cancelled,
        blocks=len(state.plan.blocks),
        confidence=state.confidence.detach().to("cpu", torch.float32, copy=True),
    )


__all__ = ["denoise", "denoise_batch", "model_int"]
