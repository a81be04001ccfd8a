"""Nothing stuck, nothing lost: the sweeper moves jobs that no message would ever move.

Real PostgreSQL, RabbitMQ and a worker process whose sweep timer runs every second. A broker
outage is a producer pointed at a port nothing listens on; a lost message is a job row put in
the state a failed worker leaves behind, with no message for it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from drafting import services
from drafting.models import InfillJob
from tests.conftest import wait_for
from tests.e2e.test_pipeline import job_state, referral_draft
from tests.workers import WorkerProcess, producer_broker

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]
DEAD_BROKER = "amqp://guest:guest@127.0.0.1:1//"  # nothing listens on port 1
SWEEPING = {"STENCIL_SWEEP_SECONDS": "1", "STENCIL_SWEEP_GRACE_SECONDS": "1"}


@pytest.fixture(scope="module")
def _sweeping(amqp_worker: WorkerProcess, start_worker: Any,
              queue_prefix: str) -> Iterator[WorkerProcess]:  # fmt: skip
    """A second worker on the same queues whose timer sweeps every second, stopped when this
    module ends (its sweeper would otherwise reach the jobs of later tests)."""
    from django.conf import settings

    worker = start_worker(broker_url=settings.CELERY_BROKER_URL, queue_prefix=queue_prefix,
                          name="sweeping", extra_env=SWEEPING)  # fmt: skip
    yield worker
    worker.stop()


@pytest.fixture
def sweeping_worker(_sweeping: WorkerProcess, worker_settings: Any) -> WorkerProcess:
    return _sweeping


def test_a_submission_during_a_broker_outage_answers_202_and_runs_later(
    sweeping_worker: WorkerProcess, demo_templates: None, user: Any, queue_prefix: str
) -> None:
    from stencil.celery import app

    draft = referral_draft(user)
    client = Client()
    client.force_login(user)
    with producer_broker(app, DEAD_BROKER, queue_prefix):
        answer = client.post(f"/api/v1/drafts/{draft.pk}/infill", data=json.dumps({}),
                             content_type="application/json")  # fmt: skip
    assert answer.status_code == 202, answer.content
    job = InfillJob.objects.get(pk=answer.json()["id"])
    assert job.dispatched is None  # the broker never took it; the row waits as the outbox
    wait_for(lambda: job_state(job) in InfillJob.FINAL_STATES, timeout=90, what="the job")
    assert job.state == InfillJob.State.SUCCEEDED, (job.reasons, sweeping_worker.log()[-3000:])
    assert job.dispatched is not None and job.delivery_count == 1
    assert draft.revisions.filter(reason="infill").count() == 1


def test_a_running_job_whose_message_is_gone_is_claimed_again(
    sweeping_worker: WorkerProcess, demo_templates: None, user: Any
) -> None:
    """The state a worker leaves when its database connection dies mid-job after the ack."""
    draft = referral_draft(user)
    job = services.draft_infill_request(draft=draft, user=user, preset="balanced")
    wait_for(lambda: job_state(job) in InfillJob.FINAL_STATES, timeout=90, what="the first run")
    long_ago = timezone.now() - timedelta(minutes=5)
    InfillJob.objects.filter(pk=job.pk).update(
        state=InfillJob.State.RUNNING, lease_expires=long_ago, dispatched=long_ago,
        delivery_count=1, result=None, finished=None,
    )  # fmt: skip
    wait_for(lambda: job_state(job) in InfillJob.FINAL_STATES, timeout=90, what="the reclaim")
    assert job.state == InfillJob.State.SUCCEEDED, (job.reasons, sweeping_worker.log()[-3000:])
    assert job.delivery_count == 2


def test_cancelling_a_job_whose_worker_is_gone_ends_it(
    sweeping_worker: WorkerProcess, demo_templates: None, user: Any
) -> None:
    draft = referral_draft(user)
    job = services.draft_infill_request(draft=draft, user=user, preset="balanced")
    wait_for(lambda: job_state(job) in InfillJob.FINAL_STATES, timeout=90, what="the first run")
    long_ago = timezone.now() - timedelta(minutes=5)
    InfillJob.objects.filter(pk=job.pk).update(
        state=InfillJob.State.RUNNING, lease_expires=long_ago, dispatched=timezone.now(),
        finished=None,
    )  # fmt: skip
    services.infill_job_cancel(job=job)
    wait_for(lambda: job_state(job) == InfillJob.State.CANCELLED, timeout=30, what="the cancel")
    # the draft can be filled again: nothing holds its slot
    again = services.draft_infill_request(draft=draft, user=user, preset="balanced")
    assert again.pk != job.pk
