"""Audit writes: run records, the log and its checkpoints, diagnostics, incidents, replays.

Every write that matters goes through ``_log_append``: it adds a leaf to the Merkle log in the
same transaction, and a signed checkpoint is appended to the checkpoint file after commit.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, connection, models, transaction
from django.db.models import Max
from django.utils import timezone

from audit import checkpoints, crypto, keys, merkle, witness
from audit.canonical import canonical_json, sha256_hex
from audit.models import (
    RUN_RECORD_SCHEMA_VERSION,
    AuditEvent,
    Diagnostic,
    Incident,
    LogEntry,
    LoggedModel,
    RunRecord,
)
from audit.replay import ReplayReport, replay_record
from audit.runbody import RunContext, run_body_build
from audit.selectors import user_is_auditor
from audit.trace import trace_hash, trace_head

if TYPE_CHECKING:
    from gpu_worker.engine.outcome import Outcome

logger = logging.getLogger(__name__)

SYSTEM_ACTOR = "system"
_SEQ_RETRIES = 8  # without a lock, concurrent appenders race for the next seq; the index decides
# PostgreSQL serialises appenders on one transaction-scoped advisory lock (held to commit), so
# the next seq is read after the previous appender committed and the insert cannot collide.
_LOG_LOCK_KEY = 0x5374656E63696C  # "Stencil"
_SAMPLING_BUCKETS = 1 << 64

User = AbstractBaseUser | AnonymousUser


# -- the log ------------------------------------------------------------------------------
def _log_append(*, obj: LoggedModel) -> LogEntry:
    """Add ``obj``'s current logged fields as the next leaf; checkpoint after commit."""
    fresh = type(obj)._base_manager.get(pk=obj.pk)  # hash what the database holds
    digests = canonical_json(fresh.field_digests())
    for _ in range(_SEQ_RETRIES):
        try:
            with transaction.atomic():
                _log_lock()
                last = LogEntry.objects.aggregate(m=Max("seq"))["m"]
                entry = LogEntry(
                    seq=0 if last is None else last + 1,
                    kind=obj.LOG_KIND,
                    ref=str(obj.pk),
                    digests=digests,
                    created=timezone.now(),
                )
                entry.save()
        except IntegrityError:
            continue
        transaction.on_commit(_checkpoint_after_commit)
        return entry
    raise RuntimeError("could not allocate an audit log sequence number")


