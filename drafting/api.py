"""The JSON API (/api/v1/...): everything the pages do, for scripts and for the pages' fetches.

Errors are ``{"error": message, "errors": {field: message}}`` with 400 (bad input), 401 (no
credentials), 403 (CSRF / not allowed), 404 (not yours or absent), 405, 409 (compare-and-set
lost), 429 (admission control, with Retry-After). Model output is provisional until a person
accepts it, and every answer that carries model text says so.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt

from drafting import checks, docformat, exports, selectors, services
from drafting.api_body import BadRequest, json_body
from drafting.auth import AuthError, csrf_failure_reason, user_from_authorization
from drafting.authoring import user_is_template_author
from drafting.models import (
    Draft,
    DraftRevision,
    Fragment,
    InfillJob,
    TemplateVersion,
)
from drafting.templating import TemplateError
from gpu_worker.engine.outcome import MAX_SEED

if TYPE_CHECKING:
    from django.contrib.auth.models import User

SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}

ApiView = Callable[..., HttpResponse]


def error_response(
    message: str, *, status: int, errors: dict[str, str] | None = None
) -> JsonResponse:
    return JsonResponse({"error": message, "errors": errors or {}}, status=status)


# -- request plumbing -----------------------------------------------------------------------
def api_endpoint(*methods: str) -> Callable[[ApiView], ApiView]:
    """Authenticate (token or session + CSRF), check the method, translate errors to JSON."""
    allowed = set(methods)

    def decorate(view: ApiView) -> ApiView:
        @csrf_exempt  # session writes are checked below; token requests carry no cookie
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method not in allowed:
                response = error_response(
                    f"method {request.method} is not allowed here", status=405
                )
                response["Allow"] = ", ".join(sorted(allowed))
                return response
            header = request.META.get("HTTP_AUTHORIZATION", "")
            if header:
                try:
                    request.user = cast("User", user_from_authorization(header))
                except AuthError as exc:
                    return _unauthorized(str(exc))
            elif not request.user.is_authenticated:
                return _unauthorized("authentication required: send 'Authorization: Token <key>'")
            elif request.method not in SAFE_METHODS:
                reason = csrf_failure_reason(request)
                if reason is not None:
                    return error_response(f"CSRF check failed: {reason}", status=403)
            return _translate_errors(view, request, *args, **kwargs)

        return wrapper

    return decorate


def _unauthorized(message: str) -> JsonResponse:
    response = error_response(message, status=401)
    response["WWW-Authenticate"] = 'Token realm="stencil"'
    return response


def _translate_errors(view: ApiView, request: HttpRequest, *args: Any, **kwargs: Any
                     ) -> HttpResponse:  # fmt: skip
    try:
        return view(request, *args, **kwargs)
    except BadRequest as exc:
        return error_response(str(exc), status=exc.status, errors=exc.errors)
    except services.UserError as exc:
        return error_response(str(exc), status=exc.status, errors=exc.errors)
    except TemplateError as exc:
        return JsonResponse({"error": str(exc), "errors": {"source": str(exc)},
                             "line": exc.line, "column": exc.column}, status=400)
    except Http404 as exc:
        return error_response(str(exc) or "not found", status=404)
    except PermissionDenied as exc:
        return error_response(str(exc) or "not allowed", status=403)
    except services.ConflictError as exc:
        return error_response(str(exc), status=409)
    except services.AdmissionError as exc:
        response = error_response(str(exc), status=429)
        response["Retry-After"] = str(exc.retry_after)
        return response


def _typed(data: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) and kind is not bool:
        raise BadRequest(f"{name} must be {what}", errors={name: f"must be {what}"})
    if not isinstance(value, kind):
        raise BadRequest(f"{name} must be {what}", errors={name: f"must be {what}"})
    return value


def _preset(data: dict[str, Any]) -> str:
    preset = _typed(data, "preset", str, "a string") or "balanced"
    return str(preset)


# -- serialization ---------------------------------------------------------------------------
def template_json(version: TemplateVersion, *, source: bool = False) -> dict[str, Any]:
    template = version.template
    data: dict[str, Any] = {
        "slug": template.slug,
        "title": template.title,
        "kind": template.kind,
        "description": template.description,
        "version": version.number,
        "fields": version.fields,
        "holes": version.holes,
        "route_hint": version.route_hint,
        "doc_format": version.doc_format,
    }
    if source:
        data["source"] = version.source
    return data


def fragment_json(fragment: Fragment) -> dict[str, Any]:
    return {
        "id": fragment.id,
        "position": fragment.position,
        "kind": fragment.kind,
        "name": fragment.name,
        "label": checks.fragment_display_label(fragment),
        "hint": (fragment.spec or {}).get("hint", ""),
        "text": fragment.text,
        "value": docformat.unescape_for(fragment.text, (fragment.spec or {}).get("context", "")),
        "locked": fragment.locked,
        "status": fragment.status,
        "provisional": fragment.status == Fragment.Status.PROVISIONAL,
        "confidence": fragment.confidence or None,  # None: not measured (or a person wrote it)
        "written_by": fragment.written_by,
    }


def revision_json(revision: DraftRevision, *, text: bool = True) -> dict[str, Any]:
    data: dict[str, Any] = {
        "number": revision.number,
        "reason": revision.reason,
        "accepted": revision.accepted,
        "created": revision.created.isoformat(),
    }
    if text:
        data["text"] = revision.text
    return data


def draft_json(draft: Draft) -> dict[str, Any]:
    version = draft.template_version
    latest = selectors.job_latest_for_draft(draft=draft)
    return {
        "id": draft.id,
        "title": draft.title,
        "template": version.template.slug,
        "template_version": version.number,
        "revision": draft.revision,
        "values": draft.values,
        "fields": version.fields,
        "fragments": [fragment_json(f) for f in draft.fragments.all()],
        "has_provisional": selectors.draft_has_provisional(draft=draft),
        "status": selectors.draft_status(draft=draft),
        "latest_revision": getattr(selectors.draft_revision_list(draft=draft).first(), "number", 0),
        "accepted_revision": revision_json(draft.accepted_revision)
        if draft.accepted_revision
        else None,
        "latest_job": job_summary_json(latest) if latest else None,
        "created": draft.created.isoformat(),
        "updated": draft.updated.isoformat(),
        "urls": {
            "page": reverse("drafting:draft_detail", args=[draft.id]),
            "review": reverse("drafting:draft_review", args=[draft.id]),
        },
    }


def draft_summary_json(draft: Draft) -> dict[str, Any]:
    return {
        "id": draft.id,
        "title": draft.title,
        "template": draft.template_version.template.slug,
        "revision": draft.revision,
        "accepted": draft.accepted_revision_id is not None,
        "status": selectors.draft_status(draft=draft),
        "updated": draft.updated.isoformat(),
    }


def job_summary_json(job: InfillJob) -> dict[str, Any]:
    return {
        "id": str(job.id),
        "state": job.state,
        "final": job.is_final,
        "draft": job.draft_id,
        "preset": job.preset,
        "created": job.created.isoformat(),
    }


def _hole_labels(job: InfillJob) -> dict[str, str]:
    """Readable names of a draft job's holes (hole names carry fragment ids)."""
    labels: dict[str, str] = {}
    if job.draft_id is None:
        return labels
    fragments = Fragment.objects.filter(draft_id=job.draft_id).select_related("draft")
    by_id = {f.id: f for f in fragments}
    for target in job.target_fragments:
        fragment = by_id.get(target.get("fragment"))
        if fragment is not None:
            labels[str(target.get("hole"))] = checks.fragment_display_label(fragment)
    return labels


