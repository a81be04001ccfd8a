"""The state of one canvas between steps, and the data one step works on.

- :class:`RowState`: a canvas between steps (ids, per-position confidence and re-mask
  counts, the pattern automata's states, where in the block plan it is). Immutable: the
  loop makes the next one from a step's output (``step.advance``).
- :class:`Draft`: the working copy a step writes as its rules commit, built from a state.
- :class:`StepLogits`: the logits a step reads. :class:`Decision`: a step's proposal.

Shapes: L canvas length, V vocabulary, K logits rows, n proposed positions.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from gpu_worker.engine.canvas import Canvas, Hole
from gpu_worker.engine.config import SamplerConfig
from gpu_worker.engine.sampler.plan import CanvasPlan, pattern_starts, plan_canvas


@dataclass(frozen=True)
class RowState:
    """One canvas between steps."""

    plan: CanvasPlan  # what never changes (blocks, token tables, protect mask)
    ids: torch.Tensor  # [L] long: the canvas
    confidence: torch.Tensor  # [L] float: each position's probability at commit (nan = never)
    remasks: torch.Tensor  # [L] long: times each position was re-masked
    pattern_state: Mapping[int, int]  # pattern hole index -> its automaton's state
    block: int = 0  # the active block (len(plan.blocks) once every block is done)
    block_steps: int = 0  # steps spent in the active block
    steps: int = 0  # steps (= forward passes) taken
    flushed: bool = False  # the budget's last pass ran

    @property
    def done(self) -> bool:
        return self.flushed or self.block >= len(self.plan.blocks)

    def flushes(self, config: SamplerConfig) -> bool:
        """Whether the next step is the budget's last pass (it commits everything left)."""
        return self.steps >= config.max_steps - 1

    def active_block(self) -> torch.Tensor:
        """[n_b] long positions of the active block."""
        return self.plan.blocks[self.block]

    def masked_in_block(self) -> torch.Tensor:
        """[n] ascending masked positions of the active block: what its step reads."""
        block = self.active_block()
        return block[self.ids[block] == self.plan.mask_id]


def start_state(canvas: Canvas, config: SamplerConfig, device: torch.device) -> RowState:
    """A canvas before its first step (blocks with nothing masked already skipped)."""
    plan = plan_canvas(canvas, config, device)
    ids = canvas.ids.to(device, copy=True)
    state = RowState(
        plan=plan,
        ids=ids,
        confidence=torch.full((canvas.length,), math.nan, device=device),
        remasks=torch.zeros(canvas.length, dtype=torch.long, device=device),
        pattern_state=pattern_starts(canvas),
    )
    return dataclasses.replace(state, block=next_block(plan, ids, 0))


def next_block(plan: CanvasPlan, ids: torch.Tensor, block: int) -> int:
    """The first block from ``block`` on that still holds a masked position."""
    while block < len(plan.blocks) and not bool((ids[plan.blocks[block]] == plan.mask_id).any()):
        block += 1
    return block


def strip_tails(plan: CanvasPlan, ids: torch.Tensor) -> torch.Tensor:
    """A copy of ``ids`` with each hole's positions from its first EOS / pad on set to pad."""
    ids = ids.clone()
    ends = torch.tensor(plan.ends, device=ids.device)
    for hole in plan.canvas.holes:
        span = ids[hole.start : hole.end]
        hit = torch.isin(span, ends)
        if bool(hit.any()):
            span[int(hit.nonzero()[0]) :] = plan.pad_id
    return ids


@dataclass
class Draft:
    """A step's working copy of a state: the rules read and write it as they commit."""

    plan: CanvasPlan
    ids: torch.Tensor  # [L] long
    confidence: torch.Tensor  # [L] float
    remasks: torch.Tensor  # [L] long
    pattern_state: dict[int, int]

    @classmethod
    def of(cls, state: RowState) -> Draft:
        return cls(state.plan, state.ids.clone(), state.confidence.clone(),
                   state.remasks.clone(), dict(state.pattern_state))  # fmt: skip

    def first_masked(self, hole: Hole, x: list[int]) -> int:
        """The first masked position of ``hole`` in ``x`` (the canvas as a list), -1 if none."""
        mask_id = self.plan.mask_id
        return next((p for p in range(hole.start, hole.end) if x[p] == mask_id), -1)


@dataclass(frozen=True)
class StepLogits:
    """The logits one step reads: ``values[where[p]]`` are canvas position p's."""

    values: torch.Tensor  # [K, V] float32
    where: torch.Tensor  # [L] long: each position's row of values (-1: not computed)


@dataclass
class Decision:
    """Per eligible position: the token proposed and how sure the model is."""

    positions: list[int]  # [n] canvas positions, ascending
    tokens: list[int]  # [n] proposed tokens
    prob: list[float]  # [n] model probability of the proposed token
    score: torch.Tensor  # [n] float the commit rule's score (higher = surer; rules set -inf)
    held: dict[int, float] = field(default_factory=dict)  # deferred EOS / pad -> its score


__all__ = ["Decision", "Draft", "RowState", "StepLogits", "next_block", "start_state", "strip_tails"]
