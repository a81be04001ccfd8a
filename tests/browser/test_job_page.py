"""The job page tells the truth about a job: what the row says, in words a person reads."""

from __future__ import annotations

import json
import re
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
    assert page.locator("#written-by").is_hidden()  # no result yet: no writer named
    job_succeed(job, {"reason": FULL}, model_version={
        "id": 3, "name": "tuned", "scope": "template:referral", "weights_sha256": "ab"})
    InfillJob.objects.filter(pk=job.pk).update(
        progress=stale_progress(job), result={**(job.result or {}), "steps": 20}
    )
    page.wait_for_function("document.getElementById('progress').dataset.state === 'succeeded'")
    for seen in (page, page.context.new_page()):
        if seen is not page:
            seen.goto(f"{live_server.url}/jobs/{job.id}/")  # and as the server renders it
        assert seen.locator("#written-by").is_visible()
        assert seen.locator("#written-by").inner_text() == (
            "Written by model version tuned (promoted for this template).")
        assert seen.locator("#committed").inner_text() == "100%"
        assert seen.locator("#stable .stable-text").first.inner_text() == FULL
        assert seen.locator("#step").inner_text() == "20 steps"
    answer = json.loads(page.evaluate(
        "url => fetch(url).then(r => r.text())", f"/api/v1/jobs/{job.id}"))  # fmt: skip
    assert answer["progress"]["committed_share"] == 1.0
    hole = job.target_fragments[0]["hole"]
    assert answer["progress"]["holes"][hole]["stable"] == answer["result"]["holes"][hole] == FULL


def test_pages_speak_plain_words_not_internal_names(
    live_server: Any, page: Any, alice: Any, referral: None, demo_templates: None,
    dispatched: list[str],
) -> None:  # fmt: skip
    from drafting.models import TemplateVersion

    base = live_server.url
    log_in(page, base)
    # A hole declared without a label is named in words on the job page.
    incident = TemplateVersion.objects.filter(template__slug="incident-report").first()
    assert incident is not None
    values = {"ref": "INC-2025-0042", "site": "Depot 4", "incident_date": "14 May 2025",
              "reporter": "Ana Ruiz", "severity": "Low", "event": "a pallet fell"}  # fmt: skip
    draft = services.draft_create(owner=alice, version=incident, values=values)
    job = services.draft_infill_request(draft=draft, user=alice, preset="fast")
    hole = next(t["hole"] for t in job.target_fragments if t["hole"].startswith("witness_line"))
    InfillJob.objects.filter(pk=job.pk).update(state="running", progress={
        "attempt": 0, "step": 2, "max_steps": 512, "committed": 1, "positions": 99,
        "holes": {hole: {"stable": "Two", "provisional": "Two staff"}}})  # fmt: skip
    page.goto(f"{base}/jobs/{job.id}/")
    assert "Witness line" in page.locator("#stable").inner_text()
    assert "witness_line" not in page.locator("main").inner_text()
    assert page.locator("#step").inner_text() == "2 (at most 512)"
    # A cancelled job is not explained under "Why it failed".
    InfillJob.objects.filter(pk=job.pk).update(state="cancelled", reasons=["cancelled at step 2"])
    page.wait_for_function("document.getElementById('progress').dataset.state === 'cancelled'")
    assert page.locator("#reasons").inner_text().startswith("Why it was cancelled:")
    assert "failed" not in page.locator("#reasons").inner_text()
    InfillJob.objects.filter(pk=job.pk).update(state="failed", reasons=[
        f"attempt 1 (diffusion): {hole}: longer than its 32 tokens"])  # fmt: skip
    page.goto(f"{base}/jobs/{job.id}/")
    reasons = " ".join(page.locator("#reasons").inner_text().split())
    assert reasons == "Why it failed: attempt 1 (diffusion): Witness line: longer than its 32 tokens"

    # Template text is named by its words; a date in a letter reads as a date.
    version = TemplateVersion.objects.get(template__slug="referral")
    letter = services.draft_create(owner=alice, version=version, values=dict(VALUES))
    page.goto(f"{base}/drafts/{letter.id}/")
    assert "born 17 April 1961" in page.locator("#document").inner_text()
    page.get_by_role("button", name=re.compile("^Unlock template text “Kind regards")).click()
    message = page.locator(".messages").inner_text()
    assert message.startswith("“Kind regards,” is now unlocked") and "Fragment" not in message
