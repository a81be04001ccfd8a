"""SamplerConfig: how one request is denoised, in one frozen dataclass.

The config is stored on the job and in the run record, so it has one canonical JSON form
(sorted keys, no spaces) and a sha256 of that form. It holds the user-facing knobs (blocks,
step budget, commit rule and threshold, sampling, re-masking, stopping, precision, cache) and
one group of rule settings, :class:`CommitRules`: the heuristics that refine which positions
a step commits. The defaults are the "balanced" preset.

Schema versions. ``schema_version`` 2 is the form above (``rules`` nested). Version 1 configs
(stored before, a flat object without ``schema_version``) are read by :meth:`from_json`
through a migration: missing fields take their version-1 defaults, and the config keeps
``schema_version=1``, so it writes its version-1 canonical form again and its sha256 is the
one recorded with it. The settings decide the run, not the version: a version-1 config and
the version-2 config with the same settings denoise identically.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

CommitRule = Literal["even", "threshold", "margin", "entropy"]
RemaskPolicy = Literal["none", "low_confidence"]
Precision = Literal["fp32", "bf16"]
CacheMode = Literal["none", "dual", "delayed", "block"]
BlockScope = Literal["canvas", "hole", "attention"]

SCHEMA_VERSION = 2
SCHEMA_VERSIONS = (1, SCHEMA_VERSION)

_CHOICES: dict[str, tuple[str, ...]] = {
    "commit_rule": get_args(CommitRule),
    "remask": get_args(RemaskPolicy),
    "precision": get_args(Precision),
    "cache": get_args(CacheMode),
    "block_scope": get_args(BlockScope),
}


@dataclass(frozen=True)
class CommitRules:
    """The rules that refine a step's commits (the sampler's ``rules`` module applies them).

    Most apply to the threshold rules (threshold, margin, entropy) only; each says so. The
    studies behind each default are in bench/sampler (the file named beside it).
    """

    # A free-hole position may not take the word token (one holding a letter) written right
    # before or right after it (past the tail pad): parallel commits repeat a word whose
    # place the model is unsure of ("J Carter Carter"). Of two neighbours that would commit
    # the same word in one step only the left one does (the budget's last pass excepted).
    ban_adjacent_repeats: bool = True
    # Threshold rules: a position committed in the same step as its left neighbour (in its
    # hole) needs at least this probability as well as passing the rule, and so does an EOS
    # / pad ending its hole in the step that writes the hole's last words: each was judged
    # with that neighbour masked. One below the bar waits a step. 0.0 is off.
    # bench/sampler/THRESHOLD_STUDY*.md.
    neighbour_threshold: float = 0.9
    # A free-hole position waits a step while its left neighbour in its hole is still masked
    # and the model proposes the same word for both (it is unsure which position the word
    # belongs to, "Melissa was Wright"); the leftmost of such a run may commit. Not in the
    # budget's last pass. Right-context entities 0.95 -> 0.97 EM on val (40 holes).
    hold_shifted_repeats: bool = True
    # Threshold rules: once a step writes a pattern hole's position, the hole's next masked
    # positions in the block are proposed from the same forward pass, each under the
    # automaton state its left neighbour led to, and written while each passes the rule
    # and neighbour_threshold and holds no letter: a date or an amount costs one pass.
    # bench/sampler/PATTERN_RUNS_STUDY*.md, bench/sampler/pattern_runs_words/.
    pattern_runs: bool = True
    # Threshold rules: a free-hole position commits only next to written text (locked text,
    # a written or padded token, the canvas's edge) or chained to such a position through
    # positions committed in the same step; when none passing is anchored, the surest
    # anchored one commits. The fast preset's (bench/sampler/PRESET_STUDY*.md, anchored*/).
    anchored: bool = False
    # Threshold rules: of the positions that pass, the likeliest commit while their summed
    # error probability (1 - p) stays within this budget; always at least one. 0.0 is off.
    # Kept as val's choice at threshold 0.1, it lost on test (bench/sampler/budget_val).
    error_budget: float = 0.0
    # With stop_on_eos: before each step commits, a free hole's masked tail is padded from
    # its last position leftwards while the model gives EOS and pad together more than this
    # probability (never the hole's first position). For models that run a hole's text on
    # past its end; the shipped denoiser ends holes itself. 1.0 is off.
    tail_threshold: float = 1.0

    def __post_init__(self) -> None:
        _normalise_floats(self)
        _validate_rules(self)

    def replace(self, **changes: Any) -> CommitRules:
        return dataclasses.replace(self, **_coerce(changes, _defaults(CommitRules), "rules."))


RULE_NAMES = tuple(f.name for f in dataclasses.fields(CommitRules))


@dataclass(frozen=True)
class SamplerConfig:
    """How one request is denoised. Every field is part of the audit record."""

    # The canonical form this config is written in: 2 (this one), or 1 for a config read
    # from a version-1 record (see the module docstring).
    schema_version: int = SCHEMA_VERSION
    # Maskable (hole) positions per block. Blocks advance left to right across the canvas;
    # attention stays bidirectional, so a block sees the locked text on both sides.
    block_length: int = 32
    # "canvas": a block packs the next block_length hole positions, across holes;
    # "hole": a block never spans two holes (a short hole is a block of its own);
    # "attention": a block is the hole positions inside one span of block_length canvas
    # positions from position 0, the attention blocks of a block-diffusion model (set by
    # LoadedModel.fit_config for such a model, which reads no text past its block).
    block_scope: BlockScope = "canvas"
    # `even` rule: the steps a block's masked positions are spread over (LLaDA's schedule:
    # ceil(masked left / steps left) per step). The threshold rules stop when a block is done.
    steps_per_block: int = 32
    # Request budget: the most forward passes (= steps) for the whole canvas. The last pass
    # commits every position still masked (a "flush").
    max_steps: int = 512
    # Which masked positions of the active block each step commits:
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
    # The most tokens re-masked in one step.
    remask_budget: int = 1
    # Only tokens whose probability under the current step's logits is below this re-mask.
    remask_below: float = 0.3
    # Stopping inside a hole: when EOS or pad is committed, the rest of the hole is filled
    # with pad at once. An EOS / pad waits while an earlier position of its hole is masked,
    # and a free hole's first position never takes one (a hole is never left empty). The
    # tail after a hole's first EOS / pad is stripped from its text either way.
    stop_on_eos: bool = True
    # Arithmetic of the forward pass: fp32, or bf16 under torch.autocast.
    precision: Precision = "fp32"
    # "dual": a KV cache of every position, refreshed at each block's first step; the steps
    # inside a block recompute only the block's window (Fast-dLLM's dual cache). "delayed":
    # a step recomputes only the block's masked positions and the tokens changed since
    # their cache entries were written, and writes those back (dKV-Cache's delayed caching).
    # "none": exact, a full forward pass at every step. "block": a block-diffusion
    # network's block KV cache (finished attention blocks cached, a step computes the active
    # block), exact up to float summation order; LoadedModel.fit_config sets it for such a
    # network in place of "dual" / "delayed". The model backend provides the cache (see
    # gpu_worker.engine.sampler.cache).
    cache: CacheMode = "dual"
    # Which block starts refresh the delayed cache with a full forward pass: every
    # cache_refresh-th block (1: every block), or 0: only the request's first step. Other
    # blocks start with a window of their masked positions and the tokens changed since
    # they were cached, so a document with many holes pays one full forward. Only the
    # delayed cache reads it, so a preset's value survives a switch of cache mode.
    cache_refresh: int = 1
    # The commit rules' settings.
    rules: CommitRules = field(default_factory=CommitRules)

    def __post_init__(self) -> None:
        _normalise_floats(self)
        _validate(self)

    # -- canonical form ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Every field; ``rules`` nested. A version-1 config: its flat version-1 fields."""
        if self.schema_version == 1:
            return _v1_dict(self)
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no spaces (version 1: its version-1 canonical form)."""
        data = _v1_canonical(self) if self.schema_version == 1 else self.to_dict()
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    @classmethod
    def from_json(cls, data: str | dict[str, Any]) -> SamplerConfig:
        """Parse a (canonical or partial) JSON object; missing fields take the defaults.

        An object with ``schema_version`` 2 is read as written; one without a
        ``schema_version`` is a version-1 config, migrated (see the module docstring).
        """
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except json.JSONDecodeError as exc:
                raise ValueError(f"sampler config is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"sampler config must be a JSON object, got {type(data).__name__}")
        if "schema_version" not in data:
            if "rules" in data:
                raise ValueError("a sampler config with rules needs schema_version "
                                 f"{SCHEMA_VERSION}; a version-1 config names each rule flat")
            return _from_v1(data)
        version = data["schema_version"]
        if version != SCHEMA_VERSION or isinstance(version, bool):
            raise ValueError(
                f"schema_version={version!r} is not {SCHEMA_VERSION} (a version-1 config "
                "is an object without schema_version)"
            )
        fields = _coerce({k: v for k, v in data.items() if k != "rules"}, _defaults(cls))
        rules = _rules_from(data.get("rules", {}), CommitRules())
        return cls(**fields, rules=rules)

    def replace(self, **changes: Any) -> SamplerConfig:
        """This config with ``changes``: top-level fields, ``rules`` (a CommitRules, or an
        object of rule settings that replace the current ones), or a rule setting by its own
        name (``replace(anchored=True)``), as request overrides may name them."""
        top, rule_changes = _split_overrides(changes)
        rules = top.pop("rules", self.rules)
        if isinstance(rules, dict):
            rules = _rules_from(rules, self.rules)
        if rule_changes:
            rules = rules.replace(**rule_changes)
        return dataclasses.replace(self, **top, rules=rules)


# -- parsing and validation -----------------------------------------------------------------
def _defaults(cls: type) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cls):
        out[f.name] = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
    return out


def _split_overrides(changes: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Top-level fields (checked and coerced) and rule settings named on their own."""
    rule_changes = {k: v for k, v in changes.items() if k in RULE_NAMES}
    rest = {k: v for k, v in changes.items() if k not in RULE_NAMES}
    rules = rest.pop("rules", None)
    top = _coerce(rest, _defaults(SamplerConfig), also_known=RULE_NAMES)
    if rules is not None:
        if not isinstance(rules, dict | CommitRules):
            raise ValueError(f"sampler field rules={rules!r} must be a JSON object")
        top["rules"] = rules
    return top, rule_changes


