"""A web job on a real diffusion LM's checkpoint: the tiny LLaDA fixture (built with LLaDA's own
code, tests/fixtures/native) served by a real Celery worker whose STENCIL_MODEL_DIR points at it.

The job is posted to the JSON API, claimed by the worker over RabbitMQ, run by the native LLaDA
backend, and read back from the API; its locked text must come back byte-identical and its run
record must name the LLaDA checkpoint and its weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from drafting.auth import api_token_create
from drafting.models import InfillJob
from tests.conftest import wait_for

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

LLADA_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "native" / "llada-tiny"
LOCKED = ["Dear ", ",\nThank you for seeing ", " at the clinic on Monday.\nKind regards,\n"]
CANVAS = {
    "segments": [{"text": LOCKED[0]}, {"hole": "name", "max_tokens": 5}, {"text": LOCKED[1]},
                 {"hole": "who", "max_tokens": 6}, {"text": LOCKED[2]},
                 {"hole": "signature", "max_tokens": 4}],
    "seed": 5,
}  # fmt: skip


@pytest.fixture
def llada_worker(start_worker: Any, queue_prefix: str, settings: Any) -> Any:
    """A worker serving the LLaDA fixture on queues of its own; the web process's producer
    sends there, and its settings name the same model directory."""
    from stencil.celery import app
    from tests.workers import producer_broker, queues_purge

    prefix = f"{queue_prefix}llada-"
    broker = settings.CELERY_BROKER_URL
    queues_purge(broker, prefix)
    settings.STENCIL_MODEL_DIR = LLADA_DIR
    worker = start_worker(broker_url=broker, queue_prefix=prefix, name="llada",
                          extra_env={"STENCIL_MODEL_DIR": str(LLADA_DIR)})  # fmt: skip
    with producer_broker(app, broker, prefix):
        yield worker
    worker.stop()


def _job(client: Client, job_id: str) -> dict[str, Any]:
    response = client.get(f"/api/v1/jobs/{job_id}")
    assert response.status_code == 200
    data: dict[str, Any] = response.json()
    return data


def test_web_job_on_the_llada_checkpoint_keeps_locked_text_and_names_the_model(
    llada_worker: Any, user: Any
) -> None:
    from audit.models import RunRecord
    from gpu_worker.engine.backends import load_backend

    client = Client(HTTP_AUTHORIZATION=f"Token {api_token_create(user=user, name='e2e')[1]}")
    response = client.post("/api/v1/infill", json.dumps({**CANVAS, "preset": "balanced"}),
                           content_type="application/json")  # fmt: skip
    assert response.status_code == 202, response.content
    job_id = response.json()["id"]

    finals = {s.value for s in InfillJob.FINAL_STATES}
    job = wait_for(lambda: (j := _job(client, job_id))["state"] in finals and j,
                   timeout=90, what="the LLaDA job")  # fmt: skip

    assert job["state"] == InfillJob.State.SUCCEEDED, (job["reasons"], llada_worker.log()[-3000:])
    result = job["result"]
    holes = result["holes"]
    assert result["document"] == (LOCKED[0] + holes["name"] + LOCKED[1] + holes["who"]
                                  + LOCKED[2] + holes["signature"])  # fmt: skip
    assert all(holes.values()) and result["violations"] == []
    assert job["route"] == "diffusion"
    records = list(RunRecord.objects.filter(job_id=job_id))
    assert [r.model_name for r in records] == ["llada-tiny"]
    body = json.loads(records[0].body)
    assert body["gen_ai.response.model"] == "llada-tiny"
    assert body["stencil.model"]["dir"] == str(LLADA_DIR)
    assert body["stencil.model"]["weights_sha256"] == load_backend(LLADA_DIR).weights_sha256
    assert body["stencil.outcome_route"] == "diffusion"
