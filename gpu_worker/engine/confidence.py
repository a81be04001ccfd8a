"""Each span's confidence: the probability that the text the route wrote is right.

Both routes keep, for every position they wrote, the probability the model gave the token it
committed there (the sampler's ``RowState.confidence``: at its commit, or at its last one
after a re-mask; the AR route: at its decoding; a ``choices`` hole: the chosen candidate's
share, on every position of it). From those, and where the route's calibration asks, the
model's re-read of the finished span (:mod:`gpu_worker.engine.rescore`: the denoiser's
few-pass ELBO, the AR-FIM model's NLL between the filled prefix and suffix), a span gets one
*signal* (``SIGNALS``, ``RESCORED_SIGNALS``), and the model directory's ``confidence.json``
maps the signal, per route and hole class, to the probability that the span is right, as
measured on the validation split (an isotonic curve, monotone by construction). Without that
file the score is the span's geometric-mean token probability, marked
``"calibrated": false``.

What a hole gets (``Outcome.confidence[hole]``, the job result's ``confidence``)::

    {"p": 0.83, "low": false, "marks": [[12, 19]], "signal": "mean_logp", "calibrated": true}

``low`` is ``p`` under the file's threshold for the hole class; ``marks`` are the character
ranges, in the hole's text, of the tokens the model was least sure of (probability under the
file's ``mark_below``, the surest tokens never marked, at most ``MAX_MARKS`` of them).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpu_worker.engine.canvas import Canvas, Hole
from gpu_worker.engine.constraints import ChoiceConstraint, PatternConstraint
from gpu_worker.engine.domain import assess_text
from gpu_worker.engine.model_files import model_file
from gpu_worker.engine.tokenizer import StencilTokenizer

CALIBRATION_FILE = "confidence.json"
CALIBRATION_FORMAT = "stencil-confidence/1"
HOLE_CLASSES = ("free", "pattern", "choice")  # what a request hole's constraint makes it
ANY_CLASS = "all"  # a route's curve for classes without their own
UNFAMILIAR = "unfamiliar"  # the curve of spans in a canvas whose domain score is over the bar
UNCALIBRATED_SIGNAL = "gmean_p"
UNCALIBRATED_LOW_BELOW = 0.5  # without a calibration: low under this geometric-mean probability
UNCALIBRATED_MARK_BELOW = 0.5
MAX_MARKS = 3  # tokens marked per span at most
_FLOOR = 1e-6  # probabilities are floored here before their logarithm


# -- signals ------------------------------------------------------------------------------------
def _logs(probs: Sequence[float]) -> list[float]:
    return [math.log(max(float(p), _FLOOR)) for p in probs]


SIGNALS = {  # name -> the span's score from its tokens' probabilities (never empty)
    "mean_logp": lambda ps: sum(_logs(ps)) / len(ps),
    "min_logp": lambda ps: min(_logs(ps)),
    "gmean_p": lambda ps: math.exp(sum(_logs(ps)) / len(ps)),
    "mean_p": lambda ps: sum(float(p) for p in ps) / len(ps),
    "min_p": lambda ps: min(float(p) for p in ps),
    "low3_logp": lambda ps: sum(sorted(_logs(ps))[:3]) / min(3, len(ps)),
}
RESCORED_SIGNALS = {  # name -> the score from the tokens' probabilities and the re-read span
    "elbo": lambda ps, r: r["elbo"],
    "elbo_min": lambda ps, r: r["elbo_min"],
    "logp_elbo": lambda ps, r: sum(_logs(ps)) / len(ps) + r["elbo"],
    "reread": lambda ps, r: r["reread"],
    "logp_reread": lambda ps, r: sum(_logs(ps)) / len(ps) + r["reread"],
}  # (gpu_worker.engine.rescore: the denoiser's ELBO, the AR-FIM model's re-read)
RESCORE_READS = {"elbo": "elbo", "elbo_min": "elbo_min", "logp_elbo": "elbo",
                 "reread": "reread", "logp_reread": "reread"}  # fmt: skip
SIGNAL_NAMES = (*SIGNALS, *RESCORED_SIGNALS)


def span_signal(
    name: str, probs: Sequence[float], rescored: dict[str, float] | None = None
) -> float:
    """The signal ``name`` of a span with token probabilities ``probs`` and, for a signal of
    ``RESCORED_SIGNALS``, its re-read ``rescored`` (``ValueError`` for an unknown name, no
    tokens, or a rescored signal without the value it reads)."""
    if name not in SIGNALS and name not in RESCORED_SIGNALS:
        raise ValueError(f"signal={name!r} is not one of {sorted(SIGNAL_NAMES)}")
    if not probs:
        raise ValueError("a span without tokens has no signal")
    if name in SIGNALS:
        return float(SIGNALS[name](probs))
    if rescored is None or RESCORE_READS[name] not in rescored:
        raise ValueError(f"signal={name!r} needs the span's re-read "
                         f"{RESCORE_READS[name]!r} (gpu_worker.engine.rescore)")  # fmt: skip
    return float(RESCORED_SIGNALS[name](probs, rescored))


# -- the calibration curve ----------------------------------------------------------------------
@dataclass(frozen=True)
class Isotonic:
    """A non-decreasing map from a signal to P(right): linear between fitted points."""

    x: tuple[float, ...]  # ascending signal values
    y: tuple[float, ...]  # P(right) at each, non-decreasing, in [0, 1]

    def __post_init__(self) -> None:
        if not self.x or len(self.x) != len(self.y):
            raise ValueError(f"an isotonic curve needs as many x as y, at least one: {self}")
        if any(b < a for a, b in zip(self.x, self.x[1:], strict=False)):
            raise ValueError("an isotonic curve's x must ascend")
        if any(b < a for a, b in zip(self.y, self.y[1:], strict=False)):
            raise ValueError("an isotonic curve's y must not decrease")
        if not all(0.0 <= v <= 1.0 for v in self.y):
            raise ValueError("an isotonic curve's y must lie in [0, 1]")

    def __call__(self, score: float) -> float:
        if math.isnan(score) or score <= self.x[0]:
            return self.y[0]
        if score >= self.x[-1]:
            return self.y[-1]
        i = bisect.bisect_right(self.x, score)
        x0, x1, y0, y1 = self.x[i - 1], self.x[i], self.y[i - 1], self.y[i]
        t = 0.0 if x1 == x0 else (score - x0) / (x1 - x0)
        return min(max(y0 + t * (y1 - y0), y0), y1)

    @classmethod
    def fit(
        cls, scores: Sequence[float], labels: Sequence[bool], *, prior: float = 1.0
    ) -> Isotonic:
        """Pool-adjacent-violators on (score, label), each pooled block's mean smoothed by
        ``prior`` pseudo-counts toward the overall rate; one point per block at its mean score."""
        if not scores or len(scores) != len(labels):
            raise ValueError("fit needs as many labels as scores, at least one")
        base = sum(bool(v) for v in labels) / len(labels)
        blocks: list[list[float]] = []  # [sum score, sum label, count]
        for s, v in sorted(zip(scores, labels, strict=True)):
            blocks.append([float(s), float(bool(v)), 1.0])
            while (
                len(blocks) > 1 and blocks[-2][1] / blocks[-2][2] >= blocks[-1][1] / blocks[-1][2]
            ):
                last = blocks.pop()
                blocks[-1] = [a + b for a, b in zip(blocks[-1], last, strict=True)]
        xs = [b[0] / b[2] for b in blocks]
        ys = [(b[1] + prior * base) / (b[2] + prior) for b in blocks]
        for i in range(1, len(ys)):  # smoothing keeps the order; guard float ties
            ys[i] = max(ys[i], ys[i - 1])
        return cls(tuple(xs), tuple(ys))

    def to_json(self) -> dict[str, list[float]]:
        return {"x": [round(v, 6) for v in self.x], "y": [round(v, 6) for v in self.y]}


@dataclass(frozen=True)
class RouteCalibration:
    """One route's calibration: its signal (or one per hole class), a curve and a
    threshold per hole class."""

    signal: str
    curves: dict[str, Isotonic]  # hole class (or ANY_CLASS) -> curve
    low_below: dict[str, float]  # hole class (or ANY_CLASS) -> p under which a span is low
    mark_below: float  # a token under this probability may be marked
    domain_weight: float = 0.0  # the signal minus this times the canvas's domain score
    signals: dict[str, str] = field(default_factory=dict)  # hole class -> its own signal
    unfamiliar_above: float | None = None  # a domain score over this uses the UNFAMILIAR curve
    elbo_passes: int = 0  # re-masked passes of a span's ELBO, for a signal that reads it

    @property
    def rescores(self) -> bool:
        """Whether a span's score reads its re-read (the route must compute it)."""
        return any(name in RESCORED_SIGNALS for name in (self.signal, *self.signals.values()))

    @property
    def reads_elbo(self) -> bool:
        """Whether a span's score reads the denoiser's ELBO (``elbo_passes`` of it)."""
        names = (self.signal, *self.signals.values())
        return any(RESCORE_READS.get(name) in ("elbo", "elbo_min") for name in names)

    def curve(self, hole_class: str) -> Isotonic:
        return self.curves.get(hole_class) or self.curves[ANY_CLASS]

    def threshold(self, hole_class: str) -> float:
        return self.low_below.get(hole_class, self.low_below[ANY_CLASS])

    def hole_key(self, hole_class: str, domain_score: float) -> str:
        """The curve a span uses: UNFAMILIAR when its canvas reads unlike the corpus (and the
        calibration has that curve), else its hole class."""
        above = self.unfamiliar_above
        gated = above is not None and UNFAMILIAR in self.curves and domain_score > above
        return UNFAMILIAR if gated else hole_class

    def signal_for(self, hole_class: str) -> str:
        """The signal of a hole class: its own where it has a curve of its own, else the
        route's (the ANY_CLASS curve is fitted on the route's signal)."""
        return (
            self.signals.get(hole_class, self.signal) if hole_class in self.curves else self.signal
        )

    def score(
        self, probs: Sequence[float], domain_score: float, hole_class: str = ANY_CLASS,
        rescored: dict[str, float] | None = None,
    ) -> float:  # fmt: skip
        signal = span_signal(self.signal_for(hole_class), probs, rescored)
        return signal - self.domain_weight * domain_score

    def to_json(self) -> dict[str, Any]:
        return {"signal": self.signal, "signals": self.signals, "mark_below": self.mark_below,
                "unfamiliar_above": self.unfamiliar_above, "elbo_passes": self.elbo_passes,
                "domain_weight": self.domain_weight, "low_below": self.low_below,
                "curves": {k: c.to_json() for k, c in self.curves.items()}}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RouteCalibration:
        curves = {k: Isotonic(tuple(c["x"]), tuple(c["y"])) for k, c in data["curves"].items()}
        low = {k: float(v) for k, v in data["low_below"].items()}
        if ANY_CLASS not in curves or ANY_CLASS not in low:
            raise ValueError(f"a route calibration needs an {ANY_CLASS!r} curve and threshold")
        signals = {str(k): str(v) for k, v in data.get("signals", {}).items()}
        for name in (str(data["signal"]), *signals.values()):
            span_signal(name, [0.5], dict.fromkeys(RESCORE_READS.values(), 0.0))  # unknown: refused
        passes = int(data.get("elbo_passes", 0))
        route = cls(str(data["signal"]), curves, low, float(data["mark_below"]),
                    float(data.get("domain_weight", 0.0)), signals,
                    None if data.get("unfamiliar_above") is None else float(data["unfamiliar_above"]),
                    passes)  # fmt: skip
        if route.reads_elbo and passes < 1:
            raise ValueError("a calibration whose signal reads the ELBO needs elbo_passes >= 1")
        return route


