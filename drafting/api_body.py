"""Reading a JSON API request body: size, syntax, nesting and the characters text may hold.

Everything here refuses with :class:`BadRequest` (a 400 naming what to send instead) before
anything is written.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest

MAX_BODY_BYTES = 1_000_000  # 1 MB: larger request bodies are refused before they are read


class BadRequest(Exception):
    """A request the API cannot read: the message says what to send instead."""

    def __init__(self, message: str, *, errors: dict[str, str] | None = None,
                 status: int = 400) -> None:  # fmt: skip
        super().__init__(message)
        self.errors = errors or {}
        self.status = status  # 400, or 413 for a body too large to read


def json_body(
    request: HttpRequest, *, allowed: Collection[str], required: Collection[str] = ()
) -> dict[str, Any]:
    """The request's JSON object, refusing big bodies, non-objects and unknown fields."""
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError as exc:
        raise BadRequest("the Content-Length header is not a number") from exc
    if length > MAX_BODY_BYTES:
        raise BadRequest(f"the request body is larger than {MAX_BODY_BYTES} bytes", status=413)
    try:
        raw = request.body
    except RequestDataTooBig as exc:
        raise BadRequest(f"the request body is larger than {MAX_BODY_BYTES} bytes", status=413) from exc
    if len(raw) > MAX_BODY_BYTES:
        raise BadRequest(f"the request body is larger than {MAX_BODY_BYTES} bytes", status=413)
    if not raw.strip():
        data: Any = {}
    else:
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise BadRequest(f"the body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    problem = json_text_problem(data)
    if problem is not None:
        raise BadRequest(problem)
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise BadRequest(
            f"unknown field(s): {', '.join(unknown)}",
            errors={name: "not a field of this request" for name in unknown},
        )
    missing = sorted(set(required) - set(data))
    if missing:
        raise BadRequest(
            f"missing field(s): {', '.join(missing)}",
            errors={name: "this field is required" for name in missing},
        )
    return data


MAX_JSON_DEPTH = 32  # the deepest nesting a request may have (Canvas JSON needs about 6)
_NONCHARACTERS = frozenset(range(0xFDD0, 0xFDF0)) | {
    plane + end for plane in range(0, 0x110000, 0x10000) for end in (0xFFFE, 0xFFFF)
}


def _bad_char(text: str) -> str | None:
    for ch in text:
        code = ord(ch)
        if code == 0:  # PostgreSQL cannot store U+0000 in text or jsonb
            return "text may not contain NUL (U+0000) characters"
        if 0xD800 <= code <= 0xDFFF:
            return f"text may not contain a lone surrogate (U+{code:04X})"
        if code in _NONCHARACTERS:
            return f"text may not contain the noncharacter U+{code:04X}"
    return None


def json_text_problem(value: Any) -> str | None:
    """Why a parsed JSON value cannot be stored as text, or None: nesting deeper than
    MAX_JSON_DEPTH, NUL, a lone surrogate or a noncharacter in any key or string. Walks with
    an explicit stack, so no input can exhaust the interpreter's recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            problem = _bad_char(item)
            if problem is not None:
                return problem
        elif isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                return f"the JSON is nested deeper than {MAX_JSON_DEPTH} levels"
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return None
