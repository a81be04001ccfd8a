"""The block-diffusion sampler's invariants, on a tiny random model."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_worker.engine.canvas import Canvas, parse_canvas
from gpu_worker.engine.config import CacheMode, CommitRule, CommitRules, SamplerConfig
from gpu_worker.engine.constraints import token_table
from gpu_worker.engine.model import StencilTransformer, hole_room
from gpu_worker.engine.sampler import StepInfo, canvas_sha256, denoise, denoise_batch, plan_blocks
from gpu_worker.engine.tokenizer import StencilTokenizer
from gpu_worker.engine.validation import validate

MAX_LEN = 160
# Every refinement rule off and no cache: a test turns on what it is about.
BARE = SamplerConfig(cache="none", rules=CommitRules(ban_adjacent_repeats=False, neighbour_threshold=0.0,
                                                     hold_shifted_repeats=False, pattern_runs=False))  # fmt: skip


def bare(**fields: Any) -> SamplerConfig:
    """:data:`BARE` with ``fields`` (a rule setting may be named on its own)."""
    return BARE.replace(**fields)

TEXTS = ["Dear ", ", thank you for ", " at ", ".\n", "Ref: ", "", " about"]
PATTERNS = ["\\d{1,3}", "[A-Z]{2}-\\d{2}", "(yes|no)", "[a-z]{1,4}"]
CHOICES = [["Bob", "Dr Smith", "Olga"], ["London", "Paris"]]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer"},
        "ok": {"type": "boolean"},
        "tier": {"enum": ["gold", 2]},
    },
}


def canvas_of(tokenizer: StencilTokenizer, segments: list[dict[str, Any]], seed: int = 0) -> Canvas:
    return parse_canvas({"segments": segments, "seed": seed}, tokenizer, max_len=MAX_LEN)


@st.composite
def segment_lists(draw: st.DrawFn) -> list[dict[str, Any]]:
    segments: list[dict[str, Any]] = []
    for i in range(draw(st.integers(1, 3))):
        text = draw(st.sampled_from(TEXTS))
        if text:
            segments.append({"text": text})
        kind = draw(st.sampled_from(["free", "free", "pattern", "choices", "schema"]))
        hole: dict[str, Any] = {"hole": f"h{i}", "max_tokens": draw(st.integers(1, 6))}
        if kind == "pattern":
            hole["constraint"] = {"pattern": draw(st.sampled_from(PATTERNS))}
            hole["max_tokens"] = 7
        elif kind == "choices":
            hole["constraint"] = {"choices": draw(st.sampled_from(CHOICES))}
            del hole["max_tokens"]
        elif kind == "schema":
            hole["constraint"] = {"schema": SCHEMA}
            hole["max_tokens"] = 4
        segments.append(hole)
    segments.append({"text": draw(st.sampled_from(TEXTS))})
    return segments


sampler_configs = st.builds(
    lambda **fields: bare(**fields),
    block_length=st.integers(1, 8),
    block_scope=st.sampled_from(["canvas", "hole"]),
    steps_per_block=st.integers(1, 4),
    max_steps=st.integers(2, 40),
    commit_rule=st.sampled_from(["even", "threshold", "margin", "entropy"]),
    threshold=st.sampled_from([0.3, 0.6, 0.9]),
    temperature=st.sampled_from([0.0, 0.8]),
    top_p=st.sampled_from([1.0, 0.8]),
    remask=st.sampled_from(["none", "low_confidence"]),
    remask_budget=st.integers(0, 2),
    remask_below=st.sampled_from([0.3, 1.0]),
    stop_on_eos=st.booleans(),
    tail_threshold=st.sampled_from([0.3, 1.0]),
    ban_adjacent_repeats=st.booleans(),
    neighbour_threshold=st.sampled_from([0.0, 0.9]),
    hold_shifted_repeats=st.booleans(),
    cache=st.sampled_from(["none", "dual", "delayed"]),
    cache_refresh=st.integers(0, 3),  # the delayed cache's: once, every block, 2nd, 3rd
    error_budget=st.sampled_from([0.0, 0.3, 2.0]),
    anchored=st.booleans(),
    pattern_runs=st.booleans(),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(segment_lists(), sampler_configs, st.integers(1, 3), st.integers(0, 1000), st.booleans())
def test_step_protect_mask_prevents_editing_under_every_rule_cache_and_batch(
    tokenizer: StencilTokenizer,
    model: StencilTransformer,
    room_model: StencilTransformer,
    segments: list[dict[str, Any]],
    config: SamplerConfig,
    batch: int,
    seed: int,
    with_room: bool,
) -> None:
    model = room_model if with_room else model
    canvases = [canvas_of(tokenizer, segments)] + [
        canvas_of(tokenizer, [{"text": "Dear "}, {"hole": "x", "max_tokens": 2 + b}, {"text": "."}])
        for b in range(batch - 1)
    ]
    steps: dict[int, list[StepInfo]] = {b: [] for b in range(batch)}

    def on_step(row: int, info: StepInfo) -> None:
        canvas = canvases[row]
        assert torch.equal(info.ids[canvas.protect], canvas.ids[canvas.protect])
        assert info.canvas_sha256 == canvas_sha256(info.ids)
        steps[row].append(info)

    generators = [torch.Generator().manual_seed(seed + b) for b in range(batch)]
    results = denoise_batch(model, canvases, config, generators, on_step=on_step)
    for row, (canvas, result) in enumerate(zip(canvases, results, strict=True)):
        assert torch.equal(result.ids[canvas.protect], canvas.ids[canvas.protect])
        assert not bool((result.ids == canvas.mask_id).any()), "a mask token is left"
        assert result.steps == len(steps[row]) <= config.max_steps
        violations = validate(canvas, result.ids, tokenizer)
        if not config.stop_on_eos:  # without the stopping rule an EOS may come first: empty
            violations = [v for v in violations if v.name != "empty_hole"]
        assert violations == []
        for info in steps[row]:
            assert not set(info.remasked) & set(canvas.protect.nonzero().squeeze(-1).tolist())
        for hole in canvas.holes:  # a moved locked space stays the first token's prefix
            first = int(result.ids[hole.start])
            if hole.prefix and first not in canvas.terminators():
                assert tokenizer.token_text(first).startswith(hole.prefix)


def llada_reference_order(
    model: StencilTransformer, canvas: Canvas, steps: int, *, room: bool = True
) -> list[list[int]]:
    """LLaDA's generate() with low-confidence transfer, one block per hole, temperature 0;
    a model with a room embedding is given each position's room unless ``room`` is False."""
    x = canvas.ids.clone()[None]  # [1, L]
    attention = torch.ones_like(x, dtype=torch.bool)
    budgets = [(hole.start, hole.end) for hole in canvas.holes]
    extra = {"room": hole_room(canvas.length, budgets)[None]} if room else {}
    order: list[list[int]] = []
    for hole in canvas.holes:
        in_block = torch.zeros(canvas.length, dtype=torch.bool)
        in_block[hole.start : hole.end] = True
        base, remainder = divmod(hole.max_len, steps)
        schedule = [base + 1] * remainder + [base] * (steps - remainder)
        for k in schedule:
            with torch.no_grad():
                logits = model(x, attention_mask=attention, **extra)[0]  # [L, V]
            logits = logits.masked_fill(~canvas.free_vocab, -torch.inf)
            probs = torch.softmax(logits, dim=-1)
            x0 = probs.argmax(-1)  # [L]
            confidence = probs.gather(-1, x0[:, None]).squeeze(-1)
            confidence = torch.where((x[0] == canvas.mask_id) & in_block, confidence, -torch.inf)
            if k == 0:
                continue  # LLaDA still runs a forward pass here; it commits nothing
            chosen = torch.topk(confidence, k).indices
            x[0, chosen] = x0[chosen]
            order.append(sorted(chosen.tolist()))
    return order


