"""The template language: what a template may say, and a clear message for what it may not."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from drafting.templating import TemplateError, field_errors, fields_json_schema, parse_template
from tests.drafting.helpers import REFERRAL_SOURCE, VALUES

FIELD = '{{ field("name") }}'


def message(source: str, **kwargs: Any) -> str:
    with pytest.raises(TemplateError) as info:
        parse_template(source, **kwargs)
    return str(info.value)


def test_pieces_keep_locked_text_fields_and_holes_in_document_order() -> None:
    parsed = parse_template(REFERRAL_SOURCE)
    kinds = [(p.kind, p.name) for p in parsed.pieces if p.kind != "text"]
    assert kinds == [("field", "doctor"), ("field", "patient_name"), ("field", "birth_date"),
                     ("fill", "reason"), ("fill", "urgency"), ("fill", "summary"),
                     ("field", "sender")]  # fmt: skip
    assert parsed.pieces[0].text == "Dear "
    assert parsed.holes[1].constraint == {"choices": ["routine", "soon", "urgent"]}
    assert parsed.holes[0].hint == "why the patient is referred"


def test_a_repeated_field_is_one_field_used_twice() -> None:
    parsed = parse_template('{{ field("n", label="Name") }} and {{ field("n") }}')
    assert [f.name for f in parsed.fields] == ["n"]
    assert [p.name for p in parsed.pieces if p.kind == "field"] == ["n", "n"]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('Hi {{ field("name" }}', "line 1"),
        ("Hi\n{% for x in xs %}{{ x }}{% endfor %}", "not allowed"),
        ('{% if 1 %}{{ field("a") }}{% endif %}', "not allowed"),
        ('{{ field("a")|upper }}', "not allowed"),
        ('{{ field("a").__class__ }}', "not allowed"),
        ('{{ range(3) }}{{ field("a") }}', "range(...) is not allowed"),
        ('{{ field(name) }}', "not allowed"),
        ('{{ field("a", colour="red") }}', "unsupported keyword(s) colour"),
        ('{{ field("a", type="colour") }}', "type 'colour' is not one of"),
        ('{{ field("Bad Name") }}', "must be lowercase letters"),
        ('{{ field("a", type="choice") }}', "needs choices"),
        ('{{ field("a", pattern="[") }}', "not a valid regex"),
        ('{{ field("a", max_length=10) }}{{ field("a", max_length=20) }}', "declared twice"),
        ('{% infill "s", max_tokens=8, grammar="x" %}{% endinfill %}', "unsupported keyword(s) grammar"),
        ('{% infill "s" %}{% endinfill %}', "max_tokens must be an integer"),
        ('{% infill "s", max_tokens=100000 %}{% endinfill %}', "max_tokens must be an integer"),
        ('{% infill "s", max_tokens=8, schema={"type": 12} %}{% endinfill %}',
         "not a valid JSON Schema"),
        ('{% infill "s", max_tokens=8, schema="object" %}{% endinfill %}',
         "schema must be a JSON object"),
        ('{% infill "s", max_tokens=8, choices=[] %}{% endinfill %}', "choices must be"),
        ('{% infill "s", max_tokens=8, pattern="(" %}{% endinfill %}', "not a valid regex"),
        ('{% infill "s", max_tokens=8, choices=["a"], pattern="a" %}{% endinfill %}',
         "not several"),
        ('{% infill "s", max_tokens=8 %}{% endinfill %}{% infill "s", max_tokens=8 %}{% endinfill %}',
         "declared twice"),
        ('{{ field("s") }}{% infill "s", max_tokens=8 %}{% endinfill %}', "both a field and an infill"),
        ("Just text, nothing to fill.", "declares no field"),
        ("   ", "empty"),
        ('\ue000{{ field("a") }}', "reserved characters"),
    ],
)
def test_malformed_templates_get_a_clear_message(source: str, expected: str) -> None:
    assert expected in message(source)


def test_oversized_template_is_rejected_with_its_limit() -> None:
    assert "larger than 100 bytes" in message(FIELD + "x" * 200, max_bytes=100)


def test_field_errors_name_each_bad_field() -> None:
    fields = [f.to_json() for f in parse_template(REFERRAL_SOURCE).fields]
    errors = field_errors({**VALUES, "doctor": "", "birth_date": "1961/04/17", "extra": "x"},
                          fields, max_field_length=2000)  # fmt: skip
    assert errors["doctor"] == "Referring to is required."
    assert errors["birth_date"] == (
        "Date of birth is not a real date: use a calendar date as YYYY-MM-DD (e.g. 2025-02-28).")
    assert "Unknown fields" in errors["__all__"]
    assert field_errors(VALUES, fields, max_field_length=2000) == {}


def test_no_field_may_exceed_the_service_wide_length_limit() -> None:
    fields = [{"name": "notes", "type": "textarea", "max_length": 10_000}]
    schema = fields_json_schema(fields, max_field_length=500)
    assert schema["properties"]["notes"]["maxLength"] == 500
    errors = field_errors({"notes": "n" * 501}, fields, max_field_length=500)
    assert errors == {"notes": "notes is too long: at most 500 characters."}


def test_number_fields_check_type_and_range() -> None:
    fields = [{"name": "age", "type": "integer", "label": "Age", "minimum": 0, "maximum": 130}]
    assert field_errors({"age": "forty"}, fields, max_field_length=10) == {
        "age": "Age must be a whole number (digits only, e.g. 92000)."}  # fmt: skip
    assert field_errors({"age": 200}, fields, max_field_length=10) == {
        "age": "Age must be at most 130."}  # fmt: skip


def test_line_endings_are_normalized_to_newlines() -> None:
    """Jinja's lexer turns CRLF and CR into LF: locked text is byte-exact after that step."""
    parsed = parse_template("A\r\nB\r" + FIELD)
    assert parsed.pieces[0].text == "A\nB\n"


