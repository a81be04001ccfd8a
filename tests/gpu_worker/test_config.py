"""SamplerConfig: canonical JSON, sha256, round trips, strict parsing, presets."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_worker.engine.config import ADDED_LATER, PRESETS, SamplerConfig, config_from_overrides

configs = st.builds(
    SamplerConfig,
    block_length=st.integers(1, 64),
    block_scope=st.sampled_from(["canvas", "hole"]),
    steps_per_block=st.integers(1, 64),
    max_steps=st.integers(1, 1000),
    commit_rule=st.sampled_from(["even", "threshold", "margin", "entropy"]),
    threshold=st.floats(0.01, 1.0),
    temperature=st.floats(0.0, 3.0),
    top_p=st.floats(0.05, 1.0),
    remask=st.sampled_from(["none", "low_confidence"]),
    remask_budget=st.integers(0, 4),
    stop_on_eos=st.booleans(),
    tail_threshold=st.floats(0.0, 1.0),
    ban_adjacent_repeats=st.booleans(),
    neighbour_threshold=st.floats(0.0, 1.0),
    hold_shifted_repeats=st.booleans(),
    precision=st.sampled_from(["fp32", "bf16"]),
    cache=st.sampled_from(["none", "dual", "delayed"]),
    cache_refresh=st.integers(0, 3),
    error_budget=st.floats(0.0, 8.0),
    anchored=st.booleans(),
)


def test_canonical_json_has_sorted_keys_and_no_spaces() -> None:
    text = SamplerConfig().to_json()
    assert " " not in text
    assert list(json.loads(text)) == sorted(json.loads(text))


@settings(max_examples=40, deadline=None)
@given(configs)
def test_from_json_round_trips_with_the_same_sha256(config: SamplerConfig) -> None:
    again = SamplerConfig.from_json(config.to_json())
    assert again == config
    assert again.sha256 == config.sha256
    assert SamplerConfig.from_json(config.to_dict()) == config


def test_an_int_where_a_float_belongs_gives_the_same_canonical_json() -> None:
    assert SamplerConfig(threshold=1).to_json() == SamplerConfig(threshold=1.0).to_json()


def test_from_json_rejects_unknown_fields_by_name() -> None:
    with pytest.raises(ValueError, match="unknown sampler field.*'blok_length'"):
        SamplerConfig.from_json({"blok_length": 4})


def test_from_json_rejects_bad_json_and_non_objects() -> None:
    with pytest.raises(ValueError, match="not valid JSON"):
        SamplerConfig.from_json("{nope")
    with pytest.raises(ValueError, match="JSON object"):
        SamplerConfig.from_json("[1]")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("block_length", 0),
        ("steps_per_block", -1),
        ("max_steps", 0),
        ("commit_rule", "greedy"),
        ("threshold", 0.0),
        ("threshold", 1.5),
        ("temperature", -0.1),
        ("top_p", 0.0),
        ("remask", "always"),
        ("remask_budget", -1),
        ("precision", "fp16"),
        ("cache", "prefix"),
        ("block_scope", "document"),
    ],
)
def test_invalid_values_raise_naming_the_parameter(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SamplerConfig.from_json({field: value})


def test_wrong_json_types_are_rejected() -> None:
    with pytest.raises(ValueError, match="block_length"):
        SamplerConfig.from_json({"block_length": "8"})
    with pytest.raises(ValueError, match="stop_on_eos"):
        SamplerConfig.from_json({"stop_on_eos": 1})


def test_presets_are_valid_and_distinct() -> None:
    assert set(PRESETS) == {"fast", "balanced", "careful"}
    assert len({p.sha256 for p in PRESETS.values()}) == 3


def test_config_from_overrides_replaces_fields_of_a_preset() -> None:
    config = config_from_overrides("careful", {"temperature": 0.7})
    assert config.temperature == 0.7
    assert config.commit_rule == PRESETS["careful"].commit_rule
    assert config_from_overrides() == PRESETS["balanced"]


def test_config_from_overrides_rejects_unknown_presets_and_fields() -> None:
    with pytest.raises(ValueError, match="preset='turbo'"):
        config_from_overrides("turbo", {})
    with pytest.raises(ValueError, match="unknown sampler field"):
        config_from_overrides("fast", {"speed": 3})


@pytest.mark.parametrize(
    ("name", "off", "on"),
    [("tail_threshold", 1.0, 0.5), ("ban_adjacent_repeats", False, True),
     ("neighbour_threshold", 0.0, 0.9), ("hold_shifted_repeats", False, True),
     ("cache_refresh", 1, 0), ("error_budget", 0.0, 0.5),
     ("anchored", False, True)],
)  # fmt: skip
def test_a_config_stored_before_a_field_was_added_keeps_its_sha256_and_decodes_as_before(
    name: str, off: object, on: object
) -> None:
    assert name in ADDED_LATER
    stored = json.loads(SamplerConfig().to_json())
    assert name not in stored  # at the value that decodes as before, the field is left out
    before = json.dumps(stored, sort_keys=True, separators=(",", ":"))
    config = SamplerConfig.from_json(before)
    assert getattr(config, name) == off
    assert config.to_json() == before
    turned_on = config.replace(**{name: on})
    assert json.loads(turned_on.to_json())[name] == on and turned_on.sha256 != config.sha256
    assert SamplerConfig.from_json(turned_on.to_json()) == turned_on


def test_cache_refresh_is_a_whole_number_of_blocks_and_survives_a_switch_of_cache_mode() -> None:
    fast = PRESETS["fast"]
    assert fast.cache == "delayed" and fast.cache_refresh == 0
    exact = config_from_overrides("fast", {"cache": "none"})  # the job retries' escalation
    assert exact.cache == "none" and exact.cache_refresh == 0
    with pytest.raises(ValueError, match="cache_refresh=-1 must be an integer >= 0"):
        SamplerConfig(cache="delayed", cache_refresh=-1)
    with pytest.raises(ValueError, match="sampler field cache_refresh=0.5 must be of type int"):
        SamplerConfig.from_json({"cache": "delayed", "cache_refresh": 0.5})


def test_a_negative_error_budget_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"error_budget=-0.5 must lie in \[0.0, inf\]"):
        SamplerConfig.from_json({"error_budget": -0.5})
    with pytest.raises(ValueError, match="sampler field error_budget='1' must be of type float"):
        SamplerConfig.from_json({"error_budget": "1"})


def test_a_neighbour_threshold_outside_0_1_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"neighbour_threshold=1.5 must lie in \[0.0, 1.0\]"):
        SamplerConfig.from_json({"neighbour_threshold": 1.5})
