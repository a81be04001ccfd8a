"""The pages. Each view parses its input, calls one service or selector, and renders.

Another person's draft, job or export is a 404 (``*_get_for_user``). Every form posts with a
CSRF token; every write redirects (post/redirect/get) with a message saying what happened.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from drafting import checks, confidence, docformat, exports, reports, selectors, services
from drafting.api import export_response, job_json, job_reasons_display
from drafting.auth import api_token_create, api_token_list_for_user, api_token_revoke
from drafting.forms import form_fields, post_text, values_from_post
from drafting.models import Draft, Fragment, InfillJob, ProblemReport

PRESET_CHOICES = [
    ("fast", "Fast — fewest steps"),
    ("balanced", "Balanced"),
    ("careful", "Careful — more steps, more checks"),
]
VARIATION_CHOICES = [
    ("small", "A little different"),
    ("medium", "Different"),
    ("large", "Very different (less careful)"),
]


def _admission_message(request: HttpRequest, exc: services.AdmissionError) -> None:
    messages.error(
        request, f"Not queued: {exc} (the service accepts new work again in about "
        f"{exc.retry_after} seconds)."
    )  # fmt: skip


def _int_or_none(raw: str | None) -> int | None:
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        return None


# -- home and new drafts ---------------------------------------------------------------------
@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    templates = selectors.template_list_live()
    drafts = [DraftRow(draft=d, status=selectors.draft_status(draft=d))
              for d in selectors.draft_list_for_user(user=request.user)]  # fmt: skip
    return render(request, "drafting/home.html", {"templates": templates, "drafts": drafts})


@dataclass(frozen=True)
class DraftRow:
    draft: Draft
    status: str  # selectors.draft_status

    @property
    def status_words(self) -> str:
        return selectors.DRAFT_STATUS_WORDS[self.status]


@login_required
@require_http_methods(["GET", "POST"])
def draft_new(request: HttpRequest, slug: str) -> HttpResponse:
    template = selectors.template_get(slug=slug)
    version = selectors.template_version_live(template=template)
    values: dict[str, Any] = {}
    errors: dict[str, str] = {}
    title = template.title
    status = 200
    if request.method == "POST":
        values = values_from_post(version.fields, request.POST)
        title = post_text(request.POST, "title") or template.title
        try:
            draft = services.draft_create(
                owner=request.user, version=version, values=values, title=title
            )
        except services.UserError as exc:
            messages.error(request, str(exc))
            errors, status = exc.errors, 400
        else:
            messages.success(request, "Draft created. Lock what must not change, then fill.")
            return redirect("drafting:draft_detail", draft_id=draft.id)
    context = {
        "template": template,
        "version": version,
        "title": title,
        "fields": form_fields(version.fields, values, errors),
        "form_error": errors.get("__all__", ""),
    }
    return render(request, "drafting/draft_new.html", context, status=status)


# -- the draft page: values, locks, selection, fill -------------------------------------------
@dataclass(frozen=True)
class FragmentRow:
    """A fragment as the pages show it."""

    id: int
    position: int
    kind: str
    name: str
    text: str
    locked: bool
    status: str
    status_display: str
    label: str
    hint: str
    value: str  # the text as a person edits it (a JSON string's content unescaped)
    by_model: bool = False  # written by a model job (it can be reported)
    reports: tuple[Any, ...] = ()  # this person's problem reports on it
    written_by: str = ""  # model | person | "" (template text, form values)
    confidence: confidence.ConfidenceView | None = None  # None: not the model's text
    segments: tuple[tuple[str, bool], ...] = ()  # ``value`` cut at the low-confidence marks
    previous: str = ""  # the text a regenerate replaced (shown beside the new one)

    @property
    def low(self) -> bool:
        """Model text flagged low-confidence, still to be reviewed or accepted anyway."""
        return self.confidence is not None and self.confidence.low

    @property
    def review_rank(self) -> tuple[int, int]:
        """Flagged spans first in the review list, then document order."""
        return (0 if self.low and self.status == Fragment.Status.PROVISIONAL else 1,
                self.position)  # fmt: skip

    @property
    def description(self) -> str:
        """How controls name this fragment to a screen reader."""
        if self.kind == Fragment.Kind.TEXT:
            excerpt = " ".join(self.text.split())[:40]
            return f"template text “{excerpt}”"
        return self.label

    @property
    def blank(self) -> bool:
        """Whitespace-only template text: nothing a person would lock or rewrite."""
        return self.kind == Fragment.Kind.TEXT and not self.text.strip()

    @classmethod
    def of(cls, fragment: Fragment) -> FragmentRow:
        spec = fragment.spec or {}
        context = spec.get("context", "")
        value = docformat.unescape_for(fragment.text, context)
        by_model = fragment.job_id is not None and fragment.written_by != "person"
        measured = fragment.confidence or {}
        segments = tuple((docformat.unescape_for(piece, context), marked) for piece, marked in
                         confidence.marked_segments(fragment.text, measured.get("marks", [])))
        if "".join(piece for piece, _ in segments) != value:  # an escape cut by a mark
            segments = ((value, False),)
        previous = ""
        if by_model and fragment.job is not None:
            for target in fragment.job.target_fragments:
                if target.get("fragment") == fragment.id and target.get("previous"):
                    previous = docformat.unescape_for(str(target["previous"]), context)
        return cls(
            id=fragment.id, position=fragment.position, kind=fragment.kind, name=fragment.name,
            text=fragment.text, locked=fragment.locked, status=fragment.status,
            status_display=fragment.get_status_display(),
            label=checks.fragment_display_label(fragment),
            hint=str(spec.get("hint") or ""),
            value=value, by_model=by_model, written_by=fragment.written_by,
            confidence=confidence.confidence_view(measured) if by_model and fragment.text
            else None,
            segments=segments, previous=previous if previous != value else "",
        )  # fmt: skip


def _draft_context(draft: Draft, values: dict[str, Any] | None = None,
                   errors: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    latest = selectors.job_latest_for_draft(draft=draft)
    return {
        "draft": draft,
        "fragments": [FragmentRow.of(f) for f in draft.fragments.select_related("job")],
        "fields": form_fields(draft.template_version.fields,
                              draft.values if values is None else values, errors or {}),
        "active_job": selectors.job_active_for_draft(draft=draft),
        "latest_job": latest,
        "latest_job_reasons": job_reasons_display(latest) if latest else [],
        "presets": PRESET_CHOICES,
        "has_provisional": selectors.draft_has_provisional(draft=draft),
        "status": selectors.draft_status(draft=draft),
        "latest_revision": selectors.draft_revision_list(draft=draft).first(),
        "notes": selectors.draft_model_notes(draft=draft),
        "variations": VARIATION_CHOICES,
    }  # fmt: skip


@login_required
@require_GET
def draft_detail(request: HttpRequest, draft_id: int) -> HttpResponse:
    draft = selectors.draft_get_for_user(user=request.user, draft_id=draft_id)
    return render(request, "drafting/draft_detail.html", _draft_context(draft))


@login_required
@require_POST
def draft_values(request: HttpRequest, draft_id: int) -> HttpResponse:
    draft = selectors.draft_get_for_user(user=request.user, draft_id=draft_id)
    values = values_from_post(draft.template_version.fields, request.POST)
    try:
        services.draft_values_update(draft=draft, values=values)
    except services.UserError as exc:
        messages.error(request, f"{exc} Nothing was saved.")
        context = _draft_context(draft, values=values, errors=exc.errors)
        return render(request, "drafting/draft_detail.html", context, status=400)
    messages.success(request, "Values saved.")
    return redirect("drafting:draft_detail", draft_id=draft.id)


@login_required
@require_http_methods(["GET", "POST"])
def draft_delete(request: HttpRequest, draft_id: int) -> HttpResponse:
    """GET asks to confirm; POST deletes and goes home."""
    draft = selectors.draft_get_for_user(user=request.user, draft_id=draft_id)
    if request.method == "POST":
        title = draft.title
        try:
            services.draft_delete(draft=draft)
        except services.UserError as exc:
            messages.error(request, f"Not deleted: {exc}")
            return render(request, "drafting/draft_delete.html", {"draft": draft}, status=409)
        messages.success(request, f"“{title}” was deleted.")
        return redirect("drafting:home")
    return render(request, "drafting/draft_delete.html", {"draft": draft})


@login_required
@require_POST
def fragment_lock(request: HttpRequest, draft_id: int, fragment_id: int) -> HttpResponse:
    draft = selectors.draft_get_for_user(user=request.user, draft_id=draft_id)
    fragment = selectors.fragment_get_for_user(user=request.user, draft=draft,
                                               fragment_id=fragment_id)  # fmt: skip
    locked = request.POST.get("locked") == "1"
    try:
        services.fragment_lock_set(fragment=fragment, locked=locked)
    except services.UserError as exc:
        messages.error(request, str(exc))
        return _back(request, draft)
    what = fragment_label(fragment)
    messages.success(request, f"{what} is now locked: the model never changes it." if locked
                     else f"{what} is now unlocked: the model may rewrite it.")  # fmt: skip
    return _back(request, draft, anchor=f"row-{fragment.id}")


def fragment_label(fragment: Fragment) -> str:
    """A span's name in a message: its label in quotes (template text: its first words)."""
    label = checks.fragment_display_label(fragment)
    return label if label.startswith("“") else f"“{label}”"


