"""The sweeper: every job is in a state someone will move.

Run every ``STENCIL_SWEEP_SECONDS`` by each worker (a timer thread the Celery adapter starts
when the worker is ready; several workers sweeping at once is safe, each move is a
compare-and-set). One sweep:

1. sends the jobs the broker never took (``dispatched`` empty, older than the grace period:
   the broker was down when they were submitted);
2. ends as cancelled the running jobs whose worker is gone (lease expired) and that a person
   asked to cancel;
3. re-sends the running jobs whose lease expired, at most once per lease period, so a job
   whose message was acknowledged before its worker failed (a database error, a lost
   connection) is claimed again; the claim's delivery cap still ends a poison job.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import close_old_connections, connection
from django.db.models import Q
from django.utils import timezone

from drafting import metrics, services
from drafting.models import InfillJob

log = logging.getLogger(__name__)
SWEEP_BATCH = 200  # the most jobs one sweep moves of each kind
_ACTIVE = (InfillJob.State.RUNNING, InfillJob.State.VALIDATING)


@dataclass
class SweepReport:
    dispatched: int = 0  # never-sent jobs handed to the broker
    cancelled: int = 0  # orphaned jobs a person had asked to cancel
    resent: int = 0  # orphaned jobs handed to the broker again


def _send(job_id: str, *, previous: datetime | None, now: datetime) -> bool:
    """Stamp the job as sent (only if no other sweeper did), then send it."""
    if not InfillJob.objects.filter(pk=job_id, dispatched=previous).update(dispatched=now):
        return False  # another sweeper took it
    if services.job_dispatch(job_id=job_id):
        return True
    InfillJob.objects.filter(pk=job_id, dispatched=now).update(dispatched=previous)
    return False


def sweep(*, now: datetime | None = None) -> SweepReport:
    now = now or timezone.now()
    grace = timedelta(seconds=settings.STENCIL_SWEEP_GRACE_SECONDS)
    lease = timedelta(seconds=settings.STENCIL_JOB_LEASE_SECONDS)
    report = SweepReport()
    never_sent = InfillJob.objects.filter(
        state=InfillJob.State.QUEUED, dispatched__isnull=True, created__lt=now - grace
    ).values_list("pk", flat=True)[:SWEEP_BATCH]
    for pk in never_sent:
        report.dispatched += _send(str(pk), previous=None, now=now)
    orphaned = InfillJob.objects.filter(state__in=_ACTIVE, lease_expires__lt=now)
    report.cancelled = orphaned.filter(cancel_requested=True).update(
        state=InfillJob.State.CANCELLED, finished=now, lease_expires=None,
        reasons=["cancelled; the worker running it had stopped"],
    )  # fmt: skip
    stale = orphaned.filter(cancel_requested=False).filter(
        Q(dispatched__isnull=True) | Q(dispatched__lt=now - lease)
    ).values_list("pk", "dispatched")[:SWEEP_BATCH]  # fmt: skip
    for pk, previous in stale:
        report.resent += _send(str(pk), previous=previous, now=now)
    for found, n in (("never_dispatched", report.dispatched), ("cancelled", report.cancelled),
                     ("lease_expired", report.resent)):  # fmt: skip
        if n:
            metrics.SWEPT.labels(found=found).inc(n)
            log.info("sweeper: %s %d job(s)", found, n)
    return report


def _loop(interval: float) -> None:
    while True:
        time.sleep(interval)
        try:
            close_old_connections()
            sweep()
        except Exception:  # a database or broker blip: the next sweep tries again
            log.exception("sweeper: the sweep failed")
        finally:
            connection.close()


def timer_start() -> threading.Thread | None:
    """Start this process's sweep timer (none when STENCIL_SWEEP_SECONDS is 0)."""
    interval = float(settings.STENCIL_SWEEP_SECONDS)
    if interval <= 0:
        return None
    thread = threading.Thread(target=_loop, args=(interval,), name="stencil-sweeper", daemon=True)
    thread.start()
    return thread