@pytest.mark.parametrize("which", ["model", "room_model"])
@pytest.mark.parametrize("steps", [1, 3, 4])
def test_even_rule_commit_order_equals_the_llada_reference(
    tokenizer: StencilTokenizer, request: pytest.FixtureRequest, steps: int, which: str
) -> None:
    model = request.getfixturevalue(which)
    canvas = canvas_of(tokenizer, [{"text": "Dear"}, {"hole": "a", "max_tokens": 7},
                                   {"text": ", thank you for"}, {"hole": "b", "max_tokens": 2},
                                   {"text": "."}, {"hole": "c", "max_tokens": 5}])  # fmt: skip
    config = bare(commit_rule="even", temperature=0.0, block_scope="hole",
                           block_length=8, steps_per_block=steps, cache="none",
                           stop_on_eos=False, remask="none")  # fmt: skip
    result = denoise(model, canvas, config, torch.Generator().manual_seed(0))
    assert [info.committed for info in result.trace] == llada_reference_order(model, canvas, steps)
    if which == "room_model" and steps > 1:  # the sampler gave the model each position's room
        assert llada_reference_order(model, canvas, steps, room=False) != [
            info.committed for info in result.trace
        ]


@pytest.mark.parametrize(
    ("rule", "field", "value", "steps"),
    [
        ("entropy", "entropy_threshold", 100.0, 1),  # every position passes: one step
        ("margin", "threshold", 1.0, 6),  # none passes: the surest one per step
        ("threshold", "threshold", 1.0, 6),
    ],
)
def test_threshold_rules_commit_all_passing_positions_and_at_least_one(
    tokenizer: StencilTokenizer,
    model: StencilTransformer,
    rule: str,
    field: str,
    value: float,
    steps: int,
) -> None:
    canvas = canvas_of(tokenizer, [{"text": "Dear"}, {"hole": "a", "max_tokens": 6}])
    config = bare(**{"commit_rule": rule, field: value, "stop_on_eos": False})
    result = denoise(model, canvas, config, torch.Generator())
    assert result.steps == steps
    assert sum(len(info.committed) for info in result.trace) == 6


def test_seed_reproducibility(tokenizer: StencilTokenizer, model: StencilTransformer) -> None:
    canvas = canvas_of(
        tokenizer, [{"text": "Dear "}, {"hole": "a", "max_tokens": 6}, {"text": "."}]
    )
    config = bare(temperature=1.0, commit_rule="threshold", threshold=0.5)
    runs = [denoise(model, canvas, config, torch.Generator().manual_seed(s)) for s in (5, 5, 6)]
    hashes = [[i.canvas_sha256 for i in r.trace] for r in runs]
    assert hashes[0] == hashes[1]
    assert torch.equal(runs[0].ids, runs[1].ids)
    assert hashes[0] != hashes[2]


