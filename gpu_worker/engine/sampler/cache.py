"""The forward-pass protocol a model backend provides the sampler: :class:`ForwardCache`.

The sampler never looks inside a cache. Per batch of canvases it asks the backend for one
ForwardCache object (``network.forward_cache(mode)``, mode being the config's ``cache``:
"none", "dual" or "delayed"), and at every step calls one of two methods for the rows
(canvases) that step:

``full(ids, attention, rows, *, reads, room) -> logits``
    A forward pass over every position of the batch rows ``rows``. It is called for a row's
    first step, at the block starts the config's cache refresh names, for the budget's last
    pass, and (without a cache) at every step. A caching backend (re)writes those rows'
    cache entries from it.

``window(ids, attention, rows, *, blocks, reads, room) -> logits``
    A step of rows whose cache was written by an earlier ``full``. ``blocks[i]`` is row
    ``rows[i]``'s active block (ascending positions): a dual cache recomputes that block and
    reads every other position from the cache; a delayed cache recomputes ``reads[i]`` and
    whatever changed since it cached it (it compares ``ids`` with what it was given). A
    backend without a cache may run a full forward.

Arguments (on the model's device; B batch rows, L the longest canvas, V vocabulary):

- ``ids`` [B, L] long: every row's canvas as it stands before the step (short rows are
  right-padded with pad); ``attention`` [B, L] bool: True on each row's canvas, a prefix;
- ``rows``: the batch rows to run, ascending (a subset of range(B) once some are done);
- ``reads``: per row of ``rows``, the ascending positions whose logits the step reads (the
  active block's masked positions), or None for every position (someone flushes);
- ``room`` [B, L] long or None: each position's room in its hole's budget, for a model with
  a room embedding (``ModelConfig.room_buckets``); None for every other model.

Both return logits [len(rows), K, V], row i for ``rows[i]``: with ``reads``, entry j < n_i is
position ``reads[i][j]``'s logits (K >= every n_i; the rest are filler); with ``reads=None``,
entry p is position p's, for every position of the row's canvas. Float or bfloat16; the
sampler reads them as float32. The sampler calls these under ``torch.inference_mode`` and,
for ``precision="bf16"``, ``torch.autocast``; it passes only rows that are not done.

A row's results must not depend on the other rows (batched equals unbatched up to float
summation order): a cache keeps every row of the batch, and a row's window sees what it
would see alone. The Stencil transformer's implementations are
:mod:`gpu_worker.engine.model_cache`; :class:`PlainForward` serves any network with only
the minimal backend protocol, ``logits = network(ids, attention_mask=...)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class ForwardCache(Protocol):
    """One batch's forward passes, with whatever the backend keeps between them."""

    def full(
        self, ids: torch.Tensor, attention: torch.Tensor, rows: Sequence[int], *,
        reads: Sequence[torch.Tensor] | None, room: torch.Tensor | None,
    ) -> torch.Tensor: ...  # fmt: skip

    def window(
        self, ids: torch.Tensor, attention: torch.Tensor, rows: Sequence[int], *,
        blocks: Sequence[torch.Tensor], reads: Sequence[torch.Tensor], room: torch.Tensor | None,
    ) -> torch.Tensor: ...  # fmt: skip


class PlainForward:
    """No cache, over a network with the minimal backend protocol: every call runs
    ``network(ids, attention_mask=...)`` on the rows, cut to their longest canvas."""

    def __init__(self, network: Any) -> None:
        self.network = network
        self._lengths: list[int] | None = None  # each row's canvas length

    def full(
        self, ids: torch.Tensor, attention: torch.Tensor, rows: Sequence[int], *,
        reads: Sequence[torch.Tensor] | None, room: torch.Tensor | None,
    ) -> torch.Tensor:  # fmt: skip
        if self._lengths is None:
            self._lengths = [int(n) for n in attention.sum(-1).tolist()]
        length = max(self._lengths[b] for b in rows)
        index = torch.tensor(list(rows), device=ids.device)
        extra = {} if room is None else {"room": room[index, :length]}
        logits: torch.Tensor = self.network(
            ids[index, :length], attention_mask=attention[index, :length], **extra
        )  # [A, length, V]
        if reads is None:
            return logits
        width = max(1, max(int(read.numel()) for read in reads))
        at = torch.zeros((len(reads), width), dtype=torch.long, device=logits.device)
        for i, read in enumerate(reads):
            if read.numel():
                at[i, : read.numel()] = read
                at[i, read.numel() :] = read[0]
        return logits.gather(1, at[..., None].expand(-1, -1, logits.shape[-1]))

    def window(
        self, ids: torch.Tensor, attention: torch.Tensor, rows: Sequence[int], *,
        blocks: Sequence[torch.Tensor], reads: Sequence[torch.Tensor], room: torch.Tensor | None,
    ) -> torch.Tensor:  # fmt: skip
        return self.full(ids, attention, rows, reads=reads, room=room)


def forward_cache_for(network: Any, mode: str) -> ForwardCache:
    """The backend's forward passes for ``mode``; a network without ``forward_cache`` gets
    :class:`PlainForward` (and may only run ``mode="none"``)."""
    provide = getattr(network, "forward_cache", None)
    if provide is None:
        if mode != "none":
            raise ValueError(
                f"cache={mode!r} needs a model that provides forward_cache(); use cache='none'"
            )
        return PlainForward(network)
    cache: ForwardCache = provide(mode)
    return cache


__all__ = ["ForwardCache", "PlainForward", "forward_cache_for"]
