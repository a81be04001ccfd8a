"""Structural checks of Canvas JSON before a job is queued: field names and types, hole names,
token budgets, constraints, sizes (a canvas with too much text is a 413). The worker checks
the rest against its model."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from drafting.errors import UserError
from drafting.templating import MAX_HOLE_TOKENS, TemplateError, constraint_check
from gpu_worker.engine.outcome import MAX_SEED

CANVAS_KEYS = {"segments", "seed", "sampler", "purpose"}
SEGMENT_TEXT_KEYS = {"text"}
SEGMENT_HOLE_KEYS = {"hole", "max_tokens", "constraint", "hint"}
MAX_PURPOSE_CHARS = 2000  # an instruct model's preamble reads the purpose and the hints
MAX_HINT_CHARS = 500


def canvas_request_check(request: Any) -> dict[str, Any]:
    """Structural checks of Canvas JSON before a job is queued (the worker checks the rest)."""
    if not isinstance(request, dict):
        raise UserError("the canvas must be a JSON object")
    unknown = set(request) - CANVAS_KEYS
    if unknown:
        raise UserError(f"unknown canvas field(s): {', '.join(sorted(unknown))}")
    purpose = request.get("purpose", "")
    if not isinstance(purpose, str) or len(purpose) > MAX_PURPOSE_CHARS:
        raise UserError(f"purpose must be a string of at most {MAX_PURPOSE_CHARS} characters")
    segments = request.get("segments")
    if not isinstance(segments, list) or not segments:
        raise UserError("segments must be a non-empty list")
    names: set[str] = set()
    total_tokens = 0
    text_chars = sum(len(s["text"]) for s in segments if isinstance(s, dict)
                     and isinstance(s.get("text"), str))  # fmt: skip
    if text_chars > settings.STENCIL_MAX_CANVAS_CHARS:
        raise UserError(f"the canvas holds {text_chars:,} characters of text; the limit is "
                        f"{settings.STENCIL_MAX_CANVAS_CHARS:,}", status=413)  # fmt: skip
    for i, segment in enumerate(segments):
        if not isinstance(segment, dict):
            raise UserError(f"segment {i} must be an object")
        if "text" in segment:
            if set(segment) - SEGMENT_TEXT_KEYS or not isinstance(segment["text"], str):
                raise UserError(f"segment {i}: a text segment is {{\"text\": \"...\"}}")
            continue
        if "hole" not in segment:
            raise UserError(f"segment {i} is neither text nor a hole")
        extra = set(segment) - SEGMENT_HOLE_KEYS
        if extra:
            raise UserError(f"segment {i}: unknown field(s) {', '.join(sorted(extra))}")
        hint = segment.get("hint", "")
        if not isinstance(hint, str) or len(hint) > MAX_HINT_CHARS:
            raise UserError(f"segment {i}: hint must be a string of at most {MAX_HINT_CHARS} characters")
        name, max_tokens = segment["hole"], segment.get("max_tokens")
        if not isinstance(name, str) or not name or name in names:
            raise UserError(f"segment {i}: hole names must be unique non-empty strings")
        names.add(name)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not (
            1 <= max_tokens <= MAX_HOLE_TOKENS
        ):
            raise UserError(f"segment {i}: max_tokens must be an integer from 1 to {MAX_HOLE_TOKENS}")
        total_tokens += max_tokens
        constraint = segment.get("constraint") or {}
        if not isinstance(constraint, dict):
            raise UserError(f"segment {i}: constraint must be an object")
        unknown_keys = set(constraint) - {"pattern", "choices", "schema"}
        if unknown_keys:
            raise UserError(
                f"segment {i}: unsupported constraint keyword(s) {', '.join(sorted(unknown_keys))}"
            )
        try:
            constraint_check(constraint, where=f"segment {i} ({name})")
        except TemplateError as exc:
            raise UserError(str(exc)) from exc
    if not names:
        raise UserError("the canvas has no hole to fill")
    if total_tokens > settings.STENCIL_MAX_REQUEST_TOKENS:
        raise UserError(
            f"the holes ask for {total_tokens} tokens; the limit is "
            f"{settings.STENCIL_MAX_REQUEST_TOKENS}"
        )
    seed = request.get("seed")
    if seed is not None and (
        not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED
    ):
        raise UserError(f"seed must be an integer from 0 to {MAX_SEED}")
    if "sampler" in request and not isinstance(request["sampler"], dict):
        raise UserError("sampler must be an object of SamplerConfig overrides")
    return request
