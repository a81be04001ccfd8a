"""The staff pages: corpora (create, upload, read), training runs (start, progress, cancel,
evaluation) and model versions (promote, roll back). Anybody else gets 403.

Each view parses its input, calls one service or selector, and renders; every write
redirects (post/redirect/get) with a message saying what happened.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from corpora import selectors, services
from corpora.models import TrainingRun
from corpora.training import TrainingForm, evaluation_rows
from drafting.models import DocumentTemplate
from drafting.services import UserError

View = Callable[..., HttpResponse]


def staff_page(view: View) -> View:
    """Logged in (else the login page), then staff (else 403)."""

    @login_required
    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        selectors.require_staff(request.user)
        return view(request, *args, **kwargs)

    return wrapper


def uploaded_files(request: HttpRequest) -> list[tuple[str, bytes]]:
    """The request's files as (name, bytes); a body over the upload limit is refused unread."""
    length = int(request.META.get("CONTENT_LENGTH") or 0)
    if length > settings.STENCIL_CORPUS_MAX_UPLOAD_BYTES:
        raise UserError(f"The upload is {length:,} bytes; at most "
                        f"{settings.STENCIL_CORPUS_MAX_UPLOAD_BYTES:,} in one go (split it).")  # fmt: skip
    return [(f.name or "unnamed", f.read()) for f in request.FILES.getlist("files")]


def run_for(request: HttpRequest, run_id: Any) -> TrainingRun:
    """The run, failed first if its worker stopped renewing its heartbeat (killed, lost)."""
    run = selectors.training_run_get(user=request.user, run_id=run_id)
    return services.training_run_fail_stale(run=run)


@staff_page
@require_http_methods(["GET", "POST"])
def corpus_list(request: HttpRequest) -> HttpResponse:
    error, status = "", 200
    if request.method == "POST":
        try:
            corpus = services.corpus_create(owner=request.user, name=request.POST.get("name", ""))
        except UserError as exc:
            error, status = str(exc), 400
        else:
            messages.success(request, f"Corpus “{corpus.name}” created. Upload its documents.")
            return redirect("corpora:corpus_detail", corpus_id=corpus.id)
    context = {"corpora": selectors.corpus_list(user=request.user), "error": error,
               "runs": selectors.training_runs()[:10]}  # fmt: skip
    return render(request, "corpora/corpus_list.html", context, status=status)


@staff_page
@require_GET
def corpus_detail(request: HttpRequest, corpus_id: int) -> HttpResponse:
    corpus = selectors.corpus_get(user=request.user, corpus_id=corpus_id)
    context = {
        "corpus": corpus, "documents": selectors.corpus_documents(corpus=corpus)[:500],
        "imports": corpus.imports.all()[:10], "runs": selectors.training_runs(corpus=corpus),
        "form": TrainingForm.defaults(),
        "max_upload": settings.STENCIL_CORPUS_MAX_UPLOAD_BYTES,
        "max_file": settings.STENCIL_CORPUS_MAX_FILE_BYTES,
    }  # fmt: skip
    return render(request, "corpora/corpus_detail.html", context)


@staff_page
@require_POST
def corpus_upload(request: HttpRequest, corpus_id: int) -> HttpResponse:
    corpus = selectors.corpus_get(user=request.user, corpus_id=corpus_id)
    try:
        outcome = services.corpus_import(corpus=corpus, user=request.user,
                                         files=uploaded_files(request))  # fmt: skip
    except UserError as exc:
        messages.error(request, f"{exc} Nothing was imported; the corpus is as it was.")
        return redirect("corpora:corpus_detail", corpus_id=corpus.id)
    text = f"Imported {len(outcome.added)} document(s)"
    if outcome.skipped:
        messages.warning(request, f"{text}; skipped {len(outcome.skipped)} file(s), each with "
                                  "its reason below.")  # fmt: skip
    else:
        messages.success(request, f"{text}.")
    return redirect("corpora:import_detail", corpus_id=corpus.id, import_id=outcome.batch.id)


@staff_page
@require_GET
def import_detail(request: HttpRequest, corpus_id: int, import_id: int) -> HttpResponse:
    corpus = selectors.corpus_get(user=request.user, corpus_id=corpus_id)
    batch = selectors.corpus_import_get(corpus=corpus, import_id=import_id)
    return render(request, "corpora/import_detail.html", {"corpus": corpus, "batch": batch})


