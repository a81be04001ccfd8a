"""Audit reads: who may read diagnostics, traces for the admin, incident bundles, verification."""

from __future__ import annotations

import json
from typing import Any

from audit.models import Incident, LogEntry, RunRecord
from audit.verify import VerifyReport
from audit.verify import log_verify as verify_all

AUDITORS_GROUP = "auditors"
BUNDLE_FORMAT = "stencil.audit.incident_bundle/1"


def user_is_auditor(*, user: Any) -> bool:
    """Superusers and members of the ``auditors`` group may read diagnostics."""
    if user is None or not getattr(user, "is_authenticated", False):
        return False
    if getattr(user, "is_superuser", False):
        return True
    return bool(user.groups.filter(name=AUDITORS_GROUP).exists())


def run_trace_steps(*, run: RunRecord) -> list[dict[str, Any]]:
    """The hashed trace of a run, one dict per step (for the admin timeline)."""
    steps: list[dict[str, Any]] = json.loads(run.trace)
    return steps


def run_body_get(*, run: RunRecord) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(run.body)
    return body


def run_log_entries(*, run: RunRecord) -> list[LogEntry]:
    return list(LogEntry.objects.filter(kind=RunRecord.LOG_KIND, ref=str(run.pk)).order_by("seq"))


def incident_bundle_get(*, incident: Incident) -> dict[str, Any]:
    """Everything needed to reproduce an incident's run, as one JSON-able dict."""
    bundle: dict[str, Any] = {
        "format": BUNDLE_FORMAT,
        "incident": {
            "id": incident.pk,
            "kind": incident.kind,
            "status": incident.status,
            "summary": incident.summary,
            "job_id": incident.job_id,
            "reporter": incident.reporter_name,
            "created": incident.created.isoformat(),
        },
        "run": None,
        "reproduce": None,
        "attempts": [],
    }
    run = RunRecord.objects.filter(pk=incident.run_id).first() if incident.run_id else None
    if run is not None:
        body = run_body_get(run=run)
        bundle["run"] = {
            "id": str(run.pk),
            "created": run.created.isoformat(),
            "body": body,
            "body_sha256": run.body_sha256,
            "request": json.loads(run.request),
            "trace": run_trace_steps(run=run),
            "trace_chain_head": run.trace_sha256,
            "log_entries": [e.seq for e in run_log_entries(run=run)],
        }
        bundle["reproduce"] = {
            "route": body["stencil.route"],
            "model": body["stencil.model"],
            "seed": body["stencil.generator"]["seed"],
            "sampler_config": body["stencil.sampler"]["config"],
            "sampler_config_sha256": body["stencil.sampler"]["config_sha256"],
            "runtime": body["stencil.runtime"],
            "batch": body["stencil.batch"],
            "command": f"python manage.py audit_replay {run.pk}",
        }
    job_id = incident.job_id or (run.job_id if run else None)
    if job_id:
        bundle["attempts"] = [
            {
                "run_id": str(r.pk),
                "attempt": r.attempt,
                "route": r.route,
                "created": r.created.isoformat(),
                "body_sha256": r.body_sha256,
            }
            for r in RunRecord.objects.filter(job_id=job_id).order_by("created")
        ]
    return bundle


def log_verify(*, expect_size: int | None = None) -> VerifyReport:
    """Check every record against the log and the log against the signed checkpoints."""
    return verify_all(expect_size=expect_size)
