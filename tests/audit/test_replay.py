"""Replay re-runs recorded runs and compares their traces step by step."""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from audit.models import AuditEvent, RunRecord
from audit.services import run_record_create, run_replay
from gpu_worker.engine.backends import load_backend
from gpu_worker.engine.config import SamplerConfig
from tests.audit.conftest import PLACEHOLDER_MODEL, REQUEST

CONFIGS: list[dict[str, Any]] = [
    {"commit_rule": "even", "block_length": 8, "steps_per_block": 8, "cache": "none"},
    {"commit_rule": "threshold", "threshold": 0.5, "cache": "dual"},
    {"commit_rule": "margin", "threshold": 0.2, "temperature": 0.9, "top_p": 0.9},
    {"commit_rule": "entropy", "entropy_threshold": 2.0, "temperature": 1.0},
    {"commit_rule": "even", "block_length": 4, "steps_per_block": 4, "remask": "low_confidence",
     "temperature": 0.7, "block_scope": "hole"},
    {"commit_rule": "threshold", "threshold": 0.9, "temperature": 1.2, "max_steps": 5},
]  # fmt: skip
SEEDS = [0, 7, 123456789]


@pytest.fixture(scope="module")
def loaded() -> Any:
    return load_backend(PLACEHOLDER_MODEL)


@pytest.fixture
def record_real(
    audit_settings: Any, db: Any, loaded: Any, use_runner: Callable[..., Any]
) -> Callable[..., RunRecord]:
    def make(config: dict[str, Any], seed: int, *, tamper: Callable[[Any], None] | None = None,
             **overrides: Any) -> RunRecord:  # fmt: skip
        request = {**copy.deepcopy(REQUEST), "seed": seed}
        cfg = SamplerConfig.from_json(config)
        outcome = use_runner(loaded, request, config=cfg, device="cpu")
        if tamper is not None:
            tamper(outcome)
        kwargs: dict[str, Any] = {
            "job_id": "job-r", "attempt": 0, "route": "diffusion",
            "model_dir": str(PLACEHOLDER_MODEL), "weights_sha256": loaded.weights_sha256,
            "tokenizer_sha256": loaded.tokenizer_sha256, "request": request, "outcome": outcome,
            "batch_job_ids": ["job-r"], "device": "cpu", "router_decision": {"route": "diffusion"},
            "correlation_id": f"replay-{seed}",
        }  # fmt: skip
        kwargs.update(overrides)
        return run_record_create(**kwargs)

    return make


def test_replay_of_recorded_runs_is_identical_over_configs_and_seeds(
    record_real: Callable[..., RunRecord],
) -> None:
    reports = []
    for config in CONFIGS:
        for seed in SEEDS:
            run = record_real(config, seed)
            reports.append((config, seed, run_replay(run=run)))
    failures = [(c, s, r.summary) for c, s, r in reports if not r.identical or r.approximate]
    assert not failures
    assert all(r.steps_replayed == r.steps_recorded > 0 for _, _, r in reports)


def test_replay_names_the_step_where_the_trace_diverged(
    record_real: Callable[..., RunRecord],
) -> None:
    def tamper(outcome: Any) -> None:
        outcome.trace[1] = {**outcome.trace[1], "committed": outcome.trace[1]["committed"] + 1}

    run = record_real(CONFIGS[0], 7, tamper=tamper)
    report = run_replay(run=run)
    assert not report.identical
    assert report.divergence is not None and report.divergence.step == 1
    assert report.summary.startswith("diverged at step 1: committed ")


def test_different_weights_hash_is_reported_and_replay_marked_approximate(
    record_real: Callable[..., RunRecord],
) -> None:
    run = record_real(CONFIGS[1], 0, weights_sha256="00" * 32)
    report = run_replay(run=run)
    assert report.approximate
    assert "weights sha256 differs: recorded 000000000000" in report.summary
    assert report.identical  # same real weights, so the trace still matches


def test_recorded_gpu_run_replays_on_cpu_as_approximate(
    record_real: Callable[..., RunRecord],
) -> None:
    run = record_real(CONFIGS[0], 0, device="cuda:NVIDIA H200")
    report = run_replay(run=run)
    assert report.approximate
    assert any("cuda:NVIDIA H200" in reason for reason in report.approximate_reasons)


def test_replay_is_itself_audited(record_real: Callable[..., RunRecord]) -> None:
    run = record_real(CONFIGS[0], 0)
    run_replay(run=run)
    event = AuditEvent.objects.get(kind=AuditEvent.Kind.RUN_REPLAYED)
    assert event.subject == f"run:{run.pk}"
    assert json.loads(event.details)["identical"] is True


def test_replay_command_prints_identical(record_real: Callable[..., RunRecord]) -> None:
    run = record_real(CONFIGS[2], 123456789)
    out = io.StringIO()
    call_command("audit_replay", str(run.pk), stdout=out)
    assert out.getvalue().startswith(f"run {run.pk}: identical (")


def test_replay_command_fails_on_divergence(record_real: Callable[..., RunRecord]) -> None:
    def tamper(outcome: Any) -> None:
        outcome.trace[0] = {**outcome.trace[0], "canvas_sha256": "f" * 64}

    run = record_real(CONFIGS[0], 0, tamper=tamper)
    out = io.StringIO()
    with pytest.raises(CommandError, match="diverged"):
        call_command("audit_replay", str(run.pk), stdout=out)
    assert "diverged at step 0: canvas_sha256" in out.getvalue()


def test_replay_of_a_missing_model_directory_is_a_clear_error(
    record_real: Callable[..., RunRecord], tmp_path: Any
) -> None:
    run = record_real(CONFIGS[0], 0, model_dir=str(tmp_path / "gone"))
    with pytest.raises(CommandError, match="not on this machine"):
        call_command("audit_replay", str(run.pk), stdout=io.StringIO())


def test_a_batched_run_replays_identically_with_its_whole_batch(
    audit_settings: Any, db: Any, loaded: Any
) -> None:
    from gpu_worker.engine.infill import InfillOutcome, infill_batch

    config = SamplerConfig.from_json({"commit_rule": "threshold", "threshold": 0.5,
                                      "cache": "dual", "temperature": 0.8})  # fmt: skip
    requests = [{**copy.deepcopy(REQUEST), "seed": seed} for seed in (3, 4, 5)]
    outcomes = infill_batch(loaded, requests, config=config, device="cpu")
    batch = [f"job-b{i}" for i in range(3)]
    runs = []
    for job_id, request, outcome in zip(batch, requests, outcomes, strict=True):
        assert isinstance(outcome, InfillOutcome)
        runs.append(run_record_create(
            job_id=job_id, attempt=0, route="diffusion", model_dir=str(PLACEHOLDER_MODEL),
            weights_sha256=loaded.weights_sha256, tokenizer_sha256=loaded.tokenizer_sha256,
            request=request, outcome=outcome, batch_job_ids=batch, device="cpu",
            router_decision={"route": "diffusion"}, correlation_id=job_id,
        ))  # fmt: skip
    for run in runs:
        report = run_replay(run=run)
        assert report.identical, report.summary
        assert "batch" not in " ".join(report.approximate_reasons)
