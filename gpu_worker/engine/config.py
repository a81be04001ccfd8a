"""SamplerConfig: every control surface of the block-diffusion sampler in one frozen dataclass.

The config is stored on the job and in the run record, so it has one canonical JSON form
(sorted keys, no spaces) and a sha256 of that form. ``from_json`` round-trips it and rejects
unknown fields; ``config_from_overrides`` starts from a named preset.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Literal, get_args

CommitRule = Literal["even", "threshold", "margin", "entropy"]
RemaskPolicy = Literal["none", "low_confidence"]
Precision = Literal["fp32", "bf16"]
CacheMode = Literal["none", "dual", "delayed"]
BlockScope = Literal["canvas", "hole"]

# Fields added after configs were first stored; each one's dataclass default decodes as
# before it existed, and the canonical JSON leaves the field out at that value.
ADDED_LATER = ("tail_threshold", "ban_adjacent_repeats", "neighbour_threshold",
               "hold_shifted_repeats", "cache_refresh", "error_budget", "anchored", "pattern_runs")  # fmt: skip

_CHOICES: dict[str, tuple[str, ...]] = {
    "commit_rule": get_args(CommitRule),
    "remask": get_args(RemaskPolicy),
    "precision": get_args(Precision),
    "cache": get_args(CacheMode),
    "block_scope": get_args(BlockScope),
}


@dataclass(frozen=True)
class SamplerConfig:
    """How one request is denoised. Every field is part of the audit record."""

    # Maskable (hole) positions per block. Blocks advance left to right across the canvas;
    # attention stays bidirectional, so a block sees the locked text on both sides.
    block_length: int = 32
    # "canvas": a block packs the next block_length hole positions, across holes;
    # "hole": a block never spans two holes (a short hole is a block of its own).
    block_scope: BlockScope = "canvas"
    # `even` rule: the steps a block's masked positions are spread over (LLaDA's schedule:
    # ceil(masked left / steps left) per step, so the remainder lands on the earliest steps).
    # The threshold rules ignore it: they stop when the block is done.
    steps_per_block: int = 32
    # Request budget: the most forward passes (= steps) for the whole canvas. When one pass is
    # left, that last pass commits every remaining masked position (a "flush").
    max_steps: int = 512
    # Which masked positions of the active block are committed at each step:
    #   even      - a fixed quota per step, the most confident first;
    #   threshold - every position whose probability >= threshold (at least one), Fast-dLLM;
    #   margin    - every position whose top-1 minus top-2 probability >= threshold (>= one);
    #   entropy   - every position whose predictive entropy <= entropy_threshold (>= one).
    commit_rule: CommitRule = "threshold"
    # Probability (threshold rule) or probability margin (margin rule) needed to commit.
    threshold: float = 0.9
    # Highest predictive entropy, in nats, at which the entropy rule commits a position.
    entropy_threshold: float = 0.5
    # Softmax temperature for the token at each position; 0 = argmax (independent of seed).
    temperature: float = 0.0
    # Nucleus sampling: keep the smallest set of tokens whose probability sums to top_p.
    top_p: float = 1.0
    # Re-masking of committed tokens so the model can reconsider them:
    #   none            - a committed token stays;
    #   low_confidence  - after each step, re-mask up to remask_budget committed, unlocked,
    #                     unconstrained tokens of the active block whose current probability
    #                     is below remask_below (the least confident first).
    remask: RemaskPolicy = "none"
    # The most tokens re-masked in one step (always fewer than the step committed).
    remask_budget: int = 1
    # Only tokens whose probability under the current step's logits is below this re-mask.
    remask_below: float = 0.3
    # Stopping rule inside a hole: when EOS or pad is committed, the rest of the hole is
    # filled with pad at once (no more steps spent on it). Where a free hole ends is decided
    # after what it says: an EOS / pad waits while an earlier position of its hole is still
    # masked, and a free hole's first position never takes one (it is never left empty).
    # The tail after the first EOS / pad is always stripped from the hole's text, whatever
    # this says.
    stop_on_eos: bool = True
    # With stop_on_eos, how a free hole's unused budget is found: before each step commits,
    # the hole's masked tail is padded from its last position leftwards while the model gives
    # EOS and pad together more than this probability (never the hole's first position; the
    # walk stops at a committed token). The model judges a hole's length best while the hole
    # is still masked: once its first tokens are written it tends to read the masks after
    # them as more text and runs on ("Dr. Anderson" -> "Dr. Anderson\n\nJ"). 1.0 turns it
    # off (no probability is above it), the behaviour before the field existed: a stored
    # config without it replays as it ran. At 0.8 it lifted the phase-8 denoiser's entity
    # exact match on the validation split (0.75 -> 0.85 on 40 right-context holes). The
    # phase-9 denoiser learned to end holes itself (train.mask_hole_tails) and does as well or
    # better without it (validation, every preset), so the presets leave it off; it stays for
    # models that run on, such as an external checkpoint.
    tail_threshold: float = 1.0
    # A free hole position may not take the word token (one holding a letter) written right
    # before it or right after it (the next position that is not tail pad): parallel commits
    # repeat a word whose place the model is unsure of ("J Carter Carter", "and and and").
    # The generated corpus has 1 such pair in 39,867 tokens; the denoiser's fills had 2 in
    # 100 tokens before this rule. Two neighbours committed in one step keep only the left
    # one (except in the flush, the last pass of a spent budget, which commits everything).
    # False: off, the behaviour before the field existed; the presets turn it on.
    ban_adjacent_repeats: bool = False
    # Threshold rules: a position committed in the same step as its left neighbour (in its
    # hole) needs at least this probability as well as passing the rule; so does an EOS /
    # pad that would end its hole in the same step as the hole's last words. Each was judged
    # with that neighbour masked, so two neighbours written together from a low threshold
    # need not fit ("Hicks" + EOS for "Hicks Inc", "Jason Schro" + EOS); one below the bar
    # waits a step and is judged again with its neighbour in place. Tokens further apart
    # still commit together at the rule's threshold. Chosen on the validation split over a
    # bar on ends alone and a bar on every token right of a masked one (which kept exact
    # match but halved tokens per pass); bench/sampler/THRESHOLD_STUDY*.md. The presets set
    # 0.9. 0.0 is off, the behaviour before the field existed.
    neighbour_threshold: float = 0.0
    # A free-hole position waits a step while its left neighbour in its hole is still masked
    # and the model proposes the same word token for both: it is unsure which of the two
    # positions the word belongs to. Committed at the right one first, the word leaves a gap
    # the model must fill with something: "Melissa was Wright" for "Melissa Wright", where
    # " Wright" was likelier at the hole's third position (0.61) than at its second (0.17)
    # and was committed there first. The leftmost of such a run may commit (a hole's first
    # masked position always may), so every step still commits. Every commit rule; not the
    # flush. On the validation split it lifted the default preset's exact match on
    # right-context entities from 0.95 to 0.97 (40 holes) and left every other hole kind's
    # as it was. False: off, the behaviour before the field existed; the presets turn it on.
    hold_shifted_repeats: bool = False
    # Threshold rules: of the positions that pass the rule, a step commits the likeliest
    # first while the sum of their error probabilities (1 - p, p the proposed token's
    # probability) stays within this budget; always at least one. The bound is on the
    # marginals: each token was judged with the others masked, so tokens written together
    # need not fit one another ("On was today Mr. Pierce" from two sentence openings, each
    # likely alone). Near-certain tokens (an entity copied from the context, a fixed phrase)
    # still commit many per pass; unsure ones one or two at a time. After Fast-dLLM's factor
    # rule and the EB-sampler's entropy bound. At threshold 0.1 a budget of 2 kept
    # even-1/step's exact match on val single holes at 3.43 tokens per pass
    # (bench/sampler/budget_val), but lost 1.7 points on test. 0.0 is off (no cap), the
    # behaviour before the field existed; the presets leave it off.
    error_budget: float = 0.0
    # Threshold rules: a free-hole position commits only next to written text: a neighbour
    # that is not masked (locked text, a written or padded token, the canvas's edge), or one
    # committed in the same step that is itself so anchored (a chain). A hole is written
    # outward from its edges and from what is already there, never as an island amid masked
    # positions, where a token likely on its own may belong to another wording than the
    # tokens later written around it ("On was today Mr. Pierce" from two sentence
    # openings). Chains keep the neighbour_threshold bar, so near-certain runs (a copied
    # name) still go in one pass.
    # When no passing position is anchored, the surest anchored one commits. At threshold
    # 0.1 with neighbour_threshold 0.5 it wrote 3.28 / 3.36 tokens per pass on val / test
    # single holes at even-1/step's exact match or better (bench/sampler/anchored*). False:
    # off, the behaviour before the field existed; the presets leave it off (on whole drafts
    # it was faster but not better on both splits, bench/sampler/PRESET_STUDY*.md).
    anchored: bool = False
    # Threshold rules: a pattern hole is decoded in order, one position per step (its
    # automaton must know the tokens before a position to say which may come next). With
    # pattern_runs, once a step writes a pattern hole's position, the hole's next masked
    # positions in the block are proposed from the same forward pass, each under the
    # automaton state its left neighbour's token led to, and written in that step while each
    # passes the rule and neighbour_threshold (judged with its neighbour masked, as any
    # token written beside a neighbour of the same step) and holds no letter. A date, an
    # amount or a reference number the model is sure of then costs one pass, not one per
    # token. Words wait: carried along, a name in a JSON string value was written "K Fox"
    # for "Kathy Fox" (" Fox" sure while the position before it was masked), and the
    # presets lost 0.2-0.4 points on val drafts (bench/sampler/pattern_runs_words/).
    # False: off, the behaviour before the field existed.
    pattern_runs: bool = False
    # Arithmetic of the forward pass: fp32, or bf16 under torch.autocast.
    precision: Precision = "fp32"
    # "dual": a KV cache of every position, refreshed once per block; the steps inside a
    # block recompute only the block's window (Fast-dLLM dual cache). "delayed": the dual
    # cache, but a step recomputes only the block's masked positions and the tokens committed
    # (or padded) in the step before, and writes their keys and values back (dKV-Cache's
    # delayed caching): fewer positions per step, one more approximation. "none": exact, a
    # full forward pass at every step.
    cache: CacheMode = "none"
    # Which block starts refresh the delayed cache with a full forward pass: every
    # cache_refresh-th block (1: every block, as the dual cache does; the behaviour before the
    # field existed), or 0: only the request's first step. A block that starts without a
    # refresh begins with one more window forward (its masked positions and the tokens changed
    # since their cache entries were written; the rest read from the cache), so a document
    # with many holes pays one full forward instead of one per hole. The approximation grows:
    # untouched positions (locked text, later holes) keep keys and values computed before the
    # holes around them were filled. Only the delayed cache reads it: the dual cache
    # refreshes at every block (its windows never recompute tokens committed before the
    # block), and "none" has no cache, so a preset's value survives a switch of cache mode.
    cache_refresh: int = 1

    def __post_init__(self) -> None:
        _validate(self)
        # An int where a float belongs would change the canonical JSON (1 vs 1.0): normalise.
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(f.default, float) and isinstance(value, int):
                object.__setattr__(self, f.name, float(value))

    # -- canonical form ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no spaces. A field added after configs were first
        stored is left out while it holds the value that decodes as before it existed (see
        ``ADDED_LATER``), so a stored config keeps its sha256 and replays as it ran."""
        defaults = _field_types()
        data = {
            name: value
            for name, value in self.to_dict().items()
            if name not in ADDED_LATER or value != defaults[name]
        }
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    @classmethod
    def from_json(cls, data: str | dict[str, Any]) -> SamplerConfig:
        """Parse a (canonical or partial) JSON object; missing fields take the defaults."""
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except json.JSONDecodeError as exc:
                raise ValueError(f"sampler config is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"sampler config must be a JSON object, got {type(data).__name__}")
        return cls(**_coerce_fields(data))

    def replace(self, **changes: Any) -> SamplerConfig:
        return dataclasses.replace(self, **_coerce_fields(changes))


def _field_types() -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(SamplerConfig)}


