"""Admission control: how much queued work one person, and everybody, may have at once.

The counts and the job insert that follows them are one step under concurrency (a PostgreSQL
advisory lock held to the end of the caller's transaction), so the limits are exact.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import connection

from drafting import metrics
from drafting.errors import AdmissionError
from drafting.models import InfillJob

ADMISSION_LOCK_KEY = 0x5374656E63696C  # the advisory lock every job admission takes ("Stencil")


def _lock() -> None:
    """Serialise admission for the rest of the transaction: the counts below and the insert
    that follows them are one step for every concurrent request (PostgreSQL advisory lock;
    SQLite already writes one transaction at a time)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ADMISSION_LOCK_KEY])


def admission_check(*, owner: Any) -> None:
    """Raise AdmissionError (counted by limit) when ``owner`` or the service is at its limit;
    call inside the transaction that then creates the job."""
    try:
        _limits(owner=owner)
    except AdmissionError as exc:
        metrics.ADMISSION_REFUSALS.labels(reason=exc.reason).inc()
        raise


def _limits(*, owner: Any) -> None:
    _lock()
    active = InfillJob.objects.filter(
        state__in=[InfillJob.State.QUEUED, InfillJob.State.RUNNING, InfillJob.State.VALIDATING]
    )
    if active.filter(owner=owner).count() >= settings.STENCIL_MAX_QUEUED_JOBS_PER_USER:
        raise AdmissionError(
            f"you already have {settings.STENCIL_MAX_QUEUED_JOBS_PER_USER} jobs waiting; "
            "try again when one finishes",
            retry_after=10, reason="user_limit",
        )  # fmt: skip
    if active.count() >= settings.STENCIL_MAX_QUEUED_JOBS:
        raise AdmissionError("the service is busy; try again shortly", retry_after=30,
                             reason="global_limit")  # fmt: skip