def _back(request: HttpRequest, draft: Draft, anchor: str = "") -> HttpResponseRedirect:
    """Back to the page the form was on (the draft page or its review page), at ``anchor``:
    without JavaScript a person lands where they were, not at the top."""
    name = "drafting:draft_review" if request.POST.get("next") == "review" else (
        "drafting:draft_detail")
    return HttpResponseRedirect(reverse(name, args=[draft.id]) + (f"#{anchor}" if anchor else ""))


@login_required
@require_POST
def draft_fill(request: HttpRequest, draft_id: int) -> HttpResponse:
    draft = selectors.draft_get_for_user(user=request.user, draft_id=draft_id)
    preset = request.POST.get("preset", "balanced")
    try:
        job = services.draft_infill_request(draft=draft, user=request.user, preset=preset)
    except services.UserError as exc:
        messages.error(request, str(exc))
        return _back(request, draft)
    except services.AdmissionError as exc:
        _admission_message(request, exc)
        return _back(request, draft)
    return redirect("drafting:job_detail", job_id=job.id)


@login_required
@require_POST
def fragment_regenerate(request: HttpRequest, draft_id: int) -> HttpResponse:
    """Regenerate one fragment, or the span of it the person selected (start/end)."""
    draft = selectors.draft_get_for_user(user=request.user, draft_id=draft_id)
    fragment = selectors.fragment_get_for_user(
        user=request.user, draft=draft, fragment_id=request.POST.get("fragment", "")
    )
    start, end = _int_or_none(request.POST.get("start")), _int_or_none(request.POST.get("end"))
    phrase = post_text(request.POST, "phrase")
    if start is None and end is None and phrase.strip():  # words typed, not selected
        start = fragment.text.find(phrase)
        if start < 0:
            messages.error(request, f"“{phrase}” is not in {fragment_label(fragment)}: type words "
                           "exactly as they stand, or select them.")  # fmt: skip
            return _back(request, draft, anchor=f"row-{fragment.id}")
        end = start + len(phrase)
    try:
        job = services.fragment_regenerate(
            fragment=fragment, user=request.user, preset=request.POST.get("preset", "balanced"),
            start=start, end=end,
            variation=request.POST.get("variation") or services.DEFAULT_VARIATION,
        )  # fmt: skip
    except services.UserError as exc:
        messages.error(request, str(exc))
        return _back(request, draft)
    except services.AdmissionError as exc:
        _admission_message(request, exc)
        return _back(request, draft)
    return redirect("drafting:job_detail", job_id=job.id)