def _log_lock() -> None:
    """Wait for every other open transaction that appends to the log (PostgreSQL only).

    Under load, optimistic retries alone can lose every race (CI saw one appender lose eight
    in a row). SQLite already serialises writers on its database lock.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOG_LOCK_KEY])


def _checkpoint_after_commit() -> None:
    try:
        checkpoint_write()
    except Exception:  # the next append (or audit_checkpoint) catches up; never lose the run
        logger.exception("audit: writing a log checkpoint failed")


class CheckpointRefused(Exception):
    """Signing now would cover up tampering (the checkpoint file falls short of its witness)."""


def checkpoint_write() -> checkpoints.Checkpoint | None:
    """Append a signed checkpoint covering every committed log entry not yet covered, and
    copy it to the witness. Refused while the file falls short of the witness."""
    path = Path(settings.AUDIT_CHECKPOINT_FILE)
    signer = keys.signing_key()
    with checkpoints.locked(path) as fh:
        line = checkpoints.last_line(fh)
        last = checkpoints.parse_line(line) if line else None
        size = last.size if last else 0
        cut = witness.cut_tail(size, witness.witness_read())
        if cut is not None:
            raise CheckpointRefused(f"refusing to sign: {cut}")
        frontier = [bytes.fromhex(x) for x in last.frontier] if last else []
        new_leaves: list[str] = []
        for entry in LogEntry.objects.filter(seq__gte=size).order_by("seq").iterator():
            if entry.seq != size + len(new_leaves):
                break  # a gap: an earlier entry is not committed yet; cover it next time
            leaf = merkle.leaf_hash(entry.leaf_data())
            frontier = merkle.frontier_append(frontier, size + len(new_leaves), leaf)
            new_leaves.append(leaf.hex())
        if not new_leaves:
            return None
        checkpoint = checkpoints.checkpoint_sign(
            key=signer,
            size=size + len(new_leaves),
            root=merkle.frontier_root(frontier).hex(),
            timestamp=timezone.now().astimezone(dt.UTC).isoformat(),
            first=size,
            leaves=new_leaves,
            frontier=[x.hex() for x in frontier],
        )
        fh.seek(0, 2)
        fh.write(checkpoint.to_line())
        fh.flush()
        os.fsync(fh.fileno())
        witness.witness_write(checkpoint)
    return checkpoint


def audit_event_append(
    *, kind: str, actor: str, subject: str = "", details: Mapping[str, Any] | None = None
) -> AuditEvent:
    with transaction.atomic():
        event = AuditEvent(
            kind=kind,
            actor=actor,
            subject=subject,
            details=canonical_json(dict(details or {})),
            created=timezone.now(),
        )
        event.save()
        _log_append(obj=event)
    return event


def _actor(user: Any) -> str:
    if user is None:
        return SYSTEM_ACTOR
    return str(getattr(user, "get_username", lambda: "anonymous")() or "anonymous")


# -- diagnostics sampling -------------------------------------------------------------------
def diagnostics_sampled(*, correlation_id: str) -> bool:
    """Deterministic: the same correlation id always gets the same answer.

    The worker asks before the run (to know whether to collect drafts) and the run record
    asks again when storing them, so both use the correlation id, which exists before the
    run id does; every attempt of one request is kept or none is.
    """
    share = float(settings.AUDIT_DIAGNOSTIC_SHARE)
    if share <= 0:
        return False
    if share >= 1:
        return True
    bucket = int(sha256_hex("diagnostics:" + correlation_id)[:16], 16)
    return bucket < share * _SAMPLING_BUCKETS


def diagnostics_wanted(*, correlation_id: str) -> bool:
    """Whether the worker should collect raw intermediate drafts for this request."""
    return diagnostics_sampled(correlation_id=correlation_id)


def _diagnostic_seal(*, run_id: uuid.UUID, snapshots: Sequence[str]) -> crypto.Sealed:
    newest = keys.encryption_keys()[0]
    plaintext = canonical_json({"snapshots": list(snapshots)}).encode("utf-8")
    return crypto.seal(plaintext=plaintext, associated_data=str(run_id).encode(), key=newest)


def diagnostic_decrypt(*, diagnostic: Diagnostic) -> list[str]:
    """Decrypt without the access check: for the rotation command and tests only."""
    sealed = crypto.Sealed(
        key_id=diagnostic.key_id,
        nonce=bytes(diagnostic.nonce),
        ciphertext=bytes(diagnostic.ciphertext),
    )
    plaintext = crypto.unseal(
        sealed=sealed,
        associated_data=str(diagnostic.run_id).encode(),
        keys=keys.encryption_keys(),
    )
    return [str(s) for s in json.loads(plaintext)["snapshots"]]


def diagnostic_read(*, diagnostic: Diagnostic, user: Any) -> list[str]:
    """The raw drafts, for an auditor; every attempt, allowed or not, is an audit event."""
    subject = f"diagnostic:{diagnostic.pk}"
    if not user_is_auditor(user=user):
        audit_event_append(
            kind=AuditEvent.Kind.DIAGNOSTIC_READ_DENIED,
            actor=_actor(user),
            subject=subject,
            details={"run_id": str(diagnostic.run_id)},
        )
        raise PermissionDenied("reading diagnostics requires the auditors group")
    audit_event_append(
        kind=AuditEvent.Kind.DIAGNOSTIC_READ,
        actor=_actor(user),
        subject=subject,
        details={"run_id": str(diagnostic.run_id), "key_id": diagnostic.key_id},
    )
    return diagnostic_decrypt(diagnostic=diagnostic)


@dataclass(frozen=True)
class RotationReport:
    newest_key_id: str
    reencrypted: int
    already_current: int


def keys_rotate(*, actor: str = SYSTEM_ACTOR) -> RotationReport:
    """Re-encrypt every diagnostic under the newest key; each rewrite is a new log version."""
    newest = keys.encryption_keys()[0]
    done = 0
    current = 0
    old_ids: set[str] = set()
    raw: models.QuerySet[Diagnostic] = models.QuerySet(model=Diagnostic)  # sanctioned rewrite
    for pk in list(Diagnostic.objects.order_by("pk").values_list("pk", flat=True)):
        with transaction.atomic():
            diagnostic = raw.select_for_update().get(pk=pk)
            if diagnostic.key_id == newest.key_id:
                current += 1
                continue
            old_ids.add(diagnostic.key_id)
            plaintext = canonical_json(
                {"snapshots": diagnostic_decrypt(diagnostic=diagnostic)}
            ).encode("utf-8")
            sealed = crypto.seal(
                plaintext=plaintext,
                associated_data=str(diagnostic.run_id).encode(),
                key=newest,
            )
            raw.filter(pk=pk).update(
                key_id=sealed.key_id, nonce=sealed.nonce, ciphertext=sealed.ciphertext
            )
            diagnostic.refresh_from_db()
            _log_append(obj=diagnostic)
            done += 1
    audit_event_append(
        kind=AuditEvent.Kind.KEYS_ROTATED,
        actor=actor,
        subject=f"key:{newest.key_id}",
        details={"reencrypted": done, "from_keys": sorted(old_ids)},
    )
    return RotationReport(newest_key_id=newest.key_id, reencrypted=done, already_current=current)


def diagnostics_purge(*, older_than_days: int | None = None, actor: str = SYSTEM_ACTOR) -> int:
    """Delete diagnostics past retention: the one deletion, recorded as an audit event."""
    days = settings.AUDIT_DIAGNOSTIC_RETENTION_DAYS if older_than_days is None else older_than_days
    if days < 0:
        raise ValueError(f"older_than_days must be >= 0, got {days}")
    cutoff = timezone.now() - dt.timedelta(days=days)
    with transaction.atomic():
        ids = list(
            Diagnostic.objects.filter(created__lt=cutoff)
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        if not ids:
            return 0
        audit_event_append(
            kind=AuditEvent.Kind.DIAGNOSTICS_PURGED,
            actor=actor,
            subject=f"older_than_days:{days}",
            details={"diagnostics": ids, "cutoff": cutoff.isoformat()},
        )
        models.QuerySet(model=Diagnostic).filter(pk__in=ids).delete()
    return len(ids)


# -- run records ----------------------------------------------------------------------------
def run_record_create(
    *, context: RunContext, outcome: Outcome, snapshots: Sequence[str] | None = None
) -> RunRecord:
    """Record one run (and, when sampled, its encrypted drafts) in the audit log.

    ``snapshots`` are the raw intermediate drafts; they are kept, encrypted, only when
    diagnostics sampling picks the context's correlation id.
    """
    run_id = uuid.uuid4()
    keep = bool(snapshots) and diagnostics_sampled(correlation_id=context.correlation_id)
    hashed = trace_hash(outcome.trace)
    body = canonical_json(
        run_body_build(run_id=str(run_id), context=context, outcome=outcome, diagnostics=keep)
    )
    with transaction.atomic():
        run = RunRecord(
            id=run_id,
            schema_version=RUN_RECORD_SCHEMA_VERSION,
            body=body,
            body_sha256=sha256_hex(body),
            trace=canonical_json(hashed),
            trace_sha256=trace_head(hashed),
            request=canonical_json(dict(context.request)),
            job_id=context.job_id,
            attempt=context.attempt,
            route=context.route,
            model_name=Path(context.model_dir).name,
            correlation_id=context.correlation_id,
            has_diagnostics=keep,
            created=timezone.now(),
        )
        run.save()
        _log_append(obj=run)
        if keep and snapshots:
            sealed = _diagnostic_seal(run_id=run_id, snapshots=snapshots)
            diagnostic = Diagnostic(
                run=run,
                key_id=sealed.key_id,
                nonce=sealed.nonce,
                ciphertext=sealed.ciphertext,
                created=run.created,
            )
            diagnostic.save()
            _log_append(obj=diagnostic)
    return run


# -- incidents ------------------------------------------------------------------------------
def incident_open(
    *,
    kind: str,
    summary: str,
    run: RunRecord | None = None,
    job_id: str | None = None,
    reporter: Any = None,
) -> Incident:
    """Open an incident (a person's report, a validation failure, a fallback)."""
    if kind not in Incident.Kind.values:
        raise ValueError(f"kind must be one of {Incident.Kind.values}, got {kind!r}")
    if not summary.strip():
        raise ValueError("summary must not be empty")
    is_person = reporter is not None and getattr(reporter, "is_authenticated", False)
    with transaction.atomic():
        incident = Incident(
            kind=kind,
            run=run,
            job_id=job_id if job_id is not None else (run.job_id if run else None),
            reporter=reporter if is_person else None,
            reporter_name=_actor(reporter) if is_person else SYSTEM_ACTOR,
            summary=summary,
            created=timezone.now(),
        )
        incident.save()
        _log_append(obj=incident)
    return incident


def incident_status_set(*, incident: Incident, status: str, user: Any = None) -> Incident:
    if status not in Incident.Status.values:
        raise ValueError(f"status must be one of {Incident.Status.values}, got {status!r}")
    with transaction.atomic():
        old = incident.status
        Incident.objects.filter(pk=incident.pk).update(status=status)
        incident.status = status
        audit_event_append(
            kind=AuditEvent.Kind.INCIDENT_STATUS_CHANGED,
            actor=_actor(user),
            subject=f"incident:{incident.pk}",
            details={"from": old, "to": status},
        )
    return incident


# -- replay ---------------------------------------------------------------------------------
def _batch_requests(run: RunRecord) -> list[dict[str, Any]] | None:
    """The requests (with seeds) of every run in ``run``'s batch, in batch order.

    None when the run was alone or a batch mate's record is missing (then the replay runs
    alone and says it is approximate).
    """
    body = json.loads(run.body)
    batch = body["stencil.batch"]["job_ids"]
    if len(batch) <= 1:
        return None
    requests: list[dict[str, Any]] = []
    for job_id in batch:
        mate = (RunRecord.objects.filter(job_id=job_id, attempt=run.attempt, route=run.route)
                .order_by("created").first())  # fmt: skip
        if mate is None:
            return None
        mate_body = json.loads(mate.body)
        if mate_body["stencil.batch"]["job_ids"] != batch:
            return None
        requests.append({**json.loads(mate.request), "seed": mate_body["stencil.generator"]["seed"]})
    return requests


def run_replay(*, run: RunRecord, actor: str = SYSTEM_ACTOR) -> ReplayReport:
    """Re-run ``run`` (with its whole batch, when it ran in one) and compare.

    The result is itself an audit event.
    """
    report = replay_record(run_id=str(run.pk), body=run.body, request=run.request,
                           trace=run.trace, batch_requests=_batch_requests(run))  # fmt: skip
    audit_event_append(
        kind=AuditEvent.Kind.RUN_REPLAYED,
        actor=actor,
        subject=f"run:{run.pk}",
        details=report.to_json(),
    )
    return report


def incident_report(
    *, run: RunRecord | None, reporter: Any, reason: str, note: str, where: str,
    job_id: str | None = None,
) -> Incident:  # fmt: skip
    """A person reports a bad output: an incident of kind user_report tied to its run.

    ``where`` names what was reported (e.g. "span 'Clinical summary' of draft 12"); the
    summary holds the reason and the person's note, never the reported text itself (a replay
    of the run reproduces it).
    """
    if not reason.strip():
        raise ValueError("reason must not be empty")
    summary = f"Reported by a reviewer: {reason.strip()}. Where: {where}."
    if note.strip():
        summary += f" Note: {note.strip()}"
    return incident_open(kind=Incident.Kind.USER_REPORT, summary=summary, run=run,
                         job_id=job_id, reporter=reporter)  # fmt: skip
