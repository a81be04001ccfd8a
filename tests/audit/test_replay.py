"""Replay re-runs recorded runs and compares their traces step by step."""

from __future__ import annotations

import copy
import dataclasses
import io
import json
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from audit.models import AuditEvent, RunRecord
from audit.replay import ReplayError, replay_record
from audit.services import run_record_create, run_replay
from gpu_worker.engine.backends import load_backend
from gpu_worker.engine.config import SamplerConfig
from gpu_worker.engine.outcome import Outcome
from gpu_worker.engine.run import run, run_batch
from tests.audit.conftest import PLACEHOLDER_MODEL, REQUEST, run_context

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


AR_MODEL = PLACEHOLDER_MODEL.parent / "stencil-ar-fim"


@pytest.fixture(scope="module")
def loaded() -> Any:
    return load_backend(PLACEHOLDER_MODEL)


@pytest.fixture(scope="module")
def ar_loaded() -> Any:
    return load_backend(AR_MODEL)


@pytest.fixture
def record_real(audit_settings: Any, db: Any, loaded: Any) -> Callable[..., RunRecord]:
    """Run REQUEST through the engine, optionally change the outcome, record it."""

    def make(config: dict[str, Any], seed: int, *, tamper: Callable[[Outcome], Outcome] | None = None,
             **context: Any) -> RunRecord:  # fmt: skip
        request = {**copy.deepcopy(REQUEST), "seed": seed}
        outcome = run("diffusion", loaded, request, SamplerConfig.from_json(config))
        if tamper is not None:
            outcome = tamper(outcome)
        fields: dict[str, Any] = {
            "job_id": "job-r", "request": request, "batch_job_ids": ("job-r",),
            "router_decision": {"route": "diffusion"}, "correlation_id": f"replay-{seed}",
            "template_version": None, **context,
        }  # fmt: skip
        return run_record_create(context=run_context(**fields), outcome=outcome)

    return make


def _with_step(outcome: Outcome, index: int, **changes: Any) -> Outcome:
    """``outcome`` with trace entry ``index`` changed (its trace head follows)."""
    trace = [dict(entry) for entry in outcome.trace]
    trace[index].update(changes)
    return dataclasses.replace(outcome, trace=trace)


def test_replay_of_recorded_runs_is_identical_over_configs_and_seeds(
    record_real: Callable[..., RunRecord],
) -> None:
    reports = []
    for config in CONFIGS:
        for seed in SEEDS:
            record = record_real(config, seed)
            reports.append((config, seed, run_replay(run=record)))
    failures = [(c, s, r.summary) for c, s, r in reports if not r.identical or r.approximate]
    assert not failures
    assert all(r.steps_replayed == r.steps_recorded > 0 for _, _, r in reports)


def test_replay_names_the_step_where_the_trace_diverged(
    record_real: Callable[..., RunRecord],
) -> None:
    def tamper(outcome: Outcome) -> Outcome:
        return _with_step(outcome, 1, committed=outcome.trace[1]["committed"] + 1)

    record = record_real(CONFIGS[0], 7, tamper=tamper)
    report = run_replay(run=record)
    assert not report.identical
    assert report.divergence is not None and report.divergence.step == 1
    assert report.summary.startswith("diverged at step 1: committed ")


def test_different_weights_hash_is_reported_and_replay_marked_approximate(
    record_real: Callable[..., RunRecord],
) -> None:
    def other_weights(outcome: Outcome) -> Outcome:
        return dataclasses.replace(outcome, model={**outcome.model, "weights_sha256": "00" * 32})

    record = record_real(CONFIGS[1], 0, tamper=other_weights)
    report = run_replay(run=record)
    assert report.approximate
    assert "weights sha256 differs: recorded 000000000000" in report.summary
    assert report.identical  # same real weights, so the trace still matches


def test_recorded_gpu_run_replays_on_cpu_as_approximate(
    record_real: Callable[..., RunRecord],
) -> None:
    record = record_real(CONFIGS[0], 0, device="cuda:NVIDIA H200")
    report = run_replay(run=record)
    assert report.approximate
    assert any("cuda:NVIDIA H200" in reason for reason in report.approximate_reasons)


def test_replay_is_itself_audited(record_real: Callable[..., RunRecord]) -> None:
    record = record_real(CONFIGS[0], 0)
    run_replay(run=record)
    event = AuditEvent.objects.get(kind=AuditEvent.Kind.RUN_REPLAYED)
    assert event.subject == f"run:{record.pk}"
    assert json.loads(event.details)["identical"] is True


def test_replay_command_prints_identical(record_real: Callable[..., RunRecord]) -> None:
    record = record_real(CONFIGS[2], 123456789)
    out = io.StringIO()
    call_command("audit_replay", str(record.pk), stdout=out)
    assert out.getvalue().startswith(f"run {record.pk}: identical (")


def test_replay_command_fails_on_divergence(record_real: Callable[..., RunRecord]) -> None:
    def tamper(outcome: Outcome) -> Outcome:
        return _with_step(outcome, 0, canvas_sha256="f" * 64)

    record = record_real(CONFIGS[0], 0, tamper=tamper)
    out = io.StringIO()
    with pytest.raises(CommandError, match="diverged"):
        call_command("audit_replay", str(record.pk), stdout=out)
    assert "diverged at step 0: canvas_sha256" in out.getvalue()


def test_replay_of_a_missing_model_directory_is_a_clear_error(
    record_real: Callable[..., RunRecord], tmp_path: Any
) -> None:
    record = record_real(CONFIGS[0], 0, model_dir=str(tmp_path / "gone"))
    with pytest.raises(CommandError, match="not on this machine"):
        call_command("audit_replay", str(record.pk), stdout=io.StringIO())


def test_a_batched_run_replays_identically_with_its_whole_batch(
    audit_settings: Any, db: Any, loaded: Any
) -> None:
    config = SamplerConfig.from_json({"commit_rule": "threshold", "threshold": 0.5,
                                      "cache": "dual", "temperature": 0.8})  # fmt: skip
    requests = [{**copy.deepcopy(REQUEST), "seed": seed} for seed in (3, 4, 5)]
    outcomes = run_batch("diffusion", loaded, requests, config)
    batch = tuple(f"job-b{i}" for i in range(3))
    runs = []
    for job_id, request, outcome in zip(batch, requests, outcomes, strict=True):
        assert isinstance(outcome, Outcome)
        context = run_context(job_id=job_id, request=request, batch_job_ids=batch,
                              router_decision={"route": "diffusion"}, correlation_id=job_id)
        runs.append(run_record_create(context=context, outcome=outcome))
    for record in runs:
        report = run_replay(run=record)
        assert report.identical, report.summary
        assert "batch" not in " ".join(report.approximate_reasons)


def test_a_shadow_run_replays_on_the_route_that_produced_it(
    audit_settings: Any, db: Any, ar_loaded: Any
) -> None:
    request = {**copy.deepcopy(REQUEST), "seed": 9}
    outcome = run("ar", ar_loaded, request)
    context = run_context(route="shadow-ar", model_dir=str(AR_MODEL), request=request)
    report = run_replay(run=run_record_create(context=context, outcome=outcome))
    assert report.identical, report.summary
    assert report.steps_replayed == len(outcome.trace) > 0


def test_a_record_of_an_unknown_route_is_a_clear_replay_error(record_fake: Any) -> None:
    record = record_fake()
    body = {**json.loads(record.body), "stencil.outcome_route": "beam"}
    with pytest.raises(ReplayError, match="'beam'"):
        replay_record(run_id=str(record.pk), body=json.dumps(body), request=record.request,
                      trace=record.trace)  # fmt: skip
