"""A step's proposal: a token per eligible position and how sure the model is of it.

The :class:`Proposer` narrows the allowed scores (the repeat ban), samples a token per
position (or takes the argmax), scores each under the base rule, then lets the holds hold
some back. Every path that commits (a step, a pattern run, the budget's last pass) proposes
through it, so all randomness is drawn in one place, in canvas order.
Shapes: n positions, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpu_worker.engine.sampler.ops import pick_tokens
from gpu_worker.engine.sampler.rules import BanAdjacentRepeats, BaseRule, Hold
from gpu_worker.engine.sampler.state import Decision, Draft


@dataclass(frozen=True)
class Proposer:
    """How tokens are proposed under one config."""

    rule: BaseRule  # scores each proposal
    temperature: float  # 0 = argmax (nothing is drawn)
    top_p: float  # nucleus sampling
    ban: BanAdjacentRepeats | None = None  # narrows the allowed tokens first
    holds: tuple[Hold, ...] = ()  # hold positions back after scoring, in this order

    def __call__(
        self, draft: Draft, positions: torch.Tensor, scores: torch.Tensor,
        generator: torch.Generator,
    ) -> Decision | None:  # fmt: skip
        """The decision for ``positions`` [n] (ascending) from their allowed scores [n, V]
        (see ``ops.allowed_scores``; narrowed in place by the ban); None for no positions."""
        if positions.numel() == 0:
            return None
        if self.ban is not None:
            self.ban.mask(draft, positions, scores)
        probs = torch.softmax(scores, dim=-1)  # [n, V] the model's distribution over allowed tokens
        tokens = pick_tokens(scores, self.temperature, self.top_p, generator)  # [n]
        prob = probs.gather(-1, tokens[:, None]).squeeze(-1)  # [n]
        score = self.rule.score(probs, prob, tokens)  # [n]
        decision = Decision(positions.tolist(), tokens.tolist(), prob.tolist(), score)
        for hold in self.holds:
            hold(draft, decision)
        return decision


__all__ = ["Proposer"]
