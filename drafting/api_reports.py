"""The JSON API of problem reports: a person reports a span; their reports with status."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from drafting import reports
from drafting.api import _fragment, _typed, api_endpoint
from drafting.api_body import json_body
from drafting.models import ProblemReport


def report_json(report: ProblemReport) -> dict[str, Any]:
    return {
        "id": report.id,
        "draft": report.draft_id,
        "fragment": report.fragment_id,
        "span": report.span_label,
        "reason": report.reason,
        "note": report.note,
        "incident": report.incident_id,
        "status": report.incident.status,
        "created": report.created.isoformat(),
    }


@api_endpoint("POST")
def fragment_report(request: HttpRequest, draft_id: int, fragment_id: int) -> HttpResponse:
    fragment = _fragment(request, draft_id, fragment_id)
    data = json_body(request, allowed={"reason", "note"}, required={"reason"})
    report = reports.problem_report_create(
        fragment=fragment, user=request.user,
        reason=_typed(data, "reason", str, "a string") or "",
        note=_typed(data, "note", str, "a string") or "",
    )  # fmt: skip
    return JsonResponse(report_json(report), status=201)


@api_endpoint("GET")
def problem_reports(request: HttpRequest) -> HttpResponse:
    """The signed-in person's reports, newest first, with their incidents' status."""
    mine = ProblemReport.objects.filter(reporter_id=request.user.pk).select_related("incident")[:100]
    return JsonResponse({"reports": [report_json(r) for r in mine]})
