"""The Stencil transformer's forward passes for the sampler, with and without a KV cache.

Each class implements the sampler's ``ForwardCache`` protocol
(:mod:`gpu_worker.engine.sampler.cache`, which states the contract) for one batch of canvases:

- :class:`ExactForward` (``cache="none"``): a full forward of the rows at every step;
- :class:`DualCache` (``"dual"``, Fast-dLLM's dual cache): ``full`` computes every position
  and keeps the keys and values of every layer; a ``window`` step recomputes the active block
  and reads every other position from the cache;
- :class:`DelayedCache` (``"delayed"``, dKV-Cache's delayed caching): a ``window`` step
  recomputes only the positions it reads and those whose token changed since their cache
  entry was written, and writes their keys and values back.

The cache keeps every row of the batch (row b of the cache is canvas b), so its tensors stay
aligned with the batch; a step of some rows reads and writes only theirs. Rows whose windows
are narrower than the widest one fill up with positions that keep the cache's keys and values,
so each row sees what it would see alone.

Shapes: B batch, A rows in one call, L sequence length, W window, K output positions, V vocab.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from gpu_worker.engine.model_layers import KVCache


class WindowedNetwork(Protocol):
    """What these classes call: the Stencil transformer's ``forward_window`` and forward."""

    def forward_window(
        self,
        ids: torch.Tensor,
        *,
        start: int = 0,
        cache: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,
        write_cache: bool = False,
        positions: torch.Tensor | None = None,
        from_cache: torch.Tensor | None = None,
        outputs: torch.Tensor | None = None,
        room: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, KVCache | None]: ...

    def __call__(
        self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
        room: torch.Tensor | None = None,
    ) -> torch.Tensor: ...  # fmt: skip


def for_mode(network: WindowedNetwork, mode: str) -> ExactForward | DualCache:
    """The forward passes of ``mode`` ("none", "dual", "delayed") over ``network``."""
    kinds: dict[str, type[ExactForward] | type[DualCache]] = {
        "none": ExactForward, "dual": DualCache, "delayed": DelayedCache,
    }  # fmt: skip
    if mode not in kinds:
        raise ValueError(f"cache={mode!r} is not one of {sorted(kinds)}")
    return kinds[mode](network)


def output_index(
    reads: Sequence[torch.Tensor], windows: Sequence[torch.Tensor] | None, device: torch.device
) -> torch.Tensor:
    """[A, K] long: where each row's ``reads`` (ascending positions) lie in its window
    (ascending positions; None = the whole sequence, a position its own index), each row
    filled up to K by repeating its first (zeros for a row that reads nothing)."""
    width = max(1, max(int(read.numel()) for read in reads))
    outputs = torch.zeros((len(reads), width), dtype=torch.long, device=device)
    for i, read in enumerate(reads):
        n = int(read.numel())
        if n:
            at = read if windows is None else torch.searchsorted(windows[i], read)
            outputs[i, :n] = at
            outputs[i, n:] = at[0]
    return outputs


