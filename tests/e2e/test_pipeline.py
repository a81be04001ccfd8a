"""The real path: template → draft → job row → RabbitMQ → worker process → sampler → review.

These tests use PostgreSQL, a real broker and real Celery worker processes (no eager mode).
"""

from __future__ import annotations

from typing import Any

import pytest

from drafting import services
from drafting.models import DocumentTemplate, Draft, Fragment, InfillJob
from tests.conftest import wait_for

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

REFERRAL_VALUES = {
    "clinic": "Harbour Family Practice", "letter_date": "2025-03-14", "doctor": "Dr. Patel",
    "patient": "Maria Lopez", "dob": "1961-07-02", "symptom": "chest pain on exertion",
    "sender": "Dr. Ann Hughes",
}  # fmt: skip

# A long job: four long holes, one token per step, exact attention (about 440 passes).
LONG_SAMPLER = {"commit_rule": "even", "block_length": 32, "steps_per_block": 32,
                "max_steps": 4096, "cache": "none", "remask": "none"}  # fmt: skip


def referral_draft(owner: Any) -> Draft:
    version = DocumentTemplate.objects.get(slug="referral-letter").latest_version()
    assert version is not None
    return services.draft_create(owner=owner, version=version, values=REFERRAL_VALUES)


def long_request() -> dict[str, Any]:
    segments: list[dict[str, Any]] = [{"text": "MINUTES OF THE BOARD MEETING\n\n"}]
    for i in range(4):
        segments += [{"text": f"{i + 1}. Discussion. "}, {"hole": f"part{i}", "max_tokens": 110},
                     {"text": "\n\n"}]  # fmt: skip
    return {"segments": segments, "seed": 11, "sampler": LONG_SAMPLER}


def job_state(job: InfillJob) -> str:
    job.refresh_from_db()
    return job.state


def running_past(job: InfillJob, step: int, delivery: int | None = None) -> bool:
    """True once the job runs at ``step`` or later; fails at once if it ended instead."""
    state = job_state(job)
    assert state not in InfillJob.FINAL_STATES, (state, job.reasons)
    return (state == InfillJob.State.RUNNING and job.progress.get("step", 0) >= step
            and (delivery is None or job.delivery_count == delivery))  # fmt: skip


def test_draft_is_filled_by_a_worker_and_locked_text_stays(
    amqp_worker: Any, demo_templates: None, user: Any, worker_settings: Any
) -> None:
    draft = referral_draft(user)
    locked_before = {f.id: f.text for f in draft.fragments.filter(locked=True)}
    job = services.draft_infill_request(draft=draft, user=user, preset="balanced")

    wait_for(lambda: job_state(job) in InfillJob.FINAL_STATES, timeout=60, what="the job")

    assert job.state == InfillJob.State.SUCCEEDED, (job.reasons, amqp_worker.log()[-3000:])
    assert job.delivery_count == 1
    fills = list(draft.fragments.filter(kind=Fragment.Kind.FILL))
    assert fills and all(f.status == Fragment.Status.PROVISIONAL for f in fills)
    assert job.result is not None
    holes = job.result["holes"]
    assert {t["hole"] for t in job.target_fragments} == set(holes)
    for fragment in draft.fragments.filter(locked=True):
        assert fragment.text == locked_before[fragment.id]
    # choices holes hold one of their choices, whole
    by_name = {f.name: f.text for f in fills}
    assert by_name["priority"] in {"routine", "urgent", "two-week wait"}
    # the document the worker assembled is the draft's text
    assert job.result["document"] == "".join(f.text for f in draft.fragments.all())
    assert job.result["placeholder_model"] is True
    from audit.models import RunRecord

    assert RunRecord.objects.filter(job_id=str(job.id)).count() == 1


def test_sigkilled_worker_job_is_redelivered_and_finishes_exactly_once(
    start_worker: Any, user: Any, worker_settings: Any, queue_prefix: str
) -> None:
    from django.conf import settings

    from stencil.celery import app
    from tests.workers import producer_broker

    prefix = f"{queue_prefix}kill-"
    broker = settings.CELERY_BROKER_URL
    first = start_worker(broker_url=broker, queue_prefix=prefix, name="doomed")
    with producer_broker(app, broker, prefix):
        job = services.infill_job_create(owner=user, request=long_request(), preset="careful")
        wait_for(lambda: running_past(job, 5), timeout=60, what="the job to run")
        first.kill()
        second = start_worker(broker_url=broker, queue_prefix=prefix, name="rescuer")
        wait_for(lambda: job_state(job) in InfillJob.FINAL_STATES, timeout=120, what="the rescue")
    assert job.state == InfillJob.State.SUCCEEDED, (job.reasons, second.log()[-3000:])
    assert job.delivery_count == 2
    from audit.models import RunRecord

    assert RunRecord.objects.filter(job_id=str(job.id)).count() == 1
    second.stop()


