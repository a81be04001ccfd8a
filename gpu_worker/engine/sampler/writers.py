"""The rules that write a step's draft themselves, each a small named object.

- :class:`Choices`: a choices hole is scored whole and committed whole.
- :class:`TailPadding`: pads a free hole's tail the model calls unused budget.
- :class:`PatternRuns`: carries a pattern hole's sure run on in one pass.
- :class:`LowConfidenceRemask`: re-masks a few unsure committed tokens.
- :func:`flush`: the budget's last pass, which commits everything left.

Each returns what it wrote as (committed, padded, probabilities), as a step reports them.
Shapes: h hole length, C candidates, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from gpu_worker.engine.constraints import ChoiceConstraint, PatternConstraint
from gpu_worker.engine.sampler.ops import allowed_scores, write
from gpu_worker.engine.sampler.proposal import Proposer
from gpu_worker.engine.sampler.rules import Threshold
from gpu_worker.engine.sampler.state import Draft, StepLogits

MAX_REMASKS_PER_POSITION = 1  # bounds re-masking, so every block finishes
Written = tuple[list[int], list[int], list[float]]  # committed, padded, probabilities


@dataclass(frozen=True)
class Choices:
    """Score every candidate of a choices hole as a whole and commit one (the likeliest,
    or a draw at ``temperature``)."""

    temperature: float
    name: ClassVar[str] = "choices"

    def pending(self, draft: Draft, block: torch.Tensor) -> list[int]:
        """The choices holes starting in ``block`` that are still masked."""
        plan = draft.plan
        if not plan.choices:
            return []
        positions = set(block.tolist())
        holes = plan.canvas.holes
        return [i for i in plan.choices
                if holes[i].start in positions and int(draft.ids[holes[i].start]) == plan.mask_id]  # fmt: skip

    def commit(
        self, draft: Draft, hole_index: int, logits: StepLogits, generator: torch.Generator
    ) -> tuple[list[int], float]:
        """Commit one candidate; returns (positions, its posterior)."""
        hole = draft.plan.canvas.holes[hole_index]
        assert isinstance(hole.constraint, ChoiceConstraint)
        log_probs = torch.log_softmax(logits.values[logits.where[hole.start : hole.end]], dim=-1)  # [h, V]
        pad = draft.plan.pad_id
        candidates = torch.tensor(
            [list(c) + [pad] * (hole.max_len - len(c)) for c in hole.constraint.candidates],
            dtype=torch.long,
            device=log_probs.device,
        )  # [C, h]: each candidate's tokens, then pad to the hole's end
        positions = torch.arange(hole.max_len, device=log_probs.device)
        totals = log_probs[positions[None, :], candidates].sum(-1)  # [C] log-likelihoods
        posterior = torch.softmax(totals, dim=-1)  # [C]
        if self.temperature == 0:
            pick = int(totals.argmax())
        else:
            weights = torch.softmax(totals / self.temperature, dim=-1).to(generator.device)
            pick = int(torch.multinomial(weights, 1, generator=generator))
        draft.ids[hole.start : hole.end] = candidates[pick]
        draft.confidence[hole.start : hole.end] = float(posterior[pick])
        return list(range(hole.start, hole.end)), float(posterior[pick])


@dataclass(frozen=True)
class TailPadding:
    """Pad each free hole's masked tail, from the hole's last position leftwards, while the
    model gives EOS and pad together more than ``threshold``; the walk stops at a committed
    token, a position not eligible (outside the active block), or the hole's first position
    (never padded)."""

    threshold: float
    name: ClassVar[str] = "tail_threshold"

    def __call__(self, draft: Draft, eligible: torch.Tensor, scores: torch.Tensor) -> list[int]:
        """``scores`` [n, V] are ``eligible``'s allowed scores. Returns the padded positions."""
        plan = draft.plan
        holes = plan.canvas.holes
        positions = eligible.tolist()
        free = [i for i, p in enumerate(positions) if plan.free_at[p]]
        if not free:
            return []
        ends = list(plan.ends)
        if len(free) < len(positions):
            scores = scores[torch.tensor(free, dtype=torch.long, device=scores.device)]
        end_prob = torch.softmax(scores, dim=-1)[:, ends].sum(-1).tolist()
        prob_at = {positions[i]: p for i, p in zip(free, end_prob, strict=True)}
        x = draft.ids.tolist()
        padded: list[int] = []
        for hole_index in sorted({plan.hole_at[positions[i]] for i in free}):
            hole = holes[hole_index]
            for position in range(hole.end - 1, hole.start, -1):
                if x[position] == plan.pad_id:
                    continue  # the tail padded before
                if prob_at.get(position, 0.0) <= self.threshold:
                    break
                padded.append(position)
        if padded:
            device = draft.ids.device
            at = torch.tensor(padded, dtype=torch.long, device=device)
            draft.ids[at] = plan.pad_id
            draft.confidence[at] = torch.tensor([prob_at[p] for p in padded], device=device)
        return padded


