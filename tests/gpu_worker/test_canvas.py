"""Canvas JSON parsing and tokenization at segment boundaries."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gpu_worker.engine.canvas import parse_canvas
from gpu_worker.engine.constraints import ChoiceConstraint, PatternConstraint
from gpu_worker.engine.tokenizer import StencilTokenizer
from research.corpus import Document, Span, document_at, tokenize_with_holes
from tests.gpu_worker.conftest import shipped_tokenizer

MAX_LEN = 160
SENTENCES = [
    "Dear Dr Smith, thank you for seeing me at the clinic about the report.",
    "Dear Olga, thank you for calling me at Room 12 about order 77.",
    "Dear Ravi, thank you for helping me at our office about your letter.",
]


def parse(request: dict[str, Any], tokenizer: StencilTokenizer, max_len: int = MAX_LEN) -> Any:
    return parse_canvas(request, tokenizer, max_len=max_len)


def split_at_words(sentence: str, picks: list[int]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Segments where chosen words become holes holding the original word (no leading space)."""
    words = sentence.split(" ")
    segments: list[dict[str, Any]] = []
    fills: dict[str, str] = {}
    text = ""
    for i, word in enumerate(words):
        sep = "" if i == 0 else " "
        if i in picks and word.isalpha():
            segments.append({"text": text + sep})
            name = f"w{i}"
            segments.append({"hole": name, "max_tokens": 8})
            fills[name] = word
            text = ""
        else:
            text += sep + word
    segments.append({"text": text})
    return [s for s in segments if s.get("text", None) != ""], fills


def holed_at_spans(
    doc: Document, rnd: random.Random, tokenizer: StencilTokenizer
) -> tuple[dict[str, Any], dict[str, str], list[Span]]:
    """A request holing about half of ``doc``'s spans (none overlapping), each hole named
    h<i> and sized for its text; the hole texts, and the spans holed."""
    segments: list[dict[str, Any]] = []
    fills: dict[str, str] = {}
    spans: list[Span] = []
    cursor = 0
    for span in sorted(doc.spans, key=lambda s: s.start):
        if span.start < cursor or span.end == span.start or rnd.random() < 0.5:
            continue
        segments.append({"text": doc.text[cursor : span.start]})
        name = f"h{len(fills)}"
        fills[name] = doc.text[span.start : span.end]
        segments.append({"hole": name, "max_tokens": len(tokenizer.encode(fills[name])) + 2})
        spans.append(span)
        cursor = span.end
    segments.append({"text": doc.text[cursor:]})
    assume(fills)
    return {"segments": [s for s in segments if s.get("text") != ""]}, fills, spans


def test_a_locked_trailing_space_becomes_a_forced_prefix(tokenizer: StencilTokenizer) -> None:
    canvas = parse({"segments": [{"text": "Thank you for seeing "}, {"hole": "who", "max_tokens": 4},
                                 {"text": "."}]}, tokenizer)  # fmt: skip
    hole = canvas.holes[0]
    assert hole.prefix == " "
    assert canvas.ids[: hole.start].tolist() == tokenizer.encode("Thank you for seeing")
    first = canvas.allowed[hole.start]
    for token_id in first.nonzero().squeeze(-1).tolist():
        text = tokenizer.token_text(token_id)
        assert text.startswith(" ") or token_id in canvas.terminators()


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(SENTENCES), st.lists(st.integers(0, 14), min_size=1, max_size=4))
def test_a_canvas_whose_holes_hold_the_original_text_tokenizes_like_the_original(
    tokenizer: StencilTokenizer, sentence: str, picks: list[int]
) -> None:
    segments, fills = split_at_words(sentence, picks)
    if not fills:
        return
    canvas = parse({"segments": segments}, tokenizer)
    assert canvas.filled_ids(fills, tokenizer) == tokenizer.encode(sentence)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 400), st.randoms(use_true_random=False))
def test_a_corpus_document_holed_at_its_spans_tokenizes_like_the_original(
    index: int, rnd: random.Random
) -> None:
    """Holes after a blank line, a colon, a bracket or a space: with the original text in
    them, the canvas has the tokens of the training row holed at the same spans (the shipped
    tokenizer, real documents), and those are the document's own tokens unless a hole's edge
    falls inside a word of the BPE pre-tokenizer: a job title ending in ")" before "," is
    one ")," word in the whole text, but a hole ends at ")" in training rows and canvases
    alike (test document 181)."""
    tokenizer = shipped_tokenizer()
    doc = document_at("test", index)
    request, fills, spans = holed_at_spans(doc, rnd, tokenizer)
    canvas = parse(request, tokenizer, 2048)
    row, _ = tokenize_with_holes(doc, spans, tokenizer.encode)
    assert canvas.filled_ids(fills, tokenizer) == row
    cuts = [at - 1 if doc.text[at - 1 : at] == " " else at for s in spans for at in (s.start, s.end)]
    words = tokenizer.tok.pre_tokenizer.pre_tokenize_str(doc.text)  # BPE merges within these
    if not any(a < cut < b for _, (a, b) in words for cut in cuts):
        assert row == tokenizer.encode(doc.text)