def test_temperature_zero_determinism(
    tokenizer: StencilTokenizer, model: StencilTransformer
) -> None:
    canvas = canvas_of(tokenizer, [{"text": "Dear "}, {"hole": "a", "max_tokens": 6},
                                   {"hole": "b", "max_tokens": 3, "constraint": {"choices": ["Bob", "Olga"]}}])  # fmt: skip
    config = bare(temperature=0.0, commit_rule="even", steps_per_block=3)
    first = denoise(model, canvas, config, torch.Generator().manual_seed(1))
    second = denoise(model, canvas, config, torch.Generator().manual_seed(999))
    assert [i.canvas_sha256 for i in first.trace] == [i.canvas_sha256 for i in second.trace]


@pytest.mark.parametrize("which", ["model", "room_model"])
@pytest.mark.parametrize(("cache", "refresh"), [("none", 1), ("dual", 1), ("delayed", 1),
                                                ("delayed", 0)])  # fmt: skip
def test_batched_equals_unbatched(
    tokenizer: StencilTokenizer,
    request: pytest.FixtureRequest,
    cache: CacheMode,
    refresh: int,
    which: str,
) -> None:
    """Rows of different lengths whose blocks start at different steps and places: with the
    dual cache each row refreshes its own cache rows and steps on its own window (and with a
    room embedding, its window's room)."""
    model = request.getfixturevalue(which)
    canvases = [
        canvas_of(
            tokenizer, [{"text": "Dear "}, {"hole": "a", "max_tokens": 5}, {"text": ", hi."}]
        ),
        canvas_of(
            tokenizer,
            [
                {"hole": "b", "max_tokens": 3},
                {"text": " at the clinic about "},
                {"hole": "c", "max_tokens": 6, "constraint": {"pattern": "\\d{1,3}"}},
            ],
        ),
        canvas_of(tokenizer, [{"text": "Ref "}, {"hole": "d", "max_tokens": 2}]),
    ]
    config = bare(temperature=0.7, commit_rule="threshold", threshold=0.5, block_length=4,
                           cache=cache, cache_refresh=refresh)  # fmt: skip
    alone = [
        denoise(model, c, config, torch.Generator().manual_seed(i)) for i, c in enumerate(canvases)
    ]
    together = denoise_batch(model, canvases, config,
                             [torch.Generator().manual_seed(i) for i in range(3)])  # fmt: skip
    for a, b in zip(alone, together, strict=True):
        assert torch.equal(a.ids, b.ids)
        assert [i.committed for i in a.trace] == [i.committed for i in b.trace]
        for x, y in zip(a.trace, b.trace, strict=True):  # the same probabilities, too
            assert x.confidence == pytest.approx(y.confidence, rel=1e-4, abs=1e-6)


def test_dual_cache_first_step_of_a_block_is_exact(
    tokenizer: StencilTokenizer, model: StencilTransformer
) -> None:
    canvas = canvas_of(tokenizer, [{"text": "Dear "}, {"hole": "a", "max_tokens": 6}, {"text": " at "},
                                   {"hole": "b", "max_tokens": 6}, {"text": "."}])  # fmt: skip
    base = bare(commit_rule="even", steps_per_block=3, block_length=6)
    exact = denoise(model, canvas, base, torch.Generator())
    cached = denoise(model, canvas, base.replace(cache="dual"), torch.Generator())
    assert exact.trace[0].committed == cached.trace[0].committed
    assert exact.steps == cached.steps == 6  # 2 blocks x 3 steps, one forward each


class WindowLog(StencilTransformer):
    """The real model, noting how many positions each window forward recomputes."""

    widths: list[int]

    def forward_window(self, ids: torch.Tensor, **kwargs: Any) -> Any:
        self.widths.append(int(ids.shape[1]) if kwargs.get("positions") is not None else -1)
        return super().forward_window(ids, **kwargs)


@pytest.mark.parametrize("cache", ["dual", "delayed"])
def test_a_cached_step_recomputes_its_window(
    tokenizer: StencilTokenizer, model: StencilTransformer, cache: CacheMode
) -> None:
    """One token per step in a 6-position block: the dual cache recomputes the whole block
    each step; delayed caching the positions still masked plus the one committed last."""
    logged = WindowLog(model.config)
    logged.load_state_dict(model.state_dict())
    logged.eval().widths = []
    canvas = canvas_of(tokenizer, [{"text": "Dear "}, {"hole": "a", "max_tokens": 6},
                                   {"text": " at the clinic."}])  # fmt: skip
    config = bare(commit_rule="even", steps_per_block=6, block_length=6, cache=cache,
                           stop_on_eos=False)  # fmt: skip
    result = denoise(logged, canvas, config, torch.Generator())
    assert [len(info.committed) for info in result.trace] == [1] * 6
    expected = [6] * 5 if cache == "dual" else [6, 5, 4, 3, 2]  # -1 = a full forward
    assert logged.widths == [-1] + expected
    assert validate(canvas, result.ids, tokenizer) == []