def job_reasons_display(job: InfillJob, labels: dict[str, str] | None = None) -> list[str]:
    """A job's reasons with each hole's internal name replaced by the span's name."""
    labels = _hole_labels(job) if labels is None else labels
    shown: list[str] = []
    for reason in job.reasons:
        text = str(reason)
        for hole in sorted(labels, key=len, reverse=True):
            text = text.replace(hole, labels[hole])
        shown.append(text)
    return shown


def job_progress(job: InfillJob) -> dict[str, Any]:
    """What a job has done, from its row. A succeeded job's progress is its result (every
    position committed, the holes' final text), whatever the last throttled progress row said."""
    progress = job.progress or {}
    positions = int(progress.get("positions") or 0)
    committed = int(progress.get("committed") or 0)
    holes: dict[str, Any] = progress.get("holes") or {}
    step = int(progress.get("step") or 0)
    max_steps = int(progress.get("max_steps") or 0)
    result = job.result or {}
    if job.state == InfillJob.State.SUCCEEDED and result:
        final = {str(name): str(text) for name, text in (result.get("holes") or {}).items()}
        holes = {name: {"stable": text, "provisional": text} for name, text in final.items()}
        positions = positions or sum(int(s.get("max_tokens", 0))
                                     for s in job.request.get("segments", []) if "hole" in s)
        committed = positions
        step = int(result.get("steps") or step)
    share = round(committed / positions, 4) if positions else 0.0
    if job.state == InfillJob.State.SUCCEEDED:
        share = 1.0
    return {
        "attempt": int(progress.get("attempt") or 0),
        "step": step,
        "max_steps": max_steps,
        "committed": committed,
        "positions": positions,
        "committed_share": share,
        "holes": holes,
        "provisional": True,
        "step_text": _step_text(job.state, step, max_steps),
    }


