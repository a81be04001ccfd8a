"""A web job on a block-diffusion checkpoint: the tiny SDAR fixture (built with SDAR's own code,
tests/fixtures/native) served by a real Celery worker whose STENCIL_MODEL_DIR points at it.

The jobs are posted to the JSON API, claimed by the worker over RabbitMQ, run by the native SDAR
backend and read back from the API and the job page. The locked text must come back
byte-identical; the run record must name the SDAR checkpoint and say its sampler ran the block
cache. The row keeps the config the web process froze from the preset ("dual", "delayed"); the
result carries the config that ran, and the API and the page tell the two apart."""

from __future__ import annotations

import json
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

SDAR_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "native" / "sdar-tiny"
LOCKED = ["Dear ", ",\nThank you for seeing ", " at the clinic on Monday.\nKind regards,\n"]
CANVAS = {
    "segments": [{"text": LOCKED[0]}, {"hole": "name", "max_tokens": 5}, {"text": LOCKED[1]},
                 {"hole": "who", "max_tokens": 6}, {"text": LOCKED[2]},
                 {"hole": "signature", "max_tokens": 4}],
    "seed": 5,
}  # fmt: skip


@pytest.fixture
def sdar_worker(start_worker: Any, queue_prefix: str, settings: Any) -> Any:
    """A worker serving the SDAR fixture on queues of its own; the web process's producer
    sends there, and its settings name the same model directory."""
    from stencil.celery import app
    from tests.workers import producer_broker, queues_purge

    prefix = f"{queue_prefix}sdar-"
    broker = settings.CELERY_BROKER_URL
    queues_purge(broker, prefix)
    settings.STENCIL_MODEL_DIR = SDAR_DIR
    worker = start_worker(broker_url=broker, queue_prefix=prefix, name="sdar",
                          extra_env={"STENCIL_MODEL_DIR": str(SDAR_DIR)})  # fmt: skip
    with producer_broker(app, broker, prefix):
        yield worker
    worker.stop()


def _job(client: Client, job_id: str) -> dict[str, Any]:
    response = client.get(f"/api/v1/jobs/{job_id}")
    assert response.status_code == 200
    data: dict[str, Any] = response.json()
    return data


@pytest.mark.parametrize("preset", ["balanced", "fast"])
def test_web_job_on_the_sdar_checkpoint_runs_the_block_cache_and_says_so(
    sdar_worker: Any, user: Any, preset: str
) -> None:
    from audit.models import RunRecord
    from gpu_worker.engine.backends import load_backend

    requested_cache = PRESETS[preset].cache
    assert requested_cache in {"dual", "delayed"}
    client = Client(HTTP_AUTHORIZATION=f"Token {api_token_create(user=user, name='e2e')[1]}")
    response = client.post("/api/v1/infill", json.dumps({**CANVAS, "preset": preset}),
                           content_type="application/json")  # fmt: skip
    assert response.status_code == 202, response.content
    job_id = response.json()["id"]

    finals = {s.value for s in InfillJob.FINAL_STATES}
    job = wait_for(lambda: (j := _job(client, job_id))["state"] in finals and j,
                   timeout=90, what="the SDAR job")  # fmt: skip

    assert job["state"] == InfillJob.State.SUCCEEDED, (job["reasons"], sdar_worker.log()[-3000:])
    result = job["result"]
    holes = result["holes"]
    assert result["document"] == (LOCKED[0] + holes["name"] + LOCKED[1] + holes["who"]
                                  + LOCKED[2] + holes["signature"])  # fmt: skip
    assert result["violations"] == [] and job["route"] == "diffusion"

    records = list(RunRecord.objects.filter(job_id=job_id))
    assert [r.model_name for r in records] == ["sdar-tiny"]
    body = json.loads(records[0].body)
    assert body["gen_ai.response.model"] == "sdar-tiny"
    assert body["stencil.model"]["dir"] == str(SDAR_DIR)
    assert body["stencil.model"]["weights_sha256"] == load_backend(SDAR_DIR).weights_sha256
    sampler = body["stencil.sampler"]
    assert (sampler["config"]["cache"], sampler["config"]["block_scope"],
            sampler["config"]["block_length"]) == ("block", "attention", 4)  # fmt: skip

    # the row says what was requested; the result says what ran, as the run record does
    row = InfillJob.objects.get(pk=job_id)
    assert row.config["cache"] == requested_cache == job["requested_config"]["cache"]
    assert job["config_sha256"] == row.config_sha256 != result["config_sha256"]
    assert result["config"] == sampler["config"]
    assert result["config_sha256"] == sampler["config_sha256"]
    assert job["written_by"] == "Written by the configured model (sdar-tiny)."
    page = Client()
    page.force_login(user)
    text = page.get(reverse("drafting:job_detail", args=[job_id])).content.decode()
    assert f"The config that ran: cache block, {result['config']['max_steps']} steps" in text
    assert f"(requested: cache {requested_cache}," in text
    assert "Written by the configured model (sdar-tiny)." in text
