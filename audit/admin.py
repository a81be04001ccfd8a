"""Admin: runs, incidents, diagnostics, the log. Audit rows are read-only here; the admin only
translates clicks into audit.services calls (replay, status change, diagnostic read)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from audit import selectors, services
from audit.models import AuditEvent, Diagnostic, Incident, LogEntry, RunRecord
from audit.replay import ReplayError

TIMELINE_COLUMNS_MAX = 8
INCIDENT_SUMMARY_MAX = 2000
REPLAY_TASK = "audit.tasks.run_replay"  # enqueued by name, on the audit queue


def replay_dispatch(*, run_id: str) -> None:
    """Send a run's id (never the run) to the audit queue's replay task."""
    from celery import current_app as app
    from django.conf import settings

    app.send_task(REPLAY_TASK, (run_id,), queue=settings.QUEUE_AUDIT)


def _replay_summary(event: AuditEvent) -> str:
    try:
        details = json.loads(event.details)
    except ValueError:
        return "unreadable result"
    return str(details.get("summary") or ("identical" if details.get("identical") else "diverged"))

if TYPE_CHECKING:
    ModelAdminBase = admin.ModelAdmin[Any]
else:
    ModelAdminBase = admin.ModelAdmin


class ReadOnlyAdmin(ModelAdminBase):
    """View-only: the app never updates or deletes audit records, nor does the admin."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class HasIncidentFilter(admin.SimpleListFilter):
    title = "has incident"
    parameter_name = "has_incident"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Yes"), ("no", "No")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "yes":
            return queryset.filter(n_incidents__gt=0)
        if self.value() == "no":
            return queryset.filter(n_incidents=0)
        return queryset


def _cell(value: Any) -> str:
    if isinstance(value, dict):
        if "count" in value:
            return f"{value['count']} ({str(value.get('sha256', ''))[:8]})"
        return ", ".join(f"{k}={_cell(v)}" for k, v in sorted(value.items()))
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, str) and len(value) > 16:
        return value[:12] + "…"
    return "" if value is None else str(value)


