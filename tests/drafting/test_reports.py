"""Reporting a span opens an audit incident; bad input opens nothing."""

from __future__ import annotations

import json
from typing import Any

from django.test import Client

from audit.models import Incident
from drafting.models import Draft, Fragment
from tests.drafting.helpers import fill, provisional_draft


def post(client: Client, url: str, body: Any) -> Any:
    return client.post(url, json.dumps(body), content_type="application/json")


def test_reporting_a_model_span_opens_an_incident_and_lists_it(token_client: Client,
                                                               draft: Draft, user: Any) -> None:
    provisional_draft(draft, user)
    summary = fill(draft, "summary")
    url = f"/api/v1/drafts/{draft.id}/fragments/{summary.id}/report"
    answer = post(token_client, url, {"reason": "unsafe", "note": "advises stopping aspirin"})
    assert answer.status_code == 201
    incident = Incident.objects.get(pk=answer.json()["incident"])
    assert incident.kind == "user_report" and incident.job_id == str(summary.job_id)
    assert "Clinical summary" in incident.summary and "stopping aspirin" in incident.summary
    listed = token_client.get("/api/v1/reports").json()["reports"]
    assert [(r["span"], r["status"]) for r in listed] == [("Clinical summary", "open")]


def test_a_report_without_a_reason_or_on_template_text_opens_nothing(
    token_client: Client, draft: Draft, user: Any
) -> None:
    provisional_draft(draft, user)
    summary = fill(draft, "summary")
    base = f"/api/v1/drafts/{draft.id}/fragments"
    no_reason = post(token_client, f"{base}/{summary.id}/report", {"reason": "meh"})
    assert no_reason.status_code == 400 and "reason" in no_reason.json()["errors"]
    text = draft.fragments.filter(kind=Fragment.Kind.TEXT).first()
    assert text is not None
    template = post(token_client, f"{base}/{text.id}/report", {"reason": "other"})
    assert template.status_code == 400 and "not written by the model" in template.json()["error"]
    assert not Incident.objects.exists()