@dataclass(frozen=True)
class PatternRuns:
    """After a pattern hole's ``position`` is written, its next masked positions (up to the
    block's last) are proposed one by one from the same logits, each under the automaton
    state its left neighbour's token led to, and written while each passes the base rule and
    ``bar`` and holds no letter; an EOS / pad ends the hole."""

    rule: Threshold
    bar: float
    stop_on_eos: bool
    name: ClassVar[str] = "pattern_runs"

    def __call__(
        self, draft: Draft, position: int, last: int, logits: StepLogits, propose: Proposer,
        generator: torch.Generator,
    ) -> Written:  # fmt: skip
        plan = draft.plan
        hole = plan.hole(position)
        assert isinstance(hole.constraint, PatternConstraint)
        words, mask_id, where = hole.constraint.table.words, plan.mask_id, logits.where
        committed: list[int] = []
        padded: list[int] = []
        probs: list[float] = []
        nxt = position + 1
        while nxt < hole.end and nxt <= last and int(draft.ids[nxt]) == mask_id and int(where[nxt]) >= 0:
            eligible = torch.tensor([nxt], dtype=torch.long, device=draft.ids.device)
            decision = propose(draft, eligible, allowed_scores(draft, eligible, logits), generator)
            assert decision is not None
            token, prob = decision.tokens[0], decision.prob[0]
            if token in words or prob < self.bar:
                break
            if not bool(self.rule.passes(decision.score[0])):
                break
            written, ended = write(draft, [(nxt, token, prob)], stop_on_eos=self.stop_on_eos)
            committed.extend(written)
            padded.extend(ended)
            probs.append(prob)
            nxt += 1
        return committed, padded, probs


@dataclass(frozen=True)
class LowConfidenceRemask:
    """Re-mask up to ``budget`` unsure committed tokens of the active block: free-text hole
    positions only (never locked, constrained, EOS / pad, or this step's commits), each at
    most MAX_REMASKS_PER_POSITION times, those below ``below`` probability, least confident
    first."""

    budget: int
    below: float
    name: ClassVar[str] = "remask"

    def __call__(self, draft: Draft, block: torch.Tensor, just_committed: list[int]) -> list[int]:
        if self.budget == 0:
            return []
        plan = draft.plan
        fresh = torch.tensor(just_committed, dtype=torch.long, device=block.device)
        candidates = block[
            (draft.ids[block] != plan.mask_id)
            & ~torch.isin(draft.ids[block], torch.tensor(plan.ends, device=block.device))
            & ~torch.isin(block, fresh)
            & (draft.remasks[block] < MAX_REMASKS_PER_POSITION)
            & (draft.confidence[block] < self.below)
            & ~plan.canvas.protect.to(block.device)[block]
        ]
        free = [p for p in candidates.tolist() if plan.hole(p).constraint is None]
        if not free:
            return []
        chosen_t = torch.tensor(free, dtype=torch.long, device=block.device)
        order = draft.confidence[chosen_t].argsort()[: self.budget]
        chosen = chosen_t[order]
        draft.ids[chosen] = plan.mask_id
        draft.confidence[chosen] = math.nan
        draft.remasks[chosen] += 1
        return chosen.tolist()


def flush(
    draft: Draft, logits: StepLogits, propose: Proposer, choices: Choices, *,
    stop_on_eos: bool, generator: torch.Generator,
) -> Written:  # fmt: skip
    """The budget's last pass: commit every masked position of the canvas from one forward.
    Holes are walked in order; a pattern hole left to right with the same logits (one
    position per pass of the walk), so it still matches."""
    plan = draft.plan
    committed: list[int] = []
    padded: list[int] = []
    probs: list[float] = []
    for hole_index, hole in enumerate(plan.canvas.holes):
        if int(draft.ids[hole.start]) == plan.mask_id and isinstance(hole.constraint, ChoiceConstraint):
            positions, prob = choices.commit(draft, hole_index, logits, generator)
            committed.extend(positions)
            probs.append(prob)
            continue
        while True:  # each pass commits at least one position of this hole
            span = torch.arange(hole.start, hole.end, device=draft.ids.device)
            masked = span[draft.ids[span] == plan.mask_id]
            if masked.numel() == 0:
                break
            eligible = eligible_positions(draft, masked)
            decision = propose(draft, eligible, allowed_scores(draft, eligible, logits), generator)
            assert decision is not None
            picks = zip(decision.positions, decision.tokens, decision.prob, strict=True)
            written, ended = write(draft, list(picks), stop_on_eos=stop_on_eos)
            committed.extend(written)
            padded.extend(ended)
            probs.extend(decision.prob)
    return committed, padded, probs


def eligible_positions(draft: Draft, block: torch.Tensor, all_free: bool = False) -> torch.Tensor:
    """[n] masked positions of ``block`` that may be committed now; ``all_free`` says every
    position of ``block`` lies in a free hole (then each masked one is). A pattern hole is
    decoded in order, so only its leftmost masked position is; a choices hole never is (it
    is committed whole, by :class:`Choices`)."""
    plan = draft.plan
    masked = block[draft.ids[block] == plan.mask_id]
    if all_free:
        return masked
    keep: list[int] = []
    seen_pattern: set[int] = set()
    x = draft.ids.tolist()
    for position in masked.tolist():
        if plan.free_at[position]:
            keep.append(position)
            continue
        hole_index = plan.hole_at[position]
        hole = plan.canvas.holes[hole_index]
        if isinstance(hole.constraint, ChoiceConstraint):
            continue
        if isinstance(hole.constraint, PatternConstraint):
            if hole_index in seen_pattern or draft.first_masked(hole, x) != position:
                continue
            seen_pattern.add(hole_index)
        keep.append(position)
    return torch.tensor(keep, dtype=torch.long, device=block.device)


__all__ = [
    "MAX_REMASKS_PER_POSITION", "Choices", "LowConfidenceRemask", "PatternRuns", "TailPadding",
    "eligible_positions", "flush",
]  # fmt: skip
