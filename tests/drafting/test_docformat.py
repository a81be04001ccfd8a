"""Values written for where they stand; JSON records parsed and checked against their schema."""

from __future__ import annotations

import json
from typing import Any

import pytest

from drafting import docformat, services
from drafting.models import Fragment
from drafting.templating import TemplateError, parse_template
from tests.drafting.helpers import job_succeed

RECORD = (
    '{"patient": "{{ field("patient", max_length=60) }}", '
    '"age": {{ field("age", type="integer") }}, '
    '"weeks": {% infill "weeks", max_tokens=3 %}weeks{% endinfill %}, '
    '"note": "{% infill "note", max_tokens=8 %}a note{% endinfill %}"}'
)


def test_a_slot_inside_a_json_string_and_a_bare_value_get_their_contexts() -> None:
    parsed = parse_template(RECORD, doc_format="json")
    slots = [c for p, c in zip(parsed.pieces, parsed.contexts, strict=True) if p.kind != "text"]
    assert slots == ["json_string", "json_value", "json_value", "json_string"]


def test_a_quote_in_a_json_string_is_escaped_and_a_bare_text_is_quoted() -> None:
    assert docformat.escape_for('José "Pepe" \\', "json_string") == 'José \\"Pepe\\" \\\\'
    assert docformat.escape_for("42", "json_value", numeric=True) == "42"
    assert docformat.escape_for("forty", "json_value") == '"forty"'
    assert docformat.escape_for("*a* #1", "markdown") == "\\*a\\* \\#1"
    assert docformat.escape_for('say "hi"', "text") == 'say "hi"'


def test_a_json_template_whose_locked_text_is_not_json_is_refused() -> None:
    with pytest.raises(TemplateError, match="locked JSON is not valid"):
        parse_template('{"a": "{{ field("a") }}" "b": 1}', doc_format="json")


def test_the_document_schema_holds_keys_constants_and_slot_types() -> None:
    schema = parse_template(RECORD, doc_format="json").document_schema()
    assert schema is not None
    assert schema["required"] == ["patient", "age", "weeks", "note"]
    assert schema["properties"]["age"] == {"type": "integer"}
    assert schema["additionalProperties"] is False


def test_a_broken_json_document_is_named_with_its_line_and_column() -> None:
    problems = docformat.json_document_violations('{"a": 1,\n "b": }', {"type": "object"})
    assert len(problems) == 1 and (problems[0].line, problems[0].column) == (2, 7)
    wrong = docformat.json_document_violations('{"age": "x"}', {
        "type": "object", "properties": {"age": {"type": "integer"}}})  # fmt: skip
    assert "age" in str(wrong[0])


def test_dates_and_numbers_are_shown_in_their_display_format() -> None:
    assert docformat.date_display("2026-12-06", "long") == "6 December 2026"
    assert docformat.date_display("2026-12-06", "us") == "December 6, 2026"
    assert docformat.number_display(92000, "grouped") == "92,000"
    assert docformat.number_display(92000, "money") == "92,000.00"


@pytest.fixture
def record_version(db: Any) -> Any:
    return services.template_version_create(
        slug="record", title="Record", kind="record", source=RECORD, doc_format="json"
    )


def test_a_quoted_name_makes_a_record_that_parses_once_accepted(record_version: Any, user: Any
                                                                ) -> None:  # fmt: skip
    draft = services.draft_create(owner=user, version=record_version,
                                  values={"patient": 'José "Pepe"', "age": "61"})  # fmt: skip
    for fragment in draft.fragments.filter(kind=Fragment.Kind.FILL):
        text = {"weeks": "12", "note": 'He said "ok"'}[fragment.name]
        services.fragment_review(fragment=fragment, action="edit", user=user, text=text)
    draft.refresh_from_db()
    revision = services.draft_accept(draft=draft, expected_revision=draft.revision, user=user)
    assert json.loads(revision.text) == {"patient": 'José "Pepe"', "age": 61, "weeks": 12,
                                         "note": 'He said "ok"'}  # fmt: skip


def test_a_record_that_does_not_parse_cannot_be_accepted(record_version: Any, user: Any) -> None:
    draft = services.draft_create(owner=user, version=record_version,
                                  values={"patient": "Ada", "age": "61"})  # fmt: skip
    job = services.draft_infill_request(draft=draft, user=user, preset="fast")
    job_succeed(job, {"weeks": "1 2", "note": "fine"})  # a bare value the model got wrong
    for fragment in draft.fragments.filter(kind=Fragment.Kind.FILL):
        services.fragment_review(fragment=fragment, action="accept", user=user)
    draft.refresh_from_db()
    with pytest.raises(services.UserError, match=r"line 1, column \d+: the document is not valid JSON"):
        services.draft_accept(draft=draft, expected_revision=draft.revision, user=user)
    draft.refresh_from_db()
    assert draft.accepted_revision is None


def test_model_text_in_a_json_string_is_constrained_to_string_content(record_version: Any,
                                                                     user: Any) -> None:  # fmt: skip
    draft = services.draft_create(owner=user, version=record_version,
                                  values={"patient": "Ada", "age": "61"})  # fmt: skip
    plan = services.draft_canvas_plan(draft=draft)
    note = next(s for s in plan.request["segments"] if s.get("hole", "").startswith("note"))
    assert note["constraint"] == {"pattern": docformat.JSON_STRING_PATTERN}


def test_json_punctuation_cannot_be_unlocked(record_version: Any, user: Any) -> None:
    draft = services.draft_create(owner=user, version=record_version,
                                  values={"patient": "Ada", "age": "61"})  # fmt: skip
    text = draft.fragments.filter(kind=Fragment.Kind.TEXT).first()
    assert text is not None
    with pytest.raises(services.UserError, match="keys and punctuation stay locked"):
        services.fragment_lock_set(fragment=text, locked=False)
    with pytest.raises(services.UserError, match="keys and punctuation stay locked"):
        services.fragment_review(fragment=text, action="edit", user=user, text="{")
