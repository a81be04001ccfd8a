"""The job pipeline in-process against real PostgreSQL: what a fault leaves behind.

A lost database connection is made real: the worker's own backend is terminated with
``pg_terminate_backend`` from a second connection just before a chosen query, so that query
raises PostgreSQL's OperationalError where the pipeline issued it. A killed worker is a
BaseException raised before a chosen query (nothing of the pipeline catches it, as nothing
runs after a SIGKILL); its claims stay behind until their leases run out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import OperationalError, connection
from django.utils import timezone
from prometheus_client import REGISTRY

from audit.models import RunRecord
from drafting.models import InfillJob
from gpu_worker.claims import job_claim, last_chance
from gpu_worker.engine.config import config_from_overrides
from gpu_worker.pipeline import ABANDONED, REQUEUED, job_run
from gpu_worker.progress import Held
from tests.workers import producer_broker, queues_purge
from tests.workers import test_database_url as database_url

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

REQUEST = {"segments": [{"text": "Dear "}, {"hole": "name", "max_tokens": 6},
                        {"text": ",\nThank you."}]}  # fmt: skip
PROGRESS_WRITE = 'UPDATE "drafting_infilljob" SET "progress"'  # Progress._write's update
CLAIM = 'UPDATE "drafting_infilljob" SET "state"'  # a claim's compare-and-set (and later ends)
WORK_BEGIN = 'UPDATE "drafting_infilljob" SET "delivery_count"'  # claims.work_begin


class Killed(BaseException):
    """The worker process is gone: no except clause of the pipeline sees this."""


@pytest.fixture(autouse=True)
def _postgres_and_a_private_queue(worker_settings: Any, queue_prefix: str) -> Iterator[None]:
    """PostgreSQL only; ids the pipeline sends again go to this test's own queue."""
    if connection.vendor != "postgresql":
        pytest.skip("terminating a backend needs PostgreSQL")
    from stencil.celery import app

    prefix = f"{queue_prefix}pipeline-"
    worker_settings.STENCIL_BATCH_MAX = 8
    if not settings.CELERY_BROKER_URL.startswith(("amqp", "redis")):
        yield
        return
    with producer_broker(app, settings.CELERY_BROKER_URL, prefix):
        yield
    queues_purge(settings.CELERY_BROKER_URL, prefix)


def queued_job(owner: Any, seed: int) -> InfillJob:
    """A queued job as infill_job_create writes it, without sending its id to a broker."""
    config = config_from_overrides("fast", {})
    return InfillJob.objects.create(
        owner=owner, request={**REQUEST, "seed": seed}, config=config.to_dict(),
        config_sha256=config.sha256, seed=seed, preset="fast", dispatched=timezone.now(),
    )  # fmt: skip


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def before_query(marker: str, act: Callable[[], None], *, nth: int = 1) -> Callable[..., Any]:
    """An execute wrapper that runs ``act`` once, before the ``nth`` query starting with
    ``marker``; ``wrapper.fired`` tells whether it did."""
    seen = 0

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool,
                context: Any) -> Any:  # fmt: skip
        nonlocal seen
        if sql.startswith(marker):
            seen += 1
            if seen == nth:
                wrapper.fired = True  # type: ignore[attr-defined]
                act()
        return execute(sql, params, many, context)

    wrapper.fired = False  # type: ignore[attr-defined]
    return wrapper


def terminate_this_backend() -> Callable[[], None]:
    pid = _backend_pid()

    def act() -> None:
        with psycopg.connect(database_url(), autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])

    return act


def kill() -> None:
    raise Killed()


def expire_leases(jobs: list[InfillJob]) -> None:
    InfillJob.objects.filter(pk__in=[j.pk for j in jobs]).update(
        lease_expires=timezone.now() - timedelta(seconds=1)
    )


def fresh(jobs: list[InfillJob]) -> list[InfillJob]:
    for job in jobs:
        job.refresh_from_db()
    return jobs


