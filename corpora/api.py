"""The corpora JSON API (/api/v1/corpora..., /api/v1/training-runs/..., /api/v1/model-versions
...), staff only (403 for anybody else), with the drafting API's authentication and errors."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.urls import reverse

from corpora import selectors, services
from corpora.models import Corpus, CorpusDocument, CorpusImport, ModelVersion, TrainingRun
from corpora.training import TrainingForm
from corpora.views import run_for, uploaded_files
from drafting.api import api_endpoint
from drafting.api_body import BadRequest, json_body
from drafting.models import DocumentTemplate
from drafting.services import UserError


def corpus_json(corpus: Corpus) -> dict[str, Any]:
    return {"id": corpus.id, "name": corpus.name, "documents": corpus.documents,
            "tokens": corpus.tokens, "tokenizer_sha256": corpus.tokenizer_sha256,
            "owner": corpus.owner.get_username() if corpus.owner else None,
            "created": corpus.created.isoformat(),
            "url": reverse("corpora_api:corpus_detail", args=[corpus.id])}  # fmt: skip


def document_json(document: CorpusDocument) -> dict[str, Any]:
    return {"id": document.id, "name": document.name, "sha256": document.sha256,
            "chars": document.chars, "tokens": document.tokens}  # fmt: skip


def import_json(batch: CorpusImport) -> dict[str, Any]:
    return {"id": batch.id, "added": batch.added, "skipped": batch.skipped,
            "files": batch.report}  # fmt: skip


def run_json(run: TrainingRun) -> dict[str, Any]:
    return {"id": str(run.id), "corpus": run.corpus_id, "state": run.state,
            "base_version": run.base_version_id, "config": run.config,
            "progress": run.progress, "cancel_requested": run.cancel_requested,
            "held_out_documents": len(run.held_out), "checkpoint": run.checkpoint,
            "error": run.error, "evaluation": run.evaluation,
            "model_version": run.model_version_id,
            "created": run.created.isoformat(),
            "finished": run.finished.isoformat() if run.finished else None,
            "url": reverse("corpora_api:training_run_detail", args=[run.id])}  # fmt: skip


def version_json(version: ModelVersion) -> dict[str, Any]:
    return {"id": version.id, "name": version.name, "state": version.state,
            "directory": version.directory, "weights_sha256": version.weights_sha256,
            "tokenizer_sha256": version.tokenizer_sha256, "parent": version.parent_id,
            "corpus": version.corpus_id, "training_config": version.training_config,
            "evaluation": version.evaluation, "created": version.created.isoformat()}  # fmt: skip


@api_endpoint("GET", "POST")
def corpora(request: HttpRequest) -> JsonResponse:
    if request.method == "POST":
        selectors.require_staff(request.user)
        data = json_body(request, allowed={"name"}, required={"name"})
        corpus = services.corpus_create(owner=request.user, name=str(data["name"]))
        return JsonResponse(corpus_json(corpus), status=201)
    return JsonResponse({"corpora": [corpus_json(c) for c in selectors.corpus_list(user=request.user)]})


@api_endpoint("GET")
def corpus_detail(request: HttpRequest, corpus_id: int) -> JsonResponse:
    corpus = selectors.corpus_get(user=request.user, corpus_id=corpus_id)
    return JsonResponse({**corpus_json(corpus),
                         "items": [document_json(d) for d in selectors.corpus_documents(corpus=corpus)],
                         "runs": [str(r.id) for r in selectors.training_runs(corpus=corpus)]})  # fmt: skip


@api_endpoint("POST")
def corpus_documents(request: HttpRequest, corpus_id: int) -> JsonResponse:
    """multipart/form-data with one or more ``files``: the import's per-file report."""
    corpus = selectors.corpus_get(user=request.user, corpus_id=corpus_id)
    if not (request.content_type or "").startswith("multipart/form-data"):
        raise BadRequest("send the documents as multipart/form-data, each in a 'files' field")
    outcome = services.corpus_import(corpus=corpus, user=request.user, files=uploaded_files(request))
    corpus.refresh_from_db()
    return JsonResponse({"import": import_json(outcome.batch), "corpus": corpus_json(corpus)},
                        status=201 if outcome.added else 200)  # fmt: skip


