"""The block-diffusion sampler: fill a canvas's holes by iterative denoising.

The hole positions, in canvas order, are cut into blocks (:func:`plan_blocks`) decoded left
to right; attention stays bidirectional over the whole canvas. Each step is one forward pass
(through the backend's :class:`ForwardCache`: exact, dual cache or delayed caching) and one
:func:`step`, a pure function from the logits and a canvas's :class:`RowState` to a
:class:`StepOutput`, which applies the commit rules the config switches on
(:func:`rules_for`) and enforces the protect mask. :func:`denoise_batch` runs the loop.

Modules, in the order they build on each other: ``results`` (StepInfo, DenoiseResult),
``plan`` (blocks and per-canvas tables), ``state``, ``ops`` (allowed tokens, sampling,
writing), ``rules`` (the rules that decide), ``proposal``, ``writers`` (the rules that
write), ``step``, ``cache`` (the backend protocol), ``forward``, ``loop``.
"""

from gpu_worker.engine.sampler.cache import ForwardCache, PlainForward
from gpu_worker.engine.sampler.loop import denoise, denoise_batch, model_int
from gpu_worker.engine.sampler.plan import plan_blocks
from gpu_worker.engine.sampler.results import DenoiseResult, StepInfo, canvas_sha256
from gpu_worker.engine.sampler.state import RowState, StepLogits, start_state
from gpu_worker.engine.sampler.step import RuleSet, StepOutput, advance, rules_for, step

__all__ = [
    "DenoiseResult",
    "ForwardCache",
    "PlainForward",
    "RowState",
    "RuleSet",
    "StepInfo",
    "StepLogits",
    "StepOutput",
    "advance",
    "canvas_sha256",
    "denoise",
    "denoise_batch",
    "model_int",
    "plan_blocks",
    "rules_for",
    "start_state",
    "step",
]
