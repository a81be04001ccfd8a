"""audit_verify detects every kind of tampering and names it; no false alarm on a clean log.

Mutations go through raw SQL, around the app's append-only guard, as an attacker with
database access would.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.models import AuditEvent, Diagnostic, Incident, LogEntry, RunRecord
from audit.selectors import log_verify
from audit.services import checkpoint_write, diagnostic_read, incident_open

TEXT_COLUMNS: dict[type, tuple[str, ...]] = {
    RunRecord: ("body", "trace", "request", "body_sha256", "route", "job_id"),
    Diagnostic: ("key_id",),
    AuditEvent: ("details", "subject", "actor"),
    Incident: ("summary", "job_id"),
    LogEntry: ("digests", "kind", "ref"),
}
BINARY_COLUMNS: dict[type, tuple[str, ...]] = {Diagnostic: ("ciphertext", "nonce")}
TABLES = (RunRecord, Diagnostic, AuditEvent, Incident, LogEntry)
HYPOTHESIS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture
def populated(record_fake: Any, admin_user: Any) -> None:
    """Three runs with encrypted drafts, an incident and an audited read, checkpointed."""
    runs = [record_fake(job_id=f"job-{i}", correlation_id=f"c{i}") for i in range(3)]
    incident_open(kind="user_report", summary="the letter names the wrong clinic", run=runs[0],
                  reporter=admin_user)  # fmt: skip
    diagnostic_read(diagnostic=Diagnostic.objects.earliest("pk"), user=admin_user)
    checkpoint_write()


def _rows(model: type) -> list[Any]:
    table = model._meta.db_table  # type: ignore[attr-defined]
    pk = model._meta.pk.column  # type: ignore[attr-defined]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {pk} FROM {table} ORDER BY {pk}")  # noqa: S608
        return [row[0] for row in cursor.fetchall()]


def _subject(model: type, raw_pk: Any) -> str:
    """How a finding names the row: 'run_record <uuid>', 'log entry #<seq>', ..."""
    if model is LogEntry:
        entry = LogEntry.objects.get(pk=raw_pk)
        return f"log entry #{entry.seq}"
    obj = model._base_manager.get(pk=model._meta.pk.to_python(raw_pk))  # type: ignore[attr-defined]
    return f"{model.LOG_KIND} {obj.pk}"  # type: ignore[attr-defined]


def _sql(query: str, params: list[Any]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(query, params)


def _change(model: type, raw_pk: Any, column: str, position: int, delta: int) -> None:
    table, pk = model._meta.db_table, model._meta.pk.column  # type: ignore[attr-defined]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM {table} WHERE {pk} = %s", [raw_pk])  # noqa: S608
        value = cursor.fetchone()[0]
    if isinstance(value, bytes | memoryview):
        data = bytearray(bytes(value))
        i = position % len(data)
        data[i] ^= 1 + delta % 255
        new: Any = bytes(data)
    else:
        text = str(value)
        i = position % len(text)
        replacement = chr(ord("a") + (ord(text[i]) + 1 + delta % 25) % 26)
        if replacement == text[i]:
            replacement = "#"
        new = text[:i] + replacement + text[i + 1 :]
    _sql(f"UPDATE {table} SET {column} = %s WHERE {pk} = %s", [new, raw_pk])  # noqa: S608


def _expect(subject: str, kinds: set[str]) -> None:
    report = log_verify()
    assert not report.ok, f"tampering with {subject} went unnoticed"
    named = [f for f in report.findings if f.what in kinds and subject in f.subject]
    assert named, f"no {kinds} finding names {subject}: {[str(f) for f in report.findings]}"


def test_untouched_log_verifies_ok(populated: None) -> None:
    report = log_verify()
    assert report.ok, [str(f) for f in report.findings]
    assert report.records == LogEntry.objects.count() == report.checkpoint_size


def test_verify_command_prints_ok_with_sizes(populated: None) -> None:
    out = io.StringIO()
    call_command("audit_verify", stdout=out)
    n = LogEntry.objects.count()
    assert out.getvalue().strip() == f"OK: {n} records, checkpoint at size {n} verified"


def test_verify_command_fails_and_names_the_changed_record(populated: None) -> None:
    run = RunRecord.objects.order_by("created").first()
    assert run is not None
    _change(RunRecord, run.pk.hex, "body", 40, 0)
    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("audit_verify", stdout=out)
    assert f"CHANGED: run_record {run.pk}: fields body differ" in out.getvalue()


@HYPOTHESIS
@given(
    table=st.sampled_from(TABLES), row=st.integers(0, 50), position=st.integers(0, 10_000),
    delta=st.integers(0, 1000), column_pick=st.integers(0, 10),
)  # fmt: skip
def test_changed_byte_in_any_record_is_detected(
    populated: None, table: type, row: int, position: int, delta: int, column_pick: int
) -> None:
    columns = TEXT_COLUMNS[table] + BINARY_COLUMNS.get(table, ())
    column = columns[column_pick % len(columns)]
    with transaction.atomic():
        raw_pk = _rows(table)[row % len(_rows(table))]
        subject = _subject(table, raw_pk)
        _change(table, raw_pk, column, position, delta)
        _expect(subject, {"changed", "reordered", "swapped"})
        transaction.set_rollback(True)


@HYPOTHESIS
@given(table=st.sampled_from(TABLES), row=st.integers(0, 50))
def test_deleted_record_is_detected(populated: None, table: type, row: int) -> None:
    with transaction.atomic():
        raw_pk = _rows(table)[row % len(_rows(table))]
        subject = _subject(table, raw_pk)
        t, pk = table._meta.db_table, table._meta.pk.column  # type: ignore[attr-defined]
        _sql(f"DELETE FROM {t} WHERE {pk} = %s", [raw_pk])  # noqa: S608
        _expect(subject, {"deleted"})
        transaction.set_rollback(True)


@HYPOTHESIS
@given(i=st.integers(0, 50), j=st.integers(0, 50))
def test_reordered_log_entries_are_detected(populated: None, i: int, j: int) -> None:
    n = LogEntry.objects.count()
    i, j = i % n, j % n
    if i == j:
        j = (i + 1) % n
    with transaction.atomic():
        _sql("UPDATE audit_logentry SET seq = -1 WHERE seq = %s", [i])
        _sql("UPDATE audit_logentry SET seq = %s WHERE seq = %s", [i, j])
        _sql("UPDATE audit_logentry SET seq = %s WHERE seq = -1", [j])
        _expect(f"log entry #{i}", {"reordered"})
        _expect(f"log entry #{j}", {"reordered"})
        transaction.set_rollback(True)


@HYPOTHESIS
@given(i=st.integers(0, 50), j=st.integers(0, 50))
def test_swapped_ciphertexts_are_detected(populated: None, i: int, j: int) -> None:
    ids = _rows(Diagnostic)
    a, b = ids[i % len(ids)], ids[j % len(ids)]
    if a == b:
        b = ids[(ids.index(a) + 1) % len(ids)]
    with transaction.atomic():
        ca = bytes(Diagnostic.objects.get(pk=a).ciphertext)
        cb = bytes(Diagnostic.objects.get(pk=b).ciphertext)
        _sql("UPDATE audit_diagnostic SET ciphertext = %s WHERE id = %s", [cb, a])
        _sql("UPDATE audit_diagnostic SET ciphertext = %s WHERE id = %s", [ca, b])
        _expect(f"diagnostic {a}", {"swapped"})
        _expect(f"diagnostic {b}", {"swapped"})
        transaction.set_rollback(True)


def test_inserted_row_without_log_entry_is_detected(populated: None) -> None:
    run = RunRecord.objects.first()
    assert run is not None
    _sql(
        "INSERT INTO audit_incident (kind, run_id, job_id, reporter_name, summary, status, "
        "created) VALUES ('fallback', NULL, 'x', 'system', 'forged', 'open', %s)",
        [run.created],
    )
    forged = Incident.objects.get(summary="forged")
    _expect(f"incident {forged.pk}", {"inserted"})


def test_edited_checkpoint_file_is_detected(populated: None, audit_settings: Any) -> None:
    path = Path(audit_settings.AUDIT_CHECKPOINT_FILE)
    lines = path.read_text().splitlines()
    lines[0] = lines[0].replace('"size":', '"size":1', 1)
    path.write_text("\n".join(lines) + "\n")
    report = log_verify()
    assert any(f.what == "checkpoint" and "line 1" in f.subject for f in report.findings)


def test_log_rewritten_consistently_with_its_rows_still_fails_the_checkpoint(
    populated: None,
) -> None:
    """Editing a run and re-hashing its log entry leaves the signed Merkle root behind."""
    run = RunRecord.objects.order_by("created").first()
    assert run is not None
    _change(RunRecord, run.pk.hex, "route", 0, 3)
    fresh = RunRecord._base_manager.get(pk=run.pk)
    from audit.canonical import canonical_json

    _sql(
        "UPDATE audit_logentry SET digests = %s WHERE kind = 'run_record' AND ref = %s",
        [canonical_json(fresh.field_digests()), str(run.pk)],
    )
    entry = LogEntry.objects.get(kind="run_record", ref=str(run.pk))
    _expect(f"log entry #{entry.seq}", {"changed"})


def test_unparseable_column_is_a_finding_not_a_crash(populated: None) -> None:
    # A log entry's digests are JSON text on every database: garble one.
    _sql("UPDATE audit_logentry SET digests = 'not json' WHERE kind = 'incident'", [])
    findings = log_verify().findings
    assert findings, "a garbled log entry went unnoticed"
    assert all(f.what in {"changed", "deleted", "reordered", "inserted", "swapped"}
               for f in findings)  # fmt: skip
