"""A cut tail and a re-signed forgery are detected; nothing signs over tampering.

The witness (a copy of the newest signed checkpoint kept apart from the checkpoint file) and
an operator-recorded size give the verifier an expected length the database cannot rewrite.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from audit.canonical import canonical_json
from audit.models import LogEntry, RunRecord
from audit.selectors import log_verify
from audit.services import CheckpointRefused, checkpoint_write
from audit.witness import witness_path


@pytest.fixture
def runs(record_fake: Any, audit_settings: Any) -> list[RunRecord]:
    """Three runs under two signed checkpoints: the second covers the last run alone."""
    made = [record_fake(job_id=f"job-{i}", correlation_id=f"c{i}") for i in range(2)]
    checkpoint_write()
    made.append(record_fake(job_id="job-2", correlation_id="c2"))
    checkpoint_write()
    assert log_verify().ok
    return made


def _sql(query: str, params: list[Any]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(query, params)


def _checkpoint_file(settings: Any) -> Path:
    return Path(settings.AUDIT_CHECKPOINT_FILE)


def _drop_last_checkpoint(settings: Any) -> None:
    path = _checkpoint_file(settings)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) >= 2, "the fixture writes one checkpoint per run and one catch-up"
    path.write_text("\n".join(lines[:-1]) + "\n", encoding="utf-8")


def _pk(run: RunRecord) -> str:
    return run.pk.hex if connection.vendor == "sqlite" else str(run.pk)


def _delete_last_run(run: RunRecord) -> None:
    """Delete the run, its diagnostics and their log entries, as one consistent cut."""
    _sql("DELETE FROM audit_logentry WHERE (kind = 'run_record' AND ref = %s) OR (kind = "
         "'diagnostic' AND ref IN (SELECT CAST(id AS VARCHAR(64)) FROM audit_diagnostic "
         "WHERE run_id = %s))", [str(run.pk), _pk(run)])  # fmt: skip
    _sql("DELETE FROM audit_diagnostic WHERE run_id = %s", [_pk(run)])
    _sql("DELETE FROM audit_runrecord WHERE id = %s", [_pk(run)])


def test_a_clean_log_verifies_with_its_witness(runs: list[RunRecord]) -> None:
    report = log_verify(expect_size=LogEntry.objects.count())
    assert report.ok, [str(f) for f in report.findings]
    assert witness_path().exists()


def test_deleting_the_last_checkpoint_line_is_a_finding(runs: Any, audit_settings: Any) -> None:
    _drop_last_checkpoint(audit_settings)
    report = log_verify()
    assert not report.ok
    assert any(f.what == "deleted" and "tail was cut" in f.detail for f in report.findings)


def test_cutting_the_checkpoint_the_log_entry_and_the_row_together_is_a_finding(
    runs: list[RunRecord], audit_settings: Any
) -> None:
    _drop_last_checkpoint(audit_settings)
    _delete_last_run(runs[-1])
    report = log_verify()
    assert not report.ok, "a consistent cut of all three tails verified as OK"
    assert any("tail was cut" in f.detail for f in report.findings)


def test_without_the_witness_an_operator_recorded_size_still_catches_the_cut(
    runs: list[RunRecord], audit_settings: Any
) -> None:
    size = LogEntry.objects.count()
    _drop_last_checkpoint(audit_settings)
    _delete_last_run(runs[-1])
    witness_path().write_text(_checkpoint_file(audit_settings).read_text().splitlines()[-1])
    report = log_verify(expect_size=size)
    assert any(f.what == "deleted" and f"short of the {size}" in f.detail for f in report.findings)
    with pytest.raises(CommandError):
        call_command("audit_verify", "--expect-size", str(size))


def test_no_checkpoint_is_signed_over_a_cut_tail(runs: Any, audit_settings: Any) -> None:
    _drop_last_checkpoint(audit_settings)
    with pytest.raises(CheckpointRefused, match="tail was cut"):
        checkpoint_write()
    with pytest.raises(CommandError, match="refusing to sign"):
        call_command("audit_checkpoint")
    assert not log_verify().ok  # still detected: nothing re-signed it


def test_a_forged_run_re_logged_and_checkpointed_is_still_detected(
    runs: list[RunRecord], audit_settings: Any
) -> None:
    """Edit a run's route, log it again as a new version and sign: the new entry is a finding."""
    run = runs[0]
    _sql("UPDATE audit_runrecord SET route = 'ar' WHERE id = %s", [_pk(run)])
    forged = RunRecord._base_manager.get(pk=run.pk)
    seq = LogEntry.objects.count()
    _sql(
        "INSERT INTO audit_logentry (seq, kind, ref, digests, created) "
        "SELECT %s, kind, ref, %s, created FROM audit_logentry "
        "WHERE kind = 'run_record' AND ref = %s",
        [seq, canonical_json(forged.field_digests()), str(run.pk)],
    )
    with pytest.raises(CommandError, match="refusing to sign"):
        call_command("audit_checkpoint")
    checkpoint_write()  # the automatic path signs new entries; the verifier still objects
    report = log_verify()
    assert any(f.what == "inserted" and "written once" in f.detail for f in report.findings)


def test_the_warning_about_unsigned_entries_never_advises_signing_blindly(
    runs: list[RunRecord], record_fake: Any, monkeypatch: Any
) -> None:
    monkeypatch.setattr("audit.services.checkpoint_write", lambda: None)
    record_fake(job_id="job-late", correlation_id="late")
    warnings = log_verify().warnings
    assert warnings and all("only once this verification finds nothing" in w for w in warnings)
