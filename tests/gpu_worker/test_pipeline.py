"""The job pipeline in-process against real PostgreSQL: what a database error leaves behind.

A lost database connection is made real: the worker's own backend is terminated with
``pg_terminate_backend`` from a second connection just before a progress write, so that write
raises PostgreSQL's OperationalError inside the sampler's step hook.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from django.db import connection

from drafting.models import InfillJob
from gpu_worker.engine.config import config_from_overrides
from gpu_worker.pipeline import job_run
from tests.workers import test_database_url as database_url

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

REQUEST = {"segments": [{"text": "Dear "}, {"hole": "name", "max_tokens": 6},
                        {"text": ",\nThank you."}]}  # fmt: skip
PROGRESS_WRITE = 'UPDATE "drafting_infilljob" SET "progress"'  # _Progress._write's update


def queued_job(owner: Any, seed: int) -> InfillJob:
    """A queued job as infill_job_create writes it, without sending its id to a broker."""
    config = config_from_overrides("fast", {})
    return InfillJob.objects.create(
        owner=owner, request={**REQUEST, "seed": seed}, config=config.to_dict(),
        config_sha256=config.sha256, seed=seed, preset="fast",
    )  # fmt: skip


def terminating_backend_before(marker: str) -> tuple[Callable[..., Any], list[int]]:
    """An execute wrapper that terminates this connection's backend before the first query
    starting with ``marker`` runs; the list it returns holds the terminated backend's pid."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = int(cursor.fetchone()[0])
    terminated: list[int] = []

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool,
                context: Any) -> Any:  # fmt: skip
        if not terminated and sql.startswith(marker):
            with psycopg.connect(database_url(), autocommit=True) as other:
                other.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])
            terminated.append(pid)
        return execute(sql, params, many, context)

    return wrapper, terminated


def test_a_database_error_in_the_batched_first_attempt_fails_every_job_of_the_batch(
    user: Any, worker_settings: Any
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("terminating a backend needs PostgreSQL")
    worker_settings.STENCIL_BATCH_MAX = 8
    jobs = [queued_job(user, seed) for seed in (1, 2)]
    wrapper, terminated = terminating_backend_before(PROGRESS_WRITE)
    with connection.execute_wrapper(wrapper):
        state = job_run(job_id=str(jobs[0].pk), worker="w-test")
    assert terminated, "the batch never wrote progress"
    assert state == InfillJob.State.FAILED
    for job in jobs:
        job.refresh_from_db()
        assert job.state == InfillJob.State.FAILED, job.state
        assert job.lease_expires is None and job.finished is not None
        assert job.delivery_count == 1  # both were claimed by the one batch
        assert len(job.reasons) == 1 and "OperationalError" in job.reasons[0], job.reasons