@dataclass(frozen=True)
class Calibration:
    """A model directory's ``confidence.json``: one :class:`RouteCalibration` per route."""

    routes: dict[str, RouteCalibration]
    source: str = ""  # what it was fitted on
    metrics: dict[str, Any] = field(default_factory=dict)  # what it measured on val

    def to_json(self) -> dict[str, Any]:
        return {"format": CALIBRATION_FORMAT, "source": self.source, "metrics": self.metrics,
                "routes": {k: r.to_json() for k, r in self.routes.items()}}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Calibration:
        if data.get("format") != CALIBRATION_FORMAT:
            raise ValueError(
                f"calibration format {data.get('format')!r} is not {CALIBRATION_FORMAT}"
            )
        routes = {k: RouteCalibration.from_json(v) for k, v in data["routes"].items()}
        return cls(routes, str(data.get("source", "")), dict(data.get("metrics", {})))


def load_calibration(directory: Path) -> Calibration | None:
    """The directory's calibration, or None when it has none (read once per file version)."""
    return model_file(directory, CALIBRATION_FILE, Calibration.from_json)


# -- a span's tokens --------------------------------------------------------------------------
@dataclass(frozen=True)
class SpanTokens:
    """A request hole's written tokens: their probabilities and character ranges."""

    probs: list[float]
    offsets: list[tuple[int, int]]  # [start, end) of each token in the hole's text
    hole_class: str  # one of HOLE_CLASSES
    rescored: dict[str, float] | None = None  # the span's re-read (gpu_worker.engine.rescore)


