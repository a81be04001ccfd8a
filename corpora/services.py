"""Writes: corpora and their documents (import, encrypted), training runs (start, cancel,
progress, outcome), model versions (register, promote, roll back).

Every function is keyword-only and named ``<entity>_<action>``; views, the API, the admin, the
management command and the training task call these, nothing else writes the rows.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Count, Sum
from django.utils import timezone

from audit.crypto import seal
from audit.keys import encryption_keys
from corpora.extract import Limits, extract_files
from corpora.models import (
    Corpus,
    CorpusDocument,
    CorpusImport,
    ModelVersion,
    Promotion,
    TrainingRun,
    document_associated_data,
)
from corpora.selectors import model_version_default, promotion_in_force
from drafting.models import DocumentTemplate
from drafting.services import UserError
from gpu_worker.engine.loaded import file_sha256
from gpu_worker.engine.tokenizer import StencilTokenizer

logger = logging.getLogger(__name__)

FINETUNE_TASK = "research.tasks.finetune_run"  # enqueued by name: serving code never imports research
CORPUS_NAME_MAX = 200


def import_limits() -> Limits:
    return Limits(max_file_bytes=settings.STENCIL_CORPUS_MAX_FILE_BYTES,
                  max_files=settings.STENCIL_CORPUS_MAX_FILES)  # fmt: skip


# -- corpora and imports --------------------------------------------------------------------
def corpus_create(*, owner: Any, name: str) -> Corpus:
    name = (name or "").strip()
    if not name:
        raise UserError("Give the corpus a name.", errors={"name": "Name is required."})
    if len(name) > CORPUS_NAME_MAX:
        raise UserError("The name is too long.",
                        errors={"name": f"At most {CORPUS_NAME_MAX} characters."})  # fmt: skip
    return Corpus.objects.create(owner=owner, name=name)


@lru_cache(maxsize=4)
def _tokenizer(directory: str) -> tuple[StencilTokenizer, str]:
    path = Path(directory)
    config = json.loads((path / "config.json").read_text())
    tok = StencilTokenizer.from_file(
        path / "tokenizer.json", virtual_spaces=bool(config.get("virtual_spaces", False)),
        spaced_lines=bool(config.get("spaced_lines", False)),
    )  # fmt: skip
    return tok, file_sha256(path / "tokenizer.json")


def counting_tokenizer() -> tuple[StencilTokenizer, str]:
    """The tokenizer of the default model (promoted, else the configured one), its sha256."""
    version = model_version_default()
    directory = version.directory if version is not None else str(settings.STENCIL_MODEL_DIR)
    return _tokenizer(directory)


@dataclass(frozen=True)
class ImportOutcome:
    batch: CorpusImport
    added: list[dict[str, Any]]
    skipped: list[dict[str, Any]]


def corpus_import(*, corpus: Corpus, user: Any, files: list[tuple[str, bytes]]) -> ImportOutcome:
    """Add the documents in ``files`` (name, bytes) to ``corpus``, each sealed with the newest
    audit key. Each document is written in its own transaction, so a file that fails loses
    nothing already imported; duplicates (of the corpus or of this upload), empty, oversized,
    unreadable and unsupported files are skipped, each with its reason in the report."""
    if not files:
        raise UserError("Choose at least one file to import.", errors={"files": "No file given."})
    tok, tok_sha = counting_tokenizer()
    key = encryption_keys()[0]
    batch = CorpusImport.objects.create(corpus=corpus, created_by=user)
    report: list[dict[str, Any]] = []
    seen = dict(CorpusDocument.objects.filter(corpus=corpus).values_list("sha256", "name"))
    for item in extract_files(files, import_limits()):
        entry: dict[str, Any] = {"name": item.name, "outcome": "skipped", "reason": item.reason,
                                 "tokens": 0}  # fmt: skip
        report.append(entry)
        if item.text is None:
            continue
        data = item.text.encode()
        sha = hashlib.sha256(data).hexdigest()
        if sha in seen:
            entry["reason"] = f"duplicate of {seen[sha]}"
            continue
        tokens = len(tok.encode_document(item.text))
        sealed = seal(plaintext=data, key=key,
                      associated_data=document_associated_data(corpus_id=corpus.pk, sha256=sha))  # fmt: skip
        try:
            with transaction.atomic():
                CorpusDocument.objects.create(
                    corpus=corpus, source=batch, name=item.name[:500], sha256=sha,
                    chars=len(item.text), tokens=tokens, key_id=sealed.key_id,
                    nonce=sealed.nonce, ciphertext=sealed.ciphertext,
                )  # fmt: skip
        except IntegrityError:  # imported by a concurrent upload a moment ago
            entry["reason"] = "duplicate of a document imported at the same time"
            continue
        seen[sha] = item.name
        entry.update(outcome="added", reason="", tokens=tokens)
    added = [e for e in report if e["outcome"] == "added"]
    skipped = [e for e in report if e["outcome"] == "skipped"]
    CorpusImport.objects.filter(pk=batch.pk).update(
        added=len(added), skipped=len(skipped), report=report
    )
    batch.refresh_from_db()
    corpus_recount(corpus=corpus, tokenizer_sha256=tok_sha)
    return ImportOutcome(batch=batch, added=added, skipped=skipped)


def corpus_recount(*, corpus: Corpus, tokenizer_sha256: str | None = None) -> Corpus:
    totals = CorpusDocument.objects.filter(corpus=corpus).aggregate(n=Count("id"), t=Sum("tokens"))
    fields: dict[str, Any] = {"documents": totals["n"] or 0, "tokens": totals["t"] or 0}
    if tokenizer_sha256:
        fields["tokenizer_sha256"] = tokenizer_sha256
    Corpus.objects.filter(pk=corpus.pk).update(**fields)
    corpus.refresh_from_db()
    return corpus


# -- model versions ---------------------------------------------------------------------------
def model_version_for_directory(*, directory: Path, name: str | None = None,
                                state: str = ModelVersion.State.SHIPPED) -> ModelVersion:  # fmt: skip
    """The version row of a model directory already on disk (the shipped denoiser, say),
    registered on first use and found again by its weights hash."""
    directory = Path(directory)
    weights = file_sha256(directory / "model.safetensors")
    found = ModelVersion.objects.filter(weights_sha256=weights, directory=str(directory)).first()
    if found is not None:
        return found
    tokenizer = directory / "tokenizer.json"
    return ModelVersion.objects.create(
        name=name or directory.name, directory=str(directory), weights_sha256=weights,
        tokenizer_sha256=file_sha256(tokenizer) if tokenizer.is_file() else "", state=state,
    )  # fmt: skip


def model_version_register(*, run: TrainingRun, directory: Path, evaluation: dict[str, Any],
                           training: dict[str, Any]) -> ModelVersion:  # fmt: skip
    """Register the weights a run wrote whole into ``directory`` (renamed there only once
    complete) with their evaluation, and finish the run, in one transaction."""
    directory = Path(directory)
    weights = file_sha256(directory / "model.safetensors")
    with transaction.atomic():
        locked = TrainingRun.objects.select_for_update().get(pk=run.pk)
        if locked.state != TrainingRun.State.EVALUATING:
            raise RuntimeError(f"run {run.pk} is {locked.state}, not evaluating: not registered")
        version = ModelVersion.objects.create(
            name=directory.name, directory=str(directory), weights_sha256=weights,
            tokenizer_sha256=file_sha256(directory / "tokenizer.json"),
            parent=locked.base_version, corpus=locked.corpus, training_config=training,
            evaluation=evaluation, state=ModelVersion.State.REGISTERED,
        )  # fmt: skip
        TrainingRun.objects.filter(pk=run.pk).update(
            state=TrainingRun.State.SUCCEEDED, model_version=version, evaluation=evaluation,
            finished=timezone.now(), heartbeat=timezone.now(),
        )  # fmt: skip
    return version


def model_version_promote(*, version: ModelVersion, user: Any,
                          templates: list[DocumentTemplate] | None = None) -> list[Promotion]:  # fmt: skip
    """Make ``version`` the model for each of ``templates``, or (None or empty) the default
    for every template without its own. The one it replaces stays in the history: a rollback
    brings it back."""
    if version.state == ModelVersion.State.RETIRED:
        raise UserError("A retired version cannot be promoted.")
    if not (Path(version.directory) / "model.safetensors").is_file():
        raise UserError(f"The weights of {version.name} are not on this machine "
                        f"({version.directory}).")  # fmt: skip
    scopes: list[DocumentTemplate | None] = list(templates) if templates else [None]
    with transaction.atomic():
        return [Promotion.objects.create(model_version=version, template=t, created_by=user)
                for t in scopes]  # fmt: skip


def promotion_roll_back(*, user: Any, template: DocumentTemplate | None = None) -> Promotion:
    """End the promotion in force for ``template`` (None: the default): the one before it,
    if any, is in force again, else the configured model (STENCIL_MODEL_DIR)."""
    with transaction.atomic():
        current = promotion_in_force(template=template, exact=True)
        if current is None:
            scope = f"template {template.slug}" if template is not None else "the default"
            raise UserError(f"Nothing is promoted for {scope}: there is nothing to roll back.")
        Promotion.objects.filter(pk=current.pk, rolled_back__isnull=True).update(
            rolled_back=timezone.now(), rolled_back_by=user
        )
        current.refresh_from_db()
        return current


# -- training runs ----------------------------------------------------------------------------
def training_run_start(*, corpus: Corpus, user: Any, config: dict[str, Any]) -> TrainingRun:
    """Queue a run that continues the default model version on ``corpus``; its id goes to the
    ``train`` queue once the row is committed."""
    if corpus.documents < 2:
        raise UserError("A corpus needs at least 2 documents to train on (one is held out).")
    if TrainingRun.objects.filter(corpus=corpus, state__in=TrainingRun.ACTIVE_STATES).exists():
        raise UserError("A training run on this corpus is already queued or running.")
    base = model_version_default() or model_version_for_directory(
        directory=Path(settings.STENCIL_MODEL_DIR)
    )
    run = TrainingRun.objects.create(corpus=corpus, base_version=base, requested_by=user,
                                     config=config)  # fmt: skip
    transaction.on_commit(lambda: training_run_dispatch(run_id=str(run.pk)))
    return run


def training_run_dispatch(*, run_id: str) -> bool:
    """Send the run's id to the ``train`` queue, naming the task (the web app never imports
    research). A broker that does not take it leaves the run failed, saying so."""
    from celery import current_app as app
    from kombu.exceptions import OperationalError as BrokerError

    try:
        app.send_task(FINETUNE_TASK, (run_id,), queue=settings.QUEUE_TRAIN)
    except (BrokerError, OSError) as exc:
        logger.warning("broker unavailable, training run %s not sent: %s", run_id, exc)
        TrainingRun.objects.filter(pk=run_id, state=TrainingRun.State.QUEUED).update(
            state=TrainingRun.State.FAILED, finished=timezone.now(),
            error=f"the broker did not take the run ({exc}); start it again",
        )  # fmt: skip
        return False
    TrainingRun.objects.filter(pk=run_id).update(dispatched=timezone.now())
    return True


def training_run_cancel(*, run: TrainingRun) -> TrainingRun:
    """A queued run ends now; a running one at its next step (its checkpoint is kept)."""
    with transaction.atomic():
        TrainingRun.objects.filter(pk=run.pk, state=TrainingRun.State.QUEUED).update(
            state=TrainingRun.State.CANCELLED, cancel_requested=True, finished=timezone.now()
        )
        TrainingRun.objects.filter(pk=run.pk, state__in=TrainingRun.ACTIVE_STATES).update(
            cancel_requested=True
        )
    run.refresh_from_db()
    return run


def training_run_claim(*, run_id: str, worker: str) -> TrainingRun | None:
    """Take a queued run (a conditional update); None when another worker got there first, or
    the run is not queued (a second delivery of a finished or failed run does nothing)."""
    now = timezone.now()
    taken = TrainingRun.objects.filter(pk=run_id, state=TrainingRun.State.QUEUED,
                                       cancel_requested=False).update(
        state=TrainingRun.State.RUNNING, worker=worker, started=now, heartbeat=now)  # fmt: skip
    return TrainingRun.objects.get(pk=run_id) if taken else None


def training_run_progress(*, run: TrainingRun, progress: dict[str, Any],
                          checkpoint: str | None = None, state: str | None = None) -> bool:  # fmt: skip
    """Store progress and renew the run's heartbeat; returns whether a cancel was asked."""
    fields: dict[str, Any] = {"progress": progress, "heartbeat": timezone.now()}
    if checkpoint is not None:
        fields["checkpoint"] = checkpoint
    if state is not None:
        fields["state"] = state
    TrainingRun.objects.filter(pk=run.pk, state__in=TrainingRun.ACTIVE_STATES).update(**fields)
    return bool(TrainingRun.objects.filter(pk=run.pk, cancel_requested=True).exists())