@given(st.text(alphabet=st.characters(codec="utf-8", exclude_characters="{}%#\r\ue000\ue001"), max_size=200))
def test_plain_text_around_a_field_is_locked_byte_for_byte(text: str) -> None:
    parsed = parse_template(text + FIELD + text)
    texts = [p.text for p in parsed.pieces if p.kind == "text"]
    assert "".join(texts) == text + text
    assert [p.kind for p in parsed.pieces if p.kind != "text"] == ["field"]


def test_an_error_carries_the_line_and_column_of_its_tag() -> None:
    def where(source: str, doc_format: str = "text") -> tuple[int, int]:
        with pytest.raises(TemplateError) as info:
            parse_template(source, doc_format=doc_format)
        return info.value.line, info.value.column

    assert where('Dear {{ field("name") }},\n\n  {% for x in y %}{% endfor %}') == (3, 3)
    assert where('Hi {{ field("a") }}\nBye {% infill "b", max_tokens=4 %}x') == (2, 5)
    assert where('Dear\n  {{ field("Bad Name") }}') == (2, 3)
    assert where('{"a": "{{ field("a") }}",\n "b" 1}', "json") == (2, 6)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("type='integer', minimum='abc'", "minimum must be a number"),
        ("type='number', maximum=True", "maximum must be a number"),
        ("max_length=True", "max_length must be a non-negative integer"),
        ("min_length=-1", "min_length must be a non-negative integer"),
        ("required='no'", "required must be True or False"),
    ],
)
def test_field_options_of_the_wrong_type_are_refused_at_save(options: str, message: str) -> None:
    with pytest.raises(TemplateError, match=message):
        parse_template("Dear {{ field('name', " + options + ") }},")


def test_a_field_pattern_matches_the_whole_value_by_the_automaton() -> None:
    """``^(a+)+$`` backtracks exponentially in Python's ``re`` on "aaa…!"; the automaton answers
    in one pass. The value is long enough that a backtracking engine would not finish."""
    fields = [{"name": "code", "type": "text", "label": "Code", "pattern": "^(a+)+$"}]
    assert field_errors({"code": "a" * 60 + "!"}, fields, max_field_length=100) == {
        "code": "Code does not have the expected format."}  # fmt: skip
    assert field_errors({"code": "a" * 60}, fields, max_field_length=100) == {}
    # a browser's pattern attribute matches the whole value: so does the server
    digits = [{"name": "n", "type": "text", "label": "N", "pattern": "[0-9]+"}]
    assert field_errors({"n": "x12"}, digits, max_field_length=10) == {
        "n": "N does not have the expected format."}  # fmt: skip


@pytest.mark.parametrize(("source", "message"), [
    ('{{ field("a", pattern="((a{100}){100}){100}") }}', "expands to 1,000,000 character positions"),
    ('{{ field("a", pattern="(?=a)b") }}', "field 'a'"),
    ('{% infill "s", max_tokens=8, pattern="((a{100}){100}){100}" %}{% endinfill %}',
     "nested repeats multiply"),
])  # fmt: skip
def test_patterns_too_large_or_unsupported_are_refused_at_save(source: str, message: str) -> None:
    with pytest.raises(TemplateError, match=re.escape(message)):
        parse_template(source)
