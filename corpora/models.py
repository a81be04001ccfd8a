"""Corpora (an organisation's own documents), training runs on them, and model versions.

A document's text is stored only encrypted (AES-256-GCM with the audit module's keys); its
sha256 (of the text as imported) makes duplicates visible without reading it. A TrainingRun row
is the source of truth for a run's state, as an InfillJob row is for a job. A ModelVersion is
registered only once its weights are written whole and evaluated; a Promotion row makes it the
model for a set of templates, or the default, until it is rolled back.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


def document_associated_data(*, corpus_id: int, sha256: str) -> bytes:
    """What a document's ciphertext is bound to: moved to another row, it fails to open."""
    return f"stencil-corpus-document:{corpus_id}:{sha256}".encode()


class Corpus(models.Model):
    name = models.CharField(max_length=200)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created = models.DateTimeField(auto_now_add=True)
    documents = models.PositiveIntegerField(default=0)  # counted from its entries on import
    tokens = models.PositiveBigIntegerField(default=0)  # under tokenizer_sha256's tokenizer
    tokenizer_sha256 = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["-created"]
        verbose_name_plural = "corpora"

    def __str__(self) -> str:
        return self.name


class CorpusImport(models.Model):
    """One upload (or ``corpus_import`` run): what it added and, per file, why it skipped any."""

    corpus = models.ForeignKey(Corpus, on_delete=models.CASCADE, related_name="imports")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created = models.DateTimeField(auto_now_add=True)
    added = models.PositiveIntegerField(default=0)
    skipped = models.PositiveIntegerField(default=0)
    # one entry per file: {"name", "outcome": "added" | "skipped", "reason", "tokens"}
    report = models.JSONField(default=list)

    class Meta:
        ordering = ["-created"]


class CorpusDocument(models.Model):
    corpus = models.ForeignKey(Corpus, on_delete=models.CASCADE, related_name="entries")
    source = models.ForeignKey(
        CorpusImport, null=True, blank=True, on_delete=models.SET_NULL, related_name="entries"
    )
    name = models.CharField(max_length=500)  # the file's name (its path inside a zip)
    sha256 = models.CharField(max_length=64)  # of the imported text, UTF-8
    chars = models.PositiveIntegerField()
    tokens = models.PositiveIntegerField()
    key_id = models.CharField(max_length=32)  # the audit key that sealed it
    nonce = models.BinaryField()
    ciphertext = models.BinaryField()  # the text, AES-256-GCM (tag included)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["corpus", "id"]
        constraints = [
            models.UniqueConstraint(fields=["corpus", "sha256"], name="unique_corpus_document")
        ]

    def __str__(self) -> str:
        return self.name


class ModelVersion(models.Model):
    class State(models.TextChoices):
        SHIPPED = "shipped", "shipped with Stencil"
        REGISTERED = "registered", "trained here"
        RETIRED = "retired", "retired"

    name = models.CharField(max_length=200)
    directory = models.CharField(max_length=1000)
    weights_sha256 = models.CharField(max_length=64, db_index=True)
    tokenizer_sha256 = models.CharField(max_length=64, blank=True)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="children"
    )
    corpus = models.ForeignKey(
        Corpus, null=True, blank=True, on_delete=models.SET_NULL, related_name="model_versions"
    )
    training_config = models.JSONField(default=dict)
    evaluation = models.JSONField(default=dict)
    state = models.CharField(max_length=12, choices=State.choices, default=State.REGISTERED)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.name} ({self.weights_sha256[:12]})"


class Promotion(models.Model):
    """``model_version`` serves ``template`` (None: every template without its own) from
    ``created`` until ``rolled_back``; the newest row of a scope not rolled back is in force."""

    model_version = models.ForeignKey(
        ModelVersion, on_delete=models.PROTECT, related_name="promotions"
    )
    template = models.ForeignKey(
        "drafting.DocumentTemplate", null=True, blank=True, on_delete=models.CASCADE,
        related_name="model_promotions",
    )  # fmt: skip
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+",
    )  # fmt: skip
    created = models.DateTimeField(auto_now_add=True)
    rolled_back = models.DateTimeField(null=True, blank=True)
    rolled_back_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+",
    )  # fmt: skip

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        scope = self.template.slug if self.template is not None else "default"
        return f"{self.model_version} for {scope}"


class TrainingRun(models.Model):
    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        EVALUATING = "evaluating"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    ACTIVE_STATES = (State.QUEUED, State.RUNNING, State.EVALUATING)
    FINAL_STATES = (State.SUCCEEDED, State.FAILED, State.CANCELLED)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    corpus = models.ForeignKey(Corpus, on_delete=models.PROTECT, related_name="runs")
    base_version = models.ForeignKey(
        ModelVersion, on_delete=models.PROTECT, related_name="runs_from"
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    state = models.CharField(
        max_length=12, choices=State.choices, default=State.QUEUED, db_index=True
    )
    config = models.JSONField(default=dict)  # research.finetune.FinetuneConfig as JSON
    held_out = models.JSONField(default=list)  # sha256 of the documents kept out of training
    # step, total_steps, loss, tokens, seconds, eta_seconds, phase, cases_done, cases_total
    progress = models.JSONField(default=dict)
    cancel_requested = models.BooleanField(default=False)
    heartbeat = models.DateTimeField(null=True, blank=True)  # renewed while a worker runs it
    worker = models.CharField(max_length=200, blank=True)
    checkpoint = models.CharField(max_length=1000, blank=True)  # the last one written
    evaluation = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    model_version = models.OneToOneField(
        ModelVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="training_run"
    )
    dispatched = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"run {self.id} on {self.corpus} ({self.state})"

    @property
    def is_final(self) -> bool:
        return self.state in self.FINAL_STATES


class ReviewFeed(models.Model):
    """Learning from review, opted into per template: while ``enabled``, each accepted draft of
    ``template`` (its text as accepted, with the spans people wrote or corrected) becomes a
    document of ``corpus``, the corpus the template's next fine-tune reads."""

    template = models.OneToOneField(
        "drafting.DocumentTemplate", on_delete=models.CASCADE, related_name="review_feed"
    )
    corpus = models.ForeignKey(Corpus, on_delete=models.CASCADE, related_name="review_feeds")
    enabled = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+",
    )  # fmt: skip
    created = models.DateTimeField(auto_now_add=True)
    documents_added = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"accepted {self.template.slug} drafts -> {self.corpus}"
