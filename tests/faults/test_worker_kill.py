"""A worker killed with SIGKILL in the middle of a batch: nothing lost, nothing applied twice,
nothing stuck, and the orphans are rescued together as a batch.

The doomed worker consumes its own queue; a second worker, sweeping every second, consumes
another: once the dead worker's leases run out, the sweeper sends the orphaned jobs to it and it
claims them as one batch. The poison cap counts a kill only against the jobs whose work it
interrupted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from audit.models import RunRecord
from drafting.models import InfillJob
from stencil.celery import app
from tests.conftest import wait_for
from tests.faults.conftest import SETTLE_S, all_running, draft_job
from tests.faults.ledger import settle
from tests.workers import WorkerProcess, producer_broker

pytestmark = [pytest.mark.services, pytest.mark.faults, pytest.mark.timeout(420),
              pytest.mark.django_db(transaction=True)]  # fmt: skip
BATCH = 8


@pytest.fixture(scope="module")
def rescuer(steady: WorkerProcess) -> WorkerProcess:
    return steady


@pytest.fixture
def doomed(start_worker: Callable[..., WorkerProcess], module_prefix: str,
           amqp_url: str) -> Iterator[Callable[..., WorkerProcess]]:  # fmt: skip
    started: list[WorkerProcess] = []

    def start(**env: str) -> WorkerProcess:
        worker = start_worker(broker_url=amqp_url, queue_prefix=f"{module_prefix}doomed-",
                              name="doomed", extra_env={"DEBUG": "True", **env})  # fmt: skip
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.kill()


def _queue_batch(user: Any, module_prefix: str, amqp_url: str) -> list[InfillJob]:
    with producer_broker(app, amqp_url, f"{module_prefix}doomed-"):
        return [draft_job(user) for _ in range(BATCH)]


def test_a_worker_killed_during_a_batch_loses_and_duplicates_nothing(
    rescuer: WorkerProcess, doomed: Callable[..., WorkerProcess], demo_templates: None,
    user: Any, faults_settings: Any, module_prefix: str, amqp_url: str,
) -> None:  # fmt: skip
    jobs = _queue_batch(user, module_prefix, amqp_url)
    worker = doomed()  # all eight are queued before it starts: it claims them as one batch
    wait_for(lambda: all_running(jobs, step=3, worker="doomed"), timeout=120,
             what="the batch to run", interval=0.05)  # fmt: skip
    killed_at = time.time()
    worker.kill()
    tally = settle([str(j.pk) for j in jobs], deadline_s=SETTLE_S)
    assert tally.clean, (str(tally), rescuer.log()[-3000:])
    recovery = max(t.timestamp() for t in tally.finished.values()) - killed_at
    print(f"\nkill during a batch of {BATCH}: all rescued {recovery:.1f}s after the kill")
    for job in jobs:
        job.refresh_from_db()
        assert job.delivery_count == 2  # the interrupted batch and the rescue
        assert job.worker.startswith("steady")
        assert job.result is not None and job.result["batch_size"] > 1  # rescued as a batch
        assert RunRecord.objects.filter(job_id=str(job.pk)).count() == 1


def test_claims_lost_before_their_work_began_cost_no_delivery(
    rescuer: WorkerProcess, doomed: Callable[..., WorkerProcess], demo_templates: None,
    user: Any, faults_settings: Any, module_prefix: str, amqp_url: str,
) -> None:  # fmt: skip
    jobs = _queue_batch(user, module_prefix, amqp_url)
    # The doomed worker claims all eight, then holds them as a slow model load would.
    worker = doomed(STENCIL_FAULT_INJECTION="stall:120")
    wait_for(lambda: all_running(jobs, worker="doomed"), timeout=120, what="the claims",
             interval=0.05)  # fmt: skip
    worker.kill()
    tally = settle([str(j.pk) for j in jobs], deadline_s=SETTLE_S)
    assert tally.clean, (str(tally), rescuer.log()[-3000:])
    for job in jobs:
        job.refresh_from_db()
        assert job.delivery_count == 1  # only the rescue began its work
        assert job.result is not None and job.result["batch_size"] > 1
