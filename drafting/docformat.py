"""Where a slot stands in its document, how a value is written there, and whether a whole
document is valid for its format.

A template version has a document format: ``text`` (a letter), ``markdown`` or ``json``. Each
field or infill slot gets a *context* from the locked text around it:

* ``text``: written as typed (a date or number in its display format);
* ``markdown``: Markdown's special characters are backslash-escaped;
* ``json_string``: inside a JSON string literal: escaped as JSON string content;
* ``json_value``: a bare JSON value: a number as a number, anything else as a quoted string.

A JSON template's locked skeleton must parse as JSON once every slot stands in for a value;
the document schema (keys, constants, each slot's type) is derived from that skeleton, and a
draft's document is parsed and validated against it before it can be accepted.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import jsonschema

DOC_FORMATS = ("text", "markdown", "json")
CONTEXT_TEXT, CONTEXT_MARKDOWN = "text", "markdown"
CONTEXT_JSON_STRING, CONTEXT_JSON_VALUE = "json_string", "json_value"
DATE_FORMATS = ("iso", "long", "us")  # 2026-12-06 | 6 December 2026 | December 6, 2026
NUMBER_FORMATS = ("plain", "grouped", "money")  # 92000 | 92,000 | 92,000.00
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December")  # fmt: skip
# Model text inside a JSON string: no quote, no backslash, no control character.
JSON_STRING_PATTERN = r'[^"\\\x00-\x1f]*'
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]<>()#+\-.!|~])")
_SLOT_STRING = "\ue002{}\ue003"  # a slot inside a JSON string literal, in the skeleton
_SLOT_VALUE = "\ue004{}\ue003"  # a slot standing for a whole JSON value, quoted in the skeleton
_SLOT_RE = re.compile("([\ue002\ue004])(\\d+)\ue003")


@dataclass(frozen=True)
class Violation:
    """One reason a document cannot be accepted; line and column are 1-based (0 = unknown)."""

    message: str
    line: int = 0
    column: int = 0
    where: str = ""  # a slot's name, or "" for the whole document

    def to_json(self) -> dict[str, Any]:
        return {"message": self.message, "line": self.line, "column": self.column,
                "where": self.where}  # fmt: skip

    def __str__(self) -> str:
        at = f"line {self.line}, column {self.column}: " if self.line else ""
        return f"{at}{self.message}"


# -- contexts -------------------------------------------------------------------------------
def slot_contexts(pieces: list[tuple[str, str]], doc_format: str) -> list[str]:
    """The context of each piece (``kind``, ``text``) in order; text pieces get ``""``."""
    if doc_format not in DOC_FORMATS:
        raise ValueError(f"doc_format must be one of {DOC_FORMATS}, got {doc_format!r}")
    contexts: list[str] = []
    in_string = escaped = False
    for kind, text in pieces:
        if kind == "text":
            contexts.append("")
            if doc_format == "json":
                in_string, escaped = _scan_json(text, in_string, escaped)
        elif doc_format == "json":
            contexts.append(CONTEXT_JSON_STRING if in_string else CONTEXT_JSON_VALUE)
        else:
            contexts.append(CONTEXT_MARKDOWN if doc_format == "markdown" else CONTEXT_TEXT)
    return contexts


def _scan_json(text: str, in_string: bool, escaped: bool) -> tuple[bool, bool]:
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
    return in_string, escaped


# -- display formats and escaping -------------------------------------------------------------
def display_value(value: Any, spec: dict[str, Any], *, doc_format: str) -> str:
    """A field's value as a person reads it in the document (before escaping)."""
    if value is None or value == "":
        return ""
    ftype = spec.get("type", "text")
    fmt = spec.get("format")
    if ftype == "date" and isinstance(value, str):
        default = "iso" if doc_format == "json" else "long"
        return date_display(value, fmt or default)
    if ftype in {"integer", "number"} and isinstance(value, int | float):
        return number_display(value, fmt or "plain")
    return str(value)


def date_display(iso: str, fmt: str) -> str:
    try:
        day = dt.date.fromisoformat(iso)
    except ValueError:
        return iso  # not a date: shown as typed (the field check refuses it elsewhere)
    if fmt == "long":
        return f"{day.day} {MONTHS[day.month - 1]} {day.year}"
    if fmt == "us":
        return f"{MONTHS[day.month - 1]} {day.day}, {day.year}"
    return day.isoformat()


def number_display(value: float, fmt: str) -> str:
    if fmt == "money":
        return f"{value:,.2f}"
    if fmt == "grouped":
        return _grouped(value)
    return str(value)