def stack_windows(
    windows: Sequence[torch.Tensor], length: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows' window positions as one [A, W] tensor (W the widest window), each row filled up
    with positions outside its window; and the [A, W] filler mask."""
    width = max(int(window.numel()) for window in windows)
    positions = torch.empty((len(windows), width), dtype=torch.long, device=device)
    filler = torch.zeros((len(windows), width), dtype=torch.bool, device=device)
    for i, window in enumerate(windows):
        n = int(window.numel())
        positions[i, :n] = window
        if n < width:
            outside = torch.ones(length, dtype=torch.bool, device=device)
            outside[window] = False
            positions[i, n:] = outside.nonzero().squeeze(-1)[: width - n]
            filler[i, n:] = True
    return positions, filler


def _room(
    room: torch.Tensor | None, rows: torch.Tensor, length: int | None = None
) -> torch.Tensor | None:
    """The room [A, L] (or [A, length]) of the batch rows in ``rows``; None without one."""
    if room is None:
        return None
    return room[rows] if length is None else room[rows, :length]


class ExactForward:
    """No cache: every call is a full forward of its rows, cut to their longest canvas."""

    def __init__(self, network: WindowedNetwork) -> None:
        self.network = network
        self._lengths: list[int] | None = None  # each row's canvas length (attended prefix)

    def full(
        self, ids: torch.Tensor, attention: torch.Tensor, rows: Sequence[int], *,
        reads: Sequence[torch.Tensor] | None, room: torch.Tensor | None,
    ) -> torch.Tensor:  # fmt: skip
        if self._lengths is None:
            self._lengths = [int(n) for n in attention.sum(-1).tolist()]
        length = max(self._lengths[b] for b in rows)
        index = torch.tensor(list(rows), device=ids.device)
        cut, mask = ids[index, :length], attention[index, :length]
        if reads is None:
            logits: torch.Tensor = self.network(cut, attention_mask=mask, room=_room(room, index, length))
            return logits
        outputs = output_index(reads, None, ids.device)
        logits, _ = self.network.forward_window(
            cut, attention_mask=mask, outputs=outputs, room=_room(room, index, length)
        )
        return logits

    def window(
        self, ids: torch.Tensor, attention: torch.Tensor, rows: Sequence[int], *,
        blocks: Sequence[torch.Tensor], reads: Sequence[torch.Tensor], room: torch.Tensor | None,
    ) -> torch.Tensor:  # fmt: skip
        """Without a cache a window is a full forward."""
        return self.full(ids, attention, rows, reads=reads, room=room)


class DualCache:
    """Fast-dLLM's dual cache: ``full`` writes its rows' keys and values of every position;
    ``window`` recomputes each row's active block and reads the rest from the cache."""

    writes_back = False  # whether a window's keys and values go back into the cache

    def __init__(self, network: WindowedNetwork) -> None:
        self.network = network
        self.kv: KVCache | None = None  # every row's keys and values, after the first full

    def full(
        self, ids: torch.Tensor, attention: torch.Tensor, rows: Sequence[int], *,
        reads: Sequence[torch.Tensor] | None, room: torch.Tensor | None,
    ) -> torch.Tensor:  # fmt: skip
        device = ids.device
        first = self.kv is None  # the first forward writes every row's cache
        chosen = list(range(ids.shape[0])) if first else list(rows)
        if reads is not None and first:  # a row that only fills its cache reads nothing
            empty = torch.zeros(0, dtype=torch.long, device=device)
            by_row = dict(zip(rows, reads, strict=True))
            reads = [by_row.get(b, empty) for b in chosen]
        index = torch.tensor(chosen, device=device)
        outputs = None if reads is None else output_index(reads, None, device)
        logits, fresh = self.network.forward_window(
            ids[index], attention_mask=attention[index], write_cache=True, outputs=outputs,
            room=_room(room, index),
        )  # fmt: skip
        assert fresh is not None
        self.kv = fresh if self.kv is None else self.kv.put_rows(index, fresh)
        self._cached(ids, index)
        if len(chosen) != len(rows):
            logits = logits[torch.tensor(list(rows), device=device)]
        return logits

    def window(
        self, ids: torch.Tensor, attention: torch.Tensor, rows: Sequence[int], *,
        blocks: Sequence[torch.Tensor], reads: Sequence[torch.Tensor], room: torch.Tensor | None,
    ) -> torch.Tensor:  # fmt: skip
        if self.kv is None:
            raise RuntimeError("a window forward needs a full forward first")
        device = ids.device
        windows = self._windows(ids, rows, blocks, reads)
        # filler positions lie outside a row's window and keep their cached keys and values
        positions, filler = stack_windows(windows, ids.shape[1], device)
        outputs = output_index(reads, windows, device)
        index = torch.tensor(list(rows), device=device)
        everyone = len(rows) == ids.shape[0]
        # Writing the window into the cache in place spares a copy of it per layer. The dual
        # cache may take it too when every row steps: a block's own keys and values are
        # recomputed at each of its steps, and rewritten by the refresh that begins the next.
        write = self.writes_back or everyone
        logits, fresh = self.network.forward_window(
            ids[index].gather(1, positions),
            positions=positions,
            cache=self.kv if everyone else self.kv.select_rows(index),
            attention_mask=attention[index],
            from_cache=filler if bool(filler.any()) else None,
            write_cache=write,
            outputs=outputs,
            room=None if room is None else room[index].gather(1, positions),
        )
        if write:
            assert fresh is not None
            self.kv = fresh if everyone else self.kv.put_rows(index, fresh)
        self._windowed(ids, rows, windows)
        return logits

    # -- what the delayed cache does differently ------------------------------------------
    def _windows(
        self, ids: torch.Tensor, rows: Sequence[int], blocks: Sequence[torch.Tensor],
        reads: Sequence[torch.Tensor],
    ) -> list[torch.Tensor]:  # fmt: skip
        """Each row's window (ascending positions): its active block."""
        return list(blocks)

    def _cached(self, ids: torch.Tensor, index: torch.Tensor) -> None:
        """A full forward wrote the cache rows in ``index`` from ``ids``."""

    def _windowed(self, ids: torch.Tensor, rows: Sequence[int], windows: Sequence[torch.Tensor]) -> None:
        """A window forward recomputed ``windows`` of ``rows`` from ``ids``."""


class DelayedCache(DualCache):
    """dKV-Cache's delayed caching: a window is the positions a step reads plus every
    position whose token changed since its cache entry was written (a token committed or
    padded last step, or in the previous block's last step when this block began without a
    refresh); their keys and values are written back, so a committed token is recomputed
    once, in the step after its commit, and read from the cache after that."""

    writes_back = True

    def __init__(self, network: WindowedNetwork) -> None:
        super().__init__(network)
        self.cached_ids: torch.Tensor | None = None  # [B, L] the ids each cache entry holds

    def _windows(
        self, ids: torch.Tensor, rows: Sequence[int], blocks: Sequence[torch.Tensor],
        reads: Sequence[torch.Tensor],
    ) -> list[torch.Tensor]:  # fmt: skip
        assert self.cached_ids is not None
        windows = []
        for b, read in zip(rows, reads, strict=True):
            inside = ids[b] != self.cached_ids[b]  # [L] stale positions ...
            inside[read] = True  # ... and the ones the step reads
            windows.append(inside.nonzero().squeeze(-1))  # ascending
        return windows

    def _cached(self, ids: torch.Tensor, index: torch.Tensor) -> None:
        if self.cached_ids is None:
            self.cached_ids = ids.clone()
        else:
            self.cached_ids[index] = ids[index]

    def _windowed(self, ids: torch.Tensor, rows: Sequence[int], windows: Sequence[torch.Tensor]) -> None:
        assert self.cached_ids is not None
        for b, window in zip(rows, windows, strict=True):
            self.cached_ids[b, window] = ids[b, window]


__all__ = ["DelayedCache", "DualCache", "ExactForward", "for_mode", "output_index", "stack_windows"]
