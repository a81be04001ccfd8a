"""Job claiming, leases, the poison cap, retries' seeds and escalation, admission control."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from drafting import services
from drafting.models import InfillJob
from drafting.router import route_choose
from gpu_worker.claims import JobBusy, job_claim, work_begin
from gpu_worker.pipeline import derive_seed, escalate

REQUEST = {"segments": [{"text": "Dear "}, {"hole": "name", "max_tokens": 6}, {"text": ",\n"}]}


@pytest.fixture
def job(db: Any, user: Any, django_capture_on_commit_callbacks: Any) -> InfillJob:
    # The on-commit dispatch is captured and not executed: these tests run the claim by hand.
    with django_capture_on_commit_callbacks(execute=False):
        return services.infill_job_create(owner=user, request=dict(REQUEST), preset="fast")


def test_first_claim_takes_a_queued_job_and_a_second_delivery_is_busy(job: InfillJob) -> None:
    claim = job_claim(job_id=str(job.id), worker="w1")
    assert claim is not None and claim.token == claim.job.started
    assert claim.job.state == InfillJob.State.RUNNING
    assert claim.job.delivery_count == 0  # counted once its work begins
    with pytest.raises(JobBusy):
        job_claim(job_id=str(job.id), worker="w2")


def test_a_final_job_is_not_claimed_again(job: InfillJob) -> None:
    InfillJob.objects.filter(pk=job.pk).update(state=InfillJob.State.SUCCEEDED)
    assert job_claim(job_id=str(job.id), worker="w1") is None


def test_an_expired_lease_is_reclaimed_with_a_new_token(job: InfillJob) -> None:
    first = job_claim(job_id=str(job.id), worker="w1")
    InfillJob.objects.filter(pk=job.pk).update(lease_expires=timezone.now() - timedelta(seconds=1))
    claim = job_claim(job_id=str(job.id), worker="w2")
    assert first is not None and claim is not None and claim.job.worker == "w2"
    assert claim.token != first.token
    assert not work_begin(first)  # the first worker's writes no longer land
    assert work_begin(claim)


def _lose(job: InfillJob) -> None:
    InfillJob.objects.filter(pk=job.pk).update(lease_expires=timezone.now() - timedelta(seconds=1))


def test_poison_job_fails_with_its_reason_at_the_delivery_cap(job: InfillJob, settings: Any
                                                               ) -> None:  # fmt: skip
    settings.STENCIL_MAX_DELIVERIES = 2
    for _ in range(2):
        claim = job_claim(job_id=str(job.id), worker="w")
        assert claim is not None and work_begin(claim)
        _lose(job)
    assert job_claim(job_id=str(job.id), worker="w") is None
    job.refresh_from_db()
    assert job.state == InfillJob.State.FAILED
    assert "delivery cap 2" in job.reasons[0]


def test_a_delivery_lost_before_its_work_began_does_not_count(job: InfillJob, settings: Any
                                                               ) -> None:  # fmt: skip
    settings.STENCIL_MAX_DELIVERIES = 2
    for _ in range(5):  # claimed and lost five times, its work never begun
        assert job_claim(job_id=str(job.id), worker="w") is not None
        _lose(job)
    claim = job_claim(job_id=str(job.id), worker="w")
    assert claim is not None and claim.job.delivery_count == 0


def test_a_job_cancelled_while_queued_is_never_claimed(job: InfillJob) -> None:
    services.infill_job_cancel(job=job)
    assert job.state == InfillJob.State.CANCELLED
    assert job_claim(job_id=str(job.id), worker="w1") is None


def test_unknown_job_ids_are_dropped(db: Any) -> None:
    assert job_claim(job_id="00000000-0000-0000-0000-000000000000", worker="w") is None


@given(seed=st.integers(min_value=0, max_value=2**31 - 1), attempt=st.integers(1, 20))
def test_retry_seeds_are_derived_deterministically_and_differ_from_the_first(
    seed: int, attempt: int
) -> None:
    assert derive_seed(seed, 0) == seed
    assert derive_seed(seed, attempt) == derive_seed(seed, attempt)
    assert 0 <= derive_seed(seed, attempt) < 2**31


def test_retries_escalate_to_exact_one_token_steps(settings: Any) -> None:
    from gpu_worker.engine.config import PRESETS

    base = PRESETS["fast"].to_dict()
    retry = escalate(base, 1)
    assert (retry["commit_rule"], retry["cache"]) == ("even", "none")
    assert retry["steps_per_block"] == base["block_length"]
    assert retry["max_steps"] == min(settings.STENCIL_MAX_REQUEST_STEPS, base["max_steps"] * 2)
    assert escalate(base, 0) == base


def test_admission_control_refuses_beyond_the_per_user_cap(
    db: Any, user: Any, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    settings.STENCIL_MAX_QUEUED_JOBS_PER_USER = 2
    with django_capture_on_commit_callbacks(execute=False):
        for _ in range(2):
            services.infill_job_create(owner=user, request=dict(REQUEST), preset="fast")
        with pytest.raises(services.AdmissionError) as refused:
            services.infill_job_create(owner=user, request=dict(REQUEST), preset="fast")
    assert refused.value.retry_after > 0
    assert InfillJob.objects.count() == 2


def test_admission_control_refuses_beyond_the_global_cap(
    db: Any, user: Any, other_user: Any, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    settings.STENCIL_MAX_QUEUED_JOBS = 1
    with django_capture_on_commit_callbacks(execute=False):
        services.infill_job_create(owner=user, request=dict(REQUEST), preset="fast")
        with pytest.raises(services.AdmissionError):
            services.infill_job_create(owner=other_user, request=dict(REQUEST), preset="fast")


@pytest.mark.parametrize("bad, message", [
    ({"segments": []}, "non-empty"),
    ({"segments": [{"text": "x"}]}, "no hole"),
    ({"segments": [{"hole": "a", "max_tokens": 0}]}, "max_tokens"),
    ({"segments": [{"hole": "a", "max_tokens": 4, "constraint": {"regex": "x"}}]}, "regex"),
    ({"segments": [{"hole": "a", "max_tokens": 4, "constraint": {"schema": {"type": 7}}}]},
     "JSON Schema"),
    ({"segments": [{"hole": "a", "max_tokens": 4}], "colour": 1}, "colour"),
    ({"segments": [{"hole": "a", "max_tokens": 4}, {"hole": "a", "max_tokens": 4}]}, "unique"),
    ({"segments": [{"hole": "a", "max_tokens": 4}], "seed": -1}, "seed"),
    ({"segments": [{"hole": "a", "max_tokens": 4}], "sampler": {"threshold": 7}}, "threshold"),
])  # fmt: skip
def test_bad_canvas_requests_are_refused_with_a_message_and_nothing_is_queued(
    db: Any, user: Any, bad: dict[str, Any], message: str
) -> None:
    with pytest.raises(services.UserError, match=message):
        services.infill_job_create(owner=user, request=bad, preset="fast")
    assert not InfillJob.objects.exists()


def test_router_follows_the_template_hint_and_defaults_to_diffusion(job: InfillJob) -> None:
    decision = route_choose(job=job)
    assert decision.route == "diffusion"
    assert decision.evidence["holes"] == 1
    assert decision.shadow is None


def _finished_jobs(owner: Any, route: str, seconds: float, state: str, n: int) -> None:
    from datetime import timedelta

    now = timezone.now()
    for _ in range(n):
        InfillJob.objects.create(
            owner=owner, request=dict(REQUEST), config={}, config_sha256="x", seed=1,
            route=route, state=state, started=now - timedelta(seconds=seconds), finished=now,
        )  # fmt: skip


def test_router_moves_traffic_to_ar_when_diffusion_keeps_failing(job: InfillJob) -> None:
    from drafting.router import RECENT_MIN_JOBS

    _finished_jobs(job.owner, "diffusion", 1.0, InfillJob.State.FAILED, RECENT_MIN_JOBS)
    decision = route_choose(job=job)
    assert decision.route == "ar" and "succeeded in only 0%" in decision.reason


def test_router_prefers_ar_when_diffusion_is_much_slower_at_no_better_success(
    job: InfillJob,
) -> None:
    from drafting.router import RECENT_MIN_JOBS

    _finished_jobs(job.owner, "diffusion", 3.0, InfillJob.State.SUCCEEDED, RECENT_MIN_JOBS)
    _finished_jobs(job.owner, "ar", 1.0, InfillJob.State.SUCCEEDED, RECENT_MIN_JOBS)
    decision = route_choose(job=job)
    assert decision.route == "ar" and "took 3.00s" in decision.reason
    assert decision.evidence["recent_ar"]["jobs"] == RECENT_MIN_JOBS


def test_router_sends_a_shadow_share_to_the_other_route(job: InfillJob, settings: Any) -> None:
    import random

    settings.STENCIL_SHADOW_SHARE = 1.0
    assert route_choose(job=job, rng=random.Random(0)).shadow == "ar"
    settings.STENCIL_SHADOW_SHARE = 0.0
    assert route_choose(job=job, rng=random.Random(0)).shadow is None
