"""Validation of a filled canvas: a list of named violations (data, never exceptions).

Checks: locked positions and locked text byte-identical; no mask token left; no special token
inside a hole's text; each hole within its max length; a free hole not empty; each hole's
constraint (pattern by the engine's own linear-time automaton, the same full-match semantics
as ``re.fullmatch`` with ``re.ASCII`` on the supported subset; choices; JSON Schema by
``jsonschema``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import torch

from gpu_worker.engine.canvas import Canvas
from gpu_worker.engine.constraints import pattern_fullmatch
from gpu_worker.engine.tokenizer import StencilTokenizer

LOCKED_CHANGED = "locked_changed"
LOCKED_TEXT_CHANGED = "locked_text_changed"
MASK_LEFT = "mask_left"
SPECIAL_IN_HOLE = "special_token_in_hole"
TOO_LONG = "hole_too_long"
PATTERN_MISMATCH = "pattern_mismatch"
CHOICE_MISMATCH = "choice_mismatch"
SCHEMA_INVALID = "schema_invalid"
EMPTY_HOLE = "empty_hole"


@dataclass(frozen=True)
class Violation:
    name: str  # one of the constants above
    hole: str  # the request hole it concerns, "" for the whole canvas
    message: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def validate(
    canvas: Canvas,
    ids: torch.Tensor,
    tokenizer: StencilTokenizer,
    *,
    hole_texts: dict[str, str] | None = None,
    document: str | None = None,
) -> list[Violation]:
    """Every way ``ids`` (the final [L] canvas) breaks the canvas's promises; [] when none.

    ``hole_texts`` / ``document`` default to what the canvas decodes from ``ids``; pass the
    texts a route produced (the AR route does) to check those instead.
    """
    ids = ids.detach().cpu()
    if ids.shape != canvas.ids.shape:
        raise ValueError(f"ids has shape {tuple(ids.shape)}, the canvas {tuple(canvas.ids.shape)}")
    texts = canvas.hole_texts(ids, tokenizer) if hole_texts is None else hole_texts
    violations = _check_locked(canvas, ids, tokenizer, texts, document)
    violations += _check_tokens(canvas, ids, tokenizer)
    for name, spec in canvas.groups.items():
        violations += _check_hole(name, spec, texts.get(name, ""))
    return violations


def _check_locked(
    canvas: Canvas,
    ids: torch.Tensor,
    tokenizer: StencilTokenizer,
    texts: dict[str, str],
    document: str | None,
) -> list[Violation]:
    out: list[Violation] = []
    changed = (ids != canvas.ids) & canvas.protect
    if bool(changed.any()):
        positions = changed.nonzero().squeeze(-1).tolist()
        out.append(Violation(LOCKED_CHANGED, "", f"locked positions changed: {positions}"))
    if document is None:
        document = canvas.document(ids, tokenizer)
    expected = _expected_document(canvas, ids, tokenizer, texts)
    if document != expected:
        out.append(
            Violation(LOCKED_TEXT_CHANGED, "", "the document's locked text is not byte-identical")
        )
    return out


def _expected_document(
    canvas: Canvas, ids: torch.Tensor, tokenizer: StencilTokenizer, texts: dict[str, str]
) -> str:
    """Locked texts in order with each request hole's text where it first appears."""
    spans = canvas.span_texts(ids, tokenizer)
    parts: list[str] = []
    emitted: set[str] = set()
    for piece in canvas.pieces:
        if piece.group is None:
            assert piece.text is not None
            parts.append(piece.text)
        elif piece.group in texts:
            if piece.group not in emitted:
                parts.append(texts[piece.group])
                emitted.add(piece.group)
        else:
            parts.append(piece.render(spans))
    return "".join(parts)


def _check_tokens(
    canvas: Canvas, ids: torch.Tensor, tokenizer: StencilTokenizer
) -> list[Violation]:
    out: list[Violation] = []
    if bool((ids == canvas.mask_id).any()):
        count = int((ids == canvas.mask_id).sum())
        out.append(Violation(MASK_LEFT, "", f"{count} mask token(s) left in the canvas"))
    for hole in canvas.holes:
        kept = canvas.kept_tokens(ids, hole)
        specials = sorted({t for t in kept if tokenizer.is_special(t) and t != canvas.mask_id})
        if specials:
            out.append(Violation(SPECIAL_IN_HOLE, hole.group,
                                 f"span {hole.name!r} holds special token ids {specials}"))  # fmt: skip
        if len(kept) > hole.max_len:
            out.append(Violation(TOO_LONG, hole.group,
                                 f"span {hole.name!r} has {len(kept)} > {hole.max_len} tokens"))  # fmt: skip
    return out


def _check_hole(name: str, spec: dict[str, Any], text: str) -> list[Violation]:
    constraint = spec.get("constraint") or {}
    if not constraint and text == "":
        return [Violation(EMPTY_HOLE, name, "the model wrote nothing here")]
    if "pattern" in constraint:
        pattern = constraint["pattern"]
        if not pattern_fullmatch(pattern, text):
            return [Violation(PATTERN_MISMATCH, name, f"{text!r} does not match {pattern!r}")]
    if "choices" in constraint and text not in constraint["choices"]:
        return [Violation(CHOICE_MISMATCH, name, f"{text!r} is not one of the choices")]
    if "schema" in constraint:
        return _check_schema(name, constraint["schema"], text)
    return []


def _check_schema(name: str, schema: dict[str, Any], text: str) -> list[Violation]:
    import jsonschema

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return [Violation(SCHEMA_INVALID, name, f"not valid JSON: {exc}")]
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(value), key=str)
    return [Violation(SCHEMA_INVALID, name, error.message) for error in errors]


__all__ = ["Violation", "validate"]
