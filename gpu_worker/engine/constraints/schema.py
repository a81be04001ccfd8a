"""JSON Schema skeletons: keys and punctuation become locked text, values typed holes.

string / integer / number values are pattern holes, boolean / enum values choices.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from gpu_worker.engine.constraints.regex import (
    CharAutomaton,
    check_pattern,
    parse_pattern,
    pattern_fullmatch,
)
from gpu_worker.engine.constraints.tokens import (
    ChoiceConstraint,
    PatternConstraint,
    TokenTable,
    build_choices,
    pattern_constraint,
    token_table,
)

# -- JSON Schema skeletons ------------------------------------------------------------------------
JSON_STRING_BODY = '[^"\\\\\\x00-\\x1f]'  # one character a JSON string may hold unescaped
JSON_INTEGER = "-?(0|[1-9][0-9]*)"
JSON_NUMBER = "-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?"
DEFAULT_VALUE_TOKENS = {"string": 16, "integer": 6, "number": 10}
_INTEGER_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_ANNOTATIONS = {"title", "description", "$schema", "$id", "examples", "default", "$comment"}
_SUPPORTED_KEYS = {
    "object": {"type", "properties", "required", "additionalProperties"},
    "string": {"type", "minLength", "maxLength", "enum", "const"},
    "integer": {"type", "enum", "const", *_INTEGER_BOUNDS},
    "number": {"type", "enum", "const"},
    "boolean": {"type", "enum", "const"},
    "null": {"type"},
}


@dataclass(frozen=True)
class SkeletonText:
    text: str


@dataclass(frozen=True)
class SkeletonValue:
    path: str  # e.g. "address.city": the sub-hole is named "<hole>.<path>"
    constraint: dict[str, Any]  # {"pattern": ...} or {"choices": [...]}
    max_tokens: int


SkeletonPiece = SkeletonText | SkeletonValue


def schema_skeleton(
    schema: Any, *, hole: str, max_tokens: int | None = None
) -> list[SkeletonPiece]:
    """Locked keys and punctuation plus typed value holes for a JSON Schema.

    The hole's text is one JSON value. An object writes every property (in the schema's
    order), compactly: ``{"a":1,"b":"x"}``; a scalar schema is a single typed value.
    ``max_tokens`` caps each value hole (defaults per type otherwise).
    """
    import jsonschema

    if not isinstance(schema, dict):
        raise ValueError(f"hole {hole!r}: schema must be a JSON object, got {schema!r}")
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"hole {hole!r}: invalid JSON Schema: {exc.message}") from None
    pieces: list[SkeletonPiece] = []
    _skeleton(schema, "", hole, max_tokens, pieces)
    merged: list[SkeletonPiece] = []
    for piece in pieces:  # join adjacent locked texts
        if merged and isinstance(piece, SkeletonText) and isinstance(merged[-1], SkeletonText):
            merged[-1] = SkeletonText(merged[-1].text + piece.text)
        else:
            merged.append(piece)
    return merged


def _skeleton(
    schema: dict[str, Any], path: str, hole: str, cap: int | None, out: list[SkeletonPiece]
) -> None:
    where = f"hole {hole!r}, schema at {path or '<root>'!r}"
    kind = schema.get("type")
    if "enum" in schema or "const" in schema:
        values = schema["enum"] if "enum" in schema else [schema["const"]]
        texts = [json.dumps(v, separators=(",", ":")) for v in values]
        if len(texts) == 1:
            out.append(SkeletonText(texts[0]))
        else:
            out.append(SkeletonValue(path, {"choices": texts}, 0))
        return
    if not isinstance(kind, str) or kind not in _SUPPORTED_KEYS:
        raise ValueError(f"{where}: type {kind!r} is not supported (object, string, integer, "
                         "number, boolean, null, enum)")  # fmt: skip
    unsupported = sorted(set(schema) - _SUPPORTED_KEYS[kind] - _ANNOTATIONS)
    if unsupported:
        raise ValueError(f"{where}: keyword(s) {unsupported} are not supported for {kind}")
    if kind == "object":
        properties = schema.get("properties", {})
        if not properties:
            raise ValueError(f"{where}: an object needs at least one property")
        out.append(SkeletonText("{"))
        for i, (key, sub) in enumerate(properties.items()):
            out.append(SkeletonText(("," if i else "") + json.dumps(key) + ":"))
            _skeleton(sub, f"{path}.{key}" if path else key, hole, cap, out)
        out.append(SkeletonText("}"))
    elif kind == "boolean":
        out.append(SkeletonValue(path, {"choices": ["true", "false"]}, 0))
    elif kind == "null":
        out.append(SkeletonText("null"))
    elif kind == "string":
        low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
        bounds = f"{{{low},{int(high)}}}" if high is not None else f"{{{low},}}"
        tokens = cap or DEFAULT_VALUE_TOKENS["string"]
        out.append(SkeletonText('"'))
        out.append(SkeletonValue(path, {"pattern": JSON_STRING_BODY + bounds}, tokens))
        out.append(SkeletonText('"'))
    else:
        pattern = integer_schema_pattern(schema) if kind == "integer" else JSON_NUMBER
        limits = [schema[k] for k in _INTEGER_BOUNDS if k in schema]
        widest = max((len(str(abs(int(v)))) + 1 for v in limits), default=0)  # sign + digits
        tokens = cap or max(DEFAULT_VALUE_TOKENS[kind], widest)
        out.append(SkeletonValue(path, {"pattern": pattern}, tokens))


def integer_schema_pattern(schema: dict[str, Any]) -> str:
    """The regular expression of the JSON integers an integer schema's minimum / maximum
    (and their exclusive forms) allow; JSON_INTEGER when it has no bound."""
    low = high = None
    if "minimum" in schema:
        low = math.ceil(schema["minimum"])
    if "exclusiveMinimum" in schema:
        bound = math.floor(schema["exclusiveMinimum"]) + 1
        low = bound if low is None else max(low, bound)
    if "maximum" in schema:
        high = math.floor(schema["maximum"])
    if "exclusiveMaximum" in schema:
        bound = math.ceil(schema["exclusiveMaximum"]) - 1
        high = bound if high is None else min(high, bound)
    if low is None and high is None:
        return JSON_INTEGER
    if low is not None and high is not None and low > high:
        raise ValueError(f"integer schema {schema!r} allows no value")
    return integer_range_pattern(low, high)


def integer_range_pattern(low: int | None, high: int | None) -> str:
    """A regular expression matching exactly the integers low..high written as JSON writes
    them (no leading zeros, "-" for negatives, never "-0"); a None bound is open."""
    parts: list[str] = []
    if low is None or low < 0:  # negatives: "-" then a magnitude
        smallest = 1 if high is None or high >= 0 else -high
        magnitudes = _magnitudes(smallest, None if low is None else -low)
        parts += ["-" + m for m in magnitudes]
    if high is None or high >= 0:
        parts += _magnitudes(max(0, low if low is not None else 0), high)
    return "(" + "|".join(parts) + ")"


def _magnitudes(low: int, high: int | None) -> list[str]:
    """Patterns of the naturals low..high (high None: no upper bound), no leading zeros."""
    if high is None:
        digits = len(str(low))
        return [*_natural_range(low, 10**digits - 1), f"[1-9][0-9]{{{digits},}}"]
    return _natural_range(low, high)


def _natural_range(low: int, high: int) -> list[str]:
    """Patterns, one per run of equal-length numbers, covering low..high (0 <= low)."""
    if low > high:
        return []
    a, b = str(low), str(high)
    if len(a) < len(b):
        return _natural_range(low, 10 ** len(a) - 1) + _natural_range(10 ** len(a), high)
    i = next((k for k in range(len(a)) if a[k] != b[k]), len(a))
    if i == len(a):
        return [a]
    rest = len(a) - i - 1
    prefix, tail = a[:i], "[0-9]" * rest
    if a[i + 1 :] == "0" * rest and b[i + 1 :] == "9" * rest:  # a whole digit class
        return [prefix + _digit_class(a[i], b[i]) + tail]
    parts = _natural_range(low, int(prefix + a[i] + "9" * rest))
    if int(b[i]) - int(a[i]) > 1:
        parts.append(prefix + _digit_class(str(int(a[i]) + 1), str(int(b[i]) - 1)) + tail)
    return parts + _natural_range(int(prefix + b[i] + "0" * rest), high)


def _digit_class(first: str, last: str) -> str:
    return first if first == last else f"[{first}-{last}]"


__all__ = [
    "CharAutomaton",
    "ChoiceConstraint",
    "PatternConstraint",
    "SkeletonText",
    "SkeletonValue",
    "TokenTable",
    "build_choices",
    "check_pattern",
    "integer_range_pattern",
    "integer_schema_pattern",
    "parse_pattern",
    "pattern_constraint",
    "pattern_fullmatch",
    "schema_skeleton",
    "token_table",
]