@pytest.mark.parametrize(
    ("cache", "refresh", "expected"),
    [("delayed", 1, [-1, 3, 2, -1, 3, 2, -1, 3, 2]),  # a full forward at every block's start
     ("delayed", 2, [-1, 3, 2, 4, 3, 2, -1, 3, 2]),  # at the first and third block's
     ("delayed", 0, [-1, 3, 2, 4, 3, 2, 4, 3, 2]),  # at the first step only
     ("dual", 0, [-1, 3, 3, -1, 3, 3, -1, 3, 3])],  # the dual cache: every block, whatever
)  # fmt: skip
def test_the_delayed_cache_refreshes_at_the_blocks_cache_refresh_names(
    tokenizer: StencilTokenizer,
    model: StencilTransformer,
    cache: CacheMode,
    refresh: int,
    expected: list[int],
) -> None:
    """Three 3-position holes, a block each, one token per step. A block that starts
    without a refresh recomputes its masked positions and the token the previous block
    committed last (its cache entry still holds the mask it was written with)."""
    logged = WindowLog(model.config)
    logged.load_state_dict(model.state_dict())
    logged.eval().widths = []
    canvas = canvas_of(tokenizer, [{"text": "Dear "}, {"hole": "a", "max_tokens": 3},
                                   {"text": " at "}, {"hole": "b", "max_tokens": 3},
                                   {"text": " and "}, {"hole": "c", "max_tokens": 3}])  # fmt: skip
    config = bare(commit_rule="even", steps_per_block=3, block_length=3, cache=cache,
                           cache_refresh=refresh, stop_on_eos=False)  # fmt: skip
    result = denoise(logged, canvas, config, torch.Generator())
    assert [len(info.committed) for info in result.trace] == [1] * 9
    assert logged.widths == expected
    assert validate(canvas, result.ids, tokenizer) == []


def test_cancellation_stops_within_one_step_and_commits_nothing_after(
    tokenizer: StencilTokenizer, model: StencilTransformer
) -> None:
    canvas = canvas_of(tokenizer, [{"text": "Dear "}, {"hole": "a", "max_tokens": 8}])
    config = bare(commit_rule="even", steps_per_block=8, block_length=8)
    asked: list[int] = []

    def should_stop() -> bool:
        asked.append(1)
        return len(asked) > 3

    result = denoise(model, canvas, config, torch.Generator(), should_stop=should_stop)
    assert result.cancelled and result.steps == 3 == len(result.trace)
    assert torch.equal(result.ids, result.trace[-1].ids)
    assert int((result.ids == canvas.mask_id).sum()) == 5


def test_step_budget_flushes_on_the_last_pass(
    tokenizer: StencilTokenizer, model: StencilTransformer
) -> None:
    canvas = canvas_of(tokenizer, [{"text": "Ref: "}, {"hole": "a", "max_tokens": 6},
                                   {"hole": "b", "max_tokens": 7, "constraint": {"pattern": "[A-Z]{2}-\\d{2}"}}])  # fmt: skip
    config = bare(commit_rule="even", steps_per_block=13, block_length=13, max_steps=2)
    result = denoise(model, canvas, config, torch.Generator())
    assert result.steps == 2 and result.trace[-1].flush
    assert not bool((result.ids == canvas.mask_id).any())
    assert validate(canvas, result.ids, tokenizer) == []


class Stand(torch.nn.Module):
    """A stand-in for a model: the backend protocol's ids and max_len are ``like``'s."""

    def __init__(self, like: StencilTransformer) -> None:
        super().__init__()
        self.mask_id, self.pad_id, self.eos_id, self.max_len = (
            like.mask_id, like.pad_id, like.eos_id, like.max_len)  # fmt: skip