def virtual_tokenizer() -> StencilTokenizer:
    """The shipped tokenizer as a model trained with virtual spaces reads it."""
    return StencilTokenizer(shipped_tokenizer().tok, virtual_spaces=True)


def test_holes_that_start_a_line_or_a_json_value_get_a_virtual_space() -> None:
    """Only with a model trained for it: the document's start, after a newline and after
    ': "'; a real locked space still moves; after a bare colon nothing is added."""
    segments = [
        {"hole": "greeting", "max_tokens": 4}, {"text": ",\nKind regards,\n"},
        {"hole": "name", "max_tokens": 6}, {"text": '\n{"name": "'},
        {"hole": "value", "max_tokens": 6}, {"text": '", "n":'}, {"hole": "n", "max_tokens": 3},
        {"text": ', "id": '}, {"hole": "id", "max_tokens": 3}, {"text": "}"},
    ]  # fmt: skip
    fills = {"greeting": "Hello", "name": "Joshua Nunez", "value": "Laurie Bryant", "n": "7",
             "id": "8"}  # fmt: skip
    text = "Hello,\nKind regards,\nJoshua Nunez\n{\"name\": \"Laurie Bryant\", \"n\":7, \"id\": 8}"
    plain, virtual = shipped_tokenizer(), virtual_tokenizer()
    before = parse({"segments": segments}, plain, 256)
    assert {h.name: h.prefix for h in before.holes} == {
        "greeting": "", "name": "", "value": "", "n": "", "id": " "}  # fmt: skip
    assert before.filled_ids(fills, plain) == plain.encode(text)
    canvas = parse({"segments": segments}, virtual, 256)
    assert {h.name: h.prefix for h in canvas.holes} == {
        "greeting": " ", "name": " ", "value": " ", "n": "", "id": " "}  # fmt: skip
    assert canvas.ids[canvas.protect].tolist() == before.ids[before.protect].tolist()
    name = next(h for h in canvas.holes if h.name == "name")
    joshua = virtual.encode(" Joshua")  # one token; at a line's start the name splits
    assert len(joshua) == 1 and len(plain.encode("Joshua")) > 1
    assert joshua[0] in canvas.filled_ids(fills, virtual)
    assert joshua[0] not in before.filled_ids(fills, plain)
    for token_id in canvas.allowed[name.start].nonzero().squeeze(-1).tolist():
        assert virtual.token_text(token_id).startswith(" ") or token_id in canvas.terminators()
    row = canvas.ids.clone()  # each hole holds its fill's tokens (virtual space included)
    for hole in canvas.holes:
        tokens = virtual.encode(hole.prefix + fills[hole.name])
        row[hole.start : hole.end] = canvas.pad_id
        row[hole.start : hole.start + len(tokens)] = torch.tensor(tokens)
    assert canvas.hole_texts(row, virtual) == fills  # the virtual space is stripped
    assert canvas.document(row, virtual) == text


def spaced_tokenizer() -> StencilTokenizer:
    """The shipped tokenizer as a model trained with spaced lines reads it."""
    return StencilTokenizer(shipped_tokenizer().tok, spaced_lines=True)


