"""The block KV cache of a block-diffusion network (SDAR): finished blocks are cached, each
step runs the active block only.

A block-diffusion network attends causally across its attention blocks, so a finished
block's keys and values depend on it and the blocks before it, never on a later one: once the
sampler has moved past a block (its blocks are the network's, ``block_scope="attention"``),
the block's keys and values are final. This cache implements the sampler's ``ForwardCache``
protocol (:mod:`gpu_worker.engine.sampler.cache`) on that fact:

- the first ``full`` runs every position with the block-causal mask and keeps every layer's
  keys and values (the blocks before each row's active one are final from then on);
- every later step, ``full`` or ``window`` alike, runs one window per row: the blocks that
  became final since they were cached, and the whole active block (its locked positions
  too: inside a block attention is bidirectional, so their keys change with its commits),
  reading every earlier block from the cache and writing the window back;
- a step that reads every position (the budget's last pass) runs a full forward.

Later blocks are never computed: the active block cannot see them. The logits are those of a
full block-causal forward of the same ids (up to float summation order), so a cached run
commits what an uncached one does. Shapes: B batch, L sequence, n_b positions.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gpu_worker.engine.model_cache import DualCache, WindowedNetwork


class BlockCache(DualCache):
    """Finished blocks cached; a step computes the blocks finished since and the active one."""

    writes_back = True

    def __init__(self, network: WindowedNetwork, block_size: int) -> None:
        super().__init__(network)
        self.block_size = block_size
        self.final: list[int] = []  # per batch row: blocks before this one are cached final

    def full(
        self, ids: torch.Tensor, attention: torch.Tensor, rows: Sequence[int], *,
        reads: Sequence[torch.Tensor] | None, room: torch.Tensor | None,
    ) -> torch.Tensor:  # fmt: skip
        if self.kv is not None and reads is not None and all(r.numel() for r in reads):
            return self.window(ids, attention, rows, blocks=reads, reads=reads, room=room)
        logits = super().full(ids, attention, rows, reads=reads, room=room)
        if not self.final:  # the first forward: what lies before each active block is final
            self.final = [0] * ids.shape[0]
            if reads is not None:
                for b, read in zip(rows, reads, strict=True):
                    self.final[b] = self._block(read)
        return logits

    def _block(self, positions: torch.Tensor) -> int:
        """The attention block of a step's positions (they all lie in one)."""
        return int(positions[0]) // self.block_size if positions.numel() else 0

    def _windows(
        self, ids: torch.Tensor, rows: Sequence[int], blocks: Sequence[torch.Tensor],
        reads: Sequence[torch.Tensor],
    ) -> list[torch.Tensor]:  # fmt: skip
        windows = []
        length = ids.shape[1]
        for b, read in zip(rows, reads, strict=True):
            active = self._block(read)
            start = min(self.final[b], active) * self.block_size
            stop = min((active + 1) * self.block_size, length)
            windows.append(torch.arange(start, stop, device=ids.device))  # [n_b] ascending
            self.final[b] = active
        return windows


__all__ = ["BlockCache"]
