from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from audit.canonical import canonical_json, sha256_hex
from audit.models import AppendOnlyError, Diagnostic, LogEntry, RunRecord
from audit.services import checkpoint_write, diagnostics_sampled, diagnostics_wanted
from gpu_worker.engine.trace import trace_chain
from tests.audit.conftest import SNAPSHOT_MARKER, fake_outcome, fake_trace


def test_run_record_body_is_canonical_json_with_its_sha256(record_fake: Any) -> None:
    run = record_fake()
    body = json.loads(run.body)
    assert run.body == canonical_json(body)
    assert run.body_sha256 == sha256_hex(run.body)


def test_run_record_body_uses_opentelemetry_genai_names(record_fake: Any) -> None:
    body = json.loads(record_fake().body)
    assert body["gen_ai.request.seed"] == 7
    assert body["gen_ai.request.model"] == "stencil-placeholder"
    assert body["gen_ai.request.temperature"] == 0.0
    assert body["gen_ai.request.top_p"] == 1.0
    assert body["gen_ai.request.max_tokens"] == 12
    assert body["gen_ai.usage.output_tokens"] == 6  # 3 steps x 2 committed


def test_run_record_body_holds_what_reproduces_the_run(record_fake: Any) -> None:
    body = json.loads(record_fake().body)
    assert body["stencil.model"]["weights_sha256"] == "11" * 32
    assert body["stencil.model"]["tokenizer_sha256"] == "22" * 32
    assert body["stencil.sampler"]["config_sha256"] == "cd" * 32
    assert len(body["stencil.generator"]["initial_state_sha256"]) == 64
    assert body["stencil.runtime"]["torch"]
    assert body["stencil.runtime"]["git_revision"]
    assert body["stencil.batch"] == {"size": 1, "job_ids": ["job-1"], "position": 0}
    assert body["stencil.canvas"]["template_version"] == "letter@1"
    assert body["stencil.outcome"]["trace_steps"] == 3
    assert body["stencil.router_decision"] == {"route": "diffusion", "why": "default"}


def test_run_record_trace_head_is_the_outcomes_trace_sha256(record_fake: Any) -> None:
    outcome = fake_outcome()
    run = record_fake(outcome=outcome)
    body = json.loads(run.body)
    assert run.schema_version == body["schema_version"] == 2
    assert run.trace_sha256 == body["stencil.outcome"]["trace_sha256"] == outcome.trace_sha256
    assert outcome.trace_sha256 == trace_chain(fake_trace())
    assert "trace_chain_head" not in body["stencil.outcome"]  # one head, said once


def test_run_record_names_the_model_that_produced_the_outcome(record_fake: Any) -> None:
    outcome = fake_outcome(model={**fake_outcome().model, "weights_sha256": "33" * 32})
    model = json.loads(record_fake(outcome=outcome).body)["stencil.model"]
    assert model["weights_sha256"] == "33" * 32
    assert model["dir"].endswith("stencil-placeholder")


def test_trace_steps_are_hash_chained(record_fake: Any) -> None:
    run = record_fake()
    steps = json.loads(run.trace)
    assert [s["index"] for s in steps] == [0, 1, 2]
    assert steps[0]["prev"] == "0" * 64
    assert all(b["prev"] == a["chain"] for a, b in zip(steps, steps[1:], strict=False))
    assert run.trace_sha256 == steps[-1]["chain"]
    assert steps[0]["data"]["committed"]["count"] == 2
    assert steps[0]["timing"] == {"forward_ms": 1.5, "step_ms": 2.0}


