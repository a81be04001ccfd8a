"""Reporting a bad output: a person flags a span; an audit incident opens on the run that wrote it.

The admin sees the incident, replays its run and exports it as a bundle; the reporter sees its
status beside the span.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import transaction

from drafting.checks import fragment_display_label
from drafting.errors import UserError
from drafting.models import Fragment, ProblemReport

NOTE_MAX = 1000


def fragment_run_record(*, fragment: Fragment) -> Any:
    """The audit run record of the job that wrote this span's text (None when unknown)."""
    from audit.models import RunRecord

    job = fragment.job
    if job is None:
        return None
    run_id = (job.result or {}).get("run_id")
    if not run_id and job.attempts:
        run_id = job.attempts[-1].get("run_id")
    try:
        return RunRecord.objects.filter(pk=uuid.UUID(str(run_id))).first()
    except (ValueError, TypeError):
        return None


def problem_report_create(*, fragment: Fragment, user: Any, reason: str, note: str = ""
                          ) -> ProblemReport:  # fmt: skip
    """Report ``fragment``: checks the input first, then opens the incident and records it."""
    from audit.services import incident_report

    if reason not in ProblemReport.Reason.values:
        raise UserError("Choose what is wrong with this text.",
                        errors={"reason": "Choose one of the reasons."})  # fmt: skip
    note = (note or "").replace("\x00", "").strip()
    if len(note) > NOTE_MAX:
        raise UserError(f"The note is too long: at most {NOTE_MAX} characters.",
                        errors={"note": f"At most {NOTE_MAX} characters."})  # fmt: skip
    if fragment.job_id is None:
        raise UserError("Only text the model wrote can be reported; this text was not "
                        "written by the model.")  # fmt: skip
    label = fragment_display_label(fragment)
    run = fragment_run_record(fragment=fragment)
    where = f"span {label!r} (fragment {fragment.pk}) of draft {fragment.draft_id}"
    with transaction.atomic():
        incident = incident_report(
            run=run, reporter=user, reason=ProblemReport.Reason(reason).label, note=note,
            where=where, job_id=str(fragment.job_id),
        )  # fmt: skip
        return ProblemReport.objects.create(
            draft=fragment.draft, fragment=fragment, span_label=label[:200], reporter=user,
            reason=reason, note=note, incident=incident,
        )  # fmt: skip


def problem_reports_for_draft(*, draft: Any, user: Any) -> list[ProblemReport]:
    return list(ProblemReport.objects.filter(draft=draft, reporter=user)
                .select_related("incident"))  # fmt: skip
