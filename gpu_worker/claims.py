"""Job claims: who may run a job, for how long, who may write its end, and the poison cap.

A claim is a conditional update of the job row (compare-and-set on its state) stamped with the
moment it was taken, the claim's token: every later write of the worker filters on it, so a
worker that lost its claim (its lease ran out and another worker took the job) writes nothing.
A claim holds a lease that the worker renews while it works (:func:`leases_renew`); a job whose
lease ran out (its worker died) is claimed again, by its own message, the sweeper's, or as a
batch mate of another job with the same sampler config.

The poison cap counts only the deliveries that began the job's work: :func:`work_begin` adds
one to ``delivery_count`` just before the engine runs the job, so a job claimed as a batch mate
and lost before its turn, or redelivered before its work began, comes no closer to the cap; nor
does a delivery the worker gave back because the database dropped its session
(:func:`job_release` with ``refund``). A job whose work began STENCIL_MAX_DELIVERIES times
without an end fails with its reason; a job on its last delivery runs alone
(:func:`last_chance`), so one job that kills its worker cannot take its batch mates with it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from drafting import metrics
from drafting.models import InfillJob

log = logging.getLogger(__name__)
ACTIVE = (InfillJob.State.RUNNING, InfillJob.State.VALIDATING)


class JobBusy(Exception):
    """Another worker holds a live claim; try again after ``retry_after`` seconds."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"job is running elsewhere; retry in {retry_after}s")
        self.retry_after = retry_after


@dataclass(frozen=True)
class Claim:
    job: InfillJob
    token: datetime  # when this claim was taken: only writes carrying it land

    def mine(self) -> Q:
        """The job's row while this claim still holds it."""
        return Q(pk=self.job.pk, started=self.token, state__in=ACTIVE)


def lease() -> timedelta:
    """How long a claim holds without a renewal before another worker may take over."""
    return timedelta(seconds=settings.STENCIL_JOB_LEASE_SECONDS)


def last_chance() -> int:
    """Deliveries begun from which a job runs alone: its next is the last the cap allows."""
    return max(1, settings.STENCIL_MAX_DELIVERIES - 1)


def _claimable(now: datetime) -> Q:
    """Queued jobs, and jobs whose worker is gone (lease expired), below the cap, not cancelled."""
    return Q(cancel_requested=False, delivery_count__lt=settings.STENCIL_MAX_DELIVERIES) & (
        Q(state=InfillJob.State.QUEUED) | Q(state__in=ACTIVE, lease_expires__lt=now)
    )


def _take(pk: Any, condition: Q, worker: str) -> Claim | None:
    now = timezone.now()
    taken = InfillJob.objects.filter(Q(pk=pk) & condition).update(
        state=InfillJob.State.RUNNING, worker=worker, started=now,
        lease_expires=now + lease(), progress={},
    )  # fmt: skip
    if not taken:
        return None
    return Claim(job=InfillJob.objects.get(pk=pk), token=now)


def job_claim(*, job_id: str, worker: str) -> Claim | None:
    """Claim a queued job (or one whose worker died); None when there is nothing to do."""
    now = timezone.now()
    claim = _take(job_id, _claimable(now), worker)
    if claim is not None:
        return claim
    job = InfillJob.objects.filter(pk=job_id).first()
    if job is None:
        log.warning("job %s does not exist; dropping the message", job_id)
        return None
    if job.is_final:
        return None  # another delivery got there first and finished it
    lease_left = (job.lease_expires - now).total_seconds() if job.lease_expires else 0
    if job.state in ACTIVE and lease_left > 0:
        raise JobBusy(retry_after=int(lease_left) + 1)
    if job.cancel_requested:
        job_finish(job, None, state=InfillJob.State.CANCELLED, reasons=[
            "cancelled before it started" if job.state == InfillJob.State.QUEUED
            else "cancelled; the worker running it had stopped"
        ])  # fmt: skip
        return None
    # Not claimable, not busy, not cancelled: the cap is reached, a poison job ends here.
    job_finish(job, None, state=InfillJob.State.FAILED, reasons=[
        f"the job's work was interrupted {job.delivery_count} times (delivery cap "
        f"{settings.STENCIL_MAX_DELIVERIES}): each time its worker was lost, or a database "
        "error ended the work; it was not retried again"
    ])  # fmt: skip
    metrics.JOB_FAILURES.labels(reason="poison").inc()
    return None