def _rules_from(data: Any, base: CommitRules) -> CommitRules:
    if not isinstance(data, dict):
        raise ValueError(f"sampler field rules={data!r} must be a JSON object")
    return dataclasses.replace(base, **_coerce(data, _defaults(CommitRules), "rules."))


def _coerce(
    data: dict[str, Any], defaults: dict[str, Any], prefix: str = "",
    also_known: tuple[str, ...] = (),
) -> dict[str, Any]:  # fmt: skip
    """Check names and JSON types of fields; ints are accepted where a float is expected.
    ``also_known``: names a caller handles itself (listed as known in the error)."""
    unknown = sorted(set(data) - set(defaults))
    if unknown:
        kind = "rule setting" if prefix else "field"
        known = sorted(set(defaults) | set(also_known))
        raise ValueError(f"unknown sampler {kind}(s) {unknown}; known {kind}s: {known}")
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
        elif isinstance(default, CommitRules):
            ok = isinstance(value, CommitRules)
        else:
            ok = isinstance(value, str)
        if not ok:
            kind = "CommitRules" if isinstance(default, CommitRules) else type(default).__name__
            raise ValueError(f"sampler field {prefix}{name}={value!r} must be of type {kind}")
        out[name] = value
    return out


def _normalise_floats(obj: Any) -> None:
    """An int where a float belongs would change the canonical JSON (1 vs 1.0)."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(f.default, float) and isinstance(value, int) and not isinstance(value, bool):
            object.__setattr__(obj, f.name, float(value))


def _validate(cfg: SamplerConfig) -> None:
    if cfg.schema_version not in SCHEMA_VERSIONS or isinstance(cfg.schema_version, bool):
        raise ValueError(f"schema_version={cfg.schema_version!r} is not one of {list(SCHEMA_VERSIONS)}")
    for name, allowed in _CHOICES.items():
        value = getattr(cfg, name)
        if value not in allowed:
            raise ValueError(f"{name}={value!r} is not one of {list(allowed)}")
    for name in ("block_length", "steps_per_block", "max_steps"):
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} must be an integer >= 1")
    for name in ("cache_refresh", "remask_budget"):
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name}={value!r} must be an integer >= 0")
    _check_range("threshold", cfg.threshold, 0.0, 1.0, low_open=True)
    _check_range("top_p", cfg.top_p, 0.0, 1.0, low_open=True)
    _check_range("remask_below", cfg.remask_below, 0.0, 1.0)
    _check_range("temperature", cfg.temperature, 0.0, math.inf)
    _check_range("entropy_threshold", cfg.entropy_threshold, 0.0, math.inf)
    if not isinstance(cfg.rules, CommitRules):
        raise ValueError(f"rules={cfg.rules!r} must be a CommitRules")


def _validate_rules(rules: CommitRules) -> None:
    for name in ("ban_adjacent_repeats", "hold_shifted_repeats", "pattern_runs", "anchored"):
        if not isinstance(getattr(rules, name), bool):
            raise ValueError(f"rules.{name}={getattr(rules, name)!r} must be a bool")
    _check_range("rules.neighbour_threshold", rules.neighbour_threshold, 0.0, 1.0)
    _check_range("rules.error_budget", rules.error_budget, 0.0, math.inf)
    _check_range("rules.tail_threshold", rules.tail_threshold, 0.0, 1.0)


def _check_range(
    name: str, value: float, low: float, high: float, *, low_open: bool = False
) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or math.isnan(value):
        raise ValueError(f"{name}={value!r} must be a number")
    if value < low or (low_open and value == low) or value > high or math.isinf(value):
        bracket = "(" if low_open else "["
        raise ValueError(f"{name}={value!r} must lie in {bracket}{low}, {high}]")


# -- version 1 ------------------------------------------------------------------------------
# A version-1 config is one flat object of these fields. Missing ones take these defaults;
# the canonical form leaves out each field of V1_OMITTED while it holds the value given there.
V1_DEFAULTS: dict[str, Any] = {
    "block_length": 32, "block_scope": "canvas", "steps_per_block": 32, "max_steps": 512,
    "commit_rule": "threshold", "threshold": 0.9, "entropy_threshold": 0.5,
    "temperature": 0.0, "top_p": 1.0, "remask": "none", "remask_budget": 1,
    "remask_below": 0.3, "stop_on_eos": True, "tail_threshold": 1.0,
    "ban_adjacent_repeats": False, "neighbour_threshold": 0.0, "hold_shifted_repeats": False,
    "error_budget": 0.0, "anchored": False, "pattern_runs": False, "precision": "fp32",
    "cache": "none", "cache_refresh": 1,
}  # fmt: skip
V1_OMITTED: dict[str, Any] = {
    "tail_threshold": 1.0, "ban_adjacent_repeats": False, "neighbour_threshold": 0.0,
    "hold_shifted_repeats": False, "cache_refresh": 1, "error_budget": 0.0,
    "anchored": False, "pattern_runs": False,
}  # fmt: skip


def _from_v1(data: dict[str, Any]) -> SamplerConfig:
    """Migrate a version-1 object: its fields, the version-1 defaults for the missing ones."""
    flat = _coerce(data, V1_DEFAULTS)
    merged = {**V1_DEFAULTS, **flat}
    rules = CommitRules(**{name: merged.pop(name) for name in RULE_NAMES})
    return SamplerConfig(schema_version=1, rules=rules, **merged)


def _v1_dict(cfg: SamplerConfig) -> dict[str, Any]:
    top = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
           if f.name not in ("schema_version", "rules")}  # fmt: skip
    flat = {**top, **dataclasses.asdict(cfg.rules)}
    assert set(flat) == set(V1_DEFAULTS), "a version-1 config holds the version-1 fields only"
    return flat


def _v1_canonical(cfg: SamplerConfig) -> dict[str, Any]:
    return {k: v for k, v in _v1_dict(cfg).items() if k not in V1_OMITTED or v != V1_OMITTED[k]}


# -- presets --------------------------------------------------------------------------------
PRESETS: dict[str, SamplerConfig] = {
    # Many tokens per forward pass: threshold 0.1 with anchoring and a 0.7 neighbour bar,
    # and the delayed cache refreshed only at the first step. bench/sampler/PRESET_STUDY*.md
    # (240 single holes and 160 drafts on val: EM within a point of threshold 0.7 unanchored
    # at 0.80x / 0.86x its wall time) and bench/sampler/val (the delayed cache's refresh).
    "fast": SamplerConfig(
        threshold=0.1, cache="delayed", cache_refresh=0,
        rules=CommitRules(neighbour_threshold=0.7, anchored=True),
    ),  # fmt: skip
    # The default: Fast-dLLM's threshold with the dual cache, whose texts match uncached
    # decoding more often than the delayed cache's (bench/sampler/REPORT.md, "Cache").
    "balanced": SamplerConfig(),
    # One token per step in small blocks, exact attention, with low-confidence re-masking
    # (the neighbour bar and pattern runs belong to the threshold rules: off).
    "careful": SamplerConfig(
        commit_rule="even", block_length=16, steps_per_block=16, cache="none",
        remask="low_confidence", remask_budget=1,
        rules=CommitRules(neighbour_threshold=0.0, pattern_runs=False),
    ),  # fmt: skip
}
DEFAULT_PRESET = "balanced"


def config_from_overrides(
    preset: str | None = None, overrides: dict[str, Any] | None = None
) -> SamplerConfig:
    """The named preset (default "balanced") with the fields in ``overrides`` replaced (see
    :meth:`SamplerConfig.replace` for the names it takes)."""
    name = DEFAULT_PRESET if preset is None else preset
    if name not in PRESETS:
        raise ValueError(f"preset={name!r} is not one of {sorted(PRESETS)}")
    if overrides is not None and not isinstance(overrides, dict):
        raise ValueError(f"overrides must be a JSON object, got {type(overrides).__name__}")
    if overrides and "schema_version" in overrides:
        raise ValueError("schema_version is not a sampler setting: overrides are settings only")
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
    "SCHEMA_VERSION",
    "BlockScope",
    "CacheMode",
    "CommitRule",
    "CommitRules",
    "Precision",
    "RemaskPolicy",
    "SamplerConfig",
    "config_from_overrides",
    "config_from_request",
]
