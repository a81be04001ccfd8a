"""What the sampler reports: one StepInfo per step, one DenoiseResult per canvas."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch


@dataclass
class StepInfo:
    """One step of one canvas: what ``on_step`` receives and the trace keeps."""

    step: int  # 0-based step (= forward pass) index within the request
    block: int  # index of the active block
    committed: list[int]  # canvas positions the model committed this step, ascending
    padded: list[int]  # hole positions set to pad because an EOS / pad ended their hole
    remasked: list[int]  # positions re-masked this step, ascending
    confidence: dict[str, float]  # min / mean / max probability of the step's decisions, n
    canvas_sha256: str  # sha256 of the canvas ids (int64 bytes) after the step
    ids: torch.Tensor  # [L] long on CPU: the canvas after the step (live preview; not hashed)
    masked_left: int  # masked positions left in the whole canvas after the step
    flush: bool  # True for the last pass of an exhausted step budget (commits everything)
    forward_ms: float  # wall time of the (batched) forward pass
    step_ms: float  # wall time of the whole step, forward included


@dataclass
class DenoiseResult:
    """The outcome of denoising one canvas."""

    ids: torch.Tensor  # [L] long on CPU: final ids; a hole's tail from its first EOS/pad is pad
    hole_texts: dict[str, str]  # request hole name -> its text (forced prefix stripped)
    document: str  # locked text and hole texts, in order
    steps: int  # steps taken (each one forward pass)
    forward_passes: int  # forward passes this canvas took part in
    trace: list[StepInfo]  # one entry per step, in order
    cancelled: bool  # should_stop() returned True; masks may remain
    blocks: int  # number of blocks planned
    # [L] float on CPU: each position's probability at its (last) commit; nan = never written
    confidence: torch.Tensor | None = None


def canvas_sha256(ids: torch.Tensor) -> str:
    """sha256 of ids as little-endian int64 bytes."""
    return hashlib.sha256(ids.detach().to("cpu", torch.int64).numpy().tobytes()).hexdigest()


def confidence_summary(probs: list[float]) -> dict[str, float]:
    """n / min / mean / max of a step's decision probabilities (zeros for none)."""
    if not probs:
        return {"n": 0.0, "min": 0.0, "mean": 0.0, "max": 0.0}
    return {
        "n": float(len(probs)),
        "min": min(probs),
        "mean": sum(probs) / len(probs),
        "max": max(probs),
    }


__all__ = ["DenoiseResult", "StepInfo", "canvas_sha256", "confidence_summary"]