def test_with_spaced_lines_locked_line_starts_are_spaced_and_everything_comes_back() -> None:
    """Locked words at a line's start or in a JSON value are the tokens they are inside a
    line; the holes and the document come back byte-identical, and a pattern hole's text is
    its tokens' own (the automaton's) text."""
    segments = [
        {"text": "Dear Joshua,\nThank you.\n"}, {"hole": "body", "max_tokens": 16},
        {"text": '\nKind regards,\nJoshua Nunez\n{"name": "'}, {"hole": "value", "max_tokens": 6},
        {"text": '", "code": "'}, {"hole": "code", "max_tokens": 6, "constraint": {"pattern": "a\n b"}},
        {"text": '"}'},
    ]  # fmt: skip
    fills = {"body": "We met.\nThe talk went well.", "value": "Joshua Nunez", "code": "a\n b"}
    text = ('Dear Joshua,\nThank you.\nWe met.\nThe talk went well.\nKind regards,\nJoshua Nunez\n'
            '{"name": "Joshua Nunez", "code": "a\n b"}')  # fmt: skip
    tokenizer, plain = spaced_tokenizer(), shipped_tokenizer()
    canvas = parse({"segments": segments}, tokenizer, 256)
    assert {h.name: h.prefix for h in canvas.holes} == {"body": " ", "value": " ", "code": " "}
    first = canvas.holes[0].start  # the document's first line is spaced too
    assert canvas.ids[:first].tolist() == tokenizer.encode(" Dear Joshua,\nThank you.\n")
    locked = canvas.ids[canvas.protect].tolist()
    for word in (" Thank", " Kind", " Joshua"):
        (token,) = plain.encode(word)
        assert token in locked
    assert locked.count(plain.encode(" Joshua")[0]) == 2  # "Dear Joshua" and the signature
    row = canvas.ids.clone()
    for hole in canvas.holes:
        if hole.name == "code":  # as the automaton writes it: " b" after "\n" is no
            # virtual space here, it is the pattern's own
            tokens = [plain.encode(" a")[0], *plain.encode("\n b")]
            assert isinstance(hole.constraint, PatternConstraint)
        else:
            tokens = tokenizer.encode(hole.prefix + fills[hole.name])
        row[hole.start : hole.end] = canvas.pad_id
        row[hole.start : hole.start + len(tokens)] = torch.tensor(tokens)
    body = next(h for h in canvas.holes if h.name == "body")
    assert plain.encode(" The")[0] in row[body.start : body.end].tolist()  # its second line
    assert canvas.hole_texts(row, tokenizer) == fills
    assert canvas.document(row, tokenizer) == text


@pytest.mark.parametrize("spaced", [False, True], ids=["virtual spaces", "spaced lines"])
@settings(max_examples=30, deadline=None)
@given(st.integers(0, 400), st.randoms(use_true_random=False))
def test_a_holed_document_tokenizes_as_the_training_rows_do_with_virtual_spaces(
    spaced: bool, index: int, rnd: random.Random
) -> None:
    """A Canvas for a model with virtual spaces (or spaced lines), its holes holding the
    original text, has the tokens of the training row holed at the same spans
    (corpus.tokenize_with_holes), and writes the document back."""
    tokenizer = spaced_tokenizer() if spaced else virtual_tokenizer()
    doc = document_at("test", index)
    request, fills, spans = holed_at_spans(doc, rnd, tokenizer)
    canvas = parse(request, tokenizer, 2048)
    row, _ = tokenize_with_holes(doc, spans, tokenizer.encode, virtual_spaces=True,
                                 spaced_lines=spaced)  # fmt: skip
    assert canvas.filled_ids(fills, tokenizer) == row
    if spaced:  # every line starts with a space, so a hole there is a document's own split,
        # unless a hole's edge cuts a merge (")" and "," for "),": tests/research/test_corpus.py)
        whole = tokenizer.encode_document(doc.text)
        assert row == whole or 0 < len(row) - len(whole) <= 2 * len(spans)
    filled = canvas.ids.clone()
    for hole in canvas.holes:
        tokens = tokenizer.encode(hole.prefix + fills[hole.name])
        filled[hole.start : hole.end] = canvas.pad_id
        filled[hole.start : hole.start + len(tokens)] = torch.tensor(tokens)
    assert canvas.document(filled, tokenizer) == doc.text


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.text(alphabet="ab ,.\n\té", max_size=12), min_size=1, max_size=4),
    st.lists(st.text(alphabet="xy z", max_size=6), min_size=4, max_size=4),
)
def test_locked_text_comes_back_byte_identical(
    tokenizer: StencilTokenizer, texts: list[str], fills: list[str]
) -> None:
    segments: list[dict[str, Any]] = []
    for i, text in enumerate(texts):
        segments += [{"text": text}, {"hole": f"h{i}", "max_tokens": 12}]
    canvas = parse({"segments": segments}, tokenizer)
    span_fills = {h.name: fills[i].lstrip(" ") or "x" for i, h in enumerate(canvas.holes)}
    row = canvas.ids.clone()  # each hole holds its fill's tokens, then pad
    for hole in canvas.holes:
        tokens = tokenizer.encode(hole.prefix + span_fills[hole.name])[: hole.max_len]
        row[hole.start : hole.end] = canvas.pad_id
        row[hole.start : hole.start + len(tokens)] = torch.tensor(tokens)
    document = canvas.document(row, tokenizer)
    expected = "".join(t + canvas.hole_texts(row, tokenizer)[f"h{i}"] for i, t in enumerate(texts))
    assert document == expected
    assert bool((row[canvas.protect] == canvas.ids[canvas.protect]).all())


