"""A real Celery worker on the ``train`` queue, killed mid-training: the run ends failed with
its last checkpoint, and no model version is registered."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from django.test import Client

from corpora import services
from corpora.models import ModelVersion, TrainingRun
from research.finetune_job import run_paths
from tests.conftest import wait_for
from tests.workers import PLACEHOLDER_MODEL, REPO, WorkerProcess, producer_broker, worker_env

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
LEASE_SECONDS = 3


def _train_worker(*, broker: str, prefix: str, tmp: Path, settings: Any) -> WorkerProcess:
    env = worker_env(broker_url=broker, var_dir=settings.VAR_DIR, queue_prefix=prefix, extra={
        "STENCIL_MODEL_DIR": str(PLACEHOLDER_MODEL), "STENCIL_TRAIN_DIR": str(tmp / "train"),
        "STENCIL_MODEL_VERSIONS_DIR": str(tmp / "versions"),
        "STENCIL_TRAIN_LEASE_SECONDS": str(LEASE_SECONDS)})  # fmt: skip
    log_path = tmp / "train-worker.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "stencil", "worker", "-Q", f"{prefix}train",
             "--concurrency", "1", "--pool", "prefork", "--loglevel", "INFO", "--without-gossip",
             "--without-mingle", "--hostname", f"train-{os.getpid()}@%h"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    worker = WorkerProcess(name="train", broker_url=broker, log_path=log_path, process=process, env=env)
    wait_for(lambda: " ready." in worker.log() or process.poll() is not None, timeout=60,
             what="the train worker to start")  # fmt: skip
    assert process.poll() is None, worker.log()[-3000:]
    return worker


def test_a_killed_worker_leaves_a_failed_run_and_no_version(
    settings: Any, tmp_path: Path, django_user_model: Any, queue_prefix: str
) -> None:
    from stencil.celery import app

    broker = settings.CELERY_BROKER_URL
    if not broker.startswith(("redis", "amqp")):
        pytest.skip("needs CELERY_BROKER_URL=redis://... or amqp://...")
    settings.STENCIL_MODEL_DIR = PLACEHOLDER_MODEL
    settings.STENCIL_TRAIN_DIR = tmp_path / "train"
    settings.STENCIL_MODEL_VERSIONS_DIR = tmp_path / "versions"
    settings.STENCIL_TRAIN_LEASE_SECONDS = LEASE_SECONDS
    settings.QUEUE_TRAIN = f"{queue_prefix}train"
    staff = django_user_model.objects.create_user(username="sam", password="pw", is_staff=True)
    corpus = services.corpus_create(owner=staff, name="Renewals")
    files = [(f"l{n}.txt", f"Dear Ms Ode,\n\nYour tenancy at {n} Elm Row renews soon.".encode())
             for n in range(1, 7)]  # fmt: skip
    services.corpus_import(corpus=corpus, user=staff, files=files)
    corpus.refresh_from_db()
    worker = _train_worker(broker=broker, prefix=queue_prefix, tmp=tmp_path, settings=settings)
    try:
        with producer_broker(app, broker, queue_prefix):
            run = services.training_run_start(
                corpus=corpus, user=staff, config={"minutes": 30, "threads": 1})
        checkpoint = run_paths(run)[0]

        def trained_past_a_checkpoint() -> bool:
            run.refresh_from_db()
            return run.checkpoint != "" and run.progress.get("step", 0) > 30

        wait_for(trained_past_a_checkpoint, timeout=120, what="a checkpoint", interval=0.5)
        assert run.state == TrainingRun.State.RUNNING
        worker.kill()  # SIGKILL, the whole process group: a crash, not a shutdown
    finally:
        worker.kill()
    time.sleep(LEASE_SECONDS + 1)
    client = Client()
    client.force_login(staff)
    page = client.get(f"/corpora/runs/{run.id}/")
    run.refresh_from_db()
    assert run.state == TrainingRun.State.FAILED, worker.log()[-3000:]
    assert "the worker stopped" in run.error and b"the worker stopped" in page.content
    assert torch.load(checkpoint, weights_only=False)["state"]["step"] >= 25
    assert not ModelVersion.objects.filter(state=ModelVersion.State.REGISTERED).exists()
    assert run.model_version is None and not run_paths(run)[1].exists()
