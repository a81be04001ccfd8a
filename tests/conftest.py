"""Shared fixtures: users, demo templates, and real Celery workers on the test database."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from tests.workers import (
    PLACEHOLDER_MODEL,
    WorkerProcess,
    producer_broker,
    queues_purge,
    worker_start,
)

WORKER_ENV = {
    "STENCIL_JOB_LEASE_SECONDS": "2",  # a killed worker's job is reclaimable quickly
    "STENCIL_MAX_REQUEST_STEPS": "4096",
    "STENCIL_MODEL_DIR": str(PLACEHOLDER_MODEL),  # fast and deterministic
    "STENCIL_SWEEP_SECONDS": "0",  # tests that sweep start a worker that does (test_sweeper)
}


@pytest.fixture
def user(django_user_model: Any) -> Any:
    """A reviewer: owns drafts and may accept them."""
    from drafting.management.commands.load_demo import reviewers_group

    alice = django_user_model.objects.create_user(username="alice", password="pw-alice-123")
    alice.groups.add(reviewers_group())
    return alice


@pytest.fixture
def writer(django_user_model: Any) -> Any:
    """Drafts, but is not a reviewer: cannot accept."""
    return django_user_model.objects.create_user(username="wendy", password="pw-wendy-123")


@pytest.fixture
def other_user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="mallory", password="pw-mallory-123")


@pytest.fixture
def demo_templates(db: Any) -> None:
    from django.core.management import call_command

    with open(os.devnull, "w") as quiet:
        call_command("load_demo", stdout=quiet)


@pytest.fixture(scope="session")
def queue_prefix() -> str:
    return f"t{os.getpid()}-{uuid.uuid4().hex[:6]}-"


@pytest.fixture(scope="session")
def worker_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    configured = os.getenv("STENCIL_TEST_ARTIFACTS")
    path = Path(configured) / "workers" if configured else tmp_path_factory.mktemp("workers")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def start_worker(
    django_db_setup: Any, django_db_blocker: Any, worker_logs: Path
) -> Iterator[Callable[..., WorkerProcess]]:
    """Start real worker processes on the test database; all are stopped at session end."""
    started: list[WorkerProcess] = []

    def start(*, broker_url: str, queue_prefix: str, name: str | None = None,
              extra_env: dict[str, str] | None = None) -> WorkerProcess:  # fmt: skip
        with django_db_blocker.unblock():
            worker = worker_start(
                name=name or f"w{len(started)}", broker_url=broker_url,
                var_dir=settings.VAR_DIR, queue_prefix=queue_prefix, log_dir=worker_logs,
                extra_env={**WORKER_ENV, **(extra_env or {})},
            )  # fmt: skip
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture(scope="session")
def amqp_worker(
    start_worker: Callable[..., WorkerProcess], queue_prefix: str
) -> Iterator[WorkerProcess]:
    """One worker consuming from RabbitMQ for the whole session."""
    from stencil.celery import app

    broker = settings.CELERY_BROKER_URL
    if not broker.startswith("amqp"):
        raise RuntimeError("set CELERY_BROKER_URL=amqp://... (scripts/test does)")
    queues_purge(broker, queue_prefix)
    worker = start_worker(broker_url=broker, queue_prefix=queue_prefix, name="amqp-main")
    with producer_broker(app, broker, queue_prefix):
        yield worker


@pytest.fixture
def worker_settings(settings: Any) -> Any:
    """The test process agrees with the workers on the limits that WORKER_ENV sets."""
    settings.STENCIL_MAX_REQUEST_STEPS = int(WORKER_ENV["STENCIL_MAX_REQUEST_STEPS"])
    settings.STENCIL_JOB_LEASE_SECONDS = int(WORKER_ENV["STENCIL_JOB_LEASE_SECONDS"])
    settings.STENCIL_MODEL_DIR = PLACEHOLDER_MODEL
    return settings


def wait_for(predicate: Callable[[], Any], *, timeout: float, what: str,
             interval: float = 0.1) -> Any:  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