def _grouped(value: float) -> str:
    if isinstance(value, int):
        return f"{value:,}"
    if float(value).is_integer():
        return f"{int(value):,}"
    whole, _, frac = repr(float(value)).partition(".")
    return f"{int(whole):,}.{frac}"


_GROUPED_NUMBER = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?")
_CURRENCY_SIGNS = "$€£¥"
_DAY_MONTH_YEAR = re.compile(r"(\d{1,2})(?:st|nd|rd|th)? ([A-Za-z]+),? (\d{4})")
_MONTH_DAY_YEAR = re.compile(r"([A-Za-z]+) (\d{1,2})(?:st|nd|rd|th)?,? (\d{4})")


def parse_number_text(text: str) -> str:
    """A typed number without a leading currency sign or thousands commas ("$92,000" ->
    "92000"); anything else comes back as typed, for the field check to refuse."""
    stripped = text.strip()
    bare = stripped[1:].strip() if stripped[:1] in _CURRENCY_SIGNS else stripped
    if _GROUPED_NUMBER.fullmatch(bare):
        return bare.replace(",", "")
    return bare


def parse_date_text(text: str) -> str:
    """A typed date as YYYY-MM-DD when it is one ("2 May 2025", "May 2, 2025" too); anything
    else comes back as typed, for the field check to refuse (a real calendar date only)."""
    stripped = " ".join(text.split())
    for regex, order in ((_DAY_MONTH_YEAR, "dmy"), (_MONTH_DAY_YEAR, "mdy")):
        match = regex.fullmatch(stripped)
        if match is None:
            continue
        parts = dict(zip(order, match.groups(), strict=True))
        month = _month_number(parts["m"])
        if month:
            try:
                return dt.date(int(parts["y"]), month, int(parts["d"])).isoformat()
            except ValueError:
                return stripped
    return stripped


def _month_number(name: str) -> int:
    name = name.lower()
    for number, month in enumerate(MONTHS, start=1):
        if len(name) >= 3 and month.lower().startswith(name):
            return number
    return 0


def escape_for(text: str, context: str, *, numeric: bool = False) -> str:
    """``text`` written where it stands. ``numeric``: a number field's display (bare in JSON)."""
    if context == CONTEXT_JSON_STRING:
        return json.dumps(text, ensure_ascii=False)[1:-1]
    if context == CONTEXT_JSON_VALUE:
        if numeric and _is_json_number(text):
            return text
        return json.dumps(text, ensure_ascii=False)
    if context == CONTEXT_MARKDOWN:
        return markdown_escape(text)
    return text


def escape_edit(text: str, context: str) -> str:
    """A person's hand edit of model text, written for its place: a bare JSON value that is
    already JSON stays as typed, anything else becomes a JSON string."""
    if context == CONTEXT_JSON_VALUE:
        try:
            json.loads(text)
        except ValueError:
            return json.dumps(text, ensure_ascii=False)
        return text
    return escape_for(text, context)


def _is_json_number(text: str) -> bool:
    return re.fullmatch(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?", text) is not None


def markdown_escape(text: str) -> str:
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text)


def field_text(value: Any, spec: dict[str, Any], *, context: str, doc_format: str) -> str:
    """What a field's fragment holds: its display value, escaped for its context."""
    shown = display_value(value, spec, doc_format=doc_format)
    numeric = spec.get("type") in {"integer", "number"} and not spec.get("format")
    return escape_for(shown, context, numeric=numeric)


def unescape_for(text: str, context: str) -> str:
    """The plain value a person edits, from a fragment's (escaped) text."""
    if context == CONTEXT_JSON_STRING:
        try:
            value = json.loads(f'"{text}"')
        except ValueError:
            return text
        return value if isinstance(value, str) else text
    return text


# -- the JSON skeleton and its schema ---------------------------------------------------------
def json_skeleton(pieces: list[tuple[str, str]], contexts: list[str]) -> str:
    """The locked text with each slot standing in as a string (parseable when well formed)."""
    out: list[str] = []
    for index, ((kind, text), context) in enumerate(zip(pieces, contexts, strict=True)):
        if kind == "text":
            out.append(text)
        elif context == CONTEXT_JSON_STRING:
            out.append(_SLOT_STRING.format(index))
        else:
            out.append('"' + _SLOT_VALUE.format(index) + '"')
    return "".join(out)


