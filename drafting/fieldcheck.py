"""Checking a draft's form values against its template's field declarations (jsonschema),
with one message a person can act on per field.

A field's ``pattern`` must match the whole value, as a browser's ``pattern`` attribute does. It
is matched by the engine's own automaton (time linear in the value's length, whatever the
pattern), never by a backtracking engine, so a pattern such as ``^(a+)+$`` costs microseconds.
"""

from __future__ import annotations

from typing import Any

import jsonschema

from gpu_worker.engine.constraints import pattern_fullmatch


def fields_json_schema(fields: list[dict[str, Any]], *, max_field_length: int) -> dict[str, Any]:
    """The JSON Schema that a draft's field values must satisfy."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    for spec in fields:
        prop: dict[str, Any]
        ftype = spec.get("type", "text")
        if ftype in {"integer", "number"}:
            prop = {"type": ftype}
            for key in ("minimum", "maximum"):
                if spec.get(key) is not None:
                    prop[key] = spec[key]
        else:
            prop = {"type": "string", "maxLength": min(spec.get("max_length") or max_field_length,
                                                       max_field_length)}
            if spec.get("min_length"):
                prop["minLength"] = spec["min_length"]
            if ftype == "choice":
                prop["enum"] = spec["choices"]
            elif ftype == "date":
                prop["format"] = "date"
        if spec.get("required", True):
            required.append(spec["name"])
            if prop.get("type") == "string":
                prop.setdefault("minLength", 1)
        properties[spec["name"]] = prop
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def field_errors(values: dict[str, Any], fields: list[dict[str, Any]], *,
                 max_field_length: int) -> dict[str, str]:
    """Per-field messages (empty when the values are valid)."""
    schema = fields_json_schema(fields, max_field_length=max_field_length)
    labels = {f["name"]: f.get("label") or f["name"] for f in fields}
    types = {f["name"]: f.get("type", "text") for f in fields}
    errors: dict[str, str] = {}
    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    for error in sorted(validator.iter_errors(values), key=lambda e: list(e.path)):
        if error.validator == "required":
            missing = error.message.split("'")[1]
            errors.setdefault(missing, f"{labels.get(missing, missing)} is required.")
            continue
        if error.validator == "additionalProperties":
            errors.setdefault("__all__", "Unknown fields were sent: " + error.message)
            continue
        name = str(error.path[0]) if error.path else "__all__"
        message = _friendly(error, labels.get(name, name))
        if types.get(name) == "date" and error.validator in {"pattern", "format"}:
            message = (f"{labels.get(name, name)} is not a real date: use a calendar date as "
                       "YYYY-MM-DD (e.g. 2025-02-28).")  # fmt: skip
        errors.setdefault(name, message)
    for spec in fields:
        name, value = spec["name"], values.get(spec["name"])
        pattern = field_pattern(spec)
        if name in errors or pattern is None or not isinstance(value, str) or not value:
            continue
        label = labels.get(name, name)
        try:
            matched = pattern_fullmatch(pattern, value)
        except ValueError:  # a template saved before its pattern could be checked
            errors[name] = (f"{label} cannot be checked: the template's pattern for it is not "
                            "supported. Ask the template's author to fix it.")  # fmt: skip
            continue
        if not matched:
            errors[name] = (f"{label} is not a real date: use a calendar date as YYYY-MM-DD "
                            "(e.g. 2025-02-28)." if types.get(name) == "date"
                            else f"{label} does not have the expected format.")  # fmt: skip
    return errors


def field_pattern(spec: dict[str, Any]) -> str | None:
    """The pattern a text field's whole value must match, if any."""
    ftype = spec.get("type", "text")
    if ftype == "date":
        return r"\d{4}-\d{2}-\d{2}"
    if ftype == "email":
        return spec.get("pattern") or r"[^@\s]+@[^@\s]+\.[^@\s]+"
    if ftype in {"integer", "number", "choice"}:
        return None
    return spec.get("pattern") or None


_TYPE_WORDS = {"integer": "a whole number (digits only, e.g. 92000)",
               "number": "a number (digits, e.g. 92000 or 92000.50)", "string": "text"}


def _friendly(error: jsonschema.ValidationError, label: str) -> str:
    limit = error.validator_value
    return {
        "maxLength": f"{label} is too long: at most {limit} characters.",
        "minLength": f"{label} is required." if limit == 1 else f"{label} needs at least {limit} characters.",
        "pattern": f"{label} does not have the expected format.",
        "enum": f"{label} must be one of: {', '.join(map(str, limit)) if isinstance(limit, list) else limit}.",
        "type": f"{label} must be {_TYPE_WORDS.get(str(limit), limit)}.",
        "minimum": f"{label} must be at least {limit}.",
        "maximum": f"{label} must be at most {limit}.",
    }.get(str(error.validator), f"{label}: {error.message}")
