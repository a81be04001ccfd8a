"""The routes' shared interface: their names, a request's seed bound, the callbacks a route
takes besides the request (:class:`Hooks`) and what it gives back (:class:`Outcome`).

Both routes (diffusion: :mod:`gpu_worker.engine.infill`, AR-FIM: :mod:`gpu_worker.engine.ar`)
return this one dataclass, and every reader takes it as is: the worker's pipeline, the CLI,
the audit's run record (``audit.runbody``) and replay.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpu_worker.engine.trace import trace_chain

DIFFUSION = "diffusion"  # the denoiser fills every hole in parallel
AR = "ar"  # the AR-FIM model fills the holes left to right
ROUTES = (DIFFUSION, AR)
MAX_SEED = 2**63 - 1  # a request's largest seed: a job row stores it in a signed 64-bit column


@dataclass(frozen=True)
class Hooks:
    """The callbacks of one request's run; each may be left out.

    ``on_step(entry)`` gets each trace entry as it is appended (progress, lease renewal).
    ``should_stop()`` is asked once per step (diffusion) or per token (AR); True cancels the
    run, and the outcome says ``cancelled``. ``on_snapshot(step, provisional, stable)`` gets,
    after each diffusion step, each hole's text with the still-masked positions left out and
    its stable prefix (the text before its first still-masked position), for live previews and
    diagnostic sampling; that text never enters the trace. The AR route has no snapshots.
    """

    on_step: Callable[[dict[str, Any]], None] | None = None
    should_stop: Callable[[], bool] | None = None
    on_snapshot: Callable[[int, dict[str, str], dict[str, str]], None] | None = None

    def stop_requested(self) -> bool:
        return self.should_stop is not None and self.should_stop()


@dataclass
class Outcome:
    """What one route produced for one request."""

    holes: dict[str, str]  # request hole name -> filled text
    document: str  # locked text and hole texts, in order
    forward_passes: int  # model forward passes spent
    steps: int  # diffusion: sampler steps (one forward pass each); AR: forward passes
    timings: dict[str, float]  # seconds: encode, denoise (AR: decode), validate, total
    trace: list[dict[str, Any]]  # per-step entries; keys ending in _ms are timings
    config: dict[str, Any]  # the SamplerConfig as a dict
    config_sha256: str  # sha256 of the config's canonical JSON
    seed: int  # the request's seed (its torch.Generator's)
    route: str  # DIFFUSION | AR
    cancelled: bool  # should_stop() ended the run early; holes may be partial
    violations: list[dict[str, str]]  # validation: {"name", "hole", "message"}; [] = valid
    model: dict[str, Any]  # LoadedModel.identity(): name, kind, hashes, placeholder
    device: str  # the torch device that ran the model
    # request hole name -> {"p", "low", "marks", "signal", "calibrated"} (engine.confidence)
    confidence: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the locked text against the training corpus: {"score", "unfamiliar", "threshold"}, or
    # None when the model ships no domain profile (engine.domain)
    domain: dict[str, Any] | None = None

    @property
    def trace_sha256(self) -> str:
        """Head of the hash chain over the trace (:func:`gpu_worker.engine.trace.trace_chain`)."""
        return trace_chain(self.trace)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of every field and the trace's head."""
        return {**dataclasses.asdict(self), "trace_sha256": self.trace_sha256}


__all__ = ["AR", "DIFFUSION", "MAX_SEED", "ROUTES", "Hooks", "Outcome"]