def test_a_database_error_in_the_batched_first_attempt_gives_every_job_back_to_the_queue(
    user: Any,
) -> None:
    jobs = [queued_job(user, seed) for seed in (1, 2)]
    wrapper = before_query(PROGRESS_WRITE, terminate_this_backend())
    with connection.execute_wrapper(wrapper):
        state = job_run(job_id=str(jobs[0].pk), worker="w-test")
    assert wrapper.fired, "the batch never wrote progress"  # type: ignore[attr-defined]
    assert state == REQUEUED
    for job in fresh(jobs):
        assert job.state == InfillJob.State.QUEUED, job.state
        assert job.lease_expires is None and job.worker == ""
        assert job.dispatched is not None  # its id went to the broker again
        assert job.delivery_count == 0  # the database dropped the session: not the job's doing
    # The next delivery runs both, again as one batch, and each ends once.
    assert job_run(job_id=str(jobs[1].pk), worker="w-test") == InfillJob.State.SUCCEEDED
    for job in fresh(jobs):
        assert job.state == InfillJob.State.SUCCEEDED, job.reasons
        assert job.delivery_count == 1
        assert job.result is not None and job.result["batch_size"] == 2
        assert RunRecord.objects.filter(job_id=str(job.pk)).count() == 1


def test_a_database_error_on_a_live_connection_counts_against_the_cap(user: Any) -> None:
    """A deadlock, a timeout or a limit the job's data reached: the job may be the cause."""
    job = queued_job(user, 1)

    def fail() -> None:
        raise OperationalError("canceling statement due to statement timeout")

    with connection.execute_wrapper(before_query(PROGRESS_WRITE, fail)):
        assert job_run(job_id=str(job.pk), worker="w") == REQUEUED
    job.refresh_from_db()
    assert job.state == InfillJob.State.QUEUED and job.delivery_count == 1


def test_a_database_error_while_claiming_batch_mates_leaves_no_job_running(user: Any) -> None:
    jobs = [queued_job(user, seed) for seed in (1, 2, 3)]
    # the first claim update is the message's job, the second its first mate
    wrapper = before_query(CLAIM, terminate_this_backend(), nth=3)
    with connection.execute_wrapper(wrapper):
        state = job_run(job_id=str(jobs[0].pk), worker="w-test")
    assert wrapper.fired  # type: ignore[attr-defined]
    assert state == REQUEUED
    for job in fresh(jobs):
        assert job.state == InfillJob.State.QUEUED, job.state
        assert job.delivery_count == 0  # no work began: no step closer to the cap


def test_a_kill_before_work_began_costs_no_delivery_and_the_orphans_batch_again(
    user: Any,
) -> None:
    jobs = [queued_job(user, seed) for seed in (1, 2, 3)]
    with connection.execute_wrapper(before_query(WORK_BEGIN, kill)), pytest.raises(Killed):
        job_run(job_id=str(jobs[0].pk), worker="w-dead")
    assert all(j.state == InfillJob.State.RUNNING for j in fresh(jobs))  # claimed, then lost
    expire_leases(jobs)
    assert job_run(job_id=str(jobs[2].pk), worker="w-rescue") == InfillJob.State.SUCCEEDED
    for job in fresh(jobs):
        assert job.state == InfillJob.State.SUCCEEDED, job.reasons
        assert job.worker.startswith("w-rescue")
        assert job.delivery_count == 1  # only the delivery that ran it counts
        assert job.result is not None and job.result["batch_size"] == 3  # reclaimed as a batch