def test_poison_job_stops_at_the_delivery_cap(
    start_worker: Any, user: Any, worker_settings: Any, queue_prefix: str
) -> None:
    from django.conf import settings

    from stencil.celery import app
    from tests.workers import producer_broker

    prefix = f"{queue_prefix}poison-"
    broker = settings.CELERY_BROKER_URL
    with producer_broker(app, broker, prefix):
        job = services.infill_job_create(owner=user, request=long_request(), preset="careful")
        for delivery in range(1, settings.STENCIL_MAX_DELIVERIES + 1):
            worker = start_worker(broker_url=broker, queue_prefix=prefix, name=f"crash{delivery}")
            wait_for(lambda d=delivery: running_past(job, 2, d), timeout=60,  # type: ignore[misc]
                     what=f"delivery {delivery}")
            worker.kill()  # the job "crashes" its worker every time
        last = start_worker(broker_url=broker, queue_prefix=prefix, name="after-cap")
        wait_for(lambda: job_state(job) in InfillJob.FINAL_STATES, timeout=60, what="the cap")
        last.stop()
    assert job.state == InfillJob.State.FAILED
    assert job.delivery_count == settings.STENCIL_MAX_DELIVERIES
    assert "delivery cap" in " ".join(job.reasons)


def test_cancel_stops_a_running_job_and_commits_nothing(
    amqp_worker: Any, demo_templates: None, user: Any, worker_settings: Any
) -> None:
    draft = referral_draft(user)
    before = [(f.id, f.text, f.status) for f in draft.fragments.all()]
    job = services.infill_job_create(owner=user, request=long_request(), preset="careful",
                                     draft=draft, targets=[])  # fmt: skip
    wait_for(lambda: running_past(job, 3), timeout=60, what="the job to run")
    live = job.progress["holes"]  # the progress row carries text while the job runs
    assert set(live) == {f"part{i}" for i in range(4)}
    assert any(h["provisional"] for h in live.values())
    assert all(h["provisional"].startswith(h["stable"]) for h in live.values())
    services.infill_job_cancel(job=job)
    wait_for(lambda: job_state(job) in InfillJob.FINAL_STATES, timeout=10, what="the cancel")
    assert job.state == InfillJob.State.CANCELLED
    assert job.result is None
    assert [(f.id, f.text, f.status) for f in draft.fragments.all()] == before
    # the sampler stopped long before its ~440 steps
    assert job.attempts[-1]["cancelled"] is True
    assert job.attempts[-1]["steps"] < 400


SHORT_REQUEST = {"segments": [{"text": "Dear "}, {"hole": "name", "max_tokens": 6},
                              {"text": ",\nThank you."}], "seed": 5}  # fmt: skip


def one_job_on_own_worker(start_worker: Any, user: Any, prefix: str, env: dict[str, str],
                          until: Any = None) -> InfillJob:  # fmt: skip
    """Start a worker with ``env`` on its own queues, run SHORT_REQUEST there, stop it."""
    from django.conf import settings

    from stencil.celery import app
    from tests.workers import producer_broker

    worker = start_worker(broker_url=settings.CELERY_BROKER_URL, queue_prefix=prefix,
                          name=prefix.rstrip("-").rsplit("-", 1)[-1], extra_env=env)  # fmt: skip
    with producer_broker(app, worker.broker_url, prefix):
        job = services.infill_job_create(owner=user, request=dict(SHORT_REQUEST), preset="fast")
        wait_for(lambda: job_state(job) in InfillJob.FINAL_STATES and (until is None or until(job)),
                 timeout=120, what="the job")  # fmt: skip
    worker.stop()
    return job


def test_failed_validation_retries_then_falls_back_then_fails_with_named_reasons(
    start_worker: Any, user: Any, worker_settings: Any, queue_prefix: str
) -> None:
    job = one_job_on_own_worker(start_worker, user, f"{queue_prefix}faultsall-",
                                {"STENCIL_FAULT_INJECTION": "violate:diffusion,violate:ar"})
    assert job.state == InfillJob.State.FAILED, job.reasons
    routes = [a["route"] for a in job.attempts]
    assert routes == ["diffusion"] * worker_settings.STENCIL_MAX_ATTEMPTS + ["ar"]
    assert len(job.reasons) == len(routes)
    assert all("fault injection" in reason for reason in job.reasons)
    assert job.reasons[-1].startswith(f"attempt {len(routes)} (ar)")
    seeds = [a["seed"] for a in job.attempts if a["route"] == "diffusion"]
    assert len(set(seeds)) == len(seeds)  # each retry uses a new seed derived from the first
    from audit.models import Incident, RunRecord

    assert RunRecord.objects.filter(job_id=str(job.id)).count() == len(routes)
    kinds = set(Incident.objects.filter(job_id=str(job.id)).values_list("kind", flat=True))
    assert kinds == {"validation_failure", "fallback"}