def training_run_held_out(*, run: TrainingRun, held_out: list[str]) -> None:
    TrainingRun.objects.filter(pk=run.pk).update(held_out=held_out)


def training_run_finish(*, run: TrainingRun, state: str, error: str = "") -> None:
    """End an active run as cancelled or failed (its checkpoint stays; no version is made)."""
    TrainingRun.objects.filter(pk=run.pk, state__in=TrainingRun.ACTIVE_STATES).update(
        state=state, error=error[:4000], finished=timezone.now(), heartbeat=timezone.now()
    )


def training_run_fail_stale(*, run: TrainingRun) -> TrainingRun:
    """A running run whose worker stopped renewing its heartbeat (killed, lost) is failed,
    keeping its last checkpoint; a later delivery of its id finds nothing to do."""
    lease = timedelta(seconds=settings.STENCIL_TRAIN_LEASE_SECONDS)
    stale = timezone.now() - lease
    running = (TrainingRun.State.RUNNING, TrainingRun.State.EVALUATING)
    failed = TrainingRun.objects.filter(pk=run.pk, state__in=running, heartbeat__lt=stale).update(
        state=TrainingRun.State.FAILED, finished=timezone.now(),
        error=f"the worker stopped (no heartbeat for {settings.STENCIL_TRAIN_LEASE_SECONDS} s); "
              "the last checkpoint is kept and no model version was registered",
    )  # fmt: skip
    if failed:
        run.refresh_from_db()
    return run
