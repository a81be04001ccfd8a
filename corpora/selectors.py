"""Reads: corpora and documents (decrypted for staff), runs, model versions in force.

``model_version_for_template`` is what a worker asks before each job: the version promoted for
the job's template, else the default promotion, else None (the configured STENCIL_MODEL_DIR).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from audit.crypto import Sealed, unseal
from audit.keys import encryption_keys
from corpora.models import (
    Corpus,
    CorpusDocument,
    CorpusImport,
    ModelVersion,
    Promotion,
    TrainingRun,
    document_associated_data,
)
from drafting.models import DocumentTemplate


def require_staff(user: Any) -> None:
    """Corpora hold an organisation's documents: only staff may see or change them."""
    if not (user.is_authenticated and user.is_active and user.is_staff):
        raise PermissionDenied("only staff may see corpora, train or promote model versions")


def corpus_list(*, user: Any) -> QuerySet[Corpus]:
    require_staff(user)
    return Corpus.objects.select_related("owner")


def corpus_get(*, user: Any, corpus_id: int) -> Corpus:
    require_staff(user)
    return get_object_or_404(Corpus, pk=corpus_id)


def corpus_documents(*, corpus: Corpus) -> QuerySet[CorpusDocument]:
    return CorpusDocument.objects.filter(corpus=corpus).defer("ciphertext", "nonce")


def corpus_import_get(*, corpus: Corpus, import_id: int) -> CorpusImport:
    return get_object_or_404(CorpusImport, corpus=corpus, pk=import_id)


def document_text(*, document: CorpusDocument) -> str:
    """The document's text, opened with the audit keys (DecryptionError if altered)."""
    sealed = Sealed(key_id=document.key_id, nonce=bytes(document.nonce),
                    ciphertext=bytes(document.ciphertext))  # fmt: skip
    data = unseal(sealed=sealed, keys=encryption_keys(),
                  associated_data=document_associated_data(corpus_id=document.corpus_id,
                                                           sha256=document.sha256))  # fmt: skip
    return data.decode()


def document_get(*, user: Any, corpus: Corpus, document_id: int) -> CorpusDocument:
    require_staff(user)
    return get_object_or_404(CorpusDocument, corpus=corpus, pk=document_id)


def corpus_texts(*, corpus: Corpus) -> list[tuple[str, str, str]]:
    """Every document of ``corpus`` as (sha256, name, text), in import order (for training)."""
    return [(d.sha256, d.name, document_text(document=d))
            for d in CorpusDocument.objects.filter(corpus=corpus).order_by("id")]  # fmt: skip


def training_run_get(*, user: Any, run_id: Any) -> TrainingRun:
    require_staff(user)
    return get_object_or_404(TrainingRun.objects.select_related("corpus", "base_version",
                                                                "model_version"), pk=run_id)  # fmt: skip


def training_runs(*, corpus: Corpus | None = None) -> QuerySet[TrainingRun]:
    runs = TrainingRun.objects.select_related("corpus", "base_version", "model_version")
    return runs.filter(corpus=corpus) if corpus is not None else runs


def model_version_list(*, user: Any) -> QuerySet[ModelVersion]:
    require_staff(user)
    return ModelVersion.objects.select_related("parent", "corpus")


def model_version_get(*, user: Any, version_id: int) -> ModelVersion:
    require_staff(user)
    return get_object_or_404(ModelVersion, pk=version_id)


def promotion_in_force(*, template: DocumentTemplate | None, exact: bool = False) -> Promotion | None:
    """The newest promotion not rolled back for ``template`` (None: the default); unless
    ``exact``, a template without its own falls back to the default's."""
    rows = Promotion.objects.select_related("model_version").filter(rolled_back__isnull=True)
    found = rows.filter(template=template).first() if template is not None else None
    if found is None and (template is None or not exact):
        found = rows.filter(template__isnull=True).first()
    return found


def model_version_default() -> ModelVersion | None:
    """The version promoted as the default, or None (the configured STENCIL_MODEL_DIR)."""
    promotion = promotion_in_force(template=None)
    return promotion.model_version if promotion is not None else None


def model_version_for_template(template: DocumentTemplate | None) -> ModelVersion | None:
    """The model version a job of ``template`` runs with: the one promoted for that template,
    else the default promotion, else None (the worker then loads STENCIL_MODEL_DIR). A job
    without a template (an API infill) gets the default."""
    promotion = promotion_in_force(template=template)
    return promotion.model_version if promotion is not None else None


def promotions_in_force() -> list[Promotion]:
    """Every scope's promotion in force: the default first, then per template."""
    rows = Promotion.objects.select_related("model_version", "template").filter(
        rolled_back__isnull=True)  # fmt: skip
    seen: set[int | None] = set()
    out: list[Promotion] = []
    for row in rows.order_by("-created", "-id"):
        if row.template_id not in seen:
            seen.add(row.template_id)
            out.append(row)
    return sorted(out, key=lambda p: (p.template_id is not None, p.template_id or 0))


def promotion_history() -> QuerySet[Promotion]:
    return Promotion.objects.select_related("model_version", "template", "created_by",
                                            "rolled_back_by")  # fmt: skip