def test_the_ar_fallback_recovers_a_job_the_denoiser_keeps_failing(
    start_worker: Any, user: Any, worker_settings: Any, queue_prefix: str
) -> None:
    job = one_job_on_own_worker(start_worker, user, f"{queue_prefix}faultsdiff-",
                                {"STENCIL_FAULT_INJECTION": "violate:diffusion"})
    assert job.state == InfillJob.State.SUCCEEDED, job.reasons
    assert job.result is not None and job.result["route"] == "ar"
    assert job.result["document"].startswith("Dear ")
    assert job.result["document"].endswith(",\nThank you.")


def test_shadow_share_runs_the_other_route_for_comparison_only(
    start_worker: Any, user: Any, worker_settings: Any, queue_prefix: str
) -> None:
    job = one_job_on_own_worker(start_worker, user, f"{queue_prefix}shadow-",
                                {"STENCIL_SHADOW_SHARE": "1.0"},
                                until=lambda j: "shadow_result" in j.route_reason)  # fmt: skip
    assert job.state == InfillJob.State.SUCCEEDED and job.route == "diffusion"
    shadow = job.route_reason["shadow_result"]
    assert shadow["route"] == "ar" and isinstance(shadow["same_holes"], bool)
    from audit.models import RunRecord

    routes = set(RunRecord.objects.filter(job_id=str(job.id)).values_list("route", flat=True))
    assert routes == {"diffusion", "shadow-ar"}
    assert [a["route"] for a in job.attempts] == ["diffusion"]  # the shadow is not an attempt


def test_a_worker_batches_compatible_queued_jobs_into_one_denoising_batch(
    start_worker: Any, user: Any, worker_settings: Any, queue_prefix: str
) -> None:
    from django.conf import settings

    from stencil.celery import app
    from tests.workers import producer_broker

    prefix = f"{queue_prefix}batch-"
    with producer_broker(app, settings.CELERY_BROKER_URL, prefix):
        jobs = [services.infill_job_create(owner=user, request={**SHORT_REQUEST, "seed": seed},
                                           preset="fast") for seed in (1, 2, 3)]  # fmt: skip
        worker = start_worker(broker_url=settings.CELERY_BROKER_URL, queue_prefix=prefix,
                              name="batcher")  # all three are queued before it starts
        wait_for(lambda: all(job_state(j) in InfillJob.FINAL_STATES for j in jobs),
                 timeout=120, what="the batch")  # fmt: skip
    worker.stop()
    ids = sorted(str(j.pk) for j in jobs)
    for job in jobs:
        assert job.state == InfillJob.State.SUCCEEDED, job.reasons
        assert job.result is not None and job.result["batch_size"] == 3
        assert job.delivery_count == 1  # claimed once, by the batch; its own message skipped
        assert sorted(job.attempts[0]["batch"]) == ids
    from audit.models import RunRecord
    from audit.services import run_replay

    run = RunRecord.objects.get(job_id=str(jobs[1].pk))
    assert run_replay(run=run).identical  # the batch is re-run as recorded


def test_a_worker_consuming_from_redis_runs_a_job(
    start_worker: Any, user: Any, worker_settings: Any, queue_prefix: str
) -> None:
    import os

    from stencil.celery import app
    from tests.workers import producer_broker

    broker = os.environ.get("STENCIL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    prefix = f"{queue_prefix}redis-"
    worker = start_worker(broker_url=broker, queue_prefix=prefix, name="redis")
    with producer_broker(app, broker, prefix):
        request = {"segments": [{"text": "Dear "}, {"hole": "name", "max_tokens": 6},
                                {"text": ",\nThank you."}], "seed": 5}  # fmt: skip
        job = services.infill_job_create(owner=user, request=request, preset="fast")
        wait_for(lambda: job_state(job) in InfillJob.FINAL_STATES, timeout=60, what="the job")
    worker.stop()
    assert job.state == InfillJob.State.SUCCEEDED, (job.reasons, worker.log()[-3000:])
    assert job.result is not None
    assert job.result["document"].startswith("Dear ")
    assert job.result["document"].endswith(",\nThank you.")
