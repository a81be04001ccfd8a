"""Drafting data: templates and their versions, drafts made of fragments, infill jobs.

The InfillJob row is the source of truth for a job's state; the broker carries only its id.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.db import models


class DocumentTemplate(models.Model):
    slug = models.SlugField(unique=True, max_length=80)
    title = models.CharField(max_length=200)
    kind = models.CharField(max_length=60, help_text="document kind, e.g. referral_letter")
    description = models.TextField(blank=True)
    created = models.DateTimeField(auto_now_add=True)
    # The version new drafts use; None = unpublished (not offered to people).
    published_version = models.ForeignKey(
        "TemplateVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["title"]
        permissions = [("author_template", "Can write and publish templates (template author)")]

    def __str__(self) -> str:
        return self.title

    def latest_version(self) -> TemplateVersion | None:
        return self.versions.order_by("-number").first()


class TemplateVersion(models.Model):
    """An immutable version of a template's source; a draft keeps the version it came from."""

    template = models.ForeignKey(DocumentTemplate, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    source = models.TextField()
    fields = models.JSONField(default=list)  # parsed field declarations, in order
    holes = models.JSONField(default=list)  # parsed hole declarations, in order
    route_hint = models.CharField(max_length=20, default="auto")  # auto | diffusion | ar
    doc_format = models.CharField(max_length=12, default="text")  # text | markdown | json
    created = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )

    class Meta:
        ordering = ["template", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["template", "number"], name="unique_template_version")
        ]

    def __str__(self) -> str:
        return f"{self.template.slug} v{self.number}"


class Draft(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    template_version = models.ForeignKey(TemplateVersion, on_delete=models.PROTECT)
    title = models.CharField(max_length=200)
    values = models.JSONField(default=dict)  # the form's field values (autosaved)
    revision = models.PositiveIntegerField(default=0)  # bumps on every change (compare-and-set)
    accepted_revision = models.ForeignKey(
        "DraftRevision", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated"]
        permissions = [("accept_draft", "Can accept a draft (the reviewer role)")]

    def __str__(self) -> str:
        return self.title


class Fragment(models.Model):
    """One piece of a draft: template text, a person's field value, or a model fill."""

    class Kind(models.TextChoices):
        TEXT = "text", "template text"
        FIELD = "field", "field value"
        FILL = "fill", "model fill"

    class Status(models.TextChoices):
        EMPTY = "empty", "not yet filled"
        PROVISIONAL = "provisional", "provisional (model output, not accepted)"
        ACCEPTED = "accepted", "accepted"
        EDITED = "edited", "edited by hand"
        REJECTED = "rejected", "rejected"
        FIXED = "fixed", "fixed text"

    draft = models.ForeignKey(Draft, on_delete=models.CASCADE, related_name="fragments")
    position = models.PositiveIntegerField()
    kind = models.CharField(max_length=10, choices=Kind.choices)
    name = models.CharField(max_length=80, blank=True)
    text = models.TextField(blank=True)
    locked = models.BooleanField(default=True)  # True = the model never changes it
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.FIXED)
    spec = models.JSONField(default=dict)  # a fill's hole spec: max_tokens, constraint, hint
    job = models.ForeignKey(
        "InfillJob", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The model's confidence in this text, as its job's result gave it (drafting.confidence):
    # {"p", "low", "marks", "signal", "calibrated"}; {} = not measured, or text a person wrote.
    confidence = models.JSONField(default=dict, blank=True)
    # Who wrote the current text: "model" (a job), "person" (typed by hand), "" (template/form).
    written_by = models.CharField(max_length=10, blank=True, default="")

    class Meta:
        ordering = ["position"]
        constraints = [
            models.UniqueConstraint(fields=["draft", "position"], name="unique_fragment_position")
        ]

    def __str__(self) -> str:
        return f"{self.kind}:{self.name or self.position}"


class DraftRevision(models.Model):
    """An immutable snapshot of a draft's fragments; accepted revisions are final text."""

    draft = models.ForeignKey(Draft, on_delete=models.CASCADE, related_name="revisions")
    number = models.PositiveIntegerField()
    reason = models.CharField(max_length=40)  # created | infill | edit | accepted
    fragments = models.JSONField()
    text = models.TextField()
    accepted = models.BooleanField(default=False)
    created = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )

    class Meta:
        ordering = ["draft", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["draft", "number"], name="unique_draft_revision")
        ]

    REASON_WORDS = {
        "created": "created", "infill": "model text filled in", "accept": "a span accepted",
        "reject": "a span rejected", "edit": "edited by hand",
        "values": "form values changed",
        "write": "written by a person (the model's text was a guess)",
        "accepted": "the whole text accepted",
    }  # fmt: skip

    @property
    def reason_words(self) -> str:
        return self.REASON_WORDS.get(self.reason, self.reason)

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise ValueError("a draft revision is immutable once written")
        super().save(*args, **kwargs)