def hole_class(holes: Sequence[Hole]) -> str:
    """The class of a request hole from its canvas spans' constraints."""
    constraints = [h.constraint for h in holes]
    if any(isinstance(c, ChoiceConstraint) for c in constraints):
        return "choice"
    if any(isinstance(c, PatternConstraint) for c in constraints) or len(holes) > 1:
        return "pattern"  # a pattern, or the values of a JSON skeleton
    return "free"


def span_tokens(
    canvas: Canvas, ids: torch.Tensor, probs: torch.Tensor, tokenizer: StencilTokenizer,
    rescored: dict[str, dict[str, float]] | None = None,
) -> dict[str, SpanTokens]:  # fmt: skip
    """Each request hole's tokens from the final ``ids`` [L] and ``probs`` [L] (nan where
    the route wrote nothing), with its re-read from ``rescored`` where given."""
    values = probs.detach().to("cpu", torch.float64).tolist()
    texts = canvas.span_texts(ids, tokenizer)
    out: dict[str, SpanTokens] = {}
    for name in canvas.groups:
        spans = [h for h in canvas.holes if h.group == name]
        token_probs: list[float] = []
        offsets: list[tuple[int, int]] = []
        cursor = 0  # characters of the hole's text before the current piece
        for piece in canvas.pieces:
            if piece.group != name:
                continue
            if piece.hole is None:
                cursor += len(piece.text or "")
                continue
            hole = canvas.holes[piece.hole]
            for position, (a, b) in _token_ranges(canvas, ids, hole, tokenizer):
                p = values[position]
                token_probs.append(1.0 if math.isnan(p) else p)  # a forced token is sure
                offsets.append((cursor + a, cursor + b))
            cursor += len(texts[piece.hole])
        out[name] = SpanTokens(
            token_probs, offsets, hole_class(spans), (rescored or {}).get(name)
        )
    return out


