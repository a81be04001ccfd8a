"""Canvases longer than the model reads: each hole filled from a window of its nearest context.

A request whose canvas fits the model runs as it is. One that does not (the locked text plus
every hole's ``max_tokens`` is more than the model's ``max_len``) is filled hole by hole, in
document order: each hole's window holds the hole, the document's text before it (locked text
and the holes already filled, cut at the left) and the locked text after it up to the next
hole (cut at the right), as much of each as fits. A cut falls at a line start where one is
near, else at a space. The document is assembled from the request's own locked strings and the
holes' texts, so locked text is byte-identical whatever the windows held.

The outcome is one :class:`~gpu_worker.engine.outcome.Outcome` for the request: holes,
document, the sum of the windows' steps, passes and timings, their violations, and their trace
entries in order, each naming its window (``"window": {"index", "of", "hole",
"left_tokens", "right_tokens", "canvas_tokens", "max_len"}``): the window and why (the canvas
needed ``canvas_tokens``, the model reads ``max_len``) are in the run record's trace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_worker.engine.canvas import parse_canvas
from gpu_worker.engine.config import SamplerConfig
from gpu_worker.engine.loaded import LoadedModel
from gpu_worker.engine.outcome import DIFFUSION, Hooks, Outcome
from gpu_worker.engine.sampler import model_int
from gpu_worker.engine.tokenizer import StencilTokenizer

Runner = Callable[..., list[Outcome | ValueError]]
TOO_LONG = "the canvas needs at least"  # how the canvas parser refuses a canvas too long
UNBOUNDED = 1 << 30  # a max_len no canvas reaches: measures a canvas without refusing it
RIGHT_SHARE = 3  # the text after a hole gets at most 1/RIGHT_SHARE of a window's context
NEAR = 200  # characters searched for a line start or a space at a cut
_FITS_TRIES = 6  # window builds before giving up (the tokenizer merged across a cut)


def infill_batch_windowed(runner: Runner, loaded: LoadedModel, requests: Sequence[dict[str, Any]], *,
                          config: SamplerConfig | None = None,
                          hooks: Sequence[Hooks] | None = None) -> list[Outcome | ValueError]:  # fmt: skip
    """``runner`` (the diffusion route's batch runner) on ``requests`` as one batch, exactly
    as without windows; then each request the runner refused as longer than the model, window
    by window."""
    out = runner(loaded, requests, config=config, hooks=hooks)
    for i, outcome in enumerate(out):
        if isinstance(outcome, ValueError) and str(outcome).startswith(TOO_LONG):
            row_hooks = hooks[i] if hooks is not None else Hooks()
            out[i] = _windowed(runner, loaded, requests[i], config, row_hooks,
                               model_int(loaded.network, "max_len"))  # fmt: skip
    return out


def _measure(loaded: LoadedModel, request: dict[str, Any], max_len: int) -> int:
    return parse_canvas(request, loaded.tokenizer, max_len=max_len).length


@dataclass
class _Window:
    request: dict[str, Any]
    left_tokens: int
    right_tokens: int


def _windowed(runner: Runner, loaded: LoadedModel, request: dict[str, Any],
              config: SamplerConfig | None, hooks: Hooks, max_len: int) -> Outcome | ValueError:  # fmt: skip
    segments: list[dict[str, Any]] = list(request["segments"])
    holes = [i for i, s in enumerate(segments) if "hole" in s]
    canvas_tokens = _measure(loaded, request, UNBOUNDED)
    fills: dict[str, str] = {}
    parts: list[Outcome] = []
    for index, at in enumerate(holes):
        name = str(segments[at]["hole"])
        if parts and parts[-1].cancelled:
            fills[name] = ""
            continue
        try:
            window = _window_for(loaded, request, segments, at, fills, max_len)
        except ValueError as exc:
            return exc
        outcome = runner(loaded, [window.request], config=config, hooks=[hooks])[0]
        if isinstance(outcome, ValueError):
            return outcome
        note = {"index": index, "of": len(holes), "hole": name, "left_tokens": window.left_tokens,
                "right_tokens": window.right_tokens, "canvas_tokens": canvas_tokens,
                "max_len": max_len}  # fmt: skip
        for entry in outcome.trace:
            entry["window"] = dict(note)
        fills[name] = outcome.holes[name]
        parts.append(outcome)
    return _merged(request, segments, fills, parts)


def _window_for(loaded: LoadedModel, request: dict[str, Any], segments: list[dict[str, Any]],
                at: int, fills: dict[str, str], max_len: int) -> _Window:  # fmt: skip
    """The window for the hole ``segments[at]``: as much nearest context as fits."""
    tokenizer = loaded.tokenizer
    hole = segments[at]
    alone = _measure(loaded, {"segments": [hole]}, UNBOUNDED)
    if alone > max_len:
        raise ValueError(f"hole {hole['hole']!r} needs {alone} tokens but the model's context "
                         f"is max_len={max_len}")  # fmt: skip
    left = "".join(str(s["text"]) if "text" in s else fills[str(s["hole"])] for s in segments[:at])
    right = ""
    for s in segments[at + 1 :]:
        if "hole" in s:
            break
        right += str(s["text"])
    room = max_len - alone
    for _ in range(_FITS_TRIES):
        right_want = min(_count(tokenizer, right), room // RIGHT_SHARE)
        left_cut = _cut_left(tokenizer, left, room - right_want)
        right_cut = _cut_right(tokenizer, right, room - _count(tokenizer, left_cut))
        window = [*([{"text": left_cut}] if left_cut else []), hole,
                  *([{"text": right_cut}] if right_cut else [])]  # fmt: skip
        built = {**{k: v for k, v in request.items() if k != "segments"}, "segments": window}
        needed = _measure(loaded, built, UNBOUNDED)
        if needed <= max_len:
            return _Window(built, _count(tokenizer, left_cut), _count(tokenizer, right_cut))
        room -= needed - max_len  # the tokenizer joined differently at a cut: take less
    raise ValueError(f"no window around hole {hole['hole']!r} fits max_len={max_len}")


def _count(tokenizer: StencilTokenizer, text: str) -> int:
    return len(tokenizer.encode(text)) if text else 0


def _cut_left(tokenizer: StencilTokenizer, text: str, budget: int) -> str:
    """The longest suffix of ``text`` of at most ``budget`` tokens, begun at a line or word."""
    if budget <= 0:
        return ""
    if _count(tokenizer, text) <= budget:
        return text
    lo, hi = 0, len(text)  # the smallest start whose suffix fits lies in (lo, hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _count(tokenizer, text[mid:]) <= budget:
            hi = mid
        else:
            lo = mid
    start = hi
    line = text.find("\n", start, start + NEAR)
    if line != -1:
        return text[line + 1 :]
    space = text.find(" ", start, start + NEAR)
    return text[space + 1 :] if space != -1 else text[start:]


def _cut_right(tokenizer: StencilTokenizer, text: str, budget: int) -> str:
    """The longest prefix of ``text`` of at most ``budget`` tokens, ended at a line or word."""
    if budget <= 0:
        return ""
    if _count(tokenizer, text) <= budget:
        return text
    lo, hi = 0, len(text)  # the largest end whose prefix fits lies in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _count(tokenizer, text[:mid]) <= budget:
            lo = mid
        else:
            hi = mid
    end = lo
    line = text.rfind("\n", max(0, end - NEAR), end)
    if line != -1:
        return text[: line + 1]
    space = text.rfind(" ", max(0, end - NEAR), end)
    return text[:space] if space != -1 else text[:end]


def _merged(request: dict[str, Any], segments: list[dict[str, Any]], fills: dict[str, str],
            parts: list[Outcome]) -> Outcome:  # fmt: skip
    """One outcome for the request from its windows' outcomes."""
    first = parts[0]
    timings: dict[str, float] = {}
    for part in parts:
        for key, seconds in part.timings.items():
            timings[key] = timings.get(key, 0.0) + seconds
    document = "".join(str(s["text"]) if "text" in s else fills[str(s["hole"])] for s in segments)
    return Outcome(
        holes={str(s["hole"]): fills[str(s["hole"])] for s in segments if "hole" in s},
        document=document,
        forward_passes=sum(p.forward_passes for p in parts),
        steps=sum(p.steps for p in parts),
        timings=timings,
        trace=[entry for p in parts for entry in p.trace],
        config=first.config,
        config_sha256=first.config_sha256,
        seed=int(request.get("seed", first.seed)),
        route=DIFFUSION,
        cancelled=any(p.cancelled for p in parts),
        violations=[v for p in parts for v in p.violations],
        model=first.model,
        device=first.device,
    )


def infill_windowed(runner: Runner, loaded: LoadedModel, request: dict[str, Any], *, context: int,
                    config: SamplerConfig | None = None,
                    hooks: Hooks | None = None) -> Outcome | ValueError:  # fmt: skip
    """``request`` filled window by window as if the model read ``context`` tokens, whatever
    it reads: the windowed path measured beside the same model reading the whole canvas."""
    return _windowed(runner, loaded, request, config, hooks or Hooks(), context)


__all__ = ["infill_batch_windowed", "infill_windowed"]
