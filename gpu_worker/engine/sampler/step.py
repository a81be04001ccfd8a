"""One denoising step of one canvas: ``step(logits, state, config, generator) -> StepOutput``.

A pure function of its inputs and the generator's state: it reads the state and the logits
of one forward pass, and returns the canvas after the step; it changes neither. The rules a
config switches on (:func:`rules_for`) apply in this order:

1. choices holes starting in the active block are committed whole;
2. the eligible positions' allowed scores are read (a pattern hole: its leftmost masked
   position, under its automaton); tail padding pads the unused budget it finds;
3. the proposer samples a token per eligible position and scores it; holds defer some;
4. the base rule picks (the even quota, or the threshold rules then their filters), held
   ends that may go with their hole's last words are released;
5. the picks are written left to right (an EOS / pad ends its hole; a repeat is skipped);
   a written pattern position may carry its hole's sure run on;
6. re-masking re-opens a few unsure tokens; the protect mask is enforced.

When the step budget is down to its last pass, the step is a flush instead: every masked
position of the canvas is committed.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

from gpu_worker.engine.config import SamplerConfig
from gpu_worker.engine.sampler.ops import allowed_scores, write
from gpu_worker.engine.sampler.proposal import Proposer
from gpu_worker.engine.sampler.rules import (
    Anchored,
    BanAdjacentRepeats,
    BaseRule,
    DeferEarlyEnds,
    Entropy,
    ErrorBudget,
    EvenQuota,
    Filter,
    Hold,
    HoldShiftedRepeats,
    Margin,
    NeighbourBar,
    ReleaseEnds,
    Threshold,
)
from gpu_worker.engine.sampler.state import (
    Decision,
    Draft,
    RowState,
    StepLogits,
    next_block,
    strip_tails,
)
from gpu_worker.engine.sampler.writers import (
    Choices,
    LowConfidenceRemask,
    PatternRuns,
    TailPadding,
    eligible_positions,
    flush,
)


@dataclass(frozen=True)
class RuleSet:
    """The rules one config switches on, composed (see the module docstring's order)."""

    base: BaseRule
    propose: Proposer
    choices: Choices
    filters: tuple[Filter, ...] = ()  # after a threshold rule's pick, in order
    release: ReleaseEnds | None = None
    tail: TailPadding | None = None
    ban: BanAdjacentRepeats | None = None  # skips repeats while writing
    runs: PatternRuns | None = None
    remask: LowConfidenceRemask | None = None
    stop_on_eos: bool = True

    @property
    def names(self) -> list[str]:
        """The active rules' names, in the order they apply."""
        parts = [self.choices, self.tail, *self.propose.holds, self.base, *self.filters,
                 self.release, self.ban, self.runs, self.remask]  # fmt: skip
        return [rule.name for rule in parts if rule is not None]


@functools.lru_cache(maxsize=64)
def rules_for(config: SamplerConfig) -> RuleSet:
    """The rules ``config`` switches on."""
    r = config.rules
    base: BaseRule
    if config.commit_rule == "even":
        base = EvenQuota(config.steps_per_block)
    elif config.commit_rule == "entropy":
        base = Entropy(config.entropy_threshold)
    else:
        base = (Margin if config.commit_rule == "margin" else Threshold)(config.threshold)
    holds: list[Hold] = []
    if config.stop_on_eos:
        holds.append(DeferEarlyEnds())
    if r.hold_shifted_repeats:
        holds.append(HoldShiftedRepeats())
    ban = BanAdjacentRepeats() if r.ban_adjacent_repeats else None
    threshold = base if isinstance(base, Threshold) else None
    filters: list[Filter] = []
    if threshold is not None:
        filters += [ErrorBudget(r.error_budget)] if r.error_budget > 0 else []
        filters += [NeighbourBar(r.neighbour_threshold)] if r.neighbour_threshold > 0 else []
        filters += [Anchored()] if r.anchored else []
    return RuleSet(
        base=base,
        propose=Proposer(base, config.temperature, config.top_p, ban, tuple(holds)),
        choices=Choices(config.temperature),
        filters=tuple(filters),
        release=ReleaseEnds(threshold, r.neighbour_threshold) if threshold is not None else None,
        tail=(TailPadding(r.tail_threshold)
              if config.stop_on_eos and r.tail_threshold < 1.0 else None),
        ban=ban,
        runs=(PatternRuns(threshold, r.neighbour_threshold, config.stop_on_eos)
              if threshold is not None and r.pattern_runs else None),
        remask=(LowConfidenceRemask(config.remask_budget, config.remask_below)
                if config.remask != "none" else None),
        stop_on_eos=config.stop_on_eos,
    )  # fmt: skip


@dataclass(frozen=True)
class StepOutput:
    """What one step did to one canvas (L the canvas length)."""

    ids: torch.Tensor  # [L] long: the canvas after the step, protect mask enforced
    confidence: torch.Tensor  # [L] float: probability of each position at its commit (nan = never)
    remasks: torch.Tensor  # [L] long: times each position was re-masked, this step included
    pattern_state: dict[int, int]  # pattern hole index -> its automaton state after the step
    committed: list[int]  # positions the model committed, ascending
    padded: list[int]  # positions set to pad (an EOS / pad ended their hole, or tail padding)
    remasked: list[int]  # positions re-masked, ascending
    probs: list[float]  # the probability of each decision the step read (any order)
    flush: bool  # the step was the budget's last pass


def step(
    logits: StepLogits, state: RowState, config: SamplerConfig, generator: torch.Generator
) -> StepOutput:
    """One step of ``state`` from ``logits`` (the active block's masked positions at least;
    every position when the step flushes)."""
    if state.done:
        raise ValueError("state is done: every block is decoded")
    rules = rules_for(config)
    draft = Draft.of(state)
    flushes = state.flushes(config)
    if flushes:
        committed, padded, probs = flush(draft, logits, rules.propose, rules.choices,
                                         stop_on_eos=rules.stop_on_eos, generator=generator)  # fmt: skip
        remasked: list[int] = []
    else:
        committed, padded, probs = _commit(draft, state, logits, rules, generator)
        block = state.active_block()
        remasked = rules.remask(draft, block, committed) if rules.remask is not None else []
    plan = draft.plan
    ids = torch.where(plan.protect, plan.locked, draft.ids)  # the protect mask, every step
    return StepOutput(ids, draft.confidence, draft.remasks, draft.pattern_state, sorted(committed),
                      sorted(padded), sorted(remasked), probs, flushes)  # fmt: skip


def advance(state: RowState, out: StepOutput) -> RowState:
    """The state after ``out``: the step counted, finished blocks skipped, and, once the
    canvas is done, every hole's tail from its first EOS / pad set to pad."""
    block = next_block(state.plan, out.ids, state.block)
    new = RowState(
        plan=state.plan,
        ids=out.ids,
        confidence=out.confidence,
        remasks=out.remasks,
        pattern_state=out.pattern_state,
        block=block,
        block_steps=0 if block != state.block else state.block_steps + 1,
        steps=state.steps + 1,
        flushed=out.flush,
    )
    if new.done:
        new = dataclasses.replace(new, ids=strip_tails(state.plan, out.ids))
    return new


def _commit(
    draft: Draft, state: RowState, logits: StepLogits, rules: RuleSet, generator: torch.Generator
) -> tuple[list[int], list[int], list[float]]:
    """Steps 1-5 of the module docstring: (committed, padded, probabilities)."""
    block = state.active_block()  # [n_b]
    committed: list[int] = []
    padded: list[int] = []
    probs: list[float] = []
    for hole_index in rules.choices.pending(draft, block):  # 1. choices
        positions, prob = rules.choices.commit(draft, hole_index, logits, generator)
        committed.extend(positions)
        probs.append(prob)
    eligible = eligible_positions(draft, block, all_free=draft.plan.free_blocks[state.block])
    scores = allowed_scores(draft, eligible, logits)  # 2. [n, V]
    if rules.tail is not None and eligible.numel():
        tails = rules.tail(draft, eligible, scores)
        if tails:
            padded.extend(tails)
            keep = draft.ids[eligible] == draft.plan.mask_id
            eligible, scores = eligible[keep], scores[keep]
    decision = rules.propose(draft, eligible, scores, generator)  # 3.
    if decision is None:
        return committed, padded, probs
    chosen = _pick(draft, state, decision, rules)  # 4.
    picks = [(decision.positions[i], decision.tokens[i], decision.prob[i]) for i in sorted(chosen)]
    ban, before = rules.ban, list(committed)
    skip = (None if ban is None else
            lambda p, t, written: ban.repeats_left(draft, p, t, written, before))  # fmt: skip
    written, ended = write(draft, picks, stop_on_eos=rules.stop_on_eos, skip=skip)  # 5.
    committed.extend(written)
    padded.extend(ended)
    probs.extend(decision.prob)
    if rules.runs is not None:
        last = int(block[-1])
        for position in written:
            if draft.plan.hole_at[position] in draft.pattern_state:
                run = rules.runs(draft, position, last, logits, rules.propose, generator)
                committed.extend(run[0])
                padded.extend(run[1])
                probs.extend(run[2])
    return committed, padded, probs


def _pick(draft: Draft, state: RowState, decision: Decision, rules: RuleSet) -> list[int]:
    """Step 4: indices into ``decision`` of the positions to commit (never none)."""
    base = rules.base
    if isinstance(base, EvenQuota):
        masked = int((draft.ids[state.active_block()] == draft.plan.mask_id).sum())
        return base.choose(decision, base.quota(masked, state.block_steps))
    assert isinstance(base, Threshold)
    chosen = base.passing(decision)
    for rule in rules.filters if chosen else ():  # the surest alone is never filtered
        chosen = rule(draft, decision, chosen)
    chosen = chosen or [base.surest(decision)]
    if decision.held and rules.release is not None:
        chosen = rules.release(draft, decision, chosen)
    return chosen


__all__ = ["RuleSet", "StepOutput", "advance", "rules_for", "step"]
