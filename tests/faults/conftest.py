"""Fixtures of the fault-injection suite: drafts whose jobs take seconds, a broker relay that can
go away, and workers that sweep.

Each module starts its own workers on its own queues and stops them when it ends, so a sweeper
never reaches the jobs of tests that run later.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings

from drafting import services
from drafting.models import InfillJob
from tests.e2e.test_pipeline import referral_draft
from tests.faults.inject import Relay
from tests.workers import WorkerProcess, queues_purge

# About thirty denoising steps for the referral letter's five holes: long enough to be caught
# running, short enough that a batch of eight ends in seconds on a CPU.
SLOW_SAMPLER = {"commit_rule": "even", "block_length": 32, "steps_per_block": 8,
                "max_steps": 64, "cache": "none", "remask": "none"}  # fmt: skip
SWEEPING = {"STENCIL_SWEEP_SECONDS": "1", "STENCIL_SWEEP_GRACE_SECONDS": "1"}
SETTLE_S = 150  # every job final within this, after the last fault


@pytest.fixture
def faults_settings(worker_settings: Any) -> Any:
    worker_settings.STENCIL_MAX_QUEUED_JOBS_PER_USER = 64
    return worker_settings


@pytest.fixture(scope="module")
def module_prefix(queue_prefix: str) -> Iterator[str]:
    """This module's queues; purged when it ends."""
    prefix = f"{queue_prefix}faults-{uuid.uuid4().hex[:6]}-"
    yield prefix
    if settings.CELERY_BROKER_URL.startswith("amqp"):
        for part in ("doomed-", "steady-"):
            queues_purge(settings.CELERY_BROKER_URL, prefix + part)


@pytest.fixture(scope="module")
def amqp_url() -> str:
    broker = settings.CELERY_BROKER_URL
    if not broker.startswith("amqp"):
        pytest.skip("the fault suite runs against RabbitMQ: set CELERY_BROKER_URL=amqp://...")
    return broker


@pytest.fixture(scope="module")
def relay(amqp_url: str) -> Iterator[Relay]:
    """RabbitMQ behind a relay this module can take down and bring back."""
    relay = Relay(amqp_url)
    yield relay
    relay.down()


@pytest.fixture(scope="module")
def steady(start_worker: Callable[..., WorkerProcess], relay: Relay,
           module_prefix: str) -> Iterator[WorkerProcess]:  # fmt: skip
    """A worker that sweeps every second, on the module's ``steady-`` queues, through the relay."""
    worker = start_worker(broker_url=relay.url, queue_prefix=f"{module_prefix}steady-",
                          name="steady", extra_env=SWEEPING)  # fmt: skip
    yield worker
    worker.stop()


def draft_job(owner: Any, *, sampler: dict[str, Any] | None = None) -> InfillJob:
    """A referral draft and its infill job, as the draft's infill endpoint queues it, with
    sampler settings that make it take a few seconds."""
    draft = referral_draft(owner)
    plan = services.draft_canvas_plan(draft=draft)
    request = {**plan.request, "sampler": dict(sampler or SLOW_SAMPLER)}
    return services.infill_job_create(owner=owner, request=request, preset="careful",
                                      draft=draft, targets=plan.targets)  # fmt: skip


def all_running(jobs: list[InfillJob], *, step: int = 0, worker: str | None = None) -> bool:
    rows = list(InfillJob.objects.filter(pk__in=[j.pk for j in jobs]))
    return len(rows) == len(jobs) and all(
        r.state == InfillJob.State.RUNNING and int(r.progress.get("step", 0)) >= step
        and (worker is None or r.worker.startswith(worker))
        for r in rows
    )  # fmt: skip
