"""The database drops every connection while a batch runs, twice: each job is given back to the
queue, runs again and ends once; nothing is left running with nobody moving it.

The fault is PostgreSQL's own: ``pg_terminate_backend`` on every session of the test database
but the test's, as a failover or a server restart does to a worker's connections.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from drafting.models import InfillJob
from stencil.celery import app
from tests.conftest import wait_for
from tests.faults.conftest import SETTLE_S, SLOW_SAMPLER, all_running, draft_job
from tests.faults.inject import Relay, terminate_other_backends
from tests.faults.ledger import settle
from tests.workers import WorkerProcess, producer_broker

pytestmark = [pytest.mark.services, pytest.mark.faults, pytest.mark.timeout(300),
              pytest.mark.django_db(transaction=True)]  # fmt: skip
JOBS = 6
# ~90 steps a job: a batch still runs when the poll below looks, however fast the machine
LONG_SAMPLER = {**SLOW_SAMPLER, "steps_per_block": 32, "max_steps": 256}


def _rerunning(jobs: list[InfillJob], worker: WorkerProcess) -> bool:
    """Some job runs again after the first termination gave it back."""
    return "giving it back to the queue" in worker.log() and InfillJob.objects.filter(
        pk__in=[j.pk for j in jobs], state=InfillJob.State.RUNNING, progress__step__gte=2
    ).exists()


def test_database_connections_terminated_during_work_leave_every_job_final_once(
    steady: WorkerProcess, relay: Relay, demo_templates: None, user: Any,
    faults_settings: Any, module_prefix: str,
) -> None:  # fmt: skip
    with producer_broker(app, relay.url, f"{module_prefix}steady-"):
        jobs = [draft_job(user, sampler=LONG_SAMPLER) for _ in range(JOBS)]
        wait_for(lambda: all_running(jobs[:1], step=3), timeout=120, what="work to begin",
                 interval=0.05)  # fmt: skip
        terminated = [terminate_other_backends()]
        wait_for(lambda: _rerunning(jobs, steady), timeout=60, what="a job to run again",
                 interval=0.05)  # fmt: skip
        time.sleep(0.2)
        terminated.append(terminate_other_backends())
        tally = settle([str(j.pk) for j in jobs], deadline_s=SETTLE_S)
    assert all(n >= 1 for n in terminated), terminated
    assert tally.clean, (str(tally), steady.log()[-4000:])
    assert steady.log().count("giving it back to the queue") >= 2  # they hit work in progress
    counts = {j.delivery_count for j in InfillJob.objects.filter(pk__in=[j.pk for j in jobs])}
    assert counts == {1}  # a session the database dropped is not counted against the job
