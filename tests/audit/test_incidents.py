from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from audit.models import AppendOnlyError, AuditEvent, Incident
from audit.selectors import incident_bundle_get, log_verify
from audit.services import checkpoint_write, incident_open, incident_status_set
from tests.audit.conftest import REQUEST


def test_incident_opened_by_a_person_records_the_reporter(record_fake: Any, user: Any) -> None:
    run = record_fake()
    incident = incident_open(kind="user_report", summary="wrong date", run=run, reporter=user)
    assert (incident.reporter, incident.reporter_name) == (user, "alice")
    assert incident.job_id == run.job_id
    assert incident.status == Incident.Status.OPEN


def test_automatic_incident_needs_no_run(audit_settings: Any, db: Any) -> None:
    incident = incident_open(kind="fallback", summary="diffusion failed; AR used", job_id="j9")
    assert (incident.run, incident.reporter_name, incident.job_id) == (None, "system", "j9")


@pytest.mark.parametrize(("kind", "summary"), [("nonsense", "x"), ("fallback", "  ")])
def test_bad_incident_input_is_rejected(
    audit_settings: Any, db: Any, kind: str, summary: str
) -> None:
    with pytest.raises(ValueError):
        incident_open(kind=kind, summary=summary)


def test_incident_bundle_holds_what_reproduces_the_run(record_fake: Any) -> None:
    run = record_fake()
    incident = incident_open(kind="validation_failure", summary="pattern failed", run=run)
    bundle = incident_bundle_get(incident=incident)
    json.dumps(bundle)  # JSON-able
    assert bundle["run"]["request"] == REQUEST
    assert bundle["run"]["body_sha256"] == run.body_sha256
    assert [s["chain"] for s in bundle["run"]["trace"]][-1] == run.trace_sha256
    reproduce = bundle["reproduce"]
    assert reproduce["seed"] == 7
    assert reproduce["model"]["weights_sha256"] == "11" * 32
    assert reproduce["model"]["tokenizer_sha256"] == "22" * 32
    assert reproduce["sampler_config_sha256"] == "cd" * 32
    assert reproduce["command"] == f"python manage.py audit_replay {run.pk}"
    assert [a["run_id"] for a in bundle["attempts"]] == [str(run.pk)]


def test_bundle_command_prints_the_bundle(record_fake: Any) -> None:
    incident = incident_open(kind="fallback", summary="fell back", run=record_fake())
    out = io.StringIO()
    call_command("audit_incident_bundle", str(incident.pk), stdout=out)
    assert json.loads(out.getvalue())["incident"]["id"] == incident.pk
    with pytest.raises(CommandError, match="no incident"):
        call_command("audit_incident_bundle", "999999", stdout=io.StringIO())


def test_status_change_is_audited_and_keeps_the_log_valid(record_fake: Any, user: Any) -> None:
    incident = incident_open(kind="user_report", summary="typo", run=record_fake(), reporter=user)
    incident_status_set(incident=incident, status="resolved", user=user)
    assert Incident.objects.get(pk=incident.pk).status == "resolved"
    event = AuditEvent.objects.get(kind=AuditEvent.Kind.INCIDENT_STATUS_CHANGED)
    assert json.loads(event.details) == {"from": "open", "to": "resolved"}
    checkpoint_write()
    assert log_verify().ok


def test_incidents_cannot_be_deleted(record_fake: Any) -> None:
    incident = incident_open(kind="fallback", summary="x", run=record_fake())
    with pytest.raises(AppendOnlyError):
        incident.delete()
