"""Real Celery worker processes for tests: started with the test database and a broker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from celery import Celery
from django.conf import settings
from django.db import connection

REPO = Path(__file__).resolve().parent.parent
PLACEHOLDER_MODEL = REPO / "models" / "stencil-placeholder"
READY_TIMEOUT_S = 60


def test_database_url() -> str:
    db = connection.settings_dict
    if db["ENGINE"] != "django.db.backends.postgresql":
        raise RuntimeError(
            "worker tests need PostgreSQL: run them through scripts/test (DATABASE_URL=postgres://...)"
        )
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@dataclass
class WorkerProcess:
    name: str
    broker_url: str
    log_path: Path
    process: subprocess.Popen[bytes]
    env: dict[str, str] = field(repr=False, default_factory=dict)

    def kill(self) -> None:
        """SIGKILL the whole worker (main process and pool children): a crash, not a shutdown."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def worker_env(*, broker_url: str, var_dir: Path, queue_prefix: str,
               extra: dict[str, str] | None = None) -> dict[str, str]:  # fmt: skip
    env = dict(os.environ)
    env.update({
        "DJANGO_SETTINGS_MODULE": "stencil.settings",
        "DATABASE_URL": test_database_url(),
        "CELERY_BROKER_URL": broker_url,
        "STENCIL_QUEUE_PREFIX": queue_prefix,
        "STENCIL_VAR_DIR": str(var_dir),
        "STENCIL_MODEL_DIR": str(settings.STENCIL_MODEL_DIR),
        "STENCIL_AR_MODEL_DIR": str(settings.STENCIL_AR_MODEL_DIR),
        "STENCIL_JOB_LEASE_SECONDS": str(settings.STENCIL_JOB_LEASE_SECONDS),
        "STENCIL_MAX_REQUEST_STEPS": str(settings.STENCIL_MAX_REQUEST_STEPS),
        "STENCIL_MAX_DELIVERIES": str(settings.STENCIL_MAX_DELIVERIES),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
    })  # fmt: skip
    env.update(extra or {})
    return env


def worker_start(*, name: str, broker_url: str, var_dir: Path, queue_prefix: str,
                 log_dir: Path, extra_env: dict[str, str] | None = None,
                 repo: Path = REPO) -> WorkerProcess:  # fmt: skip
    """Start a worker and wait until it is ready; ``repo`` is the checkout whose code it runs."""
    queues = ",".join(f"{queue_prefix}{q}" for q in ("denoise", "ar", "audit"))
    # Node names are unique on the broker: runs of the suite beside this one share RabbitMQ.
    name = f"{name}-{uuid.uuid4().hex[:6]}"
    log_path = log_dir / f"{name}.log"
    env = worker_env(broker_url=broker_url, var_dir=var_dir, queue_prefix=queue_prefix,
                     extra=extra_env)  # fmt: skip
    env["PYTHONPATH"] = str(repo)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "stencil", "worker", "-Q", queues,
             "--concurrency", "1", "--pool", "prefork", "--loglevel", "INFO",
             "--without-gossip", "--without-mingle", "--hostname", f"{name}@%h"],
            cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    worker = WorkerProcess(name=name, broker_url=broker_url, log_path=log_path,
                           process=process, env=env)  # fmt: skip
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if " ready." in worker.log():
            return worker
        if process.poll() is not None:
            raise RuntimeError(f"worker {name} exited at start:\n{worker.log()[-4000:]}")
        time.sleep(0.2)
    worker.kill()
    raise RuntimeError(f"worker {name} was not ready in {READY_TIMEOUT_S}s:\n{worker.log()[-4000:]}")


@contextmanager
def producer_broker(app: Celery, broker_url: str, queue_prefix: str) -> Iterator[None]:
    """Send this process's tasks to ``broker_url`` and prefixed queues while inside."""
    from django.test import override_settings

    # Celery reads CELERY_BROKER_URL from the environment before its own setting; the write
    # URL setting comes first of all, so producers switch through it.
    saved = app.conf.get("broker_write_url")
    _reset_pools(app)
    app.conf["broker_write_url"] = broker_url
    queues = {f"QUEUE_{q.upper()}": f"{queue_prefix}{q}" for q in ("denoise", "ar", "audit")}
    try:
        with override_settings(**queues):
            yield
    finally:
        _reset_pools(app)
        app.conf["broker_write_url"] = saved


def _reset_pools(app: Celery) -> None:
    # Pools are kombu globals keyed by connection: forget ours, close none (others share them).
    app._pool = None  # type: ignore[attr-defined]
    app.amqp._producer_pool = None  # type: ignore[attr-defined]


def queues_purge(broker_url: str, queue_prefix: str) -> None:
    from kombu import Connection

    with Connection(broker_url) as conn:
        channel = conn.channel()
        for q in ("denoise", "ar", "audit"):
            try:
                channel.queue_purge(f"{queue_prefix}{q}")  # type: ignore[attr-defined]
            except Exception:  # the queue does not exist yet
                channel = conn.channel()
