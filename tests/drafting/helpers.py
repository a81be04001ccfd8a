"""Helpers for drafting tests: the referral template, its values, a stand-in for the worker."""

from __future__ import annotations

from typing import Any

from drafting import services
from drafting.models import Draft, Fragment, InfillJob

REFERRAL_SOURCE = """Dear {{ field("doctor", label="Referring to", max_length=60) }},

I am referring {{ field("patient_name", label="Patient name", max_length=60) }}, \
born {{ field("birth_date", type="date", label="Date of birth") }}, for \
{% infill "reason", max_tokens=16, label="Reason for referral" %}why the patient is referred{% endinfill %}.

Urgency: {% infill "urgency", max_tokens=4, choices=["routine", "soon", "urgent"], label="Urgency" %}how urgent{% endinfill %}.

{% infill "summary", max_tokens=32, label="Clinical summary" %}history and findings{% endinfill %}

Kind regards,
{{ field("sender", label="Your name", max_length=60) }}
"""

VALUES = {
    "doctor": "Dr. Imani Okafor",
    "patient_name": "Jonas Berg",
    "birth_date": "1961-04-17",
    "sender": "Dr. Lea Martin",
}

FILLS = {
    "reason": "worsening exertional chest pain",
    "urgency": "soon",
    "summary": "Two months of angina; ECG shows ST depression.",
}


def fill(draft: Draft, name: str) -> Fragment:
    return draft.fragments.get(kind=Fragment.Kind.FILL, name=name)


def job_succeed(job: InfillJob, texts: dict[str, str] | None = None,
                **extra: Any) -> InfillJob:  # fmt: skip
    """What a worker does when a job succeeds: the result, then the draft's provisional text.

    ``extra`` adds result keys (``confidence`` keyed by hole *name*, ``domain``,
    ``needs_person``), as the worker writes them; a job without them is an older job."""
    holes = {t["hole"]: (texts or FILLS).get(t["hole"].rsplit("_", 1)[0], "model text")
             for t in job.target_fragments}  # fmt: skip
    if isinstance(extra.get("confidence"), dict):  # by name here; the result is keyed by hole
        by_name = extra["confidence"]
        extra["confidence"] = {t["hole"]: by_name[t["hole"].rsplit("_", 1)[0]]
                               for t in job.target_fragments
                               if t["hole"].rsplit("_", 1)[0] in by_name}  # fmt: skip
    InfillJob.objects.filter(pk=job.pk).update(
        state=InfillJob.State.SUCCEEDED,
        result={"holes": holes, "document": "", "violations": [], "run_id": "r1", **extra},
    )
    job.refresh_from_db()
    services.draft_apply_job_result(job=job)
    return job


def provisional_draft(draft: Draft, user: Any) -> Draft:
    """The draft with its three infills holding provisional model text."""
    job = services.draft_infill_request(draft=draft, user=user, preset="fast")
    job_succeed(job)
    draft.refresh_from_db()
    return draft


def reviewed_draft(draft: Draft, user: Any) -> Draft:
    """The draft with its infills filled and every span accepted: ready to accept."""
    provisional_draft(draft, user)
    for f in draft.fragments.filter(status=Fragment.Status.PROVISIONAL):
        services.fragment_review(fragment=f, action="accept", user=user)
    draft.refresh_from_db()
    return draft