class ForcedTokens(Stand):
    """Wraps a model so that a chosen token wins at chosen positions."""

    def __init__(
        self, inner: StencilTransformer, forced: dict[int, int],
        logit: dict[int, float] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(inner)
        self.inner, self.forced = inner, forced
        self.logit = logit or {}  # position -> the forced token's logit (default 1e4: sure)

    def forward(
        self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        logits = self.inner(ids, attention_mask).clone()
        for position, token in self.forced.items():
            logits[:, position, token] = self.logit.get(position, 1e4)
        return logits


class WiderVocab(Stand):
    """Wraps a model so that its vocabulary has ``extra`` more tokens than the canvas's
    tokenizer (as a checkpoint with a padded embedding does), each the surest everywhere."""

    def __init__(self, inner: StencilTransformer, extra: int) -> None:
        super().__init__(inner)
        self.inner, self.extra = inner, extra

    def forward(
        self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        logits = self.inner(ids, attention_mask)
        return torch.cat([logits, logits.new_full((*logits.shape[:-1], self.extra), 1e4)], -1)


@pytest.mark.parametrize("rule", ["threshold", "even"])
def test_a_model_vocabulary_wider_than_the_canvas_never_writes_its_extra_tokens(
    tokenizer: StencilTokenizer, model: StencilTransformer, rule: CommitRule
) -> None:
    canvas = canvas_of(tokenizer, [
        {"text": "Dear"}, {"hole": "a", "max_tokens": 4}, {"text": " ref "},
        {"hole": "b", "max_tokens": 7, "constraint": {"pattern": "[A-Z]{2}-\\d{2}"}},
        {"text": " in "}, {"hole": "c", "constraint": {"choices": CHOICES[1]}}, {"text": "."},
    ])  # fmt: skip
    config = bare(commit_rule=rule, block_length=8, steps_per_block=8)
    result = denoise(WiderVocab(model, 8), canvas, config, torch.Generator())
    assert int(result.ids.max()) < tokenizer.vocab_size  # the extra tokens were never written
    assert not bool((result.ids == canvas.mask_id).any())
    assert validate(canvas, result.ids, tokenizer) == []


class Ballot(Stand):
    """A model with fixed logits: ``votes`` maps a position to {token: logit}; 0 elsewhere."""

    def __init__(
        self, like: StencilTransformer, vocab: int, votes: dict[int, dict[int, float]]
    ) -> None:
        super().__init__(like)
        self.vocab, self.votes = vocab, votes

    def forward(
        self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        logits = torch.zeros((*ids.shape, self.vocab))
        for position, votes in self.votes.items():
            for token, logit in votes.items():
                logits[:, position, token] = logit
        return logits


class Beliefs(Ballot):
    """A model whose belief never changes: at each position in ``sure``, its token with the
    given probability (over ``vocab`` tokens), every other token even; elsewhere uniform."""

    def __init__(
        self, like: StencilTransformer, vocab: int, sure: dict[int, tuple[int, float]]
    ) -> None:
        super().__init__(like, vocab, {position: {token: math.log(p * (vocab - 1) / (1 - p))}
                                       for position, (token, p) in sure.items()})  # fmt: skip


def four_words(
    tokenizer: StencilTokenizer, model: StencilTransformer, probs: list[float],
    config: SamplerConfig, *, two_holes: bool = False,
) -> tuple[list[list[int]], list[int], list[int]]:  # fmt: skip
    """Denoise a four-token hole (``two_holes``: two two-token holes, touching) under
    :class:`Beliefs` sure of four words with ``probs``: each step's committed positions
    (0-3), the words and the holes' ids after."""
    holes = ([{"hole": "a", "max_tokens": 2}, {"hole": "b", "max_tokens": 2}] if two_holes
             else [{"hole": "a", "max_tokens": 4}])  # fmt: skip
    canvas = canvas_of(tokenizer, [{"text": "Dear"}, *holes, {"text": " the end."}])
    start = canvas.holes[0].start
    words = [word_token(tokenizer, w) for w in (" Smith", " thank", " London", " for")]
    beliefs = zip(words, probs, strict=True)
    sure = {start + i: (token, p) for i, (token, p) in enumerate(beliefs)}
    result = denoise(Beliefs(model, tokenizer.vocab_size, sure), canvas, config, torch.Generator())
    order = [[p - start for p in info.committed] for info in result.trace]
    return order, words, result.ids[start : start + 4].tolist()


@pytest.mark.parametrize(("budget", "steps"), [(0.0, [[1, 2, 3, 4]]), (0.25, [[2, 3], [4], [1]]),
                                               (0.05, [[2], [3], [4], [1]])])  # fmt: skip
def test_an_error_budget_commits_the_likeliest_tokens_while_their_error_sum_fits(
    tokenizer: StencilTokenizer, model: StencilTransformer, budget: float, steps: list[list[int]]
) -> None:
    config = bare(commit_rule="threshold", threshold=0.5, error_budget=budget)
    order, words, written = four_words(tokenizer, model, [0.6, 0.97, 0.9, 0.8], config)
    # 0.97 and 0.9 spend 0.13 of 0.25; 0.8 would bring it to 0.33, so it waits a step
    assert [[p + 1 for p in step] for step in order] == steps
    assert written == words


# (probabilities of the four words, two touching holes, the passes anchored, the first
# pass unanchored): only the third word sure, amid masked positions (an island); holes a
# (0, 1) and b (2, 3) touching, a written from "Dear", b's first word sure but both its
# neighbours masked when the pass begins (b starts only once a is written, as _apart's bar
# stops at a hole's edge)
ANCHORING = [([0.3, 0.3, 0.99, 0.2], False, [[0], [1], [2], [3]], [2]),
             ([0.99, 0.99, 0.99, 0.2], True, [[0, 1], [2], [3]], [0, 1, 2])]  # fmt: skip


@pytest.mark.parametrize("anchored", [True, False])
@pytest.mark.parametrize(("probs", "two_holes", "passes", "first"), ANCHORING)
def test_anchored_commits_grow_from_written_text_inside_their_hole(
    tokenizer: StencilTokenizer, model: StencilTransformer, anchored: bool, probs: list[float],
    two_holes: bool, passes: list[list[int]], first: list[int],
) -> None:  # fmt: skip
    config = bare(commit_rule="threshold", threshold=0.5, anchored=anchored)
    order, words, written = four_words(tokenizer, model, probs, config, two_holes=two_holes)
    if anchored:  # the surest anchored position first, then each next to written text
        assert order == passes
    else:
        assert order[0] == first
    assert written == words


# (pattern_runs, neighbour_threshold, each step's committed offsets in the hole): the model
# is sure of "AB-1" and EOS, and torn between "2" and "7" at the last digit (p = 1/2 each);
# a run carries no letter, so "B" waits for the pass after "A"
PATTERN_RUNS = [(False, 0.0, [[0], [1], [2], [3], [4], [5]]),
                (True, 0.0, [[0], [1, 2, 3, 4, 5]]),
                (True, 0.9, [[0], [1, 2, 3], [4, 5]])]  # fmt: skip


@pytest.mark.parametrize(("runs", "bar", "steps"), PATTERN_RUNS)
def test_a_pattern_hole_writes_its_sure_run_without_letters_in_one_pass(
    tokenizer: StencilTokenizer, model: StencilTransformer, runs: bool, bar: float,
    steps: list[list[int]],
) -> None:  # fmt: skip
    canvas = canvas_of(tokenizer, [{"text": "Ref:"}, {"hole": "a", "max_tokens": 7,
                                   "constraint": {"pattern": "[A-Z]{2}-\\d{2}"}}, {"text": "."}])  # fmt: skip
    start = canvas.holes[0].start
    chars = [tokenizer.encode(c) for c in "AB-127"]
    assert all(len(ids) == 1 for ids in chars), "each character is one token"
    a, b, dash, one, two, seven = (ids[0] for ids in chars)
    votes = {start + i: {token: 20.0} for i, token in enumerate([a, b, dash, one])}
    votes[start + 4] = {two: 20.0, seven: 20.0}
    votes[start + 5] = {model.eos_id: 20.0}
    config = bare(commit_rule="threshold", threshold=0.3, neighbour_threshold=bar,
                           pattern_runs=runs)  # fmt: skip
    result = denoise(Ballot(model, tokenizer.vocab_size, votes), canvas, config, torch.Generator())
    assert [[p - start for p in info.committed] for info in result.trace] == steps
    assert result.trace[-1].padded == [start + 6]  # EOS ends the hole: the rest is padded
    assert result.hole_texts["a"] in ("AB-12", "AB-17")
    assert validate(canvas, result.ids, tokenizer) == []


def test_eos_in_a_hole_ends_it_and_the_tail_is_stripped(
    tokenizer: StencilTokenizer, model: StencilTransformer
) -> None:
    canvas = canvas_of(tokenizer, [{"text": "Dear"}, {"hole": "a", "max_tokens": 6}, {"text": "."}])
    start = canvas.holes[0].start
    config = bare(commit_rule="threshold", threshold=0.99)
    wrapped = ForcedTokens(model, {start + 2: model.eos_id})
    result = denoise(wrapped, canvas, config, torch.Generator())
    # EOS is the surest token, but it waits until the positions before it are written; it
    # then ends the hole in the very pass that writes the last of them.
    def step_of(position: int) -> int:
        return next(i for i, info in enumerate(result.trace) if position in info.committed)

    eos_step = step_of(start + 2)
    assert eos_step == max(step_of(start), step_of(start + 1))
    written = {p for info in result.trace[: eos_step + 1] for p in info.committed}
    tail = {start + 3, start + 4, start + 5}
    assert set(result.trace[eos_step].padded) == tail - written  # the rest of the hole, at once
    assert result.steps == eos_step + 1
    assert result.ids[start + 2 :].tolist()[:4] == [canvas.pad_id] * 4
    assert result.hole_texts["a"] == tokenizer.decode(result.ids[start : start + 2].tolist())


class HalfSure(Stand):
    """Wraps a model so that chosen tokens win at chosen positions (logit 1e4) and one token
    has probability one half at one position."""

    def __init__(
        self, inner: StencilTransformer, forced: dict[int, int], half: tuple[int, int]
    ) -> None:
        super().__init__(inner)
        self.forced, self.target = ForcedTokens(inner, forced), half

    def forward(
        self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        logits = self.forced(ids, attention_mask)
        position, token = self.target
        others = logits[:, position].clone()
        others[:, token] = -torch.inf
        logits[:, position, token] = torch.logsumexp(others, dim=-1)  # p = 1/2
        return logits


@pytest.mark.parametrize("bar", [0.0, 0.9])
def test_an_unsure_end_waits_a_step_when_it_is_below_the_neighbour_threshold(
    tokenizer: StencilTokenizer, model: StencilTransformer, bar: float
) -> None:
    canvas = canvas_of(tokenizer, [{"text": "Dear"}, {"hole": "a", "max_tokens": 2}, {"text": "."}])
    start = canvas.holes[0].start
    london = word_token(tokenizer, " London")
    wrapped = HalfSure(model, {start: london}, (start + 1, model.eos_id))
    config = bare(commit_rule="threshold", threshold=0.3, neighbour_threshold=bar,
                           cache="none")  # fmt: skip
    result = denoise(wrapped, canvas, config, torch.Generator())
    committed = [info.committed for info in result.trace]
    if bar == 0.0:  # the end (p = 0.5 >= 0.3) is released with the word before it
        assert committed == [[start, start + 1]]
    else:  # below the bar it waits, and is judged again once " London" is written
        assert committed == [[start], [start + 1]]
    assert int(result.ids[start + 1]) in canvas.terminators() and result.hole_texts["a"] == " London"


@pytest.mark.parametrize("bar", [0.0, 0.9])
def test_a_token_written_with_its_left_neighbour_needs_the_neighbour_threshold(
    tokenizer: StencilTokenizer, model: StencilTransformer, bar: float
) -> None:
    canvas = canvas_of(tokenizer, [{"text": "Dear"}, {"hole": "a", "max_tokens": 5}, {"text": "."}])
    start = canvas.holes[0].start
    smith, invoice = word_token(tokenizer, " Smith"), word_token(tokenizer, " invoice")
    # sure of " Smith" two places in; half sure of " invoice" right after it
    wrapped = HalfSure(model, {start + 2: smith}, (start + 3, invoice))
    config = bare(commit_rule="threshold", threshold=0.3, neighbour_threshold=bar,
                           stop_on_eos=False, cache="none")  # fmt: skip
    result = denoise(wrapped, canvas, config, torch.Generator())
    first = result.trace[0].committed
    assert start + 2 in first  # sure enough for any bar
    if bar == 0.0:
        assert start + 3 in first  # half sure, and written in the same step as " Smith"
    else:  # below the bar beside a token written in the same step: it waits one step
        assert start + 3 not in first and start + 3 in result.trace[1].committed
    assert int(result.ids[start + 3]) == invoice  # once " Smith" is settled, 0.5 will do
    assert not bool((result.ids == canvas.mask_id).any())


@pytest.mark.parametrize("tail_threshold", [0.5, 1.0])
def test_a_hole_tail_the_model_calls_unused_is_padded_from_the_end_in_the_first_pass(
    tokenizer: StencilTokenizer, model: StencilTransformer, tail_threshold: float
) -> None:
    canvas = canvas_of(tokenizer, [{"text": "Dear"}, {"hole": "a", "max_tokens": 7}, {"text": "."}])
    end = canvas.holes[0].end
    # pad is sure at the last two positions and at one that an unsure position cuts off
    forced = [end - 1, end - 2, end - 4]
    config = bare(commit_rule="threshold", threshold=0.99, tail_threshold=tail_threshold)
    wrapped = ForcedTokens(model, dict.fromkeys(forced, model.pad_id))
    result = denoise(wrapped, canvas, config, torch.Generator())
    if tail_threshold < 1.0:
        assert result.trace[0].padded == [end - 2, end - 1]
    else:  # off: a pad waits until every position before it is written
        assert result.trace[0].padded == []
        assert all(end - 1 not in info.committed for info in result.trace[:-1])
    assert result.ids[end - 2 : end].tolist() == [canvas.pad_id] * 2
    assert not bool((result.ids == canvas.mask_id).any())
    assert result.hole_texts["a"] == tokenizer.decode(canvas.kept_tokens(result.ids, canvas.holes[0]))


def test_the_tail_rule_never_pads_a_holes_first_position(
    tokenizer: StencilTokenizer, model: StencilTransformer
) -> None:
    canvas = canvas_of(tokenizer, [{"text": "Dear"}, {"hole": "a", "max_tokens": 5}, {"text": "."}])
    start, end = canvas.holes[0].start, canvas.holes[0].end
    config = bare(commit_rule="threshold", threshold=0.9, tail_threshold=0.5)
    wrapped = ForcedTokens(model, dict.fromkeys(range(start, end), model.pad_id))
    result = denoise(wrapped, canvas, config, torch.Generator())
    assert result.trace[0].padded == list(range(start + 1, end))
    assert int(result.ids[start]) not in canvas.terminators() and result.hole_texts["a"] != ""
    assert result.steps == 1


def word_token(tokenizer: StencilTokenizer, text: str) -> int:
    (token,) = tokenizer.encode(text)
    assert token in token_table(tokenizer, tokenizer.vocab_size).words
    return token


@pytest.mark.parametrize("ban", [True, False])
def test_adjacent_positions_never_repeat_a_word_when_repeats_are_banned(
    tokenizer: StencilTokenizer, model: StencilTransformer, ban: bool
) -> None:
    canvas = canvas_of(tokenizer, [{"text": "Dear"}, {"hole": "a", "max_tokens": 5},
                                   {"text": " the end."}])  # fmt: skip
    start = canvas.holes[0].start
    word, the = word_token(tokenizer, " Smith"), word_token(tokenizer, " the")
    # the model is sure of " Smith" at three neighbours and of " the" before the locked " the"
    forced = {start + 1: word, start + 2: word, start + 3: word, start + 4: the}
    config = bare(commit_rule="threshold", threshold=0.9, ban_adjacent_repeats=ban)
    result = denoise(ForcedTokens(model, forced), canvas, config, torch.Generator())
    ids = result.ids[start - 1 : canvas.holes[0].end + 1].tolist()
    kept = [t for t in ids if t not in canvas.terminators()]
    repeats = [a for a, b in zip(kept, kept[1:], strict=False) if a == b]
    if ban:
        assert repeats == []
        # the three sure " Smith" were proposed in one step: only the leftmost was committed
        assert int(result.ids[start + 1]) == word and start + 2 not in result.trace[0].committed
    else:
        assert word in repeats and the in repeats
    assert not bool((result.ids == canvas.mask_id).any())


@pytest.mark.parametrize("rule", ["threshold", "even"])
@pytest.mark.parametrize("hold", [True, False])
def test_a_word_proposed_at_two_masked_neighbours_is_committed_at_the_left_one_first(
    tokenizer: StencilTokenizer, model: StencilTransformer, rule: CommitRule, hold: bool
) -> None:
    canvas = canvas_of(tokenizer, [{"text": "Patient:"}, {"hole": "a", "max_tokens": 5},
                                   {"text": " presented."}])  # fmt: skip
    start = canvas.holes[0].start
    word = word_token(tokenizer, " Smith")
    # the model is sure of " Smith" at the hole's third position and a little less (about
    # 0.98) at its second: the third is the surer, as in "Melissa was Wright"
    wrapped = ForcedTokens(model, {start + 1: word, start + 2: word}, logit={start + 1: 15.0})
    config = bare(commit_rule=rule, threshold=0.9, block_length=8, steps_per_block=8,
                           hold_shifted_repeats=hold)  # fmt: skip
    result = denoise(wrapped, canvas, config, torch.Generator())
    first = {p: next(i for i, info in enumerate(result.trace) if p in info.committed)
             for p in (start + 1, start + 2)}  # fmt: skip
    if hold:  # the right one waits while its left neighbour, proposed the same word, is masked
        assert first[start + 1] < first[start + 2]
    elif rule == "even":  # one per step, the surest first: the right one
        assert first[start + 2] < first[start + 1]
    else:  # both sure: committed together
        assert first[start + 1] == first[start + 2] == 0
    assert not bool((result.ids == canvas.mask_id).any())


@pytest.mark.parametrize("stop_on_eos", [True, False])
def test_a_free_hole_is_never_left_empty_when_eos_stops_it(
    tokenizer: StencilTokenizer, model: StencilTransformer, stop_on_eos: bool
) -> None:
    canvas = canvas_of(tokenizer, [{"text": "Dear"}, {"hole": "a", "max_tokens": 4}, {"text": "."}])
    start = canvas.holes[0].start
    config = bare(commit_rule="threshold", threshold=0.5, stop_on_eos=stop_on_eos)
    result = denoise(ForcedTokens(model, {start: model.eos_id}), canvas, config, torch.Generator())
    first = int(result.ids[start])
    if stop_on_eos:
        assert first not in canvas.terminators() and result.hole_texts["a"] != ""
    else:  # without the stopping rule the forced EOS is taken as it comes: an empty hole
        assert first in canvas.terminators() and result.hole_texts["a"] == ""


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 10_000))
def test_choices_are_committed_whole_never_mixed(
    tokenizer: StencilTokenizer, model: StencilTransformer, seed: int
) -> None:
    choices = ["Dr Smith", "Bob", "the clinic"]
    canvas = canvas_of(tokenizer, [{"text": "Dear "}, {"hole": "who", "constraint": {"choices": choices}},
                                   {"text": ","}])  # fmt: skip
    config = bare(temperature=2.0)
    result = denoise(model, canvas, config, torch.Generator().manual_seed(seed))
    assert result.hole_texts["who"] in choices
    assert result.trace[0].committed == list(range(canvas.holes[0].start, canvas.holes[0].end))


def test_bf16_precision_runs_and_stays_valid(
    tokenizer: StencilTokenizer, model: StencilTransformer
) -> None:
    canvas = canvas_of(tokenizer, [{"text": "Dear "}, {"hole": "a", "max_tokens": 4},
                                   {"hole": "n", "max_tokens": 4, "constraint": {"pattern": "\\d{2}"}}])  # fmt: skip
    result = denoise(
        model, canvas, bare(precision="bf16", cache="dual"), torch.Generator()
    )
    assert validate(canvas, result.ids, tokenizer) == []


def test_remasking_reconsiders_unsure_tokens(
    tokenizer: StencilTokenizer, model: StencilTransformer
) -> None:
    canvas = canvas_of(tokenizer, [{"text": "Dear "}, {"hole": "a", "max_tokens": 8}])
    config = bare(commit_rule="even", steps_per_block=8, block_length=8,
                           remask="low_confidence", remask_budget=1, remask_below=1.0)  # fmt: skip
    result = denoise(model, canvas, config, torch.Generator())
    remasked = [p for info in result.trace for p in info.remasked]
    assert remasked and len(remasked) == len(set(remasked))  # each position at most once
    assert not bool((result.ids == canvas.mask_id).any())


def test_blocks_advance_left_to_right_and_never_cut_a_choice(tokenizer: StencilTokenizer) -> None:
    canvas = canvas_of(tokenizer, [{"hole": "a", "max_tokens": 5},
                                   {"hole": "b", "constraint": {"choices": ["Dr Smith", "Bob"]}},
                                   {"hole": "c", "max_tokens": 3}])  # fmt: skip
    blocks = plan_blocks(canvas, bare(block_length=4))
    flat = torch.cat(blocks).tolist()
    assert flat == sorted(flat) == list(range(canvas.length))
    b = canvas.holes[1]
    assert any(set(range(b.start, b.end)) <= set(blk.tolist()) for blk in blocks)
    per_hole = plan_blocks(canvas, bare(block_length=4, block_scope="hole"))
    assert [len(blk) for blk in per_hole] == [4, 1, b.max_len, 3]


def test_bad_inputs_raise_value_errors(
    tokenizer: StencilTokenizer, model: StencilTransformer
) -> None:
    canvas = canvas_of(tokenizer, [{"hole": "a", "max_tokens": 2}])
    with pytest.raises(ValueError, match="one torch.Generator per canvas"):
        denoise_batch(model, [canvas, canvas], bare(), [torch.Generator()])
    with pytest.raises(ValueError, match="config="):
        denoise(model, canvas, {"cache": "none"}, torch.Generator())  # type: ignore[arg-type]
