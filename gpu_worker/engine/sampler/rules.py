"""The commit rules that decide from a step's proposal, each a small named object.

- Base rules (one per step, from ``commit_rule``): :class:`EvenQuota`, :class:`Threshold`,
  :class:`Margin`, :class:`Entropy`. Each scores a proposal; the even quota picks its
  count, a threshold rule every passing position (the filters narrow them) or the surest.
- Filters, after a threshold rule picked (in this order): :class:`ErrorBudget`,
  :class:`NeighbourBar`, :class:`Anchored`.
- Holds, on the proposal's scores: :class:`DeferEarlyEnds`, :class:`HoldShiftedRepeats`.
- :class:`BanAdjacentRepeats`: narrows the tokens before the proposal, and skips a repeat
  while writing. :class:`ReleaseEnds`: lets a held end commit with its hole's last words.

The rules that write the canvas themselves (choices, tail padding, pattern runs,
re-masking) are in :mod:`gpu_worker.engine.sampler.writers`.
Shapes: n proposed positions, V vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch

from gpu_worker.engine.sampler.state import Decision, Draft


# -- base rules ------------------------------------------------------------------------------
class BaseRule(Protocol):
    """Which proposed positions a step commits."""

    name: ClassVar[str]

    def score(self, probs: torch.Tensor, prob: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """[n] how sure the model is of each proposal (higher = surer), from the allowed
        distribution ``probs`` [n, V], the proposed tokens [n] and their probability [n]."""
        ...


@dataclass(frozen=True)
class EvenQuota:
    """A fixed quota per step, the most confident first (LLaDA's schedule, see :meth:`quota`)."""

    steps_per_block: int
    name: ClassVar[str] = "even"

    def score(self, probs: torch.Tensor, prob: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return prob

    def quota(self, masked: int, block_steps: int) -> int:
        """ceil(masked left / steps left): ceil(n / s) then ceil((n - that) / (s - 1)) ...
        gives base + 1 on the first n mod s steps and base after. Once the block's steps are
        spent, everything eligible."""
        steps_left = self.steps_per_block - block_steps
        return masked if steps_left <= 0 else max(1, -(-masked // steps_left))

    def choose(self, decision: Decision, quota: int) -> list[int]:
        """Indices into ``decision`` of the ``quota`` surest positions (at least one)."""
        score = decision.score
        k = max(1, min(quota, int(torch.isfinite(score).sum())))
        return torch.topk(score, k).indices.tolist()


@dataclass(frozen=True)
class Threshold:
    """Every position whose probability is at least ``threshold``; the surest if none is
    (Fast-dLLM's threshold rule)."""

    threshold: float
    name: ClassVar[str] = "threshold"

    def score(self, probs: torch.Tensor, prob: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return prob

    def passes(self, score: Any) -> Any:
        """[n] bool (or one bool for a float): the scores sure enough to commit."""
        return score >= self.threshold

    def passing(self, decision: Decision) -> list[int]:
        """Indices into ``decision`` of the positions that pass (possibly none): what the
        filters narrow."""
        chosen: list[int] = self.passes(decision.score).nonzero().squeeze(-1).tolist()
        return chosen

    def surest(self, decision: Decision) -> int:
        """The index of the surest position: what commits when none passes."""
        return int(decision.score.argmax())


@dataclass(frozen=True)
class Margin(Threshold):
    """Every position whose top-1 minus top-2 probability is at least ``threshold``."""

    name: ClassVar[str] = "margin"

    def score(self, probs: torch.Tensor, prob: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        others = probs.scatter(-1, tokens[:, None], 0.0)
        return prob - others.max(dim=-1).values


@dataclass(frozen=True)
class Entropy(Threshold):
    """Every position whose predictive entropy (nats) is at most ``threshold``."""

    name: ClassVar[str] = "entropy"

    def score(self, probs: torch.Tensor, prob: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return -torch.special.entr(probs).sum(-1)  # minus the entropy in nats

    def passes(self, score: Any) -> Any:
        return -score <= self.threshold


# -- filters on a threshold rule's pick -------------------------------------------------------
class Filter(Protocol):
    name: ClassVar[str]

    def __call__(self, draft: Draft, decision: Decision, chosen: list[int]) -> list[int]:
        """``chosen`` (indices into ``decision``) narrowed; ascending, never empty."""
        ...


@dataclass(frozen=True)
class ErrorBudget:
    """The likeliest of the chosen (ties: the leftmost first) while their summed error
    probability 1 - p stays within ``budget``; at least the likeliest one."""

    budget: float
    name: ClassVar[str] = "error_budget"

    def __call__(self, draft: Draft, decision: Decision, chosen: list[int]) -> list[int]:
        prob = decision.prob
        keep: list[int] = []
        spent = 0.0
        for i in sorted(chosen, key=lambda j: -prob[j]):  # a stable sort: ties keep their order
            spent += 1.0 - prob[i]
            if keep and spent > self.budget:
                break
            keep.append(i)
        return sorted(keep)


@dataclass(frozen=True)
class NeighbourBar:
    """The chosen without each position whose left neighbour in its hole is committed in the
    same step and whose probability is below ``bar``, walking left to right (a dropped
    position frees its right neighbour). The leftmost chosen position stays."""

    bar: float
    name: ClassVar[str] = "neighbour_threshold"

    def __call__(self, draft: Draft, decision: Decision, chosen: list[int]) -> list[int]:
        positions, prob, hole_at = decision.positions, decision.prob, draft.plan.hole_at
        keep: list[int] = []
        kept: set[int] = set()
        for i in sorted(chosen, key=positions.__getitem__):
            p = positions[i]
            if p - 1 in kept and hole_at[p - 1] == hole_at[p] and prob[i] < self.bar:
                continue
            keep.append(i)
            kept.add(p)
        return sorted(keep)


@dataclass(frozen=True)
class Anchored:
    """The chosen without each free-hole position that is neither next to a position that
    is not masked nor chained to one through other chosen positions of its hole; when none
    is left, the surest anchored position of the decision."""

    name: ClassVar[str] = "anchored"

    def __call__(self, draft: Draft, decision: Decision, chosen: list[int]) -> list[int]:
        plan = draft.plan
        x, mask_id, positions, free_at = draft.ids.tolist(), plan.mask_id, decision.positions, plan.free_at

        def fixed(p: int) -> bool:  # constrained, or next to written text or the canvas's edge
            return (not free_at[p] or p == 0 or x[p - 1] != mask_id
                    or p + 1 == len(x) or x[p + 1] != mask_id)  # fmt: skip

        index = {positions[i]: i for i in chosen}
        kept = {p for p in index if fixed(p)}
        hole_at = plan.hole_at
        for p in sorted(index):  # chains growing rightwards from an anchor ...
            if p - 1 in kept and hole_at[p - 1] == hole_at[p]:
                kept.add(p)
        for p in sorted(index, reverse=True):  # ... and leftwards, inside a hole
            if p + 1 in kept and hole_at[p + 1] == hole_at[p]:
                kept.add(p)
        if kept:
            return sorted(index[p] for p in kept)
        score = decision.score.tolist()
        anchored = [i for i, p in enumerate(positions) if fixed(p) and math.isfinite(score[i])]
        if not anchored:
            return chosen
        return [max(anchored, key=lambda i: (score[i], -i))]


# -- holds on a proposal ----------------------------------------------------------------------
class Hold(Protocol):
    name: ClassVar[str]

    def __call__(self, draft: Draft, decision: Decision) -> None:
        """Hold proposed positions back this step, in place (their score becomes -inf)."""
        ...


@dataclass(frozen=True)
class DeferEarlyEnds:
    """An EOS / pad proposed in a free hole waits while an earlier position of that hole is
    still masked (its score is kept in ``decision.held``), so where a hole ends is decided
    after what it says; the hole's earliest masked position is never deferred."""

    name: ClassVar[str] = "stop_on_eos"

    def __call__(self, draft: Draft, decision: Decision) -> None:
        plan = draft.plan
        ends, positions, tokens = plan.ends, decision.positions, decision.tokens
        if not any(token in ends for token in tokens):
            return
        first: dict[int, int] = {}  # hole -> its first masked position, looked up once
        scores, x = decision.score.tolist(), draft.ids.tolist()
        for i, (position, token) in enumerate(zip(positions, tokens, strict=True)):
            if token not in ends:
                continue
            hole_index = plan.hole_at[position]
            hole = plan.canvas.holes[hole_index]
            if hole_index not in first:
                first[hole_index] = draft.first_masked(hole, x)
            if hole.constraint is None and 0 <= first[hole_index] < position:
                decision.held[i] = scores[i]
        if decision.held:
            held = torch.tensor(sorted(decision.held), dtype=torch.long, device=decision.score.device)
            decision.score[held] = -math.inf


@dataclass(frozen=True)
class HoldShiftedRepeats:
    """A free-hole position whose left neighbour in its hole is proposed in the same
    decision (so still masked) with the same word token waits; the run's leftmost keeps its
    score."""

    name: ClassVar[str] = "hold_shifted_repeats"

    def __call__(self, draft: Draft, decision: Decision) -> None:
        plan = draft.plan
        words, positions, tokens = plan.words, decision.positions, decision.tokens
        if words is None or len(positions) < 2:
            return
        held = [
            i for i in range(1, len(positions))
            if positions[i - 1] == positions[i] - 1 and tokens[i - 1] == tokens[i]
            and tokens[i] in words and plan.free_at[positions[i]]
            and plan.hole_at[positions[i - 1]] == plan.hole_at[positions[i]]
        ]  # fmt: skip
        if held:
            at = torch.tensor(held, dtype=torch.long, device=decision.score.device)
            decision.score[at] = -math.inf


# -- repeats and ends -------------------------------------------------------------------------
@dataclass(frozen=True)
class BanAdjacentRepeats:
    """A free-hole position may not take the word token written right before it or right
    after it (past the hole's tail pad), and a commit whose left neighbour took the same
    word in this step is skipped."""

    name: ClassVar[str] = "ban_adjacent_repeats"

    def mask(self, draft: Draft, positions: torch.Tensor, scores: torch.Tensor) -> None:
        """In place: each free-hole position's score [n, V] of its neighbours' word tokens
        becomes -inf. A position with a forced prefix is left alone (its few tokens are not
        narrowed further); any other allows thousands, so two bans never leave it none."""
        plan = draft.plan
        words = plan.words
        if words is None:
            return
        x, pad_id = draft.ids.tolist(), plan.pad_id
        rows: list[int] = []
        tokens: list[int] = []
        for i, position in enumerate(positions.tolist()):
            if not plan.free_at[position] or position in plan.canvas.allowed:
                continue  # constrained, or a forced prefix's few tokens: never narrowed further
            right = position + 1
            while right < len(x) and x[right] == pad_id:
                right += 1
            neighbours = {x[position - 1]} if position > 0 else set()
            neighbours |= {x[right]} if right < len(x) else set()
            for token in sorted(neighbours):
                if token in words:
                    rows.append(i)
                    tokens.append(token)
        if rows:
            scores[rows, tokens] = -math.inf

    def repeats_left(
        self, draft: Draft, position: int, token: int, written: dict[int, int],
        before: Sequence[int],
    ) -> bool:  # fmt: skip
        """Whether ``token``, in a free hole, is a word token equal to the one committed
        right before ``position`` in this step: in ``written`` (not yet on the canvas) or
        ``before`` (this step's earlier commits, on it)."""
        plan = draft.plan
        if plan.words is None or token not in plan.words or not plan.free_at[position]:
            return False
        left = position - 1
        if left in written:
            return written[left] == token
        return left >= 0 and left in before and int(draft.ids[left]) == token


@dataclass(frozen=True)
class ReleaseEnds:
    """The chosen plus each held-back EOS / pad that passes the base rule on its own score,
    has at least ``bar`` probability (it was judged with those positions masked), and whose
    hole has every earlier masked position committed in this same step: a hole the model is
    sure of ends in the pass that writes it, not one pass later."""

    rule: Threshold
    bar: float
    name: ClassVar[str] = "release_ends"

    def __call__(self, draft: Draft, decision: Decision, chosen: list[int]) -> list[int]:
        positions, probs = decision.positions, decision.prob
        x, mask_id = draft.ids.tolist(), draft.plan.mask_id
        picked = set(chosen)
        committing = {positions[i] for i in picked}
        for i in sorted(decision.held, key=lambda j: positions[j]):
            position = positions[i]
            if not self.rule.passes(decision.held[i]) or probs[i] < self.bar:
                continue
            hole = draft.plan.hole(position)
            earlier = (p for p in range(hole.start, position) if x[p] == mask_id)
            if all(p in committing for p in earlier):
                picked.add(i)
                committing.add(position)
        return sorted(picked)


__all__ = [
    "Anchored", "BanAdjacentRepeats", "BaseRule", "DeferEarlyEnds", "Entropy", "ErrorBudget",
    "EvenQuota", "Filter", "Hold", "HoldShiftedRepeats", "Margin", "NeighbourBar",
    "ReleaseEnds", "Threshold",
]  # fmt: skip