def claim_batch_mates(claim: Claim, worker: str) -> Iterator[Claim]:
    """Claim, one at a time, up to STENCIL_BATCH_MAX - 1 jobs to batch with ``claim``'s.

    Mates share its sampler config and are queued or orphaned (their worker is gone), oldest
    first, so reclaimed jobs batch like fresh ones. A job on its last chance neither takes nor
    joins a batch. A generator: the caller holds each claim as soon as it is taken.
    """
    limit = settings.STENCIL_BATCH_MAX - 1
    if limit <= 0 or claim.job.delivery_count >= last_chance():
        return
    now = timezone.now()
    candidates = (
        InfillJob.objects.filter(_claimable(now), config_sha256=claim.job.config_sha256,
                                 delivery_count__lt=last_chance())  # fmt: skip
        .exclude(pk=claim.job.pk)
        .order_by("created")
        .values_list("pk", flat=True)[:limit]
    )
    for pk in list(candidates):
        mate = _take(pk, _claimable(timezone.now()), worker)
        if mate is not None:  # else another worker got there first
            yield mate


def work_begin(claim: Claim) -> bool:
    """Count this delivery against the cap: the job's work starts now. False: claim lost."""
    begun = InfillJob.objects.filter(claim.mine()).update(delivery_count=F("delivery_count") + 1)
    if begun:
        claim.job.delivery_count += 1
    return begun == 1


def holds(claim: Claim) -> bool:
    return InfillJob.objects.filter(claim.mine()).exists()


def leases_renew(claims: Iterable[Claim]) -> int:
    """Renew the lease of every claim still held; the number renewed."""
    held = Q()
    for claim in claims:
        held |= claim.mine()
    if not held:
        return 0
    return InfillJob.objects.filter(held).update(lease_expires=timezone.now() + lease())


def job_release(claim: Claim, *, refund: bool = False) -> str | None:
    """Give a claimed job back to the queue for another delivery (the worker hit a database
    fault); a job a person asked to cancel ends cancelled instead. ``refund`` takes back this
    delivery's count when the fault was the database's alone (it dropped the session). The
    row waits as the outbox: ``dispatched`` is cleared until its id reaches the broker again.
    Returns the job's new state; None when the claim was lost."""
    now = timezone.now()
    if InfillJob.objects.filter(claim.mine(), cancel_requested=True).update(
        state=InfillJob.State.CANCELLED, finished=now, lease_expires=None,
        reasons=["cancelled while its worker was recovering from a database error"],
    ):  # fmt: skip
        return InfillJob.State.CANCELLED
    changes: dict[str, Any] = {"state": InfillJob.State.QUEUED, "worker": "",
                               "lease_expires": None, "progress": {}, "dispatched": None}  # fmt: skip
    if refund:
        changes["delivery_count"] = F("delivery_count") - 1
    if InfillJob.objects.filter(claim.mine()).update(**changes):
        return InfillJob.State.QUEUED
    return None


def job_finish(job: InfillJob, token: datetime | None, *, state: str,
               reasons: list[str] | None = None, result: dict[str, Any] | None = None) -> bool:  # fmt: skip
    """Write the final state once; False when this worker no longer holds the claim.

    ``token`` None ends a job nobody holds (a cancel, the poison cap).
    """
    query = InfillJob.objects.filter(pk=job.pk).exclude(state__in=InfillJob.FINAL_STATES)
    if token is not None:
        query = query.filter(started=token, state__in=ACTIVE)
    changes: dict[str, Any] = {"state": state, "finished": timezone.now(), "lease_expires": None}
    if reasons is not None:
        changes["reasons"] = reasons
    if result is not None:
        changes["result"] = result
    changes["attempts"] = job.attempts
    changes["route"] = job.route
    changes["route_reason"] = job.route_reason
    written = query.update(**changes) == 1
    job.refresh_from_db()
    return written
