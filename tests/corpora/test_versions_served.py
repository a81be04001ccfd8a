"""Promoted model versions served by a real worker: no restart, named in run records, replayed.

One Celery worker process (RabbitMQ, PostgreSQL) runs every job here. The versions are copies
of the configured model with weights of their own (their own sha256), chained by parent:
configured -> base -> tuned.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from django.test import Client
from django.urls import reverse

from audit.models import RunRecord
from audit.replay import ReplayError
from audit.services import run_replay
from corpora import services as corpora_services
from corpora.models import ModelVersion
from drafting import services
from drafting.auth import api_token_create
from drafting.models import DocumentTemplate, InfillJob
from gpu_worker.engine.loaded import file_sha256
from tests.conftest import wait_for
from tests.e2e.test_pipeline import job_state, referral_draft
from tests.model_versions import version_directory
from tests.workers import PLACEHOLDER_MODEL

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

API_REQUEST = {"segments": [{"text": "Dear "}, {"hole": "name", "max_tokens": 6},
                            {"text": ",\nThank you for your letter."}], "seed": 5}  # fmt: skip


@pytest.fixture
def chain(tmp_path: Path, worker_settings: Any) -> dict[str, ModelVersion]:
    """The configured model's row, a base version on it and a tuned version on the base."""
    configured = corpora_services.model_version_for_directory(directory=PLACEHOLDER_MODEL)
    rows = {"configured": configured}
    parent = configured
    for name, nudge in (("base", 0.01), ("tuned", 0.02)):
        sha = version_directory(PLACEHOLDER_MODEL, tmp_path / name, nudge=nudge)
        rows[name] = ModelVersion.objects.create(
            name=name, directory=str(tmp_path / name), weights_sha256=sha, parent=parent,
            tokenizer_sha256=file_sha256(tmp_path / name / "tokenizer.json"),
            state=ModelVersion.State.REGISTERED,
        )  # fmt: skip
        parent = rows[name]
    return rows


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Replays here run on one CPU thread, as the worker does (OMP_NUM_THREADS=1)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def finished(job: InfillJob, worker: Any) -> InfillJob:
    wait_for(lambda: job_state(job) in InfillJob.FINAL_STATES, timeout=90, what="the job")
    assert job.state == InfillJob.State.SUCCEEDED, (job.reasons, worker.log()[-3000:])
    return job


def ran_with(job: InfillJob) -> tuple[RunRecord, dict[str, Any]]:
    run = RunRecord.objects.get(job_id=str(job.pk), attempt=0, route="diffusion")
    body = json.loads(run.body)
    return run, body


def page_text(job: InfillJob, user: Any) -> str:
    """The job page as its owner sees it."""
    client = Client()
    client.force_login(user)
    response = client.get(reverse("drafting:job_detail", args=[job.pk]))
    assert response.status_code == 200
    return response.content.decode()


def api_answer(job: InfillJob, user: Any) -> dict[str, Any]:
    client = Client(HTTP_AUTHORIZATION=f"Token {api_token_create(user=user, name='v')[1]}")
    response = client.get(reverse("api:job_detail", args=[job.pk]))
    assert response.status_code == 200
    data: dict[str, Any] = response.json()
    return data


def test_a_promotion_and_a_rollback_take_effect_on_a_running_worker(
    amqp_worker: Any, demo_templates: None, user: Any, staff: Any,
    chain: dict[str, ModelVersion], one_thread: None,
) -> None:  # fmt: skip
    referral = DocumentTemplate.objects.get(slug="referral-letter")
    pid = amqp_worker.process.pid

    before = finished(services.draft_infill_request(draft=referral_draft(user), user=user,
                                                    preset="fast"), amqp_worker)  # fmt: skip
    run_before, body = ran_with(before)
    assert body["stencil.model_version"] == {
        "id": chain["configured"].pk, "name": chain["configured"].name, "scope": "configured",
        "weights_sha256": chain["configured"].weights_sha256,
    }  # fmt: skip
    assert f"Written by the configured model ({chain['configured'].name})." in page_text(
        before, user)

    corpora_services.model_version_promote(version=chain["base"], user=staff)  # the default
    corpora_services.model_version_promote(version=chain["tuned"], user=staff, templates=[referral])
    tuned_job = finished(services.draft_infill_request(draft=referral_draft(user), user=user,
                                                       preset="fast"), amqp_worker)  # fmt: skip
    api_job = finished(services.infill_job_create(owner=user, request=API_REQUEST, preset="fast"),
                       amqp_worker)  # fmt: skip
    run_tuned, body = ran_with(tuned_job)
    assert body["stencil.model_version"] == {
        "id": chain["tuned"].pk, "name": "tuned", "scope": "template:referral-letter",
        "weights_sha256": chain["tuned"].weights_sha256,
    }  # fmt: skip
    # the job's result, its page and its API answer name the version the run record names
    tuned_job.refresh_from_db()
    assert (tuned_job.result or {}).get("model_version") == body["stencil.model_version"]
    assert "Written by model version tuned (promoted for this template)." in page_text(
        tuned_job, user)
    answer = api_answer(tuned_job, user)
    assert answer["result"]["model_version"] == body["stencil.model_version"]
    assert answer["written_by"] == "Written by model version tuned (promoted for this template)."
    assert body["stencil.model"]["dir"] == chain["tuned"].directory
    assert body["stencil.model"]["weights_sha256"] == chain["tuned"].weights_sha256
    _, body = ran_with(api_job)  # a job without a template runs the default
    assert (body["stencil.model_version"]["id"], body["stencil.model_version"]["scope"]) == (
        chain["base"].pk, "default")  # fmt: skip
    assert "Written by model version base (promoted as the default)." in page_text(api_job, user)

    corpora_services.promotion_roll_back(user=staff, template=referral)
    after = finished(services.draft_infill_request(draft=referral_draft(user), user=user,
                                                   preset="fast"), amqp_worker)  # fmt: skip
    _, body = ran_with(after)
    assert body["stencil.model_version"]["id"] == chain["tuned"].parent_id == chain["base"].pk
    assert body["stencil.model"]["weights_sha256"] == chain["base"].weights_sha256

    # one worker process did all of it: no restart
    assert amqp_worker.process.poll() is None and amqp_worker.process.pid == pid
    assert len({j.worker for j in (before, tuned_job, api_job, after)}) == 1

    # replay uses the version each run recorded, bit-exact, the old run's included
    for run in (run_before, run_tuned):
        report = run_replay(run=run)
        assert report.identical and report.divergence is None, report.summary
        assert all(r.startswith(("git_revision", "stencil ")) for r in report.approximate_reasons)
    assert "model version tuned" in run_replay(run=run_tuned).model

    shutil.rmtree(chain["tuned"].directory)  # the tuned weights are gone
    with pytest.raises(ReplayError, match=r"weights of model version tuned \(id \d+.*are gone"):
        run_replay(run=run_tuned)