@api_endpoint("GET")
def document_detail(request: HttpRequest, corpus_id: int, document_id: int) -> JsonResponse:
    corpus = selectors.corpus_get(user=request.user, corpus_id=corpus_id)
    document = selectors.document_get(user=request.user, corpus=corpus, document_id=document_id)
    return JsonResponse({**document_json(document), "text": selectors.document_text(document=document)})


@api_endpoint("POST")
def corpus_train(request: HttpRequest, corpus_id: int) -> JsonResponse:
    corpus = selectors.corpus_get(user=request.user, corpus_id=corpus_id)
    data = json_body(request, allowed={"minutes", "steps", "seed", "original_share",
                                       "held_out_share", "lr", "eval_cases",
                                       "regression_cases", "threads"})  # fmt: skip
    run = services.training_run_start(corpus=corpus, user=request.user,
                                      config=TrainingForm.parse(data))  # fmt: skip
    return JsonResponse(run_json(run), status=202)


@api_endpoint("GET")
def training_run_detail(request: HttpRequest, run_id: Any) -> JsonResponse:
    return JsonResponse(run_json(run_for(request, run_id)))


@api_endpoint("POST")
def training_run_cancel(request: HttpRequest, run_id: Any) -> JsonResponse:
    run = run_for(request, run_id)
    return JsonResponse(run_json(services.training_run_cancel(run=run)))


@api_endpoint("GET")
def model_versions(request: HttpRequest) -> JsonResponse:
    versions = selectors.model_version_list(user=request.user)
    in_force = [{"template": p.template.slug if p.template else None,
                 "model_version": p.model_version_id, "since": p.created.isoformat()}
                for p in selectors.promotions_in_force()]  # fmt: skip
    return JsonResponse({"versions": [version_json(v) for v in versions], "in_force": in_force,
                         "configured_model_dir": str(settings.STENCIL_MODEL_DIR)})  # fmt: skip


def _templates(slugs: Any) -> list[DocumentTemplate]:
    if slugs is None:
        return []
    if not isinstance(slugs, list) or not all(isinstance(s, str) for s in slugs):
        raise BadRequest("templates must be a list of template slugs",
                         errors={"templates": "a list of slugs"})  # fmt: skip
    found = list(DocumentTemplate.objects.filter(slug__in=slugs))
    missing = sorted(set(slugs) - {t.slug for t in found})
    if missing:
        raise UserError(f"No template {', '.join(missing)}.", errors={"templates": "unknown"})
    return found


@api_endpoint("POST")
def model_version_promote(request: HttpRequest, version_id: int) -> JsonResponse:
    """``{"templates": [slug, ...]}`` promotes for those templates; none, as the default."""
    version = selectors.model_version_get(user=request.user, version_id=version_id)
    data = json_body(request, allowed={"templates"})
    rows = services.model_version_promote(version=version, user=request.user,
                                          templates=_templates(data.get("templates")))  # fmt: skip
    return JsonResponse({"promoted": [{"template": p.template.slug if p.template else None,
                                       "model_version": version.id} for p in rows]}, status=201)  # fmt: skip


@api_endpoint("POST")
def promotion_roll_back(request: HttpRequest) -> JsonResponse:
    """``{"template": slug}`` rolls back that template's promotion; without it, the default's."""
    selectors.require_staff(request.user)
    data = json_body(request, allowed={"template"})
    slug = data.get("template")
    template = None
    if slug is not None:
        template = DocumentTemplate.objects.filter(slug=str(slug)).first()
        if template is None:
            raise UserError(f"No template {slug}.", errors={"template": "unknown"})
    ended = services.promotion_roll_back(user=request.user, template=template)
    now = selectors.model_version_for_template(template)
    return JsonResponse({"rolled_back": ended.model_version_id,
                         "in_force": now.id if now is not None else None})  # fmt: skip