@staff_page
@require_GET
def document_detail(request: HttpRequest, corpus_id: int, document_id: int) -> HttpResponse:
    corpus = selectors.corpus_get(user=request.user, corpus_id=corpus_id)
    document = selectors.document_get(user=request.user, corpus=corpus, document_id=document_id)
    context = {"corpus": corpus, "document": document,
               "text": selectors.document_text(document=document)}  # fmt: skip
    return render(request, "corpora/document_detail.html", context)


@staff_page
@require_POST
def corpus_train(request: HttpRequest, corpus_id: int) -> HttpResponse:
    corpus = selectors.corpus_get(user=request.user, corpus_id=corpus_id)
    try:
        config = TrainingForm.parse(request.POST)
        run = services.training_run_start(corpus=corpus, user=request.user, config=config)
    except UserError as exc:
        messages.error(request, f"Not started: {exc}")
        return redirect("corpora:corpus_detail", corpus_id=corpus.id)
    messages.success(request, "Training run queued on the train queue.")
    return redirect("corpora:run_detail", run_id=run.id)


@staff_page
@require_GET
def run_detail(request: HttpRequest, run_id: Any) -> HttpResponse:
    run = run_for(request, run_id)
    progress = run.progress or {}
    total = progress.get("total_steps") or 0
    context = {
        "run": run, "progress": progress,
        "share": (progress.get("step", 0) / total) if total else 0.0,
        "evaluation": evaluation_rows(run.evaluation),
        "templates": DocumentTemplate.objects.all(),
    }  # fmt: skip
    return render(request, "corpora/run_detail.html", context)


@staff_page
@require_POST
def run_cancel(request: HttpRequest, run_id: Any) -> HttpResponse:
    run = run_for(request, run_id)
    run = services.training_run_cancel(run=run)
    if run.state == run.State.CANCELLED:
        messages.success(request, "Run cancelled before it started.")
    elif run.is_final:
        messages.info(request, f"The run had already ended ({run.state}).")
    else:
        messages.success(request, "Cancel asked: the run stops at its next step and keeps its "
                                  "checkpoint.")  # fmt: skip
    return redirect("corpora:run_detail", run_id=run.id)


@staff_page
@require_GET
def model_versions(request: HttpRequest) -> HttpResponse:
    context = {
        "versions": selectors.model_version_list(user=request.user),
        "in_force": selectors.promotions_in_force(),
        "history": selectors.promotion_history()[:50],
        "templates": DocumentTemplate.objects.all(),
        "configured": settings.STENCIL_MODEL_DIR,
    }  # fmt: skip
    return render(request, "corpora/model_versions.html", context)


def _templates_from(request: HttpRequest) -> list[DocumentTemplate]:
    slugs = [s for s in request.POST.getlist("templates") if s]
    found = list(DocumentTemplate.objects.filter(slug__in=slugs))
    missing = sorted(set(slugs) - {t.slug for t in found})
    if missing:
        raise UserError(f"No template {', '.join(missing)}.")
    return found


@staff_page
@require_POST
def model_version_promote(request: HttpRequest, version_id: int) -> HttpResponse:
    version = selectors.model_version_get(user=request.user, version_id=version_id)
    try:
        rows = services.model_version_promote(version=version, user=request.user,
                                              templates=_templates_from(request))  # fmt: skip
    except UserError as exc:
        messages.error(request, f"Not promoted: {exc}")
    else:
        scopes = ", ".join(p.template.slug for p in rows if p.template) or "the default"
        messages.success(request, f"{version.name} now serves {scopes}; workers load it before "
                                  "their next job.")  # fmt: skip
    return redirect("corpora:model_versions")


@staff_page
@require_POST
def promotion_roll_back(request: HttpRequest) -> HttpResponse:
    slug = request.POST.get("template") or ""
    try:
        template = DocumentTemplate.objects.filter(slug=slug).first() if slug else None
        if slug and template is None:
            raise UserError(f"No template {slug}.")
        ended = services.promotion_roll_back(user=request.user, template=template)
    except UserError as exc:
        messages.error(request, f"Not rolled back: {exc}")
    else:
        now = selectors.model_version_for_template(template)
        shown = now.name if now is not None else f"the configured model ({settings.STENCIL_MODEL_DIR.name})"
        messages.success(request, f"Rolled back {ended.model_version.name}; {shown} serves "
                                  f"{slug or 'the default'} again.")  # fmt: skip
    return redirect("corpora:model_versions")