def test_a_promoted_version_whose_weights_are_gone_fails_the_job_and_says_why(
    amqp_worker: Any, demo_templates: None, user: Any, staff: Any,
    chain: dict[str, ModelVersion],
) -> None:  # fmt: skip
    referral = DocumentTemplate.objects.get(slug="referral-letter")
    corpora_services.model_version_promote(version=chain["tuned"], user=staff, templates=[referral])
    (Path(chain["tuned"].directory) / "model.safetensors").unlink()
    job = services.draft_infill_request(draft=referral_draft(user), user=user, preset="fast")
    wait_for(lambda: job_state(job) in InfillJob.FINAL_STATES, timeout=90, what="the job")
    assert job.state == InfillJob.State.FAILED
    (reason,) = job.reasons
    assert f"model version tuned (id {chain['tuned'].pk}, template:referral-letter)" in reason
    assert "weights are gone" in reason
    assert not RunRecord.objects.filter(job_id=str(job.pk)).exists()  # nothing else ran it


def test_altered_weights_fail_the_job(
    amqp_worker: Any, demo_templates: None, user: Any, staff: Any,
    chain: dict[str, ModelVersion],
) -> None:  # fmt: skip
    corpora_services.model_version_promote(version=chain["tuned"], user=staff)
    shutil.copy(Path(chain["base"].directory) / "model.safetensors",
                Path(chain["tuned"].directory) / "model.safetensors")  # fmt: skip
    job = services.infill_job_create(owner=user, request=API_REQUEST, preset="fast")
    wait_for(lambda: job_state(job) in InfillJob.FINAL_STATES, timeout=90, what="the job")
    assert job.state == InfillJob.State.FAILED
    assert "were altered" in job.reasons[0] and "(id" in job.reasons[0]


def test_jobs_on_different_versions_are_not_denoised_in_one_batch(
    demo_templates: None, user: Any, staff: Any, chain: dict[str, ModelVersion],
    queue_prefix: str,
) -> None:  # fmt: skip
    """In-process: three queued jobs of one sampler config, two of them on a template's
    version; the worker batches the two and runs the third alone on the default."""
    from django.conf import settings

    from gpu_worker.pipeline import job_run
    from stencil.celery import app
    from tests.workers import producer_broker, queues_purge

    referral = DocumentTemplate.objects.get(slug="referral-letter")
    corpora_services.model_version_promote(version=chain["base"], user=staff)
    corpora_services.model_version_promote(version=chain["tuned"], user=staff, templates=[referral])
    prefix = f"{queue_prefix}versions-batch-"  # no worker consumes it: this test runs the jobs
    with producer_broker(app, settings.CELERY_BROKER_URL, prefix):
        jobs = [services.draft_infill_request(draft=referral_draft(user), user=user, preset="fast")
                for _ in range(2)]  # fmt: skip
        jobs.append(services.infill_job_create(owner=user, request=API_REQUEST, preset="fast"))
    queues_purge(settings.CELERY_BROKER_URL, prefix)
    assert len({j.config_sha256 for j in jobs}) == 1  # all three could batch together
    assert job_run(job_id=str(jobs[0].pk), worker="w-in-process") == InfillJob.State.SUCCEEDED
    bodies = [ran_with(j)[1] for j in jobs]
    assert [job_state(j) for j in jobs] == [InfillJob.State.SUCCEEDED] * 3
    assert [b["stencil.model_version"]["id"] for b in bodies] == [
        chain["tuned"].pk, chain["tuned"].pk, chain["base"].pk]  # fmt: skip
    assert [b["stencil.batch"]["size"] for b in bodies] == [2, 2, 1]