def test_an_empty_hole_keeps_the_moved_space_in_the_document(tokenizer: StencilTokenizer) -> None:
    canvas = parse({"segments": [{"text": "at "}, {"hole": "x", "max_tokens": 3}, {"text": "."}]},
                   tokenizer)  # fmt: skip
    row = canvas.ids.clone()
    row[~canvas.protect] = canvas.pad_id
    assert canvas.document(row, tokenizer) == "at ."
    assert canvas.hole_texts(row, tokenizer) == {"x": ""}


def test_schema_holes_expand_to_locked_keys_and_typed_values(tokenizer: StencilTokenizer) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "ok": {"type": "boolean"}},
    }
    canvas = parse({"segments": [{"text": "Data: "}, {"hole": "data", "constraint": {"schema": schema}}]},
                   tokenizer)  # fmt: skip
    assert [h.name for h in canvas.holes] == ["data.name", "data.ok"]
    assert isinstance(canvas.holes[0].constraint, PatternConstraint)
    assert isinstance(canvas.holes[1].constraint, ChoiceConstraint)
    assert all(h.group == "data" for h in canvas.holes)
    assert tokenizer.decode(canvas.ids[: canvas.holes[0].start].tolist()) == 'Data: {"name":"'


@pytest.mark.parametrize(
    ("request_json", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"segments": [], "seed": 1}', "non-empty list"),
        ('{"segments": [{"text": "a"}], "colour": 1}', "unknown canvas field"),
        ('{"segments": [{"text": "a", "bold": true}]}', "unknown field"),
        ('{"segments": [{"hole": "a", "max_tokens": 2, "size": 1}]}', "unknown field"),
        (
            '{"segments": [{"hole": "a", "max_tokens": 2}, {"hole": "a", "max_tokens": 2}]}',
            "duplicate hole name 'a'",
        ),
        ('{"segments": [{"hole": "a"}]}', "needs max_tokens"),
        ('{"segments": [{"hole": "a", "max_tokens": 0}]}', "max_tokens=0"),
        ('{"segments": [{"text": "only text"}]}', "no hole"),
        ('{"segments": [{"hole": "a", "max_tokens": 500}]}', "max_len=160"),
        ('{"segments": [{"hole": "a", "max_tokens": 2}], "seed": "7"}', "seed="),
        (
            '{"segments": [{"hole": "a", "max_tokens": 4, "constraint": {"pattern": "(a)\\\\1"}}]}',
            "backreference",
        ),
        (
            '{"segments": [{"hole": "a", "max_tokens": 1, "constraint": {"pattern": "\\\\d{9}"}}]}',
            "needs at least",
        ),
        (
            '{"segments": [{"hole": "a", "max_tokens": 1, "constraint": {"regex": "x"}}]}',
            "unknown field",
        ),
    ],
)
def test_bad_canvas_json_raises_a_clear_value_error(
    tokenizer: StencilTokenizer, request_json: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        parse_canvas(request_json, tokenizer, max_len=MAX_LEN)


def test_a_choices_hole_is_as_long_as_its_longest_choice(tokenizer: StencilTokenizer) -> None:
    for max_tokens in (1, 20):
        request = {"segments": [{"text": "Dear "}, {"hole": "who", "max_tokens": max_tokens,
                                "constraint": {"choices": ["Bob", "Dr Smith"]}}]}  # fmt: skip
        canvas = parse(request, tokenizer)
        assert canvas.holes[0].max_len == len(tokenizer.encode(" Dr Smith"))


def test_a_scalar_schema_hole_is_one_value_span(tokenizer: StencilTokenizer) -> None:
    schema = {"type": "integer"}
    canvas = parse({"segments": [{"text": "n="}, {"hole": "n", "constraint": {"schema": schema}}]},
                   tokenizer)  # fmt: skip
    assert [h.name for h in canvas.holes] == ["n"]
    assert isinstance(canvas.holes[0].constraint, PatternConstraint)


def test_seed_and_sampler_overrides_are_kept(tokenizer: StencilTokenizer) -> None:
    request = {
        "segments": [{"hole": "a", "max_tokens": 2}],
        "seed": 9,
        "sampler": {"temperature": 0.5},
    }
    canvas = parse_canvas(json.dumps(request), tokenizer, max_len=MAX_LEN)
    assert canvas.seed == 9 and canvas.sampler == {"temperature": 0.5}