def _token_ranges(
    canvas: Canvas, ids: torch.Tensor, hole: Hole, tokenizer: StencilTokenizer
) -> list[tuple[int, tuple[int, int]]]:
    """(canvas position, [start, end) in the span's text) of each kept token of ``hole``."""
    raw = isinstance(hole.constraint, PatternConstraint)
    kept = [t for t in canvas.kept_tokens(ids, hole) if t != canvas.mask_id]
    out: list[tuple[int, tuple[int, int]]] = []
    previous = 0
    for i in range(len(kept)):
        text = tokenizer.decode(kept[: i + 1], raw=raw)
        end = len(text) - len(hole.prefix) if text.startswith(hole.prefix) else len(text)
        end = max(end, previous)
        out.append((hole.start + i, (previous, end)))
        previous = end
    return out


# -- a hole's confidence ----------------------------------------------------------------------
def hole_confidence(
    tokens: SpanTokens, route: RouteCalibration | None, *, domain_score: float = 0.0
) -> dict[str, Any]:
    """``{"p", "low", "marks", "signal", "calibrated"}`` of one request hole."""
    if route is None:
        signal, calibrated, mark_below = UNCALIBRATED_SIGNAL, False, UNCALIBRATED_MARK_BELOW
        p = span_signal(signal, tokens.probs) if tokens.probs else 0.0
        low = p < UNCALIBRATED_LOW_BELOW
    else:
        key = route.hole_key(tokens.hole_class, domain_score)
        signal, calibrated = route.signal_for(key), True
        mark_below, curve = route.mark_below, route.curve(key)
        p = (curve(route.score(tokens.probs, domain_score, key, tokens.rescored))
             if tokens.probs else curve.y[0])  # fmt: skip
        low = p < route.threshold(key)
    p = min(max(float(p), 0.0), 1.0)
    return {"p": round(p, 4), "low": bool(low), "marks": token_marks(tokens, mark_below),
            "signal": signal, "calibrated": calibrated}  # fmt: skip


