"""Web jobs on real diffusion LMs' checkpoints: the tiny LLaDA and SDAR fixtures (built with each
family's own code, tests/fixtures/native), each served by a real Celery worker whose
STENCIL_MODEL_DIR points at it.

A job is posted to the JSON API, claimed by the worker over RabbitMQ, run by the native backend
and read back from the API: its locked text comes back byte-identical and its run record names
the checkpoint and its weights. SDAR is block diffusion: the job row keeps the preset's
requested cache, the result and the run record say the block KV cache that ran."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from drafting.auth import api_token_create
from drafting.models import InfillJob
from gpu_worker.engine.config import PRESETS
from tests.conftest import wait_for

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

NATIVE = Path(__file__).resolve().parents[1] / "fixtures" / "native"
LOCKED = ["Dear ", ",\nThank you for seeing ", " at the clinic on Monday.\nKind regards,\n"]
CANVAS = {
    "segments": [{"text": LOCKED[0]}, {"hole": "name", "max_tokens": 5}, {"text": LOCKED[1]},
                 {"hole": "who", "max_tokens": 6}, {"text": LOCKED[2]},
                 {"hole": "signature", "max_tokens": 4}],
    "seed": 5,
}  # fmt: skip


@pytest.fixture
def model_worker(start_worker: Any, queue_prefix: str, settings: Any,
                 ) -> Iterator[Callable[[str], Any]]:  # fmt: skip
    """Start a worker serving the fixture ``name`` on queues of its own; the web process's
    producer sends there, and its settings name the same model directory."""
    from contextlib import ExitStack

    from stencil.celery import app
    from tests.workers import producer_broker, queues_purge

    broker, workers = settings.CELERY_BROKER_URL, []
    with ExitStack() as stack:
        def start(name: str) -> Any:
            prefix = f"{queue_prefix}{name}-"
            queues_purge(broker, prefix)
            settings.STENCIL_MODEL_DIR = NATIVE / name
            workers.append(start_worker(broker_url=broker, queue_prefix=prefix, name=name,
                                        extra_env={"STENCIL_MODEL_DIR": str(NATIVE / name)}))  # fmt: skip
            stack.enter_context(producer_broker(app, broker, prefix))
            return workers[-1]

        yield start
    for worker in workers:
        worker.stop()


def run_web_job(worker: Any, user: Any, preset: str) -> tuple[dict[str, Any], Any]:
    """Post CANVAS, wait until the job is final; the job's API answer and its run record."""
    from audit.models import RunRecord

    client = Client(HTTP_AUTHORIZATION=f"Token {api_token_create(user=user, name='e2e')[1]}")
    response = client.post("/api/v1/infill", json.dumps({**CANVAS, "preset": preset}),
                           content_type="application/json")  # fmt: skip
    assert response.status_code == 202, response.content
    job_id = response.json()["id"]
    finals = {s.value for s in InfillJob.FINAL_STATES}

    def final() -> dict[str, Any] | None:
        job: dict[str, Any] = client.get(f"/api/v1/jobs/{job_id}").json()
        return job if job["state"] in finals else None

    job = wait_for(final, timeout=90, what=f"the job on {worker.name}")
    assert job["state"] == InfillJob.State.SUCCEEDED, (job["reasons"], worker.log()[-3000:])
    result = job["result"]
    holes = result["holes"]
    assert result["document"] == (LOCKED[0] + holes["name"] + LOCKED[1] + holes["who"]
                                  + LOCKED[2] + holes["signature"])  # fmt: skip
    assert result["violations"] == [] and job["route"] == "diffusion"
    records = list(RunRecord.objects.filter(job_id=job_id))
    assert len(records) == 1
    return job, records[0]


def assert_names_the_checkpoint(record: Any, name: str) -> dict[str, Any]:
    """The run record names checkpoint ``name`` and its weights; its body."""
    from gpu_worker.engine.backends import load_backend

    assert record.model_name == name
    body: dict[str, Any] = json.loads(record.body)
    assert body["gen_ai.response.model"] == name
    assert body["stencil.model"]["dir"] == str(NATIVE / name)
    assert body["stencil.model"]["weights_sha256"] == load_backend(NATIVE / name).weights_sha256
    assert body["stencil.outcome_route"] == "diffusion"
    return body


def test_web_job_on_the_llada_checkpoint_keeps_locked_text_and_names_the_model(
    model_worker: Callable[[str], Any], user: Any
) -> None:
    job, record = run_web_job(model_worker("llada-tiny"), user, "balanced")
    assert all(job["result"]["holes"].values())
    assert_names_the_checkpoint(record, "llada-tiny")


@pytest.mark.parametrize("preset", ["balanced", "fast"])
def test_web_job_on_the_sdar_checkpoint_runs_the_block_cache_and_says_so(
    model_worker: Callable[[str], Any], user: Any, preset: str
) -> None:
    requested_cache = PRESETS[preset].cache
    assert requested_cache in {"dual", "delayed"}
    job, record = run_web_job(model_worker("sdar-tiny"), user, preset)
    body = assert_names_the_checkpoint(record, "sdar-tiny")
    sampler, result = body["stencil.sampler"], job["result"]
    assert (sampler["config"]["cache"], sampler["config"]["block_scope"],
            sampler["config"]["block_length"]) == ("block", "attention", 4)  # fmt: skip

    # the row says what was requested; the result says what ran, as the run record does
    row = InfillJob.objects.get(pk=job["id"])
    assert row.config["cache"] == requested_cache == job["requested_config"]["cache"]
    assert job["config_sha256"] == row.config_sha256 != result["config_sha256"]
    assert result["config"] == sampler["config"]
    assert result["config_sha256"] == sampler["config_sha256"]
    assert job["written_by"] == "Written by the configured model (sdar-tiny)."
    page = Client()
    page.force_login(user)
    text = page.get(reverse("drafting:job_detail", args=[job["id"]])).content.decode()
    assert f"The config that ran: cache block, {result['config']['max_steps']} steps" in text
    assert f"(requested: cache {requested_cache}," in text
    assert "Written by the configured model (sdar-tiny)." in text
