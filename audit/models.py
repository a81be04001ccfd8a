"""Audit records. Everything here is append-only except an incident's status.

Each logged row has a log entry (``LogEntry``) holding the sha256 of each of its logged fields;
the log entries are the leaves of an RFC 6962 Merkle tree whose signed checkpoints live in a
file outside the database (``AUDIT_CHECKPOINT_FILE``). ``manage.py audit_verify`` recomputes
all of it.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any, ClassVar

from django.conf import settings
from django.db import models

from audit.canonical import canonical_json, sha256_hex

# The run record body's schema version (audit.runbody), written into every new record. A record
# is read by the rules of its own version: 1 (Stencil 0.1.0) by audit.legacy, where it differs.
# 2: stencil.outcome.trace_sha256 is the head of the stored trace's chain (the one chain of
# gpu_worker.engine.trace), and trace_chain_head, which repeated it, is gone.
RUN_RECORD_SCHEMA_VERSION = 2


class AppendOnlyError(Exception):
    """The app tried to update or delete an append-only audit record."""


class AppendOnlyQuerySet(models.QuerySet[Any]):
    def update(self, **kwargs: Any) -> int:
        raise AppendOnlyError(f"{self.model.__name__} rows are append-only: no update()")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError(f"{self.model.__name__} rows are append-only: no delete()")

    def bulk_update(self, objs: Any, fields: Any, batch_size: int | None = None) -> int:
        raise AppendOnlyError(f"{self.model.__name__} rows are append-only: no bulk_update()")


def field_digest(value: Any) -> str:
    """sha256 of one column value, in a form that survives a database round trip."""
    if isinstance(value, memoryview):
        value = value.tobytes()
    if isinstance(value, bytes):
        return sha256_hex(value)
    if isinstance(value, dt.datetime):
        return sha256_hex(value.astimezone(dt.UTC).isoformat())
    if isinstance(value, uuid.UUID):
        return sha256_hex(str(value))
    if isinstance(value, str):
        return sha256_hex(value)
    return sha256_hex(canonical_json(value))


class LoggedModel(models.Model):
    """A row whose logged fields are hashed into the tamper-evident log."""

    LOG_KIND: ClassVar[str] = ""
    LOGGED_FIELDS: ClassVar[tuple[str, ...]] = ()

    class Meta:
        abstract = True

    def field_digests(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for name in self.LOGGED_FIELDS:
            attname = self._meta.get_field(name).attname  # type: ignore[union-attr]
            out[name] = field_digest(getattr(self, attname))
        return out


class AppendOnlyModel(LoggedModel):
    """Insert once; ``save()`` of an existing row and ``delete()`` raise."""

    objects = AppendOnlyQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise AppendOnlyError(f"{type(self).__name__} {self.pk} is append-only")
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError(f"{type(self).__name__} {self.pk} is append-only")


class LogEntry(models.Model):
    """One leaf of the Merkle tree: which row, and the sha256 of each of its logged fields.

    The leaf data is the canonical JSON of (kind, ref, digests, created); the position in the
    tree is ``seq`` (0-based, gapless), deliberately outside the leaf so a reordering shows as
    a known leaf in the wrong place.
    """

    seq = models.BigIntegerField(unique=True)
    kind = models.CharField(max_length=32)
    ref = models.CharField(max_length=64)
    digests = models.TextField()  # canonical JSON {field: sha256}
    created = models.DateTimeField()

    objects = AppendOnlyQuerySet.as_manager()

    class Meta:
        ordering = ["seq"]
        indexes = [models.Index(fields=["kind", "ref"])]
        verbose_name_plural = "log entries"

    def __str__(self) -> str:
        return f"#{self.seq} {self.kind} {self.ref}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise AppendOnlyError(f"log entry {self.seq} is append-only")
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError(f"log entry {self.seq} is append-only")

    def leaf_data(self) -> bytes:
        try:
            digests: Any = json.loads(self.digests)
        except ValueError:  # a tampered row: hash what is there
            digests = self.digests
        return canonical_json(
            {
                "kind": self.kind,
                "ref": self.ref,
                "digests": digests,
                "created": self.created.astimezone(dt.UTC).isoformat(),
            }
        ).encode("utf-8")


class RunRecord(AppendOnlyModel):
    """One sampler run (one attempt on one route): enough to reproduce it, and no raw text."""

    LOG_KIND = "run_record"
    LOGGED_FIELDS = (
        "schema_version", "body", "body_sha256", "trace", "trace_sha256", "request",
        "job_id", "attempt", "route", "model_name", "correlation_id", "has_diagnostics",
        "created",
    )  # fmt: skip

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    schema_version = models.PositiveIntegerField(default=RUN_RECORD_SCHEMA_VERSION)
    body = models.TextField()  # canonical JSON, see audit.runbody
    body_sha256 = models.CharField(max_length=64)
    trace = models.TextField()  # canonical JSON list of hashed, chained steps (audit.trace)
    trace_sha256 = models.CharField(max_length=64)  # the chain head of ``trace``
    request = models.TextField()  # canonical Canvas JSON of the request (input, not output)
    job_id = models.CharField(max_length=64, null=True, blank=True, db_index=True)
    attempt = models.PositiveIntegerField(default=0)  # 0 = the first attempt
    route = models.CharField(max_length=32, db_index=True)
    model_name = models.CharField(max_length=200, db_index=True)
    correlation_id = models.CharField(max_length=100, db_index=True)
    has_diagnostics = models.BooleanField(default=False)
    created = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.route}, attempt {self.attempt})"


class Diagnostic(AppendOnlyModel):
    """Raw intermediate drafts of a sampled run, AES-256-GCM encrypted (run id as AAD).

    The only rows the app ever rewrites (key rotation, logged as a new version) or deletes
    (retention purge, logged as an audit event).
    """

    LOG_KIND = "diagnostic"
    LOGGED_FIELDS = ("run", "key_id", "nonce", "ciphertext", "created")

    run = models.ForeignKey(
        RunRecord, on_delete=models.DO_NOTHING, db_constraint=False, related_name="diagnostics"
    )
    key_id = models.CharField(max_length=32)
    nonce = models.BinaryField()
    ciphertext = models.BinaryField()
    created = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"diagnostic {self.pk} of run {self.run_id}"


class AuditEvent(AppendOnlyModel):
    """Something done to the audit data: a diagnostic read, a rotation, a purge, a replay."""

    LOG_KIND = "audit_event"
    LOGGED_FIELDS = ("kind", "actor", "subject", "details", "created")

    class Kind(models.TextChoices):
        DIAGNOSTIC_READ = "diagnostic_read"
        DIAGNOSTIC_READ_DENIED = "diagnostic_read_denied"
        KEYS_ROTATED = "keys_rotated"
        DIAGNOSTICS_PURGED = "diagnostics_purged"
        RUN_REPLAYED = "run_replayed"
        INCIDENT_STATUS_CHANGED = "incident_status_changed"
        BUNDLE_EXPORTED = "incident_bundle_exported"

    kind = models.CharField(max_length=40, choices=Kind.choices, db_index=True)
    actor = models.CharField(max_length=150, blank=True)  # a username snapshot, or "system"
    subject = models.CharField(max_length=100, blank=True)  # e.g. "diagnostic:12"
    details = models.TextField(default="{}")  # canonical JSON
    created = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.kind} {self.subject} by {self.actor}"


class Incident(LoggedModel):
    """A reported or automatic problem with a run. Only ``status`` may change; never deleted."""

    LOG_KIND = "incident"
    LOGGED_FIELDS = ("kind", "run", "job_id", "reporter_name", "summary", "created")

    class Kind(models.TextChoices):
        USER_REPORT = "user_report"
        VALIDATION_FAILURE = "validation_failure"
        FALLBACK = "fallback"

    class Status(models.TextChoices):
        OPEN = "open"
        INVESTIGATING = "investigating"
        RESOLVED = "resolved"
        DISMISSED = "dismissed"

    kind = models.CharField(max_length=32, choices=Kind.choices, db_index=True)
    run = models.ForeignKey(
        RunRecord,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        null=True,
        blank=True,
        related_name="incidents",
    )
    job_id = models.CharField(max_length=64, null=True, blank=True, db_index=True)
    reporter = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    reporter_name = models.CharField(max_length=150, blank=True)  # snapshot for the log
    summary = models.TextField()
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.OPEN)
    created = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"incident {self.pk} ({self.kind}, {self.status})"

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError(f"incident {self.pk} cannot be deleted")


LOGGED_MODELS: tuple[type[LoggedModel], ...] = (RunRecord, Diagnostic, AuditEvent, Incident)
