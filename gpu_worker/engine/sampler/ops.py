"""The primitives the rules are made of: the tokens a position may take, sampling a token,
and writing commits to a draft (an EOS / pad ends its hole; a pattern hole's automaton
advances).

Shapes: n positions, V vocabulary (the model's may be wider than the canvas's).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from gpu_worker.engine.canvas import Hole
from gpu_worker.engine.constraints import CharAutomaton, PatternConstraint
from gpu_worker.engine.sampler.state import Draft, StepLogits


def allowed_scores(draft: Draft, positions: torch.Tensor, logits: StepLogits) -> torch.Tensor:
    """[n, V] the logits of ``positions`` with every token they may not take at -inf: each
    position's static set (see ``plan._vocab_table``); a pattern hole's position takes its
    automaton state's set instead."""
    plan = draft.plan
    reads = logits.where[positions]
    scores = logits.values.index_select(0, reads)  # [n, V], a copy
    if positions.numel() == 0:
        return scores
    sets = plan.vocab_of[positions]
    if scores.shape[-1] == plan.bias.shape[-1]:
        # adding 0 / -inf is masking for logits that are finite or -inf, in one cheap pass
        scores.add_(plan.bias.index_select(0, sets))
    else:  # a model vocabulary wider than the canvas's: the extra tokens are never allowed
        scores.masked_fill_(_widened(~plan.vocab[sets], scores.shape[-1]), -math.inf)
    patterned: list[int] = []  # rows of pattern-hole positions
    for i, position in enumerate(positions.tolist()):
        hole_index = plan.hole_at[position]
        if hole_index in draft.pattern_state:
            patterned.append(i)
            allowed = _pattern_allowed(draft, hole_index, position)
            if not bool(allowed.any()):
                raise RuntimeError(f"no allowed token at position {position}")
            banned = _widened(~allowed[None, :], scores.shape[-1])[0]
            scores[i] = logits.values[int(reads[i])].masked_fill(banned, -math.inf)
    if not plan.vocab_ok:  # some static set is empty: is it one of these positions'?
        nonempty = plan.vocab[sets].any(dim=-1)
        nonempty[patterned] = True
        if not bool(nonempty.all()):
            raise RuntimeError(f"no allowed token at some of positions {positions.tolist()}")
    return scores


def _widened(banned: torch.Tensor, width: int) -> torch.Tensor:
    """[n, width] bool: ``banned`` [n, V] with the tokens past V banned too."""
    if width == banned.shape[-1]:
        return banned
    return torch.cat([banned, banned.new_ones((banned.shape[0], width - banned.shape[-1]))], -1)


def _pattern_allowed(draft: Draft, hole_index: int, position: int) -> torch.Tensor:
    """[V] bool: the tokens a pattern hole's automaton allows at ``position`` now."""
    hole = draft.plan.canvas.holes[hole_index]
    assert isinstance(hole.constraint, PatternConstraint)
    state = draft.pattern_state[hole_index]
    return hole.constraint.allowed(state, hole.end - position).to(draft.plan.vocab.device)


def pick_tokens(
    scores: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator
) -> torch.Tensor:
    """[n] tokens: argmax at temperature 0 (no draw), else a top-p sample from the generator."""
    if temperature == 0:
        return scores.argmax(dim=-1)
    tempered = torch.softmax(scores / temperature, dim=-1)  # [n, V]
    if top_p < 1.0:
        sorted_p, order = tempered.sort(dim=-1, descending=True)
        outside = sorted_p.cumsum(-1) - sorted_p > top_p  # keeps at least the top one
        sorted_p = sorted_p.masked_fill(outside, 0.0)
        tempered = torch.zeros_like(tempered).scatter(-1, order, sorted_p)
    draws = torch.multinomial(tempered.to(generator.device), 1, generator=generator)
    return draws.squeeze(-1).to(scores.device)


# A commit to skip while writing: (position, token, this step's writes so far) -> skip it
Skip = Callable[[int, int, dict[int, int]], bool]


def write(
    draft: Draft,
    picks: Sequence[tuple[int, int, float]],
    *,
    stop_on_eos: bool,
    skip: Skip | None = None,
) -> tuple[list[int], list[int]]:
    """Commit ``picks`` (position, token, probability; masked positions, ascending) left to
    right, so an EOS / pad pads the rest of its hole (a free hole's only with ``stop_on_eos``)
    and a later pick it padded is skipped; so is one ``skip`` names. The tokens are written
    to the draft in one go at the end. Returns (committed, padded) positions."""
    plan = draft.plan
    ends = plan.ends
    written: dict[int, int] = {}  # position -> token, in commit order
    confidence: list[float] = []
    padded: list[int] = []
    for position, token, prob in picks:
        if position in padded:
            continue  # padded by an EOS committed before it
        if skip is not None and skip(position, token, written):
            continue
        written[position] = token
        confidence.append(prob)
        hole_index = plan.hole_at[position]
        hole = plan.canvas.holes[hole_index]
        constraint = hole.constraint
        if isinstance(constraint, PatternConstraint):
            state = constraint.advance(draft.pattern_state[hole_index], token)
            if token not in ends and state == CharAutomaton.DEAD:
                raise RuntimeError(f"pattern hole {hole.name!r} took a disallowed token {token}")
            draft.pattern_state[hole_index] = state
        if token in ends and (stop_on_eos or constraint is not None):
            padded.extend(pad_after(draft, hole, position))
    if written:  # one write for the step's commits (the pads are written by pad_after)
        device = draft.ids.device
        at = torch.tensor(list(written), dtype=torch.long, device=device)
        draft.ids[at] = torch.tensor(list(written.values()), dtype=torch.long, device=device)
        draft.confidence[at] = torch.tensor(confidence, device=device)
    return list(written), padded


def pad_after(draft: Draft, hole: Hole, position: int) -> list[int]:
    """Set the masked positions of ``hole`` after ``position`` to pad (positions left of it
    may still await their write: see :func:`write`)."""
    span = torch.arange(position + 1, hole.end, device=draft.ids.device)
    span = span[draft.ids[span] == draft.plan.mask_id]
    draft.ids[span] = draft.plan.pad_id
    return span.tolist()


__all__ = ["allowed_scores", "pad_after", "pick_tokens", "write"]
