"""Verification of the audit log: every row against its log entry, every log entry against the
signed checkpoints, and the checkpoint file against its own signatures.

Findings name what changed: which record, and whether it was changed, deleted, reordered,
inserted, or (for diagnostics) had its ciphertext swapped with another's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import models

from audit import checkpoints, keys, merkle, witness
from audit.canonical import sha256_hex
from audit.models import (
    LOGGED_MODELS,
    AuditEvent,
    Diagnostic,
    LogEntry,
    LoggedModel,
    RunRecord,
)
from audit.trace import trace_chain_valid, trace_head


@dataclass(frozen=True)
class Finding:
    what: str  # changed | deleted | reordered | inserted | swapped | checkpoint
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"{self.what.upper()}: {self.subject}: {self.detail}"


@dataclass
class VerifyReport:
    findings: list[Finding] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    records: int = 0  # log entries
    checkpoint_size: int = 0
    checkpoints: int = 0

    @property
    def ok(self) -> bool:
        return not self.findings

    def add(self, what: str, subject: str, detail: str) -> None:
        self.findings.append(Finding(what, subject, detail))


def _read_checkpoints(report: VerifyReport) -> list[str]:
    """Check the checkpoint file; return its leaf hashes (hex) in log order."""
    path = Path(settings.AUDIT_CHECKPOINT_FILE)
    if not path.exists():
        return []
    public = keys.signing_key().public_key()
    leaves: list[str] = []
    frontier: list[bytes] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"checkpoint file line {lineno}"
        try:
            cp = checkpoints.parse_line(line)
        except (ValueError, KeyError, TypeError) as exc:
            report.add("checkpoint", where, f"unreadable ({exc})")
            continue
        if not checkpoints.signature_valid(cp, public):
            report.add("checkpoint", where, f"bad signature on size {cp.size}")
        if cp.first != len(leaves) or cp.size != cp.first + len(cp.leaves):
            report.add(
                "checkpoint",
                where,
                f"covers leaves {cp.first}..{cp.size - 1} but the file so far holds {len(leaves)}",
            )
            continue
        for leaf in cp.leaves:
            frontier = merkle.frontier_append(frontier, len(leaves), bytes.fromhex(leaf))
            leaves.append(leaf)
        if merkle.frontier_root(frontier).hex() != cp.root:
            report.add(
                "checkpoint", where, f"leaves do not hash to the signed root at size {cp.size}"
            )
        report.checkpoints += 1
        report.checkpoint_size = cp.size
    return leaves


def _entry_name(entry: LogEntry) -> str:
    return f"log entry #{entry.seq} ({entry.kind} {entry.ref})"


def _check_log(report: VerifyReport, entries: list[LogEntry], file_leaves: list[str]) -> None:
    db_leaf = {e.seq: merkle.leaf_hash(e.leaf_data()).hex() for e in entries}
    by_seq = {e.seq: e for e in entries}
    file_pos = {leaf: i for i, leaf in enumerate(file_leaves)}
    db_pos = {leaf: seq for seq, leaf in db_leaf.items()}
    for i, expected in enumerate(file_leaves):
        entry = by_seq.get(i)
        if entry is None:
            if expected in db_pos:
                continue  # reported as reordered from the entry that holds it
            report.add("deleted", f"log entry #{i}", "checkpointed, missing from the database")
        elif db_leaf[i] != expected:
            j = file_pos.get(db_leaf[i])
            if j is not None:
                report.add(
                    "reordered",
                    _entry_name(entry),
                    f"holds the entry checkpointed at position {j}",
                )
            else:
                report.add("changed", _entry_name(entry), "differs from its checkpointed leaf")
    tail = sorted(seq for seq in by_seq if seq >= len(file_leaves))
    for k, seq in enumerate(tail):
        expected_seq = len(file_leaves) + k
        if seq != expected_seq:
            report.add("deleted", f"log entry #{expected_seq}", "gap in the log sequence")
            break
    if tail:
        report.warnings.append(
            f"{len(tail)} log entries after size {len(file_leaves)} are not covered by a signed "
            "checkpoint, so nothing vouches for them; audit_checkpoint signs them only once this "
            "verification finds nothing"
        )


def _latest_entries(entries: list[LogEntry]) -> dict[tuple[str, str], LogEntry]:
    latest: dict[tuple[str, str], LogEntry] = {}
    for entry in entries:  # ordered by seq: later versions win
        latest[(entry.kind, entry.ref)] = entry
    return latest


# Rows logged exactly once: a run record and an audit event never change after they are
# written (a diagnostic may: key rotation re-encrypts it under a new log entry).
_WRITTEN_ONCE = frozenset({RunRecord.LOG_KIND, AuditEvent.LOG_KIND})


def _check_versions(report: VerifyReport, entries: list[LogEntry]) -> None:
    """A run record or audit event is logged once: a second entry re-describes a written row."""
    first: dict[tuple[str, str], LogEntry] = {}
    for entry in entries:
        key = (entry.kind, entry.ref)
        if entry.kind in _WRITTEN_ONCE and key in first:
            report.add(
                "inserted",
                _entry_name(entry),
                f"a second log entry for {entry.kind} {entry.ref}, which is written once "
                f"(first logged at #{first[key].seq})",
            )
        first.setdefault(key, entry)


def _check_witness(report: VerifyReport, file_leaves: list[str]) -> None:
    """The checkpoint file must reach the witnessed checkpoint, with the same root there."""
    try:
        witnessed = witness.witness_read()
    except ValueError as exc:
        report.add("checkpoint", str(witness.witness_path()), str(exc))
        return
    if witnessed is None:
        if file_leaves:
            report.add(
                "checkpoint",
                str(witness.witness_path()),
                f"missing while the checkpoint file covers {len(file_leaves)} entries",
            )
        return
    public = keys.signing_key().public_key()
    if not checkpoints.signature_valid(witnessed, public):
        report.add("checkpoint", str(witness.witness_path()), "bad signature")
        return
    cut = witness.cut_tail(len(file_leaves), witnessed)
    if cut is not None:
        report.add("deleted", "checkpoint file tail", cut)
        return
    frontier: list[bytes] = []
    for i, leaf in enumerate(file_leaves[: witnessed.size]):
        frontier = merkle.frontier_append(frontier, i, bytes.fromhex(leaf))
    if merkle.frontier_root(frontier).hex() != witnessed.root:
        report.add(
            "checkpoint",
            "checkpoint file",
            f"its leaves up to size {witnessed.size} do not hash to the witnessed root: "
            "the file was rewritten and re-signed",
        )


def _check_expected_size(report: VerifyReport, expect_size: int | None) -> None:
    if expect_size is not None and report.checkpoint_size < expect_size:
        report.add(
            "deleted",
            "checkpoint file tail",
            f"the signed checkpoints reach size {report.checkpoint_size}, "
            f"short of the {expect_size} entries recorded",
        )


def _digests(entry: LogEntry) -> dict[str, str] | None:
    try:
        value: Any = json.loads(entry.digests)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _purged_diagnostics() -> set[str]:
    purged: set[str] = set()
    events: models.QuerySet[AuditEvent] = models.QuerySet(model=AuditEvent)
    events = events.filter(kind=AuditEvent.Kind.DIAGNOSTICS_PURGED)
    for event in events:
        try:
            purged.update(str(pk) for pk in json.loads(event.details).get("diagnostics", []))
        except (ValueError, AttributeError):
            continue  # a tampered event is reported by its own digest check
    return purged


def _check_run_internals(report: VerifyReport, run: RunRecord) -> None:
    subject = f"run_record {run.pk}"
    if sha256_hex(run.body) != run.body_sha256:
        report.add("changed", subject, "body does not match body_sha256")
    try:
        steps = json.loads(run.trace)
    except ValueError:
        report.add("changed", subject, "trace is not JSON")
        return
    broken = trace_chain_valid(steps)
    if broken is not None:
        report.add("changed", subject, f"trace hash chain broken at step position {broken}")
    elif trace_head(steps) != run.trace_sha256:
        report.add("changed", subject, "trace chain head does not match trace_sha256")


def _check_objects(report: VerifyReport, entries: list[LogEntry]) -> None:
    latest = _latest_entries(entries)
    purged = _purged_diagnostics()
    for model in LOGGED_MODELS:
        kind = model.LOG_KIND
        rows: models.QuerySet[LoggedModel] = models.QuerySet(model=model)
        try:
            objects: dict[str, LoggedModel] = {str(o.pk): o for o in rows.order_by("pk")}
        except (ValueError, TypeError) as exc:  # a column no longer parses (e.g. a date)
            report.add("changed", f"{kind} table", f"a row no longer loads: {exc}")
            continue
        logged = {ref: e for (k, ref), e in latest.items() if k == kind}
        ciphertext_owner: dict[str, str] = {}
        if model is Diagnostic:
            for ref, version in logged.items():
                digests = _digests(version) or {}
                if "ciphertext" in digests:
                    ciphertext_owner[digests["ciphertext"]] = ref
        for ref, obj in objects.items():
            subject = f"{kind} {ref}"
            entry = logged.get(ref)
            if entry is None:
                report.add("inserted", subject, "not in the audit log")
                continue
            expected = _digests(entry)
            if expected is None:
                continue  # the log entry itself is corrupt: reported by the checkpoint check
            actual = obj.field_digests()
            changed = sorted(
                f for f in set(expected) | set(actual) if expected.get(f) != actual.get(f)
            )
            if not changed:
                if isinstance(obj, RunRecord):
                    _check_run_internals(report, obj)
                continue
            owner = ciphertext_owner.get(actual.get("ciphertext", ""))
            if model is Diagnostic and "ciphertext" in changed and owner and owner != ref:
                report.add(
                    "swapped",
                    subject,
                    f"holds the ciphertext logged for diagnostic {owner} (log entry #{entry.seq})",
                )
            else:
                report.add(
                    "changed",
                    subject,
                    f"fields {', '.join(changed)} differ from log entry #{entry.seq}",
                )
        for ref, logged_entry in logged.items():
            if ref in objects:
                continue
            if model is Diagnostic and ref in purged:
                continue
            report.add(
                "deleted",
                f"{kind} {ref}",
                f"logged at #{logged_entry.seq}, missing from the database",
            )


def log_verify(*, expect_size: int | None = None) -> VerifyReport:
    """Verify everything; the report's findings are empty when nothing was tampered with.

    ``expect_size``: a checkpoint size recorded outside this machine (``audit_verify`` prints
    it); signed checkpoints that stop short of it mean the log's tail was cut.
    """
    report = VerifyReport()
    file_leaves = _read_checkpoints(report)
    _check_witness(report, file_leaves)
    _check_expected_size(report, expect_size)
    log: models.QuerySet[LogEntry] = models.QuerySet(model=LogEntry)
    try:
        entries = list(log.order_by("seq"))
    except (ValueError, TypeError) as exc:
        report.add("changed", "log table", f"a log entry no longer loads: {exc}")
        return report
    report.records = len(entries)
    if entries and not Path(settings.AUDIT_CHECKPOINT_FILE).exists():
        report.add(
            "checkpoint",
            str(settings.AUDIT_CHECKPOINT_FILE),
            f"missing while the log holds {len(entries)} entries",
        )
    _check_log(report, entries, file_leaves)
    _check_versions(report, entries)
    _check_objects(report, entries)
    return report
