"""The web form generated from a template version's field declarations.

Validation is not here: the values go to ``services.draft_values_check`` (jsonschema), and its
per-field messages come back into these widgets with the person's own values, so nothing typed
is lost on an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.http import QueryDict

INPUT_TYPES = {
    "text": "text",
    "date": "date",
    "integer": "number",
    "number": "number",
    "email": "email",
}


@dataclass(frozen=True)
class FormField:
    """One input of the generated form, ready for the template to render."""

    name: str
    label: str
    widget: str  # "input" | "textarea" | "select"
    input_type: str  # the <input type=...> for widget "input"
    value: str
    error: str
    help: str
    required: bool
    max_length: int | None
    choices: list[str]
    step: str  # "1" for integers, "any" for numbers, "" otherwise
    minimum: float | None
    maximum: float | None

    @property
    def input_id(self) -> str:
        return f"field-{self.name}"


def form_fields(
    specs: list[dict[str, Any]], values: dict[str, Any], errors: dict[str, str]
) -> list[FormField]:
    fields: list[FormField] = []
    for spec in specs:
        ftype = spec.get("type", "text")
        value = values.get(spec["name"], spec.get("default") or "")
        max_length = spec.get("max_length") or settings.STENCIL_MAX_FIELD_LENGTH
        fields.append(
            FormField(
                name=spec["name"],
                label=spec.get("label") or spec["name"],
                widget="textarea" if ftype == "textarea" else (
                    "select" if ftype == "choice" else "input"),
                input_type=INPUT_TYPES.get(ftype, "text"),
                value="" if value is None else str(value),
                error=errors.get(spec["name"], ""),
                help=spec.get("help", ""),
                required=bool(spec.get("required", True)),
                max_length=None if ftype in {"integer", "number", "date"} else int(max_length),
                choices=list(spec.get("choices") or []),
                step={"integer": "1", "number": "any"}.get(ftype, ""),
                minimum=spec.get("minimum"),
                maximum=spec.get("maximum"),
            )
        )  # fmt: skip
    return fields


def values_from_post(specs: list[dict[str, Any]], data: QueryDict) -> dict[str, str]:
    """The declared fields' values as typed (other POST keys, like the CSRF token, are not)."""
    return {spec["name"]: post_text(data, spec["name"]) for spec in specs}


def post_text(data: QueryDict, name: str) -> str:
    """A posted text without NUL characters (no browser sends them; PostgreSQL refuses them)."""
    return str(data.get(name) or "").replace("\x00", "")
