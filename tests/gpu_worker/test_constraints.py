"""Constraints: the hand-written regex automaton, token-level masks, choices, JSON skeletons."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_worker.engine.constraints import (
    CharAutomaton,
    PatternConstraint,
    SkeletonText,
    SkeletonValue,
    build_choices,
    check_pattern,
    integer_range_pattern,
    parse_pattern,
    pattern_fullmatch,
    schema_skeleton,
    token_table,
)
from gpu_worker.engine.tokenizer import StencilTokenizer

PATTERNS = [
    "[a-z]+\\d{2,3}",
    "(foo|bar)?x*",
    "\\w+@\\w+\\.com",
    "[^ab]{1,3}",
    "-?(0|[1-9][0-9]*)",
    "a.c|\\s+",
    "(ab|a)(c|bc)",
    "[A-Z]{2}-\\d{3}",
    "x{0,2}y{2,}",
    "(yes|no)",
]
ALPHABET = "abcxyz019ABZ-@. \n_"


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(PATTERNS), st.text(alphabet=ALPHABET, max_size=8))
def test_automaton_agrees_with_re_fullmatch(pattern: str, text: str) -> None:
    expected = re.fullmatch(pattern, text, flags=re.ASCII) is not None
    assert pattern_fullmatch(pattern, text) == expected


@pytest.mark.parametrize(
    ("pattern", "feature"),
    [
        ("(a)\\1", "backreference"),
        ("(?=a)a", "lookahead"),
        ("(?<!a)b", "lookbehind"),
        ("a*?", "lazy quantifier"),
        ("a++", "possessive quantifier"),
        ("\\bword", "word boundary"),
        ("(?i)abc", "inline flag"),
        ("(?P<x>a)", "named group"),
        ("a^b", "anchor"),
        ("*a", "nothing to repeat"),
    ],
)
def test_unsupported_pattern_features_are_rejected_by_name(pattern: str, feature: str) -> None:
    with pytest.raises(ValueError, match=feature):
        parse_pattern(pattern)


def test_check_pattern_is_the_template_editors_gate() -> None:
    check_pattern("[A-Z]{2}-\\d{3}")
    with pytest.raises(ValueError, match="lookahead"):
        check_pattern("(?=x)x")


def test_malformed_patterns_are_rejected() -> None:
    for pattern in ["(ab", "ab)", "[ab", "a{3,1}", "a{x}"]:
        with pytest.raises(ValueError, match="pattern"):
            parse_pattern(pattern)


def _walk(constraint: PatternConstraint, length: int, seed: int) -> tuple[str, list[int]]:
    """Decode a hole left to right, picking uniformly among the allowed tokens."""
    generator = torch.Generator().manual_seed(seed)
    state, tokens = constraint.start, []
    terminators = constraint.table.terminators
    for position in range(length):
        allowed = constraint.allowed(state, length - position)
        assert bool(allowed.any()), "a dead end: no token allowed"
        choices = allowed.nonzero().squeeze(-1)
        token = int(choices[torch.randint(len(choices), (1,), generator=generator)])
        if token in terminators:
            break
        tokens.append(token)
        state = constraint.advance(state, token)
        assert state != CharAutomaton.DEAD
    return "".join(constraint.table.texts[t] for t in tokens), tokens


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(
        ["[A-Z]{2}-\\d{3}", "\\d{1,4}", "(yes|no|maybe)", "[a-z ]{2,12}", "-?(0|[1-9][0-9]*)"]
    ),
    st.integers(6, 12),
    st.integers(0, 10_000),
    st.sampled_from(["", " "]),
)
def test_a_pattern_hole_decoded_with_allowed_tokens_always_matches(
    tokenizer: StencilTokenizer, pattern: str, length: int, seed: int, prefix: str
) -> None:
    constraint = PatternConstraint(
        pattern, token_table(tokenizer, tokenizer.vocab_size), prefix=prefix
    )
    text, _ = _walk(constraint, length, seed)
    assert text.startswith(prefix)
    assert re.fullmatch(pattern, text[len(prefix) :], flags=re.ASCII)


def test_min_tokens_counts_whole_tokens(tokenizer: StencilTokenizer) -> None:
    table = token_table(tokenizer, tokenizer.vocab_size)
    constraint = PatternConstraint("Dear", table)
    assert constraint.min_tokens() == len(tokenizer.encode("Dear"))
    assert PatternConstraint("\\d{3}", table).min_tokens() >= 1


def test_terminators_are_allowed_only_in_accepting_states(tokenizer: StencilTokenizer) -> None:
    table = token_table(tokenizer, tokenizer.vocab_size)
    constraint = PatternConstraint("\\d{2}", table)
    eos = tokenizer.special.eos
    assert not bool(constraint.allowed(constraint.start, 4)[eos])
    state = constraint.advance(constraint.advance(constraint.start, tokenizer.encode("1")[0]),
                               tokenizer.encode("2")[0])  # fmt: skip
    assert bool(constraint.allowed(state, 2)[eos])


def test_choices_become_whole_token_candidates_with_the_prefix(tokenizer: StencilTokenizer) -> None:
    choice = build_choices(["Bob", "Dr Smith"], tokenizer, prefix=" ", hole="who")
    assert choice.candidates[1] == tuple(tokenizer.encode(" Dr Smith"))
    with pytest.raises(ValueError, match="duplicates"):
        build_choices(["a", "a"], tokenizer, prefix="", hole="who")
    with pytest.raises(ValueError, match="non-empty list"):
        build_choices([], tokenizer, prefix="", hole="who")


def test_a_scalar_schema_is_one_typed_value() -> None:
    (value,) = schema_skeleton({"type": "integer"}, hole="n")
    assert isinstance(value, SkeletonValue) and value.path == ""
    quote, body, _ = schema_skeleton({"type": "string", "maxLength": 3}, hole="s")
    assert quote == SkeletonText('"') and isinstance(body, SkeletonValue)


def test_schema_skeleton_locks_keys_and_punctuation() -> None:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer"},
            "ok": {"type": "boolean"},
            "tier": {"enum": ["gold", "silver"]},
        },
    }
    pieces = schema_skeleton(schema, hole="data")
    texts = [p.text for p in pieces if isinstance(p, SkeletonText)]
    values = [p for p in pieces if isinstance(p, SkeletonValue)]
    assert texts[0] == '{"name":"' and texts[-1] == "}"
    assert [v.path for v in values] == ["name", "age", "ok", "tier"]
    assert values[2].constraint == {"choices": ["true", "false"]}
    assert values[3].constraint == {"choices": ['"gold"', '"silver"']}


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "array"}, "not supported"),
        ({"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 5}}},
         "multipleOf"),
        ({"type": "integer", "minimum": 5, "maximum": 4}, "allows no value"),
        ({"type": "object", "properties": {"a": {"type": "array"}}}, "not supported"),
        ({"type": "object", "properties": {"a": {"type": "strin"}}}, "invalid JSON Schema"),
    ],
)
def test_unsupported_schemas_are_rejected(schema: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        schema_skeleton(schema, hole="data")


BOUND = st.none() | st.integers(-100_000, 100_000)


@settings(max_examples=60, deadline=None)
@given(BOUND, BOUND, st.lists(st.integers(-200_000, 200_000), max_size=40))
def test_integer_range_patterns_match_exactly_the_integers_in_range(
    low: int | None, high: int | None, probes: list[int]
) -> None:
    if low is not None and high is not None and low > high:
        low, high = high, low
    pattern = integer_range_pattern(low, high)
    edges = [b + d for b in (low, high, 0) if b is not None for d in (-1, 0, 1)]
    for n in probes + edges:
        inside = (low is None or n >= low) and (high is None or n <= high)
        assert pattern_fullmatch(pattern, str(n)) == inside, (pattern, n)
    for text in ("-0", "007", "+1", "", "1.0"):  # not how JSON writes an integer
        assert not pattern_fullmatch(pattern, text)


def test_an_integer_schema_with_bounds_becomes_a_range_pattern() -> None:
    (value,) = schema_skeleton({"type": "integer", "minimum": 20000, "maximum": 300000},
                               hole="salary")  # fmt: skip
    assert isinstance(value, SkeletonValue)
    assert pattern_fullmatch(value.constraint["pattern"], "145000")
    assert not pattern_fullmatch(value.constraint["pattern"], "42")
    (open_ended,) = schema_skeleton({"type": "integer", "exclusiveMinimum": 0}, hole="n")
    assert isinstance(open_ended, SkeletonValue)
    assert not pattern_fullmatch(open_ended.constraint["pattern"], "0")
    assert pattern_fullmatch(open_ended.constraint["pattern"], "123456789")
