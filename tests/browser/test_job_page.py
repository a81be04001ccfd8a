"""The job page tells the truth about a job: what the row says, in words a person reads."""

from __future__ import annotations

import json
from typing import Any

import pytest

from drafting import services
from drafting.models import InfillJob
from tests.browser.pages import log_in
from tests.drafting.helpers import VALUES, job_succeed

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

FULL = "worsening exertional chest pain on stairs"


def referral_job(alice: Any) -> InfillJob:
    from drafting.models import TemplateVersion

    version = TemplateVersion.objects.get(template__slug="referral")
    draft = services.draft_create(owner=alice, version=version, values=dict(VALUES))
    return services.draft_infill_request(draft=draft, user=alice, preset="fast")


def stale_progress(job: InfillJob) -> dict[str, Any]:
    """The last progress row a worker wrote before it finished: half way, a cut-off sentence."""
    hole = job.target_fragments[0]["hole"]
    return {"attempt": 0, "step": 10, "max_steps": 512, "committed": 20, "positions": 40,
            "holes": {hole: {"stable": "worsening exert", "provisional": "worsening exert"}}}


def test_a_succeeded_job_shows_its_result_not_its_last_progress_row(
    live_server: Any, page: Any, alice: Any, referral: None, dispatched: list[str]
) -> None:
    job = referral_job(alice)
    log_in(page, live_server.url)
    page.goto(f"{live_server.url}/jobs/{job.id}/")  # open while queued: the page polls
    InfillJob.objects.filter(pk=job.pk).update(state="running", progress=stale_progress(job))
    page.wait_for_function("document.getElementById('committed').textContent === '50%'")
    job_succeed(job, {"reason": FULL})
    InfillJob.objects.filter(pk=job.pk).update(
        progress=stale_progress(job), result={**job.result, "steps": 20}
    )
    page.wait_for_function("document.getElementById('progress').dataset.state === 'succeeded'")
    for seen in (page, page.context.new_page()):
        if seen is not page:
            seen.goto(f"{live_server.url}/jobs/{job.id}/")  # and as the server renders it
        assert seen.locator("#committed").inner_text() == "100%"
        assert seen.locator("#stable .stable-text").first.inner_text() == FULL
        assert seen.locator("#step").inner_text() == "20 steps"
    answer = json.loads(page.evaluate(
        "url => fetch(url).then(r => r.text())", f"/api/v1/jobs/{job.id}"))  # fmt: skip
    assert answer["progress"]["committed_share"] == 1.0
    hole = job.target_fragments[0]["hole"]
    assert answer["progress"]["holes"][hole]["stable"] == answer["result"]["holes"][hole] == FULL