def test_a_kill_during_the_batch_counts_once_against_each_job_it_interrupted(user: Any) -> None:
    jobs = [queued_job(user, seed) for seed in (1, 2)]
    with connection.execute_wrapper(before_query(PROGRESS_WRITE, kill)), pytest.raises(Killed):
        job_run(job_id=str(jobs[0].pk), worker="w-dead")
    assert [j.delivery_count for j in fresh(jobs)] == [1, 1]
    expire_leases(jobs)
    assert job_run(job_id=str(jobs[0].pk), worker="w-rescue") == InfillJob.State.SUCCEEDED
    assert [j.delivery_count for j in fresh(jobs)] == [2, 2]
    assert all(j.state == InfillJob.State.SUCCEEDED for j in jobs)


def test_a_job_on_its_last_delivery_runs_alone(user: Any) -> None:
    suspect, other = queued_job(user, 1), queued_job(user, 2)
    InfillJob.objects.filter(pk=suspect.pk).update(
        state=InfillJob.State.RUNNING, delivery_count=last_chance(),
        lease_expires=timezone.now() - timedelta(seconds=1),
    )  # fmt: skip
    assert job_run(job_id=str(other.pk), worker="w") == InfillJob.State.SUCCEEDED
    suspect.refresh_from_db()
    assert suspect.state == InfillJob.State.RUNNING  # not taken as a mate
    third = queued_job(user, 3)
    assert job_run(job_id=str(suspect.pk), worker="w") == InfillJob.State.SUCCEEDED
    suspect.refresh_from_db()
    third.refresh_from_db()
    assert suspect.result is not None and suspect.result["batch_size"] == 1
    assert third.state == InfillJob.State.QUEUED  # it took no mate either


def test_when_the_end_cannot_be_written_the_job_is_left_to_its_lease(user: Any) -> None:
    job = queued_job(user, 1)
    down = {"on": False}

    def database_down(execute: Callable[..., Any], sql: str, params: Any, many: bool,
                      context: Any) -> Any:  # fmt: skip
        if sql.startswith(PROGRESS_WRITE):
            down["on"] = True
        if down["on"]:
            raise OperationalError("server closed the connection unexpectedly")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(database_down):
        assert job_run(job_id=str(job.pk), worker="w") == ABANDONED
    job.refresh_from_db()
    assert job.state == InfillJob.State.RUNNING and job.lease_expires is not None
    expire_leases([job])
    assert job_run(job_id=str(job.pk), worker="w") == InfillJob.State.SUCCEEDED


def test_held_claims_have_their_leases_renewed_until_dropped(user: Any) -> None:
    jobs = [queued_job(user, seed) for seed in (1, 2)]
    claims = [job_claim(job_id=str(j.pk), worker="w") for j in jobs]
    assert claims[0] is not None and claims[1] is not None
    held = Held(claims[0])
    held.add(claims[1])
    held.drop(claims[1])
    soon = timezone.now() + timedelta(milliseconds=100)
    InfillJob.objects.filter(pk__in=[j.pk for j in jobs]).update(lease_expires=soon)
    held.renew(force=True)
    kept, dropped = fresh(jobs)
    assert kept.lease_expires is not None and kept.lease_expires > soon + timedelta(seconds=1)
    assert dropped.lease_expires == soon


def test_a_batch_charges_its_wall_time_to_the_accelerator_seconds(
    user: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from gpu_worker.progress import Progress

    original = Progress.on_step

    def slow_step(self: Progress, entry: dict[str, Any]) -> None:  # denoising outweighs the rest
        time.sleep(0.05)
        original(self, entry)

    monkeypatch.setattr(Progress, "on_step", slow_step)

    def seconds() -> float:
        value = REGISTRY.get_sample_value("stencil_accelerator_seconds_total",
                                          {"route": "diffusion"})  # fmt: skip
        return value or 0.0

    jobs = [queued_job(user, seed) for seed in (1, 2, 3)]
    before = seconds()
    assert job_run(job_id=str(jobs[0].pk), worker="w") == InfillJob.State.SUCCEEDED
    denoise = sum(float(a["seconds"]) for j in fresh(jobs) for a in j.attempts) / len(jobs)
    assert seconds() - before >= denoise  # the batch's time, shared among its jobs
