"""What the model knows it does not know, as the pages show it.

A job's result may carry, per hole, the worker's confidence in the text it wrote
(``{"p", "low", "marks", "signal", "calibrated"}``), a domain score for the template, and
``needs_person`` (every route's text was low-confidence). Jobs written before the worker
measured any of this have none of these keys: everything here reads them defensively, and a
span without a measurement says "confidence not measured" rather than looking confident.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# At or above this calibrated probability a span (not flagged low) reads "Confident"; between
# the worker's low flag and this, the page asks for a close read.
CONFIDENT_P = 0.8
SIGNAL_WORDS = {  # the worker's signal names, as a person reads them
    "mean_logp": "the model's own token probabilities",
    "min_logp": "the model's least likely token",
    "agreement": "agreement between the two models",
}
MAX_MARKS = 64  # more marked stretches than this in one span is noise: keep the first ones

LOW_WORDS = "Low confidence: likely a guess — check or rewrite"
DOUBT_WORDS = "Some doubt: read it closely"
CONFIDENT_WORDS = "Confident"
UNMEASURED_WORDS = "Confidence not measured"
DOMAIN_WARNING = ("The model was not trained on documents like this; its text will need "
                  "rewriting.")  # fmt: skip


def _number(raw: Any) -> float | None:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return None
    value = float(raw)
    return value if math.isfinite(value) else None


def marks_clean(raw: Any, length: int) -> list[list[int]]:
    """Sorted, merged [start, end) stretches inside a text of ``length`` characters."""
    if not isinstance(raw, list):
        return []
    spans: list[tuple[int, int]] = []
    for item in raw[:MAX_MARKS]:
        if not (isinstance(item, list | tuple) and len(item) == 2):
            continue
        start, end = item
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end)):
            continue
        start, end = max(0, start), min(length, end)
        if start < end:
            spans.append((start, end))
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def span_confidence_clean(raw: Any, text: str) -> dict[str, Any]:
    """One hole's confidence from a job result, checked; {} when it is missing or malformed."""
    if not isinstance(raw, dict):
        return {}
    p = _number(raw.get("p"))
    if p is None:
        return {}
    p = min(1.0, max(0.0, p))
    return {
        "p": p,
        "low": raw.get("low") is True,
        "marks": marks_clean(raw.get("marks"), len(text)),
        "signal": str(raw.get("signal") or "")[:80],
        "calibrated": raw.get("calibrated") is True,
    }


@dataclass(frozen=True)
class ConfidenceView:
    """A span's confidence in words (never colour alone) and the class that colours it."""

    level: str  # low | doubt | confident | unmeasured
    words: str
    detail: str  # the number behind the words, and what measured it

    @property
    def low(self) -> bool:
        return self.level == "low"


def confidence_view(confidence: dict[str, Any]) -> ConfidenceView:
    p = _number(confidence.get("p")) if confidence else None
    if p is None:
        return ConfidenceView("unmeasured", UNMEASURED_WORDS,
                              "This text was written before Stencil measured confidence.")  # fmt: skip
    if confidence.get("calibrated"):
        detail = f"About {round(100 * p)}% likely to be right"
    else:
        detail = f"Score {p:.2f} (not calibrated to a probability)"
    if confidence.get("signal"):
        signal = str(confidence["signal"])
        detail += f"; measured by {SIGNAL_WORDS.get(signal, signal)}"
    if confidence.get("low"):
        return ConfidenceView("low", LOW_WORDS, detail + ".")
    if p >= CONFIDENT_P:
        return ConfidenceView("confident", CONFIDENT_WORDS, detail + ".")
    return ConfidenceView("doubt", DOUBT_WORDS, detail + ".")


def marked_segments(text: str, marks: list[list[int]]) -> list[tuple[str, bool]]:
    """``text`` cut at the marks: (piece, marked) pairs whose pieces join back to ``text``."""
    pieces: list[tuple[str, bool]] = []
    at = 0
    for start, end in marks_clean(marks, len(text)):
        if start > at:
            pieces.append((text[at:start], False))
        pieces.append((text[start:end], True))
        at = end
    if at < len(text):
        pieces.append((text[at:], False))
    return pieces


# -- job and template level -------------------------------------------------------------------
def result_needs_person(result: Any) -> bool:
    return isinstance(result, dict) and result.get("needs_person") is True


def domain_clean(raw: Any) -> dict[str, Any] | None:
    """A domain score ``{"score", "unfamiliar", "threshold"}``, or None when not measured."""
    if not isinstance(raw, dict) or not isinstance(raw.get("unfamiliar"), bool):
        return None
    return {"score": _number(raw.get("score")), "unfamiliar": raw["unfamiliar"],
            "threshold": _number(raw.get("threshold"))}  # fmt: skip


def result_domain(result: Any) -> dict[str, Any] | None:
    return domain_clean(result.get("domain")) if isinstance(result, dict) else None


def version_domain(version: Any) -> dict[str, Any] | None:
    """The domain score of a template version's locked text
    (:func:`drafting.authoring.template_version_domain`); None where the model ships no domain
    profile, or the version no longer parses."""
    from drafting import authoring
    from drafting.templating import TemplateError

    try:
        return domain_clean(authoring.template_version_domain(version=version))
    except (TemplateError, ValueError, OSError):  # a version that no longer parses: no score
        return None