def _coerce_fields(data: dict[str, Any]) -> dict[str, Any]:
    """Check names and JSON types of fields; ints are accepted where a float is expected."""
    defaults = _field_types()
    unknown = sorted(set(data) - set(defaults))
    if unknown:
        raise ValueError(f"unknown sampler field(s) {unknown}; known fields: {sorted(defaults)}")
    out: dict[str, Any] = {}
    for name, value in data.items():
        default = defaults[name]
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif isinstance(default, float):
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            value = float(value) if ok else value
        else:
            ok = isinstance(value, str)
        if not ok:
            raise ValueError(
                f"sampler field {name}={value!r} must be of type {type(default).__name__}"
            )
        out[name] = value
    return out


def _validate(cfg: SamplerConfig) -> None:
    for name, allowed in _CHOICES.items():
        value = getattr(cfg, name)
        if value not in allowed:
            raise ValueError(f"{name}={value!r} is not one of {list(allowed)}")
    for name in ("block_length", "steps_per_block", "max_steps"):
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} must be an integer >= 1")
    if not isinstance(cfg.cache_refresh, int) or isinstance(cfg.cache_refresh, bool) \
            or cfg.cache_refresh < 0:
        raise ValueError(f"cache_refresh={cfg.cache_refresh!r} must be an integer >= 0")
    if not isinstance(cfg.remask_budget, int) or cfg.remask_budget < 0:
        raise ValueError(f"remask_budget={cfg.remask_budget!r} must be an integer >= 0")
    _check_range("threshold", cfg.threshold, 0.0, 1.0, low_open=True)
    _check_range("top_p", cfg.top_p, 0.0, 1.0, low_open=True)
    _check_range("remask_below", cfg.remask_below, 0.0, 1.0)
    _check_range("tail_threshold", cfg.tail_threshold, 0.0, 1.0)
    _check_range("neighbour_threshold", cfg.neighbour_threshold, 0.0, 1.0)
    _check_range("error_budget", cfg.error_budget, 0.0, math.inf)
    _check_range("temperature", cfg.temperature, 0.0, math.inf)
    _check_range("entropy_threshold", cfg.entropy_threshold, 0.0, math.inf)


