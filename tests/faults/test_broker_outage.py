"""The broker goes away while jobs run and while people submit: every request is answered 202,
every job runs once, and the worker carries on when the broker is back.

"The broker" is a relay in front of RabbitMQ (tests/faults/proxy.py): taking it down cuts the
worker's and the web app's connections and refuses new ones, as a stopped broker would, while
the RabbitMQ that other runs share keeps running.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from django.test import Client

from drafting.models import InfillJob
from stencil.celery import app
from tests.conftest import wait_for
from tests.e2e.test_pipeline import referral_draft
from tests.faults.conftest import SETTLE_S, SLOW_SAMPLER, all_running, draft_job
from tests.faults.inject import Relay
from tests.faults.ledger import settle
from tests.workers import WorkerProcess, producer_broker

pytestmark = [pytest.mark.services, pytest.mark.faults, pytest.mark.timeout(300),
              pytest.mark.django_db(transaction=True)]  # fmt: skip
OUTAGE_S = 4
LONG_SAMPLER = {**SLOW_SAMPLER, "steps_per_block": 32, "max_steps": 256}  # ~90 steps
SUBMITTED_DURING = 4


def test_a_broker_outage_during_work_and_submission_loses_nothing(
    steady: WorkerProcess, relay: Relay, demo_templates: None, user: Any,
    faults_settings: Any, module_prefix: str, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    client = Client()
    client.force_login(user)
    with producer_broker(app, relay.url, f"{module_prefix}steady-"):
        running = [draft_job(user, sampler=LONG_SAMPLER) for _ in range(2)]
        wait_for(lambda: all_running(running[:1], step=2), timeout=120, what="a job to run",
                 interval=0.05)  # fmt: skip
        relay.down()
        answers = []
        for _ in range(SUBMITTED_DURING):
            draft = referral_draft(user)
            answers.append(client.post(f"/api/v1/drafts/{draft.pk}/infill", data=json.dumps({}),
                                       content_type="application/json"))  # fmt: skip
        assert [a.status_code for a in answers] == [202] * SUBMITTED_DURING, answers[0].content
        submitted = [str(a.json()["id"]) for a in answers]
        # the broker never took them: the web app left each row to the sweeper (a sweeper's own
        # stamp on ``dispatched`` is its claim before it sends, so the column alone cannot say)
        left = {r.getMessage().split()[3] for r in caplog.records
                if r.name == "drafting.services" and r.getMessage().startswith("broker unavailable")}  # fmt: skip
        assert left >= set(submitted), (left, submitted)
        time.sleep(OUTAGE_S)
        relay.up()
    tally = settle([str(j.pk) for j in running] + submitted, deadline_s=SETTLE_S)
    assert tally.clean, (str(tally), steady.log()[-3000:])
    assert InfillJob.objects.filter(pk__in=submitted, dispatched__isnull=True).count() == 0
