"""Job claims: who may run a job, for how long, and who may write its end.

A claim is a conditional update of the job row (compare-and-set on its state), so a
redelivered message finds nothing to do; each claim bumps the job's delivery number, and only
the worker holding the current one may write the final state (:func:`job_finish`). A claim
holds a lease that progress writes renew; a job whose lease ran out is claimed again, up to
STENCIL_MAX_DELIVERIES times (then it is a poison job and fails with its reason).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from drafting import metrics
from drafting.models import InfillJob

log = logging.getLogger(__name__)


class JobBusy(Exception):
    """Another worker holds a live claim; try again after ``retry_after`` seconds."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"job is running elsewhere; retry in {retry_after}s")
        self.retry_after = retry_after


@dataclass(frozen=True)
class Claim:
    job: InfillJob
    delivery: int  # the claim token: only this delivery may write the result


def lease() -> timedelta:
    """How long a claim holds without a progress write before another worker may take over."""
    return timedelta(seconds=settings.STENCIL_JOB_LEASE_SECONDS)


def job_claim(*, job_id: str, worker: str) -> Claim | None:
    """Claim a queued job (or one whose worker died); None when there is nothing to do."""
    now = timezone.now()
    fresh = Q(state=InfillJob.State.QUEUED, cancel_requested=False)
    orphaned = Q(
        state__in=[InfillJob.State.RUNNING, InfillJob.State.VALIDATING],
        lease_expires__lt=now,
        delivery_count__lt=settings.STENCIL_MAX_DELIVERIES,
    )
    claimed = InfillJob.objects.filter(Q(pk=job_id) & (fresh | orphaned)).update(
        state=InfillJob.State.RUNNING,
        delivery_count=F("delivery_count") + 1,
        worker=worker,
        started=now,
        lease_expires=now + lease(),
        progress={},
    )
    job = InfillJob.objects.filter(pk=job_id).first()
    if job is None:
        log.warning("job %s does not exist; dropping the message", job_id)
        return None
    if claimed:
        return Claim(job=job, delivery=job.delivery_count)
    if job.is_final:
        return None  # another delivery got there first and finished it
    if job.state == InfillJob.State.QUEUED and job.cancel_requested:
        job_finish(job, None, state=InfillJob.State.CANCELLED, reasons=["cancelled before it started"])
        return None
    lease_left = (job.lease_expires - now).total_seconds() if job.lease_expires else 0
    if lease_left > 0:
        raise JobBusy(retry_after=int(lease_left) + 1)
    # The lease is gone and the delivery cap is reached: a poison job ends here.
    job_finish(job, None, state=InfillJob.State.FAILED, reasons=[
        f"worker lost {job.delivery_count} times while running this job (delivery cap "
        f"{settings.STENCIL_MAX_DELIVERIES}); it was not retried again"
    ])  # fmt: skip
    metrics.JOB_FAILURES.labels(reason="poison").inc()
    return None


def job_finish(job: InfillJob, delivery: int | None, *, state: str,
               reasons: list[str] | None = None, result: dict[str, Any] | None = None) -> bool:  # fmt: skip
    """Write the final state once; False when this worker no longer holds the claim."""
    query = InfillJob.objects.filter(pk=job.pk).exclude(state__in=InfillJob.FINAL_STATES)
    if delivery is not None:
        query = query.filter(delivery_count=delivery)
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


def claim_batch_mates(claim: Claim, worker: str) -> list[Claim]:
    """Claim up to STENCIL_BATCH_MAX - 1 queued jobs with the same sampler config."""
    limit = settings.STENCIL_BATCH_MAX - 1
    if limit <= 0:
        return []
    candidates = (
        InfillJob.objects.filter(state=InfillJob.State.QUEUED, cancel_requested=False,
                                 config_sha256=claim.job.config_sha256)  # fmt: skip
        .exclude(pk=claim.job.pk)
        .order_by("created")
        .values_list("pk", flat=True)[:limit]
    )
    mates: list[Claim] = []
    for pk in list(candidates):
        now = timezone.now()
        taken = InfillJob.objects.filter(
            pk=pk, state=InfillJob.State.QUEUED, cancel_requested=False
        ).update(state=InfillJob.State.RUNNING, delivery_count=F("delivery_count") + 1,
                 worker=worker, started=now, lease_expires=now + lease(), progress={})  # fmt: skip
        if taken:  # else another worker got there first
            job = InfillJob.objects.get(pk=pk)
            mates.append(Claim(job=job, delivery=job.delivery_count))
    return mates
