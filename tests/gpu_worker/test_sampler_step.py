"""The step function's invariants, on random logits: whatever the model says, a step keeps
the locked text, commits only inside its block, and settles at least one masked position."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_worker.engine.canvas import Canvas, parse_canvas
from gpu_worker.engine.config import CommitRules, SamplerConfig
from gpu_worker.engine.sampler import (
    RowState,
    StepLogits,
    advance,
    rules_for,
    start_state,
    step,
)
from gpu_worker.engine.tokenizer import StencilTokenizer

MAX_LEN = 160
TEXTS = ["Dear ", ", thank you for ", " at ", ".\n", "Ref: "]
CONSTRAINTS: list[dict[str, Any] | None] = [
    None, None, {"pattern": "\\d{1,3}"}, {"pattern": "[A-Z]{2}-\\d{2}"},
    {"choices": ["Bob", "Dr Smith", "Olga"]},
]  # fmt: skip

step_configs = st.builds(
    SamplerConfig,
    block_length=st.integers(1, 8),
    block_scope=st.sampled_from(["canvas", "hole"]),
    steps_per_block=st.integers(1, 4),
    max_steps=st.integers(2, 12),
    commit_rule=st.sampled_from(["even", "threshold", "margin", "entropy"]),
    threshold=st.sampled_from([0.3, 0.6, 0.9]),
    temperature=st.sampled_from([0.0, 0.8]),
    top_p=st.sampled_from([1.0, 0.8]),
    remask=st.sampled_from(["none", "low_confidence"]),
    remask_below=st.sampled_from([0.3, 1.0]),
    stop_on_eos=st.booleans(),
    cache=st.just("none"),  # the step never sees the cache
    rules=st.builds(
        CommitRules,
        ban_adjacent_repeats=st.booleans(),
        neighbour_threshold=st.sampled_from([0.0, 0.9]),
        hold_shifted_repeats=st.booleans(),
        pattern_runs=st.booleans(),
        anchored=st.booleans(),
        error_budget=st.sampled_from([0.0, 0.3]),
        tail_threshold=st.sampled_from([0.3, 1.0]),
    ),
)


@st.composite
def canvases(draw: st.DrawFn, tokenizer: StencilTokenizer) -> Canvas:
    segments: list[dict[str, Any]] = []
    for i in range(draw(st.integers(1, 3))):
        segments.append({"text": draw(st.sampled_from(TEXTS))})
        hole: dict[str, Any] = {"hole": f"h{i}", "max_tokens": draw(st.integers(1, 6))}
        constraint = draw(st.sampled_from(CONSTRAINTS))
        if constraint is not None:
            hole["constraint"] = constraint
            hole["max_tokens"] = 7  # a pattern's longest match fits
        if constraint is not None and "choices" in constraint:
            del hole["max_tokens"]  # a choices hole is as long as its longest choice
        segments.append(hole)
    segments.append({"text": draw(st.sampled_from(TEXTS))})
    return parse_canvas({"segments": segments, "seed": 0}, tokenizer, max_len=MAX_LEN)


def random_logits(canvas: Canvas, vocab: int, generator: torch.Generator) -> StepLogits:
    """Peaky random logits for every position (the step reads the ones it needs)."""
    values = torch.randn((canvas.length, vocab), generator=generator) * 4  # [L, V]
    return StepLogits(values, torch.arange(canvas.length))


def walk(
    tokenizer: StencilTokenizer, canvas: Canvas, config: SamplerConfig, seed: int
) -> list[tuple[RowState, Any]]:
    """Every (state, step output) of one canvas under random logits, until it is done."""
    generator = torch.Generator().manual_seed(seed)
    state = start_state(canvas, config, torch.device("cpu"))
    out = []
    while not state.done:
        output = step(random_logits(canvas, tokenizer.vocab_size, generator), state, config, generator)
        out.append((state, output))
        state = advance(state, output)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])  # fmt: skip
@given(data=st.data(), config=step_configs, seed=st.integers(0, 10_000))
def test_step_never_changes_a_locked_position(
    tokenizer: StencilTokenizer, data: st.DataObject, config: SamplerConfig, seed: int
) -> None:
    canvas = data.draw(canvases(tokenizer))
    for _, output in walk(tokenizer, canvas, config, seed):
        assert torch.equal(output.ids[canvas.protect], canvas.ids[canvas.protect])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])  # fmt: skip
@given(data=st.data(), config=step_configs, seed=st.integers(0, 10_000))
def test_step_never_commits_outside_the_active_block(
    tokenizer: StencilTokenizer, data: st.DataObject, config: SamplerConfig, seed: int
) -> None:
    canvas = data.draw(canvases(tokenizer))
    for state, output in walk(tokenizer, canvas, config, seed):
        if output.flush:  # the budget's last pass commits the whole canvas
            continue
        block = set(state.active_block().tolist())
        assert set(output.committed) <= block
        assert set(output.remasked) <= block
        changed = (output.ids != state.ids).nonzero().squeeze(-1).tolist()
        holes = {p for hole in canvas.holes for p in range(hole.start, hole.end)}
        # a write lands in the block; only an EOS / pad ending a hole pads its tail beyond it
        assert set(changed) <= block | (set(output.padded) & holes)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])  # fmt: skip
@given(data=st.data(), config=step_configs, seed=st.integers(0, 10_000))
def test_step_settles_at_least_one_masked_position_while_masks_remain(
    tokenizer: StencilTokenizer, data: st.DataObject, config: SamplerConfig, seed: int
) -> None:
    canvas = data.draw(canvases(tokenizer))
    tail_padding = rules_for(config).tail is not None
    for state, output in walk(tokenizer, canvas, config, seed):
        assert bool((state.ids[state.active_block()] == canvas.mask_id).any())
        if tail_padding:  # a tail the model calls unused may be all a step settles
            assert len(output.committed) + len(output.padded) >= 1
        else:
            assert len(output.committed) >= 1
    assert len(walk(tokenizer, canvas, config, seed)) <= config.max_steps


def test_step_is_pure_it_changes_neither_its_state_nor_its_logits(
    tokenizer: StencilTokenizer,
) -> None:
    canvas = parse_canvas({"segments": [{"text": "Dear "}, {"hole": "a", "max_tokens": 6},
                                        {"text": "."}], "seed": 0}, tokenizer, max_len=MAX_LEN)  # fmt: skip
    config = SamplerConfig(cache="none", threshold=0.3)
    state = start_state(canvas, config, torch.device("cpu"))
    logits = random_logits(canvas, tokenizer.vocab_size, torch.Generator().manual_seed(1))
    before = (state.ids.clone(), state.confidence.clone(), dict(state.pattern_state), logits.values.clone())
    first = step(logits, state, config, torch.Generator().manual_seed(2))
    again = step(logits, state, config, torch.Generator().manual_seed(2))
    assert torch.equal(state.ids, before[0]) and torch.allclose(state.confidence, before[1], equal_nan=True)
    assert dict(state.pattern_state) == before[2] and torch.equal(logits.values, before[3])
    assert torch.equal(first.ids, again.ids) and first.committed == again.committed != []


def test_a_done_state_is_refused(tokenizer: StencilTokenizer) -> None:
    canvas = parse_canvas({"segments": [{"text": "Dear "}, {"hole": "a", "max_tokens": 2}],
                           "seed": 0}, tokenizer, max_len=MAX_LEN)  # fmt: skip
    config = SamplerConfig(cache="none", max_steps=1)  # one pass: the flush
    state = start_state(canvas, config, torch.device("cpu"))
    logits = random_logits(canvas, tokenizer.vocab_size, torch.Generator())
    done = advance(state, step(logits, state, config, torch.Generator()))
    assert done.done and not bool((done.ids == canvas.mask_id).any())
    with pytest.raises(ValueError, match="state is done"):
        step(logits, done, config, torch.Generator())


def test_rules_for_names_the_rules_a_config_switches_on() -> None:
    assert rules_for(SamplerConfig()).names == [
        "choices", "stop_on_eos", "hold_shifted_repeats", "threshold", "neighbour_threshold",
        "release_ends", "ban_adjacent_repeats", "pattern_runs",
    ]  # fmt: skip
    careful = SamplerConfig(commit_rule="even", remask="low_confidence",
                            rules=CommitRules(neighbour_threshold=0.0, pattern_runs=False))  # fmt: skip
    assert rules_for(careful).names == ["choices", "stop_on_eos", "hold_shifted_repeats", "even",
                                        "ban_adjacent_repeats", "remask"]  # fmt: skip