def _check_range(
    name: str, value: float, low: float, high: float, *, low_open: bool = False
) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or math.isnan(value):
        raise ValueError(f"{name}={value!r} must be a number")
    if value < low or (low_open and value == low) or value > high or math.isinf(value):
        bracket = "(" if low_open else "["
        raise ValueError(f"{name}={value!r} must lie in {bracket}{low}, {high}]")


PRESETS: dict[str, SamplerConfig] = {
    # Many tokens per forward pass: a low threshold and the delayed cache (bench/sampler: the
    # same EM as the dual cache at 0.7 and 0.9, 10-20% less wall time), refreshed only at the
    # first step (bench/sampler/val, 32 val documents holed as drafts: at thresholds 0.1, 0.3
    # and 0.9 EM 0.240 / 0.229 / 0.282 against 0.240 / 0.226 / 0.275 refreshing at every
    # block, 10-16% less wall time; single holes at 0.7: EM 0.325 either way). Threshold 0.1,
    # anchored, neighbour bar 0.7 (bench/sampler/PRESET_STUDY_VAL.md, 240 single holes and
    # 160 drafts): EM -0.4 / +0.3 points against the same preset at threshold 0.7 without
    # anchoring, at 0.80x / 0.86x its wall time; on test (PRESET_STUDY.md) +0.8 / -0.9.
    "fast": SamplerConfig(
        commit_rule="threshold", threshold=0.1, block_length=32, cache="delayed",
        cache_refresh=0, ban_adjacent_repeats=True, neighbour_threshold=0.7,
        hold_shifted_repeats=True, anchored=True, pattern_runs=True,
    ),
    # The default: Fast-dLLM's threshold with the dual cache, whose texts match uncached
    # decoding more often than the delayed cache's do (bench/sampler, "Cache: share ...").
    # Both threshold presets write pattern runs (bench/sampler/PATTERN_RUNS_STUDY*.md: on val
    # documents with every value span holed 0.78x / 0.75x the wall time at exact match
    # +0.0 / -0.1 points, single holes and drafts as before).
    "balanced": SamplerConfig(
        commit_rule="threshold", threshold=0.9, block_length=32, cache="dual",
        ban_adjacent_repeats=True, neighbour_threshold=0.9, hold_shifted_repeats=True,
        pattern_runs=True,
    ),
    # One token per step in small blocks, exact attention, with low-confidence re-masking.
    "careful": SamplerConfig(
        commit_rule="even",
        block_length=16,
        steps_per_block=16,
        cache="none",
        remask="low_confidence",
        remask_budget=1,
        ban_adjacent_repeats=True,
        hold_shifted_repeats=True,
    ),
}
DEFAULT_PRESET = "balanced"


def config_from_overrides(
    preset: str | None = None, overrides: dict[str, Any] | None = None
) -> SamplerConfig:
    """The named preset (default "balanced") with the fields in ``overrides`` replaced."""
    name = DEFAULT_PRESET if preset is None else preset
    if name not in PRESETS:
        raise ValueError(f"preset={name!r} is not one of {sorted(PRESETS)}")
    if overrides is not None and not isinstance(overrides, dict):
        raise ValueError(f"overrides must be a JSON object, got {type(overrides).__name__}")
    return PRESETS[name].replace(**(overrides or {}))


def config_from_request(sampler: dict[str, Any]) -> SamplerConfig:
    """A request's ``sampler`` object: overrides of the preset named by its "preset" key."""
    overrides = dict(sampler)
    preset = overrides.pop("preset", None)
    if preset is not None and not isinstance(preset, str):
        raise ValueError(f"sampler.preset={preset!r} must be a string")
    return config_from_overrides(preset, overrides)


__all__ = [
    "DEFAULT_PRESET",
    "PRESETS",
    "BlockScope",
    "CacheMode",
    "CommitRule",
    "Precision",
    "RemaskPolicy",
    "SamplerConfig",
    "config_from_overrides",
    "config_from_request",
]