def json_skeleton_error(skeleton: str) -> Violation | None:
    try:
        json.loads(skeleton)
    except json.JSONDecodeError as exc:
        return Violation(f"the locked JSON is not valid: {exc.msg}", exc.lineno, exc.colno)
    return None


def document_schema(pieces: list[tuple[str, str]], contexts: list[str],
                    specs: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """The JSON Schema a JSON document must satisfy; ``specs[i]`` is piece i's declaration
    (a field spec with "type", or a hole spec with "constraint"; {} for text)."""
    skeleton = json.loads(json_skeleton(pieces, contexts))
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            **_schema_of(skeleton, specs)}  # fmt: skip


def _schema_of(node: Any, specs: list[dict[str, Any]]) -> dict[str, Any]:
    if isinstance(node, dict):
        return {
            "type": "object",
            "properties": {key: _schema_of(value, specs) for key, value in node.items()},
            "required": list(node),
            "additionalProperties": False,
        }
    if isinstance(node, list):
        return {"type": "array", "prefixItems": [_schema_of(v, specs) for v in node],
                "items": False, "minItems": len(node)}  # fmt: skip
    if isinstance(node, str):
        slots = list(_SLOT_RE.finditer(node))
        if not slots:
            return {"const": node}
        if len(slots) == 1 and slots[0].group(0) == node:
            spec = specs[int(slots[0].group(2))]
            if slots[0].group(1) == "\ue004":
                return _value_slot_schema(spec)
            return _string_slot_schema(spec)
        return {"type": "string"}
    return {"const": node}


def _value_slot_schema(spec: dict[str, Any]) -> dict[str, Any]:
    if "constraint" in spec:  # an infill standing for a whole value
        return dict(spec["constraint"].get("schema") or {})
    ftype = spec.get("type", "text")
    if ftype in {"integer", "number"} and not spec.get("format"):
        schema: dict[str, Any] = {"type": ftype}
        for key in ("minimum", "maximum"):
            if spec.get(key) is not None:
                schema[key] = spec[key]
        return schema
    return _string_slot_schema(spec)


def _string_slot_schema(spec: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    constraint = spec.get("constraint") or {}
    if "choices" in constraint:
        schema["enum"] = list(constraint["choices"])
    elif "pattern" in constraint:
        schema["pattern"] = f"^(?:{constraint['pattern']})$"
    elif spec.get("type") == "choice" and spec.get("choices"):
        schema["enum"] = list(spec["choices"])
    elif spec.get("type") == "date" and spec.get("format") in (None, "iso"):
        schema["format"] = "date"
    return schema


def json_document_violations(text: str, schema: dict[str, Any]) -> list[Violation]:
    """Parse ``text`` as JSON and validate it against ``schema``: the named problems."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        return [Violation(f"the document is not valid JSON: {exc.msg}", exc.lineno, exc.colno)]
    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    violations: list[Violation] = []
    for error in sorted(validator.iter_errors(document), key=lambda e: list(map(str, e.path))):
        where = "/".join(str(p) for p in error.path)
        violations.append(Violation(f"{where or 'the record'}: {error.message}", where=where))
    return violations


# -- typed values ------------------------------------------------------------------------------
def values_clean(fields: list[dict[str, Any]], values: dict[str, Any]) -> dict[str, Any]:
    """Form values as stored: numbers as numbers, dates as YYYY-MM-DD when they are dates,
    text trimmed, empty optional values dropped. What cannot be read stays as typed, for the
    field check to name."""
    declared = {f["name"]: f for f in fields}
    cleaned: dict[str, Any] = {}
    for name, value in values.items():
        spec = declared.get(name)
        if spec is None:
            cleaned[name] = value  # reported by the schema as an unknown field
            continue
        if spec.get("type") in {"integer", "number"} and isinstance(value, str):
            text = parse_number_text(value)
            cleaned[name] = _number_or_text(text, integer=spec["type"] == "integer")
            if text == "" and not spec.get("required", True):
                cleaned.pop(name)
        elif isinstance(value, str):
            if value.strip() == "" and not spec.get("required", True):
                continue
            if spec.get("type") == "date":
                cleaned[name] = parse_date_text(value)
            else:
                cleaned[name] = value.strip() if spec.get("type") != "textarea" else value
        else:
            cleaned[name] = value
    return cleaned


def _number_or_text(text: str, *, integer: bool) -> int | float | str:
    """The typed number, or the text itself (which the field check reports as not a number)."""
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    if integer or not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", text):
        return text
    number = float(text)
    return number if math.isfinite(number) else text