def _step_text(state: str, step: int, max_steps: int) -> str:
    """The step line a person reads: a budget is an upper bound, not a plan."""
    if state == InfillJob.State.SUCCEEDED and step:
        return f"{step} step{'s' if step != 1 else ''}"
    if state in {InfillJob.State.FAILED, InfillJob.State.CANCELLED} and step:
        return f"stopped at step {step}"
    if step and max_steps:
        return f"{step} (at most {max_steps})"
    return "—"


def written_by(result: Any) -> str | None:
    """The model version that wrote a job's result, in plain words; None before a result or
    for a result that does not name it."""
    version = result.get("model_version") if isinstance(result, dict) else None
    if not isinstance(version, dict) or not version.get("name"):
        return None
    name, scope = str(version["name"]), str(version.get("scope") or "")
    if scope.startswith("template:"):
        return f"Written by model version {name} (promoted for this template)."
    if scope == "default":
        return f"Written by model version {name} (promoted as the default)."
    return f"Written by the configured model ({name})."


def _config_words(config: Any, sha256: str) -> str:
    config = config if isinstance(config, dict) else {}
    return (f"cache {config.get('cache', '?')}, {config.get('max_steps', '?')} steps, "
            f"sha256 {sha256[:12]}")  # fmt: skip


def config_note(job: InfillJob) -> str:
    """The sampler config that ran (the worker fits the requested one to its model, e.g. a
    block-diffusion model runs its block cache) and, where it differs, the requested one."""
    requested = f"requested: {_config_words(job.config, job.config_sha256)}"
    result = job.result if isinstance(job.result, dict) else {}
    ran, ran_sha = result.get("config"), str(result.get("config_sha256") or "")
    if not ran_sha:
        return f"Config requested: {_config_words(job.config, job.config_sha256)}."
    if ran_sha == job.config_sha256:
        return f"The config that ran, as requested: {_config_words(ran, ran_sha)}."
    return f"The config that ran: {_config_words(ran, ran_sha)} ({requested})."


def job_json(job: InfillJob) -> dict[str, Any]:
    labels = _hole_labels(job)
    result = None
    if job.result:
        result = {**job.result, "provisional": True}
    data = {
        **job_summary_json(job),
        "route": job.route,
        "queue_position": selectors.queue_position(job=job),
        "cancel_requested": job.cancel_requested,
        "progress": job_progress(job),
        "hole_labels": labels,
        "result": result,
        "reasons": job_reasons_display(job, labels),
        "reason_codes": job.reasons,
        "attempts": len(job.attempts),
        "seed": job.seed,
        "config_sha256": job.config_sha256,  # of the requested config (the row's)
        "requested_config": job.config,
        "written_by": written_by(job.result),
        "config_note": config_note(job),
        "started": job.started.isoformat() if job.started else None,
        "finished": job.finished.isoformat() if job.finished else None,
        "urls": {
            "page": reverse("drafting:job_detail", args=[job.id]),
            "cancel": reverse("api:job_cancel", args=[job.id]),
            "review": reverse("drafting:draft_review", args=[job.draft_id])
            if job.draft_id
            else None,
        },
    }
    return data