# -- review ----------------------------------------------------------------------------------
@login_required
@require_GET
def draft_review(request: HttpRequest, draft_id: int) -> HttpResponse:
    draft = selectors.draft_get_for_user(user=request.user, draft_id=draft_id)
    return render(request, "drafting/draft_review.html", _review_context(request, draft))


def _review_context(request: HttpRequest, draft: Draft, *, report_form: dict[str, Any] | None = None
                    ) -> dict[str, Any]:  # fmt: skip
    context = _draft_context(draft)
    by_fragment: dict[int, list[Any]] = {}
    for report in reports.problem_reports_for_draft(draft=draft, user=request.user):
        if report.fragment_id is not None:
            by_fragment.setdefault(report.fragment_id, []).append(report)
    context["fragments"] = [replace(row, reports=tuple(by_fragment.get(row.id, ())))
                            for row in context["fragments"]]  # fmt: skip
    context["review_rows"] = sorted((row for row in context["fragments"] if row.kind == "fill"),
                                    key=lambda row: row.review_rank)  # fmt: skip
    context["report_reasons"] = ProblemReport.Reason.choices
    context["report_form"] = report_form or {}
    context["diff_lines"] = _diff_lines(selectors.revision_diff(draft=draft))
    context["revisions"] = list(selectors.draft_revision_list(draft=draft)[:10])
    accepted = draft.accepted_revision
    context["accepted_current"] = (
        accepted is not None and accepted.text == selectors.draft_text(draft=draft)
    )
    context["problems"] = checks.draft_document_violations(draft=draft)
    return context


