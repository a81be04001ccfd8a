"""Concurrent infill requests through the API, run to the end by a real worker: limits exact,
one job and one infill revision per draft, nothing stuck.

Each request is its own thread with its own client and database connection, all released at
once against PostgreSQL.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from drafting.models import Draft, InfillJob
from stencil.celery import app
from tests.e2e.test_pipeline import referral_draft
from tests.faults.conftest import SETTLE_S
from tests.faults.inject import Relay
from tests.faults.ledger import settle
from tests.workers import WorkerProcess, producer_broker

pytestmark = [pytest.mark.services, pytest.mark.faults, pytest.mark.timeout(300),
              pytest.mark.django_db(transaction=True)]  # fmt: skip


def post_together(requests: list[tuple[Any, Draft]]) -> list[Any]:
    """POST each draft's infill as its user, every request on its own thread, released at once."""
    clients = []
    for user, _draft in requests:
        client = Client()
        client.force_login(user)
        clients.append(client)
    gate = threading.Barrier(len(requests))
    answers: list[Any] = [None] * len(requests)  # the test client's responses

    def post(i: int) -> None:
        try:
            gate.wait()
            answers[i] = clients[i].post(f"/api/v1/drafts/{requests[i][1].pk}/infill",
                                         data=json.dumps({}), content_type="application/json")  # fmt: skip
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(a is not None for a in answers)
    return [a for a in answers if a is not None]


@pytest.fixture
def through_steady(steady: WorkerProcess, relay: Relay, module_prefix: str) -> Any:
    with producer_broker(app, relay.url, f"{module_prefix}steady-"):
        yield steady


def _ids(answers: list[Any]) -> list[str]:
    return [str(a.json()["id"]) for a in answers if a.status_code == 202]


def test_concurrent_requests_on_one_draft_give_one_job_and_one_revision(
    through_steady: WorkerProcess, demo_templates: None, user: Any, faults_settings: Any
) -> None:
    draft = referral_draft(user)
    answers = post_together([(user, draft)] * 6)
    codes = sorted(a.status_code for a in answers)
    assert codes == [202, 400, 400, 400, 400, 400], [a.content for a in answers]
    assert all("already running" in a.json()["error"] for a in answers if a.status_code == 400)
    tally = settle(_ids(answers), deadline_s=SETTLE_S)
    assert tally.clean, (str(tally), through_steady.log()[-3000:])
    assert draft.jobs.count() == 1
    assert draft.revisions.filter(reason="infill").count() == 1


def test_concurrent_requests_by_one_user_admit_exactly_the_per_user_limit(
    through_steady: WorkerProcess, demo_templates: None, user: Any, faults_settings: Any
) -> None:
    faults_settings.STENCIL_MAX_QUEUED_JOBS_PER_USER = 3
    drafts = [referral_draft(user) for _ in range(10)]
    answers = post_together([(user, d) for d in drafts])
    assert sorted(a.status_code for a in answers) == [202] * 3 + [429] * 7
    assert all(a["Retry-After"] for a in answers if a.status_code == 429)
    tally = settle(_ids(answers), deadline_s=SETTLE_S)
    assert tally.clean, (str(tally), through_steady.log()[-3000:])
    assert InfillJob.objects.filter(owner=user).count() == 3


def test_concurrent_requests_by_many_users_admit_exactly_the_global_limit(
    through_steady: WorkerProcess, demo_templates: None, faults_settings: Any,
    django_user_model: Any,
) -> None:  # fmt: skip
    faults_settings.STENCIL_MAX_QUEUED_JOBS = 4
    users = [django_user_model.objects.create_user(username=f"u{i}", password="pw-123-abc")
             for i in range(8)]  # fmt: skip
    answers = post_together([(u, referral_draft(u)) for u in users])
    assert sorted(a.status_code for a in answers) == [202] * 4 + [429] * 4
    tally = settle(_ids(answers), deadline_s=SETTLE_S)
    assert tally.clean, (str(tally), through_steady.log()[-3000:])
    assert InfillJob.objects.count() == 4