def token_marks(tokens: SpanTokens, mark_below: float) -> list[list[int]]:
    """Character ranges of the least sure tokens (under ``mark_below``, at most MAX_MARKS,
    adjacent ones merged), in text order; a token without characters is never marked."""
    unsure = sorted((p, i) for i, p in enumerate(tokens.probs)
                    if p < mark_below and tokens.offsets[i][1] > tokens.offsets[i][0])  # fmt: skip
    picked = sorted(i for _p, i in unsure[:MAX_MARKS])
    marks: list[list[int]] = []
    for i in picked:
        a, b = tokens.offsets[i]
        if marks and marks[-1][1] >= a:
            marks[-1][1] = max(marks[-1][1], b)
        else:
            marks.append([a, b])
    return marks


def locked_texts(canvas: Canvas) -> list[str]:
    """The canvas's locked segments (a template's locked text and a draft's typed values)."""
    return [p.text for p in canvas.pieces if p.hole is None and p.group is None and p.text]


def outcome_confidence(
    canvas: Canvas,
    ids: torch.Tensor,
    probs: torch.Tensor,
    tokenizer: StencilTokenizer,
    *,
    directory: Path,
    route: str,
    rescored: dict[str, dict[str, float]] | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any] | None]:
    """Every request hole's confidence for ``route`` under ``directory``'s calibration, and
    the domain of the canvas's locked text (None when the model ships no profile).
    ``rescored``: each hole's re-read, which a calibration whose signal reads it needs."""
    domain = assess_text(directory, locked_texts(canvas))
    calibrated = route_calibration(directory, route)
    if calibrated is not None and calibrated.rescores and rescored is None:
        raise ValueError(f"the {route} calibration of {directory} reads the span's re-read: pass it")
    score = float(domain["score"]) if domain is not None else 0.0
    tokens = span_tokens(canvas, ids, probs, tokenizer, rescored)
    confidence = {name: hole_confidence(span, calibrated, domain_score=score)
                  for name, span in tokens.items()}  # fmt: skip
    return confidence, domain


def route_calibration(directory: Path, route: str) -> RouteCalibration | None:
    """``route``'s calibration in ``directory``'s ``confidence.json``, or None."""
    calibration = load_calibration(directory)
    return calibration.routes.get(route) if calibration is not None else None


__all__ = [
    "CALIBRATION_FILE",
    "HOLE_CLASSES",
    "RESCORED_SIGNALS",
    "RESCORE_READS",
    "SIGNALS",
    "SIGNAL_NAMES",
    "Calibration",
    "Isotonic",
    "RouteCalibration",
    "SpanTokens",
    "hole_class",
    "hole_confidence",
    "load_calibration",
    "locked_texts",
    "outcome_confidence",
    "route_calibration",
    "span_signal",
    "span_tokens",
    "token_marks",
]