class InfillJob(models.Model):
    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        VALIDATING = "validating"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    FINAL_STATES = (State.SUCCEEDED, State.FAILED, State.CANCELLED)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    draft = models.ForeignKey(
        Draft, null=True, blank=True, on_delete=models.CASCADE, related_name="jobs"
    )
    state = models.CharField(
        max_length=12, choices=State.choices, default=State.QUEUED, db_index=True
    )
    preset = models.CharField(max_length=20, default="balanced")
    request = models.JSONField()  # Canvas JSON (ARCHITECTURE.md): locked text and hole specs
    config = models.JSONField()  # the frozen SamplerConfig
    config_sha256 = models.CharField(max_length=64)
    seed = models.BigIntegerField()
    route = models.CharField(max_length=20, default="diffusion")
    route_reason = models.JSONField(default=dict)
    target_fragments = models.JSONField(default=list)  # fragment ids this job fills
    base_revision = models.PositiveIntegerField(default=0)  # draft revision when requested
    attempts = models.JSONField(default=list)  # each attempt: route, seed, outcome, run id
    delivery_count = models.PositiveIntegerField(default=0)
    cancel_requested = models.BooleanField(default=False)
    progress = models.JSONField(default=dict)  # step, total, committed share, stable/provisional
    result = models.JSONField(null=True, blank=True)  # holes, document, violations
    reasons = models.JSONField(default=list)  # why a job failed, named
    worker = models.CharField(max_length=200, blank=True)
    lease_expires = models.DateTimeField(null=True, blank=True)  # renewed while a worker runs it
    # when the job's id last went to the broker; None: not yet (the sweeper sends it)
    dispatched = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True, db_index=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"job {self.id} ({self.state})"

    @property
    def is_final(self) -> bool:
        return self.state in self.FINAL_STATES


class ApiToken(models.Model):
    """A key for API clients (``Authorization: Token <key>``); only its sha256 is stored."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=80)
    prefix = models.CharField(max_length=12)  # the key's first characters, to tell keys apart
    key_sha256 = models.CharField(max_length=64, unique=True)
    created = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class ProblemReport(models.Model):
    """A person's report of a bad span: which span, why, and the audit incident it opened."""

    class Reason(models.TextChoices):
        WRONG = "wrong_facts", "it states something wrong or invented"
        UNSAFE = "unsafe", "it is unsafe or harmful"
        OFFENSIVE = "offensive", "it is offensive or inappropriate"
        GARBLED = "garbled", "it is garbled or not a sentence"
        IGNORED = "ignored_context", "it ignores the form's values or the template"
        OTHER = "other", "something else (say what in the note)"

    draft = models.ForeignKey(Draft, on_delete=models.CASCADE, related_name="problem_reports")
    fragment = models.ForeignKey(
        Fragment, null=True, blank=True, on_delete=models.SET_NULL, related_name="reports"
    )
    span_label = models.CharField(max_length=200)  # what the span was called when reported
    reporter = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    reason = models.CharField(max_length=20, choices=Reason.choices)
    note = models.TextField(blank=True)
    incident = models.ForeignKey(
        "audit.Incident", on_delete=models.PROTECT, db_constraint=False, related_name="+"
    )
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"report {self.pk} on {self.span_label}"
