"""What never changes while a canvas is denoised: its blocks and per-position tables.

Built once per canvas (:func:`plan_canvas`) and shared by every step of it.
Shapes: L canvas length, V vocabulary, S distinct static token sets, n_b block positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gpu_worker.engine.canvas import Canvas, Hole
from gpu_worker.engine.config import SamplerConfig
from gpu_worker.engine.constraints import ChoiceConstraint, PatternConstraint, token_table


@dataclass(frozen=True)
class CanvasPlan:
    """A canvas's blocks and the tables the commit rules read, on the model's device."""

    canvas: Canvas
    hole_at: list[int]  # [L] hole index per position, -1 = locked (a list: read one by one)
    free_at: list[bool]  # [L] whether the position lies in a free (unconstrained) hole
    blocks: list[torch.Tensor]  # [n_b] long positions of each block, in decoding order
    free_blocks: list[bool]  # per block: every position lies in a free hole
    vocab: torch.Tensor  # [S, V] bool: the distinct static token sets (see _vocab_table)
    bias: torch.Tensor  # [S, V] float: 0 where ``vocab`` allows a token, -inf elsewhere
    vocab_ok: bool  # every static set allows a token (then a step need not check it)
    vocab_of: torch.Tensor  # [L] long: each position's set in ``vocab``
    words: frozenset[int] | None  # word tokens (the repeat rules), None = neither rule on
    locked: torch.Tensor  # [L] long: the canvas ids (what the protect mask restores)
    protect: torch.Tensor  # [L] bool: the canvas protect mask
    choices: list[int]  # indices of the canvas's choices holes
    ends: tuple[int, int]  # the terminators (EOS, pad)

    @property
    def mask_id(self) -> int:
        return self.canvas.mask_id

    @property
    def pad_id(self) -> int:
        return self.canvas.pad_id

    def hole(self, position: int) -> Hole:
        return self.canvas.holes[self.hole_at[position]]


def plan_blocks(canvas: Canvas, config: SamplerConfig) -> list[torch.Tensor]:
    """Hole positions in canvas order, cut into blocks of ``block_length`` positions.

    ``block_scope="hole"`` cuts each hole on its own; ``"attention"`` cuts at every multiple
    of ``block_length`` canvas positions instead of every ``block_length`` hole positions; a
    ``choices`` hole is never cut (it is committed whole, so it joins the block where it starts).
    """
    if config.block_scope == "attention":
        return _attention_blocks(canvas, config.block_length)
    blocks: list[list[int]] = []
    current: list[int] = []
    for hole in canvas.holes:
        if config.block_scope == "hole" and current:
            blocks.append(current)
            current = []
        if isinstance(hole.constraint, ChoiceConstraint):
            current.extend(range(hole.start, hole.end))
            if len(current) >= config.block_length:
                blocks.append(current)
                current = []
            continue
        for position in range(hole.start, hole.end):
            current.append(position)
            if len(current) == config.block_length:
                blocks.append(current)
                current = []
    if current:
        blocks.append(current)
    return [torch.tensor(block, dtype=torch.long) for block in blocks]


def _attention_blocks(canvas: Canvas, size: int) -> list[torch.Tensor]:
    """Hole positions grouped by the span of ``size`` canvas positions they lie in (a
    ``choices`` hole whole, in the span where it starts)."""
    blocks: list[list[int]] = []
    for hole in canvas.holes:
        whole = isinstance(hole.constraint, ChoiceConstraint)
        for position in range(hole.start, hole.end):
            span = (hole.start if whole else position) // size
            if not blocks or (blocks[-1][0] // size != span and not (whole and position > hole.start)):
                blocks.append([])
            blocks[-1].append(position)
    return [torch.tensor(block, dtype=torch.long) for block in blocks]


def plan_canvas(canvas: Canvas, config: SamplerConfig, device: torch.device) -> CanvasPlan:
    vocab, vocab_of = _vocab_table(canvas, config)
    hole_at = canvas.hole_index().tolist()
    free_at = [h >= 0 and canvas.holes[h].constraint is None for h in hole_at]
    blocks = plan_blocks(canvas, config)
    rules = config.rules
    return CanvasPlan(
        canvas=canvas,
        hole_at=hole_at,
        free_at=free_at,
        blocks=[b.to(device) for b in blocks],
        free_blocks=[all(free_at[p] for p in block.tolist()) for block in blocks],
        vocab=vocab.to(device),
        bias=torch.zeros(vocab.shape).masked_fill(~vocab, -math.inf).to(device),
        vocab_ok=bool(vocab.any(dim=-1).all()),
        vocab_of=vocab_of.to(device),
        words=(_word_tokens(canvas)
               if rules.ban_adjacent_repeats or rules.hold_shifted_repeats else None),
        locked=canvas.ids.to(device),
        protect=canvas.protect.to(device),
        choices=[i for i, hole in enumerate(canvas.holes)
                 if isinstance(hole.constraint, ChoiceConstraint)],
        ends=canvas.terminators(),
    )  # fmt: skip


def pattern_starts(canvas: Canvas) -> dict[int, int]:
    """Each pattern hole's automaton start state, by hole index."""
    return {i: hole.constraint.start for i, hole in enumerate(canvas.holes)
            if isinstance(hole.constraint, PatternConstraint)}  # fmt: skip


def _word_tokens(canvas: Canvas) -> frozenset[int] | None:
    """The canvas vocabulary's word tokens (None without a tokenizer)."""
    if canvas.tokenizer is None:
        return None
    return token_table(canvas.tokenizer, int(canvas.free_vocab.numel())).words


def _vocab_table(canvas: Canvas, config: SamplerConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct static token sets [S, V] bool of the canvas's positions, and the set of
    each position [L] (a pattern hole's positions are decided per step from its automaton).

    A free position may take the canvas's free vocabulary; a position with a forced prefix
    only tokens that start with it. With ``stop_on_eos`` a free hole's first position never
    takes EOS / pad: a hole asked for is never left empty.
    """
    sets = [canvas.free_vocab]
    index = torch.zeros(canvas.length, dtype=torch.long)
    for position, tokens in canvas.allowed.items():
        sets.append(tokens)
        index[position] = len(sets) - 1
    for hole in canvas.holes:
        if config.stop_on_eos and hole.constraint is None:
            position = hole.start
            content = sets[int(index[position])].clone()
            content[list(canvas.terminators())] = False
            if bool(content.any()):
                sets.append(content)
                index[position] = len(sets) - 1
    return torch.stack(sets), index


__all__ = ["CanvasPlan", "pattern_starts", "plan_blocks", "plan_canvas"]