def trace_timeline(steps: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """Column names and rows for the admin's trace table."""
    columns: list[str] = []
    for step in steps:
        for key in step.get("data", {}):
            if key not in columns and key not in ("step", "index"):
                columns.append(key)
    columns = columns[:TIMELINE_COLUMNS_MAX]
    rows = [
        {
            "index": step.get("index"),
            "cells": [_cell(step.get("data", {}).get(c)) for c in columns],
            "timing": _cell(step.get("timing", {})),
            "chain": str(step.get("chain", ""))[:12],
        }
        for step in steps
    ]
    return columns, rows


@admin.register(RunRecord)
class RunRecordAdmin(ReadOnlyAdmin):
    list_display = (
        "id", "created", "route", "model_name", "attempt", "job_id", "has_diagnostics",
        "incident_count",
    )  # fmt: skip
    list_filter = (
        "route",
        ("created", admin.DateFieldListFilter),
        "model_name",
        HasIncidentFilter,
        "has_diagnostics",
    )
    search_fields = ("job_id", "correlation_id")
    date_hierarchy = "created"
    exclude = ("body", "trace", "request")
    readonly_fields = (
        "id", "created", "route", "attempt", "job_id", "correlation_id", "model_name",
        "has_diagnostics", "schema_version", "body_sha256", "trace_sha256", "body_pretty",
        "request_pretty",
    )  # fmt: skip
    actions = ["replay_selected"]
    change_form_template = "admin/audit/runrecord/change_form.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet[RunRecord]:
        return super().get_queryset(request).annotate(n_incidents=Count("incidents"))

    @admin.display(description="incidents", ordering="n_incidents")
    def incident_count(self, obj: RunRecord) -> int:
        return int(getattr(obj, "n_incidents", 0))

    @admin.display(description="run record body")
    def body_pretty(self, obj: RunRecord) -> str:
        return json.dumps(json.loads(obj.body), indent=2, sort_keys=True)

    @admin.display(description="request canvas")
    def request_pretty(self, obj: RunRecord) -> str:
        return json.dumps(json.loads(obj.request), indent=2, sort_keys=True)

    def get_urls(self) -> list[URLPattern]:
        custom = [
            path(
                "<path:object_id>/replay/",
                self.admin_site.admin_view(self.replay_view),
                name="audit_runrecord_replay",
            ),
            path(
                "<path:object_id>/incident/",
                self.admin_site.admin_view(self.incident_view),
                name="audit_runrecord_incident",
            ),
        ]
        return custom + super().get_urls()

    def incident_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Open an incident on this run: a summary of what is wrong, by the signed-in admin."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        run = get_object_or_404(RunRecord, pk=object_id)
        summary = ""
        error = ""
        status = 200
        if request.method == "POST":
            summary = str(request.POST.get("summary") or "").replace("\x00", "").strip()
            if not summary:
                error, status = "Say what is wrong with this run.", 400
            elif len(summary) > INCIDENT_SUMMARY_MAX:
                error, status = f"At most {INCIDENT_SUMMARY_MAX} characters.", 400
            else:
                incident = services.incident_open(
                    kind=Incident.Kind.USER_REPORT, summary=summary, run=run,
                    reporter=request.user,
                )  # fmt: skip
                self.message_user(request, f"Incident {incident.pk} opened on run {run.pk}.",
                                  messages.SUCCESS)  # fmt: skip
                return HttpResponseRedirect(
                    reverse("admin:audit_incident_change", args=[incident.pk]))
        context = {
            **self.admin_site.each_context(request),
            "title": f"Open an incident on run {run.pk}",
            "run": run,
            "summary": summary,
            "error": error,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/audit/runrecord/incident.html", context,
                                status=status)  # fmt: skip

    def _replay(self, request: HttpRequest, run: RunRecord) -> None:
        try:
            report = services.run_replay(run=run, actor=request.user.get_username())
        except ReplayError as exc:
            self.message_user(request, f"run {run.pk}: cannot replay: {exc}", messages.ERROR)
            return
        level = messages.SUCCESS if report.identical else messages.WARNING
        self.message_user(request, f"run {run.pk}: {report.summary}", level)

    @admin.action(description="Replay selected runs in the background and compare traces")
    def replay_selected(self, request: HttpRequest, queryset: QuerySet[RunRecord]) -> None:
        """Queue one replay task per run (a replay re-runs the model: seconds each), so the
        page answers at once; each result is a 'run replayed' audit event on the run's page."""
        run_ids = [str(pk) for pk in queryset.values_list("pk", flat=True)]
        for run_id in run_ids:
            replay_dispatch(run_id=run_id)
        self.message_user(
            request, f"{len(run_ids)} replay(s) queued. Each result appears on its run's page "
            "and as a 'run replayed' audit event.", messages.SUCCESS,
        )  # fmt: skip

    def replay_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if request.method != "POST" or not self.has_view_permission(request):
            raise PermissionDenied
        run = get_object_or_404(RunRecord, pk=object_id)
        self._replay(request, run)
        return HttpResponseRedirect(reverse("admin:audit_runrecord_change", args=[run.pk]))

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        run = RunRecord.objects.filter(pk=object_id).first()
        context = dict(extra_context or {})
        if run is not None:
            columns, rows = trace_timeline(selectors.run_trace_steps(run=run))
            context.update(
                trace_columns=columns,
                trace_rows=rows,
                diagnostics=list(run.diagnostics.all()),
                incidents=list(Incident.objects.filter(run_id=run.pk)),
                replay_url=reverse("admin:audit_runrecord_replay", args=[run.pk]),
                incident_url=reverse("admin:audit_runrecord_incident", args=[run.pk]),
            )
            last = (AuditEvent.objects.filter(kind=AuditEvent.Kind.RUN_REPLAYED,
                                              subject=f"run:{run.pk}")
                    .order_by("-created").first())  # fmt: skip
            if last is not None:
                context.update(last_replay=last, last_replay_summary=_replay_summary(last))
        return super().change_view(request, object_id, form_url, extra_context=context)


@admin.register(Incident)
class IncidentAdmin(ModelAdminBase):
    list_display = ("id", "created", "kind", "status", "run", "job_id", "reporter_name")
    list_filter = ("kind", "status", ("created", admin.DateFieldListFilter))
    search_fields = ("job_id", "summary")
    fields = ("status", "kind", "summary", "run", "job_id", "reporter_name", "created")
    readonly_fields = ("kind", "summary", "run", "job_id", "reporter_name", "created")
    actions = ["export_bundles"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Incident, form: Any, change: bool) -> None:
        if change and "status" in form.changed_data:
            services.incident_status_set(
                incident=obj, status=form.cleaned_data["status"], user=request.user
            )

    @admin.action(description="Export incident bundle (JSON)")
    def export_bundles(self, request: HttpRequest, queryset: QuerySet[Incident]) -> HttpResponse:
        bundles = [selectors.incident_bundle_get(incident=i) for i in queryset.order_by("pk")]
        payload: Any = bundles[0] if len(bundles) == 1 else bundles
        response = JsonResponse(payload, safe=False, json_dumps_params={"indent": 2})
        name = f"incident-{queryset.first().pk}" if len(bundles) == 1 else "incidents"  # type: ignore[union-attr]
        response["Content-Disposition"] = f'attachment; filename="{name}-bundle.json"'
        return response


@admin.register(Diagnostic)
class DiagnosticAdmin(ReadOnlyAdmin):
    list_display = ("id", "run", "key_id", "created", "read_link")
    list_filter = (("created", admin.DateFieldListFilter), "key_id")
    exclude = ("nonce", "ciphertext")
    readonly_fields = ("run", "key_id", "created")

    @admin.display(description="drafts")
    def read_link(self, obj: Diagnostic) -> str:
        from django.utils.html import format_html

        return format_html(
            '<a href="{}">read (auditors; audited)</a>',
            reverse("admin:audit_diagnostic_read", args=[obj.pk]),
        )

    def get_urls(self) -> list[URLPattern]:
        custom = [
            path(
                "<int:object_id>/read/",
                self.admin_site.admin_view(self.read_view),
                name="audit_diagnostic_read",
            )
        ]
        return custom + super().get_urls()

    def read_view(self, request: HttpRequest, object_id: int) -> HttpResponse:
        diagnostic = get_object_or_404(Diagnostic, pk=object_id)
        snapshots = services.diagnostic_read(diagnostic=diagnostic, user=request.user)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Diagnostic {diagnostic.pk} of run {diagnostic.run_id}",
            "diagnostic": diagnostic,
            "snapshots": snapshots,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/audit/diagnostic/read.html", context)


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ("id", "created", "kind", "actor", "subject")
    list_filter = ("kind", ("created", admin.DateFieldListFilter))
    search_fields = ("subject", "actor")


@admin.register(LogEntry)
class LogEntryAdmin(ReadOnlyAdmin):
    list_display = ("seq", "kind", "ref", "created")
    list_filter = ("kind",)
    search_fields = ("ref",)
