"""SamplerConfig: canonical JSON, sha256, round trips, strict parsing, presets, version 1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_worker.engine.config import (
    PRESETS,
    SCHEMA_VERSION,
    CommitRules,
    SamplerConfig,
    config_from_overrides,
    config_from_request,
)

# Configs as the previous schema stored them, with the sha256 recorded beside them.
V1 = json.loads((Path(__file__).parent / "fixtures" / "v1_configs.json").read_text())["configs"]
V1_PRESET_SHA256 = {  # the presets' config_sha256 in every run record written before
    "fast": "b7808e4f989709e7c591d8d748f39fd20b700156a123dbc3634e7750390596a5",
    "balanced": "c499cddf61ab2c58753ad64a21dc18da51eca9c151f9be4d4ab2ffccfb895231",
    "careful": "09cd43ad03370ff3b4eedf2a167a74aa149ec25a1ec6943e6824fc8b8b450131",
}

rules = st.builds(
    CommitRules,
    ban_adjacent_repeats=st.booleans(),
    neighbour_threshold=st.floats(0.0, 1.0),
    hold_shifted_repeats=st.booleans(),
    pattern_runs=st.booleans(),
    anchored=st.booleans(),
    error_budget=st.floats(0.0, 8.0),
    tail_threshold=st.floats(0.0, 1.0),
)
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
    precision=st.sampled_from(["fp32", "bf16"]),
    cache=st.sampled_from(["none", "dual", "delayed", "block"]),
    cache_refresh=st.integers(0, 3),
    rules=rules,
)


def test_canonical_json_has_sorted_keys_no_spaces_and_the_schema_version() -> None:
    text = SamplerConfig().to_json()
    data = json.loads(text)
    assert " " not in text
    assert list(data) == sorted(data) and list(data["rules"]) == sorted(data["rules"])
    assert data["schema_version"] == SCHEMA_VERSION == 2


@settings(max_examples=40, deadline=None)
@given(configs)
def test_from_json_round_trips_with_the_same_sha256(config: SamplerConfig) -> None:
    again = SamplerConfig.from_json(config.to_json())
    assert again == config
    assert again.sha256 == config.sha256
    assert SamplerConfig.from_json(config.to_dict()) == config


def test_the_defaults_are_the_balanced_preset() -> None:
    assert SamplerConfig() == PRESETS["balanced"]
    assert config_from_overrides() == SamplerConfig()


def test_an_int_where_a_float_belongs_gives_the_same_canonical_json() -> None:
    assert SamplerConfig(threshold=1).to_json() == SamplerConfig(threshold=1.0).to_json()
    assert (SamplerConfig(rules=CommitRules(error_budget=2)).to_json()
            == SamplerConfig(rules=CommitRules(error_budget=2.0)).to_json())  # fmt: skip


def test_from_json_rejects_unknown_fields_by_name() -> None:
    with pytest.raises(ValueError, match="unknown sampler field.*'blok_length'"):
        SamplerConfig.from_json({"blok_length": 4})
    with pytest.raises(ValueError, match="unknown sampler field.*'blok_length'"):
        SamplerConfig.from_json({"schema_version": 2, "blok_length": 4})
    with pytest.raises(ValueError, match="unknown sampler rule setting.*'anchor'"):
        SamplerConfig.from_json({"schema_version": 2, "rules": {"anchor": True}})


def test_from_json_rejects_bad_json_and_non_objects() -> None:
    with pytest.raises(ValueError, match="not valid JSON"):
        SamplerConfig.from_json("{nope")
    with pytest.raises(ValueError, match="JSON object"):
        SamplerConfig.from_json("[1]")
    with pytest.raises(ValueError, match="rules=.* must be a JSON object"):
        SamplerConfig.from_json({"schema_version": 2, "rules": [1]})


def test_from_json_rejects_an_unknown_schema_version_and_rules_without_one() -> None:
    with pytest.raises(ValueError, match="schema_version=3 is not 2"):
        SamplerConfig.from_json({"schema_version": 3})
    with pytest.raises(ValueError, match="rules needs schema_version 2"):
        SamplerConfig.from_json({"rules": {"anchored": True}})


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
        SamplerConfig.from_json({"schema_version": 2, field: value})
    with pytest.raises(ValueError, match=field):
        SamplerConfig.from_json({field: value})  # a version-1 object, the same checks


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("neighbour_threshold", 1.5, r"rules.neighbour_threshold=1.5 must lie in \[0.0, 1.0\]"),
     ("error_budget", -0.5, r"rules.error_budget=-0.5 must lie in \[0.0, inf\]"),
     ("tail_threshold", 2.0, r"rules.tail_threshold=2.0 must lie in \[0.0, 1.0\]"),
     ("anchored", 1, "sampler field rules.anchored=1 must be of type bool")],
)  # fmt: skip
def test_invalid_rule_settings_raise_naming_the_setting(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplerConfig.from_json({"schema_version": 2, "rules": {field: value}})


def test_wrong_json_types_are_rejected() -> None:
    with pytest.raises(ValueError, match="block_length"):
        SamplerConfig.from_json({"block_length": "8"})
    with pytest.raises(ValueError, match="stop_on_eos"):
        SamplerConfig.from_json({"stop_on_eos": 1})


def test_presets_are_valid_distinct_and_version_2() -> None:
    assert set(PRESETS) == {"fast", "balanced", "careful"}
    assert len({p.sha256 for p in PRESETS.values()}) == 3
    assert {p.schema_version for p in PRESETS.values()} == {2}


@pytest.mark.parametrize("name", sorted(V1_PRESET_SHA256))
def test_each_preset_is_the_version_1_preset_its_records_name(name: str) -> None:
    """The same settings as before: written in the version-1 form, the preset has the
    config_sha256 of the run records made with it."""
    assert PRESETS[name].replace(schema_version=1).sha256 == V1_PRESET_SHA256[name]


def test_config_from_overrides_replaces_fields_of_a_preset() -> None:
    config = config_from_overrides("careful", {"temperature": 0.7})
    assert config.temperature == 0.7
    assert config.commit_rule == PRESETS["careful"].commit_rule
    assert config_from_overrides() == PRESETS["balanced"]


def test_overrides_name_a_rule_setting_nested_or_on_its_own() -> None:
    nested = config_from_overrides("fast", {"rules": {"anchored": False}})
    flat = config_from_overrides("fast", {"anchored": False})
    assert nested == flat == PRESETS["fast"].replace(rules=PRESETS["fast"].rules.replace(anchored=False))
    assert nested.rules.neighbour_threshold == PRESETS["fast"].rules.neighbour_threshold  # merged
    assert config_from_request({"preset": "careful", "error_budget": 1}).rules.error_budget == 1.0


def test_config_from_overrides_rejects_unknown_presets_fields_and_the_schema_version() -> None:
    with pytest.raises(ValueError, match="preset='turbo'"):
        config_from_overrides("turbo", {})
    with pytest.raises(ValueError, match="unknown sampler field"):
        config_from_overrides("fast", {"speed": 3})
    with pytest.raises(ValueError, match="unknown sampler rule setting"):
        config_from_overrides("fast", {"rules": {"speed": 3}})
    with pytest.raises(ValueError, match="schema_version is not a sampler setting"):
        config_from_overrides("fast", {"schema_version": 1})


@pytest.mark.parametrize("stored", V1, ids=[c["label"] for c in V1])
def test_a_version_1_config_keeps_its_recorded_sha256_and_canonical_form(stored: dict[str, Any]) -> None:
    config = SamplerConfig.from_json(stored["dict"])
    assert config.schema_version == 1
    assert config.sha256 == stored["sha256"]
    assert config.to_json() == stored["json"]
    assert SamplerConfig.from_json(stored["json"]) == config  # its canonical form, read back
    assert SamplerConfig.from_json(config.to_dict()) == config  # what a record stores
    if len(stored["dict"]) == 23:  # a full stored object: written back as it was
        assert config.to_dict() == stored["dict"]


@pytest.mark.parametrize("stored", V1, ids=[c["label"] for c in V1])
def test_a_version_1_config_holds_the_settings_it_ran_with(stored: dict[str, Any]) -> None:
    """Every field of the stored object is a setting of the migrated config, by name."""
    config = SamplerConfig.from_json(stored["dict"])
    for name, value in stored["dict"].items():
        holder = config.rules if hasattr(config.rules, name) else config
        assert getattr(holder, name) == value, name
    upgraded = config.replace(schema_version=2)
    assert upgraded.sha256 != config.sha256 and SamplerConfig.from_json(upgraded.to_json()) == upgraded


def test_a_partial_version_1_object_takes_the_version_1_defaults() -> None:
    """An object stored before the presets' rules and the dual cache became defaults."""
    config = SamplerConfig.from_json({"commit_rule": "even"})
    assert config.cache == "none"
    assert config.rules == CommitRules(ban_adjacent_repeats=False, neighbour_threshold=0.0,
                                       hold_shifted_repeats=False, pattern_runs=False)  # fmt: skip
    assert "neighbour_threshold" not in json.loads(config.to_json())  # left out at its default
    turned_on = config.replace(neighbour_threshold=0.9)
    assert json.loads(turned_on.to_json())["neighbour_threshold"] == 0.9
    assert turned_on.sha256 != config.sha256
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
