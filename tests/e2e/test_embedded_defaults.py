"""With no DATABASE_URL and no CELERY_BROKER_URL: SQLite and the filesystem transport, with the
web side and a worker in separate processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.workers import PLACEHOLDER_MODEL, REPO

pytestmark = pytest.mark.services

SUBMIT = """
import json, sys
from django.contrib.auth.models import User
from drafting import services
from drafting.models import DocumentTemplate
user = User.objects.get(username="demo")
version = DocumentTemplate.objects.get(slug="invoice").latest_version()
draft = services.draft_create(owner=user, version=version, values={
    "invoice_no": "INV-00042", "supplier": "Acme Ltd", "customer": "Globex plc",
    "invoice_date": "30 June 2025", "due_date": "30 July 2025", "services": "Consulting, 10 hours", "total": "$1,250.00"})
job = services.draft_infill_request(draft=draft, user=user, preset="fast")
print(json.dumps({"job": str(job.id)}))
"""

STATE = """
import json
from drafting.models import InfillJob
job = InfillJob.objects.get(pk="{job}")
print(json.dumps({{"state": job.state, "reasons": job.reasons, "result": job.result}}))
"""


def _env(var_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in {"DATABASE_URL", "CELERY_BROKER_URL", "STENCIL_QUEUE_PREFIX"}}  # fmt: skip
    env.update({"STENCIL_VAR_DIR": str(var_dir), "STENCIL_MODEL_DIR": str(PLACEHOLDER_MODEL),
                "DJANGO_SETTINGS_MODULE": "stencil.settings", "PYTHONUNBUFFERED": "1"})  # fmt: skip
    return env


def _manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_embedded_defaults_run_a_job_through_a_separate_worker_process(tmp_path: Path) -> None:
    env = _env(tmp_path)
    _manage(env, "migrate", "--noinput")
    _manage(env, "load_demo")
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "stencil", "worker", "-Q", "denoise,ar,audit",
         "--concurrency", "1", "--pool", "solo", "--loglevel", "INFO"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        job_id = json.loads(_manage(env, "shell", "-c", SUBMIT).strip().splitlines()[-1])["job"]
        state: dict[str, object] = {}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            state = json.loads(_manage(env, "shell", "-c", STATE.format(job=job_id)).splitlines()[-1])
            if state["state"] in {"succeeded", "failed", "cancelled"}:
                break
            time.sleep(1)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    assert (tmp_path / "stencil.sqlite3").exists()
    assert list((tmp_path / "broker").iterdir()), "the filesystem transport was not used"
    assert state["state"] == "succeeded", (state, (tmp_path / "worker.log").read_text()[-3000:])
    result = state["result"]
    assert isinstance(result, dict) and "Please quote INV-00042 with your payment to" in str(
        result["document"]
    )