@login_required
@require_POST
def fragment_report(request: HttpRequest, draft_id: int, fragment_id: int) -> HttpResponse:
    """Report a problem with a span: it opens an incident on the run that wrote it."""
    draft = selectors.draft_get_for_user(user=request.user, draft_id=draft_id)
    fragment = selectors.fragment_get_for_user(user=request.user, draft=draft,
                                               fragment_id=fragment_id)  # fmt: skip
    reason, note = post_text(request.POST, "reason"), post_text(request.POST, "note")
    try:
        report = reports.problem_report_create(fragment=fragment, user=request.user,
                                               reason=reason, note=note)  # fmt: skip
    except services.UserError as exc:
        messages.error(request, f"Not reported: {exc}")
        form = {"fragment": fragment.id, "reason": reason, "note": note, "errors": exc.errors}
        context = _review_context(request, draft, report_form=form)
        return render(request, "drafting/draft_review.html", context, status=400)
    messages.success(request, f"Thank you: your report on {fragment_label(fragment)} is "
                     f"incident {report.incident_id}, status {report.incident.status}.")
    return redirect(f"{reverse('drafting:draft_review', args=[draft.id])}#span-{fragment.id}")


def _diff_lines(diff: str) -> list[tuple[str, str]]:
    """(css class, line) pairs for the unified diff."""
    lines: list[tuple[str, str]] = []
    for line in diff.splitlines():
        if line.startswith(("+++", "---")):
            kind = "file"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        else:
            kind = "same"
        lines.append((kind, line))
    return lines


@login_required
@require_POST
def fragment_review(request: HttpRequest, draft_id: int, fragment_id: int) -> HttpResponse:
    draft = selectors.draft_get_for_user(user=request.user, draft_id=draft_id)
    fragment = selectors.fragment_get_for_user(user=request.user, draft=draft,
                                               fragment_id=fragment_id)  # fmt: skip
    action = request.POST.get("action", "")
    text = post_text(request.POST, "text") if "text" in request.POST else None
    try:
        services.fragment_review(fragment=fragment, action=action, user=request.user, text=text,
                                 accept_anyway=request.POST.get("accept_anyway") == "1")  # fmt: skip
    except services.UserError as exc:
        messages.error(request, str(exc))
    else:
        done = {"accept": "accepted", "reject": "rejected", "edit": "saved",
                "write": "saved as written by you"}.get(action, action)  # fmt: skip
        messages.success(request, f"{fragment_label(fragment)} {done}.")
    return HttpResponseRedirect(reverse("drafting:draft_review", args=[draft.id])
                                + f"#span-{fragment.id}")  # fmt: skip