# -- templates -------------------------------------------------------------------------------
@api_endpoint("GET", "POST")
def templates(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        if not user_is_template_author(request.user):
            raise PermissionDenied("only template authors may create templates")
        data = json_body(
            request,
            allowed={"slug", "title", "kind", "source", "description", "route_hint", "doc_format",
                     "publish"},
            required={"slug", "title", "kind", "source"},
        )
        publish = _typed(data, "publish", bool, "true or false")
        for name in data:
            if name != "publish":
                _typed(data, name, str, "a string")
        version = services.template_version_create(
            slug=data["slug"], title=data["title"], kind=data["kind"], source=data["source"],
            description=data.get("description") or "",
            route_hint=data.get("route_hint") or "auto", user=request.user,
            doc_format=data.get("doc_format") or "text", publish=publish is not False,
        )  # fmt: skip
        return JsonResponse(template_json(version, source=True), status=201)
    items = [
        template_json(t.published_version) for t in selectors.template_list_live()
        if t.published_version is not None
    ]
    return JsonResponse({"templates": items})


@api_endpoint("GET")
def template_detail(request: HttpRequest, slug: str) -> HttpResponse:
    template = selectors.template_get(slug=slug)
    if user_is_template_author(request.user):  # authors see their newest, published or not
        version = selectors.template_version_latest(template=template)
    else:
        version = selectors.template_version_live(template=template)
    data = template_json(version, source=True)
    data["published"] = template.published_version_id == version.pk
    return JsonResponse(data)


# -- drafts ----------------------------------------------------------------------------------
@api_endpoint("GET", "POST")
def drafts(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        data = json_body(request, allowed={"template", "values", "title"}, required={"template"})
        slug = _typed(data, "template", str, "a template slug")
        if not slug:
            raise BadRequest("template must be a template slug", errors={"template": "required"})
        values = _typed(data, "values", dict, "an object of field values") or {}
        title = _typed(data, "title", str, "a string") or ""
        template = selectors.template_get(slug=slug)
        version = selectors.template_version_live(template=template)
        draft = services.draft_create(owner=request.user, version=version, values=values,
                                      title=title)  # fmt: skip
        return JsonResponse(draft_json(draft), status=201)
    items = [draft_summary_json(d) for d in selectors.draft_list_for_user(user=request.user)]
    return JsonResponse({"drafts": items})


@api_endpoint("GET", "PATCH", "DELETE")
def draft_detail(request: HttpRequest, draft_id: int) -> HttpResponse:
    draft = selectors.draft_get_for_user(user=request.user, draft_id=draft_id)
    if request.method == "DELETE":
        try:
            services.draft_delete(draft=draft)
        except services.UserError as exc:
            return error_response(str(exc), status=409)
        return HttpResponse(status=204)
    if request.method == "PATCH":
        data = json_body(request, allowed={"values"}, required={"values"})
        values = _typed(data, "values", dict, "an object of field values")
        draft = services.draft_values_update(draft=draft, values=values or {})
    return JsonResponse(draft_json(draft))


def _fragment(request: HttpRequest, draft_id: int, fragment_id: int) -> Fragment:
    draft = selectors.draft_get_for_user(user=request.user, draft_id=draft_id)
    return selectors.fragment_get_for_user(user=request.user, draft=draft, fragment_id=fragment_id)


@api_endpoint("POST")
def fragment_lock(request: HttpRequest, draft_id: int, fragment_id: int) -> HttpResponse:
    fragment = _fragment(request, draft_id, fragment_id)
    data = json_body(request, allowed={"locked"}, required={"locked"})
    locked = _typed(data, "locked", bool, "true or false")
    fragment = services.fragment_lock_set(fragment=fragment, locked=bool(locked))
    return JsonResponse(fragment_json(fragment))


@api_endpoint("POST")
def fragment_review(request: HttpRequest, draft_id: int, fragment_id: int) -> HttpResponse:
    fragment = _fragment(request, draft_id, fragment_id)
    data = json_body(request, allowed={"action", "text", "accept_anyway"}, required={"action"})
    action = _typed(data, "action", str, "accept, reject, edit or write")
    text = _typed(data, "text", str, "a string")
    fragment = services.fragment_review(
        fragment=fragment, action=action, user=request.user, text=text,
        accept_anyway=_typed(data, "accept_anyway", bool, "true or false") is True,
    )
    return JsonResponse(fragment_json(fragment))


@api_endpoint("POST")
def fragment_regenerate(request: HttpRequest, draft_id: int, fragment_id: int) -> HttpResponse:
    fragment = _fragment(request, draft_id, fragment_id)
    data = json_body(request, allowed={"start", "end", "preset", "variation"})
    job = services.fragment_regenerate(
        fragment=fragment, user=request.user, preset=_preset(data),
        start=_typed(data, "start", int, "an integer"), end=_typed(data, "end", int, "an integer"),
        variation=_typed(data, "variation", str, "small, medium or large")
        or services.DEFAULT_VARIATION,
    )  # fmt: skip
    return JsonResponse(job_json(job), status=202)


@api_endpoint("POST")
def draft_infill(request: HttpRequest, draft_id: int) -> HttpResponse:
    draft = selectors.draft_get_for_user(user=request.user, draft_id=draft_id)
    data = json_body(request, allowed={"preset", "fragments"})
    fragments = _typed(data, "fragments", list, "a list of fragment ids")
    if fragments is not None and not all(
        isinstance(f, int) and not isinstance(f, bool) for f in fragments
    ):
        raise BadRequest("fragments must be a list of fragment ids",
                         errors={"fragments": "must be a list of integers"})  # fmt: skip
    job = services.draft_infill_request(
        draft=draft, user=request.user, preset=_preset(data), fragment_ids=fragments
    )
    return JsonResponse(job_json(job), status=202)


@api_endpoint("GET")
def draft_revisions(request: HttpRequest, draft_id: int) -> HttpResponse:
    draft = selectors.draft_get_for_user(user=request.user, draft_id=draft_id)
    revisions = [revision_json(r) for r in selectors.draft_revision_list(draft=draft)]
    return JsonResponse({"revisions": revisions, "diff": selectors.revision_diff(draft=draft)})


@api_endpoint("POST")
def draft_accept(request: HttpRequest, draft_id: int) -> HttpResponse:
    draft = selectors.draft_get_for_user(user=request.user, draft_id=draft_id)
    data = json_body(request, allowed={"revision"}, required={"revision"})
    expected = _typed(data, "revision", int, "the draft's revision number (an integer)")
    revision = services.draft_accept(draft=draft, expected_revision=expected, user=request.user)
    return JsonResponse(revision_json(revision))


@api_endpoint("GET")
def draft_export(request: HttpRequest, draft_id: int) -> HttpResponse:
    draft = selectors.draft_get_for_user(user=request.user, draft_id=draft_id)
    fmt = request.GET.get("format", "txt")
    if fmt not in exports.EXPORT_FORMATS:
        choices = ", ".join(exports.EXPORT_FORMATS)
        raise BadRequest(f"format must be one of {choices}", errors={"format": choices})
    which = request.GET.get("which", "current")
    if which not in exports.EXPORT_WHICH:
        raise BadRequest("which must be current or accepted", errors={"which": "current or accepted"})
    return export_response(draft, fmt, which)


def export_response(draft: Draft, fmt: str, which: str = "current") -> HttpResponse:
    content, content_type = exports.draft_export(draft=draft, fmt=fmt, which=which)
    response = HttpResponse(content, content_type=content_type)
    suffix = f"-revision-{draft.accepted_revision.number}" if (
        which == "accepted" and draft.accepted_revision) else ""
    response["Content-Disposition"] = f'attachment; filename="draft-{draft.id}{suffix}.{fmt}"'
    return response


# -- jobs ------------------------------------------------------------------------------------
@api_endpoint("POST")
def infill(request: HttpRequest) -> HttpResponse:
    """Ad-hoc infill of Canvas JSON without a template; ``preset`` may ride along."""
    data = json_body(request, allowed=set(services.CANVAS_KEYS) | {"preset"},
                     required={"segments"})  # fmt: skip
    preset = _preset(data)
    seed = data.get("seed")
    if isinstance(seed, int) and seed > MAX_SEED:  # the job row stores a signed 64-bit seed
        raise BadRequest(f"seed must be at most {MAX_SEED}", errors={"seed": "too large"})
    canvas = {k: v for k, v in data.items() if k != "preset"}
    job = services.infill_job_create(owner=request.user, request=canvas, preset=preset)
    return JsonResponse(job_json(job), status=202)


@api_endpoint("GET")
def jobs(request: HttpRequest) -> HttpResponse:
    items = [job_summary_json(j) for j in selectors.job_list_for_user(user=request.user)]
    return JsonResponse({"jobs": items})


@api_endpoint("GET")
def job_detail(request: HttpRequest, job_id: str) -> HttpResponse:
    job = selectors.job_get_for_user(user=request.user, job_id=job_id)
    return JsonResponse(job_json(job))


@api_endpoint("POST")
def job_cancel(request: HttpRequest, job_id: str) -> HttpResponse:
    job = selectors.job_get_for_user(user=request.user, job_id=job_id)
    json_body(request, allowed=set())
    job = services.infill_job_cancel(job=job)
    return JsonResponse(job_json(job))


def openapi_document(request: HttpRequest) -> HttpResponse:
    from drafting.openapi import openapi_spec

    return JsonResponse(openapi_spec(), json_dumps_params={"indent": 1})
