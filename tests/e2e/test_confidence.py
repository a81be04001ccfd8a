"""A job through a real Celery worker stores a confidence for every hole it filled."""

from __future__ import annotations

from typing import Any

import pytest

from drafting import services
from drafting.models import InfillJob
from tests.conftest import wait_for
from tests.e2e.test_pipeline import job_state, referral_draft

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


def test_a_worker_stores_a_confidence_for_every_hole(
    amqp_worker: Any, demo_templates: None, user: Any, worker_settings: Any
) -> None:
    draft = referral_draft(user)
    job = services.draft_infill_request(draft=draft, user=user, preset="balanced")

    wait_for(lambda: job_state(job) in InfillJob.FINAL_STATES, timeout=60, what="the job")

    assert job.state == InfillJob.State.SUCCEEDED, (job.reasons, amqp_worker.log()[-3000:])
    result = job.result
    assert result is not None and set(result["confidence"]) == set(result["holes"])
    for confidence in result["confidence"].values():
        assert 0.0 <= confidence["p"] <= 1.0
        assert set(confidence) == {"p", "low", "marks", "signal", "calibrated"}
    assert isinstance(result["needs_person"], bool)
    assert "domain" in result