@login_required
@require_POST
def draft_accept(request: HttpRequest, draft_id: int) -> HttpResponse:
    draft = selectors.draft_get_for_user(user=request.user, draft_id=draft_id)
    expected = _int_or_none(request.POST.get("revision"))
    if expected is None:
        messages.error(request, "The accept form lost its revision number; reload the page.")
        return redirect("drafting:draft_review", draft_id=draft.id)
    try:
        revision = services.draft_accept(draft=draft, expected_revision=expected,
                                         user=request.user)  # fmt: skip
    except (services.UserError, PermissionDenied) as exc:
        messages.error(request, f"Not accepted: {exc}.")
    except services.ConflictError:
        draft.refresh_from_db()
        already = draft.accepted_revision
        note = (f" Revision {already.number} is the accepted one." if already else "")
        messages.error(
            request,
            "Not accepted: this draft changed since the page was loaded, or it was already "
            f"accepted (a double click or another tab).{note} Check the text below and accept "
            "again if it is right.",
        )
    else:
        messages.success(request, f"Accepted as revision {revision.number}: this text is final.")
    return redirect("drafting:draft_review", draft_id=draft.id)


@login_required
@require_GET
def draft_export(request: HttpRequest, draft_id: int, fmt: str) -> HttpResponse:
    draft = selectors.draft_get_for_user(user=request.user, draft_id=draft_id)
    if fmt not in exports.EXPORT_FORMATS:
        raise Http404("no such export format")
    which = request.GET.get("which", "current")
    if which not in exports.EXPORT_WHICH:
        return HttpResponse("which must be current or accepted", status=400,
                            content_type="text/plain; charset=utf-8")  # fmt: skip
    try:
        return export_response(draft, fmt, which)
    except services.UserError as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain; charset=utf-8")


# -- jobs ------------------------------------------------------------------------------------
@login_required
@require_GET
def job_detail(request: HttpRequest, job_id: uuid.UUID) -> HttpResponse:
    job = selectors.job_get_for_user(user=request.user, job_id=job_id)
    state = job_json(job)
    holes = [
        {"name": name, "label": state["hole_labels"].get(name, name),
         "stable": hole.get("stable", ""), "provisional": hole.get("provisional", "")}
        for name, hole in state["progress"]["holes"].items()
    ]  # fmt: skip
    domain = confidence.result_domain(job.result) or (
        confidence.version_domain(job.draft.template_version) if job.draft else None)
    return render(request, "drafting/job_detail.html", {
        "job": job, "state": state, "holes": holes,
        "needs_person": confidence.result_needs_person(job.result),
        "domain_unfamiliar": bool(domain and domain["unfamiliar"]),
        "domain_warning": confidence.DOMAIN_WARNING,
        "measured": isinstance(job.result, dict) and "confidence" in job.result,
    })  # fmt: skip


@login_required
@require_POST
def job_cancel(request: HttpRequest, job_id: uuid.UUID) -> HttpResponse:
    job = selectors.job_get_for_user(user=request.user, job_id=job_id)
    job = services.infill_job_cancel(job=job)
    if job.state == InfillJob.State.CANCELLED:
        messages.success(request, "Cancelled.")
    elif job.is_final:
        messages.info(request, f"The job had already ended ({job.state}).")
    else:
        messages.info(request, "Cancelling: the model stops at its next step.")
    return redirect("drafting:job_detail", job_id=job.id)


# -- API tokens ------------------------------------------------------------------------------
@login_required
@require_http_methods(["GET", "POST"])
def tokens(request: HttpRequest) -> HttpResponse:
    new_key = ""
    error = ""
    status = 200
    if request.method == "POST":
        try:
            _, new_key = api_token_create(user=request.user, name=post_text(request.POST, "name"))
        except services.UserError as exc:
            error, status = exc.errors.get("name", str(exc)), 400
    context = {
        "tokens": api_token_list_for_user(user=request.user),
        "new_key": new_key,
        "error": error,
        "api_base": request.build_absolute_uri(reverse("api:drafts")).rsplit("/drafts", 1)[0],
    }
    return render(request, "drafting/tokens.html", context, status=status)


@login_required
@require_POST
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    if not api_token_revoke(user=request.user, token_id=token_id):
        raise Http404("You have no token with that number.")
    messages.success(request, "Token revoked.")
    return redirect("drafting:tokens")
