"""validate(): named violations as data."""

from __future__ import annotations

from typing import Any

import torch

from gpu_worker.engine.canvas import Canvas, parse_canvas
from gpu_worker.engine.config import SamplerConfig
from gpu_worker.engine.model import StencilTransformer
from gpu_worker.engine.sampler import denoise
from gpu_worker.engine.tokenizer import StencilTokenizer
from gpu_worker.engine.validation import (
    CHOICE_MISMATCH,
    EMPTY_HOLE,
    LOCKED_CHANGED,
    MASK_LEFT,
    PATTERN_MISMATCH,
    SCHEMA_INVALID,
    SPECIAL_IN_HOLE,
    validate,
)

SCHEMA = {"type": "object", "properties": {"age": {"type": "integer"}, "ok": {"type": "boolean"}}}
SEGMENTS: list[dict[str, Any]] = [
    {"text": "Dear "},
    {"hole": "name", "max_tokens": 4},
    {"text": ", ref "},
    {"hole": "ref", "max_tokens": 6, "constraint": {"pattern": "[A-Z]{2}-\\d{2}"}},
    {"text": " for "},
    {"hole": "who", "constraint": {"choices": ["Bob", "Olga"]}},
    {"text": ". "},
    {"hole": "data", "constraint": {"schema": SCHEMA}},
]


def filled(tokenizer: StencilTokenizer, model: StencilTransformer) -> tuple[Canvas, torch.Tensor]:
    canvas = parse_canvas({"segments": SEGMENTS}, tokenizer, max_len=160)
    result = denoise(model, canvas, SamplerConfig(), torch.Generator())
    return canvas, result.ids


def names(violations: list[Any]) -> list[str]:
    return [v.name for v in violations]


def test_a_sampled_canvas_has_no_violations(
    tokenizer: StencilTokenizer, model: StencilTransformer
) -> None:
    canvas, ids = filled(tokenizer, model)
    assert validate(canvas, ids, tokenizer) == []


def test_a_changed_locked_token_is_reported(
    tokenizer: StencilTokenizer, model: StencilTransformer
) -> None:
    canvas, ids = filled(tokenizer, model)
    ids = ids.clone()
    assert bool(canvas.protect[0])
    ids[0] = tokenizer.encode("Zoe")[0]
    assert LOCKED_CHANGED in names(validate(canvas, ids, tokenizer))


def test_a_mask_left_is_reported(tokenizer: StencilTokenizer, model: StencilTransformer) -> None:
    canvas, ids = filled(tokenizer, model)
    ids = ids.clone()
    ids[canvas.holes[0].start] = canvas.mask_id
    assert MASK_LEFT in names(validate(canvas, ids, tokenizer))


def test_a_special_token_inside_a_hole_is_reported(
    tokenizer: StencilTokenizer, model: StencilTransformer
) -> None:
    canvas, ids = filled(tokenizer, model)
    ids = ids.clone()
    ids[canvas.holes[0].start] = tokenizer.special.fim_prefix
    violations = validate(canvas, ids, tokenizer)
    assert SPECIAL_IN_HOLE in names(violations)
    assert violations[names(violations).index(SPECIAL_IN_HOLE)].hole == "name"


def test_constraint_violations_in_given_texts_are_named_per_hole(
    tokenizer: StencilTokenizer, model: StencilTransformer
) -> None:
    canvas, ids = filled(tokenizer, model)
    texts = {"name": "Zoe", "ref": "ab-12", "who": "Bobby", "data": '{"age":"x","ok":true}'}
    found = {(v.name, v.hole) for v in validate(canvas, ids, tokenizer, hole_texts=texts)}
    assert (PATTERN_MISMATCH, "ref") in found
    assert (CHOICE_MISMATCH, "who") in found
    assert (SCHEMA_INVALID, "data") in found
    texts["data"] = "{not json"
    assert (SCHEMA_INVALID, "data") in {
        (v.name, v.hole) for v in validate(canvas, ids, tokenizer, hole_texts=texts)
    }


def test_an_empty_free_hole_is_a_violation(
    tokenizer: StencilTokenizer, model: StencilTransformer
) -> None:
    canvas, ids = filled(tokenizer, model)
    texts = {**canvas.hole_texts(ids, tokenizer), "name": ""}
    found = validate(canvas, ids, tokenizer, hole_texts=texts)
    assert (EMPTY_HOLE, "name") in {(v.name, v.hole) for v in found}
    assert EMPTY_HOLE not in names(validate(canvas, ids, tokenizer))


def test_a_pattern_with_nested_repeats_is_checked_in_linear_time(
    tokenizer: StencilTokenizer,
) -> None:
    """(a+)+$ backtracks exponentially under re; the automaton reads each character once."""
    import time

    canvas = parse_canvas(
        {"segments": [{"text": "x "}, {"hole": "v", "max_tokens": 40,
                                        "constraint": {"pattern": "(a+)+$"}}]},
        tokenizer, max_len=80,
    )  # fmt: skip
    started = time.perf_counter()
    found = validate(canvas, canvas.ids, tokenizer, hole_texts={"v": "a" * 29 + "!"})
    assert PATTERN_MISMATCH in names(found)
    assert time.perf_counter() - started < 5.0  # re.fullmatch takes about 10 s on this input