def test_no_raw_intermediate_text_in_records_logs_or_checkpoints(
    record_fake: Any, audit_settings: Any
) -> None:
    output_text = "Mr Unmistakable Outputname"
    outcome = fake_outcome(
        trace=[{**s, "draft": f"{SNAPSHOT_MARKER} in trace"} for s in fake_trace()],
        holes={"name": output_text},
        document=f"Dear {output_text}",
        violations=[{"name": "pattern", "hole": "name", "message": f"{SNAPSHOT_MARKER} bad"}],
    )
    run = record_fake(outcome=outcome)
    checkpoint_write()
    assert Diagnostic.objects.filter(run=run).exists()  # drafts were kept, encrypted
    with connection.cursor() as cursor:
        dumps = []
        for table in ("audit_runrecord", "audit_logentry", "audit_auditevent", "audit_diagnostic"):
            cursor.execute(f"SELECT * FROM {table}")  # noqa: S608 - fixed table names
            dumps.append(repr(cursor.fetchall()))
    stored = "\n".join(dumps) + Path(audit_settings.AUDIT_CHECKPOINT_FILE).read_text()
    assert SNAPSHOT_MARKER not in stored
    assert output_text not in stored


def test_append_only_rows_refuse_update_and_delete(record_fake: Any) -> None:
    run = record_fake()
    run.route = "ar"
    with pytest.raises(AppendOnlyError):
        run.save()
    with pytest.raises(AppendOnlyError):
        run.delete()
    with pytest.raises(AppendOnlyError):
        RunRecord.objects.filter(pk=run.pk).update(route="ar")
    with pytest.raises(AppendOnlyError):
        RunRecord.objects.all().delete()
    with pytest.raises(AppendOnlyError):
        LogEntry.objects.all().delete()
    assert RunRecord.objects.get(pk=run.pk).route == "diffusion"


def test_diagnostics_sampling_is_deterministic_and_follows_the_share(audit_settings: Any) -> None:
    audit_settings.AUDIT_DIAGNOSTIC_SHARE = 0.3
    ids = [f"corr-{i}" for i in range(2000)]
    first = [diagnostics_sampled(correlation_id=c) for c in ids]
    assert first == [diagnostics_wanted(correlation_id=c) for c in ids]
    assert 0.25 < sum(first) / len(first) < 0.35
    audit_settings.AUDIT_DIAGNOSTIC_SHARE = 0.0
    assert not any(diagnostics_wanted(correlation_id=c) for c in ids[:50])


def test_unsampled_run_keeps_no_snapshots(record_fake: Any, audit_settings: Any) -> None:
    audit_settings.AUDIT_DIAGNOSTIC_SHARE = 0.0
    run = record_fake()
    assert not run.has_diagnostics
    assert not Diagnostic.objects.filter(run=run).exists()


def test_negative_attempt_is_rejected(record_fake: Any) -> None:
    with pytest.raises(ValueError, match="attempt"):
        record_fake(attempt=-1)


def test_development_keys_are_generated_once_with_mode_0600(
    audit_settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from audit import keys

    audit_settings.AUDIT_DEV_KEYS = True
    audit_settings.AUDIT_ENCRYPTION_KEYS = []
    audit_settings.AUDIT_SIGNING_KEY = ""
    first = keys.encryption_keys()
    keys.signing_key()
    assert keys.encryption_keys() == first
    for name in (keys.ENCRYPTION_KEY_FILE, keys.SIGNING_KEY_FILE):
        path = Path(audit_settings.VAR_DIR) / "audit" / name
        assert path.stat().st_mode & 0o777 == 0o600
    assert "generated a development" in caplog.text


def test_production_requires_keys_from_the_environment(audit_settings: Any) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from audit import keys

    audit_settings.AUDIT_DEV_KEYS = False  # what DEBUG off means
    audit_settings.AUDIT_ENCRYPTION_KEYS = []
    audit_settings.AUDIT_SIGNING_KEY = ""
    with pytest.raises(ImproperlyConfigured, match="AUDIT_ENCRYPTION_KEYS"):
        keys.encryption_keys()
    with pytest.raises(ImproperlyConfigured, match="AUDIT_SIGNING_KEY"):
        keys.signing_key()
