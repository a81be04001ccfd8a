"""A step's forward pass for the batch: which rows run ``full`` and which ``window`` on the
backend's :class:`~gpu_worker.engine.sampler.cache.ForwardCache`, and the logits each row
reads (:class:`~gpu_worker.engine.sampler.state.StepLogits`).

A step reads the logits of its active block's masked positions only (every position when it
flushes), so the backend may run its output head on those alone.
Shapes: B batch, L the longest canvas, K positions read, V vocabulary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch

from gpu_worker.engine.canvas import Canvas
from gpu_worker.engine.config import SamplerConfig
from gpu_worker.engine.model import hole_room
from gpu_worker.engine.sampler.cache import ForwardCache, forward_cache_for
from gpu_worker.engine.sampler.state import RowState, StepLogits


class BatchForward:
    """The forward passes of one batch of canvases under one config."""

    def __init__(
        self, network: torch.nn.Module, canvases: Sequence[Canvas], config: SamplerConfig,
        device: torch.device, length: int,
    ) -> None:  # fmt: skip
        self.cache: ForwardCache = forward_cache_for(network, config.cache)
        self.config = config
        self.room = _room(network, canvases, length, device)
        self.refreshed: list[int | None] = [None] * len(canvases)  # block of each row's last full

    def __call__(
        self, ids: torch.Tensor, attention: torch.Tensor, states: Sequence[RowState],
        active: Sequence[int],
    ) -> list[StepLogits]:  # fmt: skip
        """Per active row (in ``active`` order, ``states`` by batch row) the logits its step
        reads, after one full and / or one window call of the cache."""
        config = self.config
        full = [b for b in active if self._refreshes(b, states[b])]
        window = [b for b in active if b not in full]
        out: dict[int, StepLogits] = {}
        with _precision(config, ids.device), torch.inference_mode():
            if full:
                flushing = any(states[b].flushes(config) for b in full)
                reads = None if flushing else [states[b].masked_in_block() for b in full]
                logits = self.cache.full(ids, attention, full, reads=reads, room=self.room)
                out |= _per_row(logits, full, reads, states)
                for b in full:
                    self.refreshed[b] = states[b].block
            if window:
                reads = [states[b].masked_in_block() for b in window]
                blocks = [states[b].active_block() for b in window]
                logits = self.cache.window(ids, attention, window, blocks=blocks, reads=reads,
                                           room=self.room)  # fmt: skip
                out |= _per_row(logits, window, reads, states)
        return [out[b] for b in active]

    def _refreshes(self, row: int, state: RowState) -> bool:
        """Whether the row's step runs ``full``: always without a cache; with one, at the
        row's first step, at a new block's (the delayed cache: as ``cache_refresh`` asks)
        and for the budget's last pass."""
        config = self.config
        if config.cache == "none" or state.flushes(config):
            return True
        refreshed = self.refreshed[row]
        if refreshed is None:
            return True
        every = config.cache_refresh if config.cache == "delayed" else 1
        return every > 0 and state.block - refreshed >= every


def _per_row(
    logits: torch.Tensor, rows: Sequence[int], reads: Sequence[torch.Tensor] | None,
    states: Sequence[RowState],
) -> dict[int, StepLogits]:  # fmt: skip
    """Each row's logits as float32 (after the device has finished, so forward timings are
    true) with the row of each position it reads."""
    if logits.device.type == "cuda":
        torch.cuda.synchronize(logits.device)
    logits = logits.float()
    out = {}
    for i, b in enumerate(rows):
        length = states[b].plan.canvas.length
        if reads is None:
            where = torch.arange(length, device=logits.device)
        else:
            read = reads[i]
            where = torch.full((length,), -1, dtype=torch.long, device=logits.device)
            where[read] = torch.arange(read.numel(), device=logits.device)
        out[b] = StepLogits(logits[i], where)
    return out


def _room(
    network: torch.nn.Module, canvases: Sequence[Canvas], length: int, device: torch.device
) -> torch.Tensor | None:
    """[B, length] long: each position's room in its hole's budget (model.hole_room), for a
    model with a room embedding (``config.room_buckets``); None for any other model."""
    if not getattr(getattr(network, "config", None), "room_buckets", 0):
        return None
    room = torch.zeros((len(canvases), length), dtype=torch.long)
    for b, canvas in enumerate(canvases):
        room[b] = hole_room(length, [(hole.start, hole.end) for hole in canvas.holes])
    return room.to(device)


def _precision(config: SamplerConfig, device: torch.device) -> contextlib.AbstractContextManager[None]:
    if config.precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


__all__ = ["BatchForward"]
