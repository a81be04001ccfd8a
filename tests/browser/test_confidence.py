"""A guess never looks like a suggestion: flagged spans, needs a person, the domain warning.

The jobs' results are stored data here, written as the worker writes them; the regenerate test
in test_review.py runs the real pipeline.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from drafting import confidence, services
from drafting.models import DraftRevision, Fragment, TemplateVersion
from tests.browser.pages import click_and_settle, log_in, span_card
from tests.drafting.helpers import FILLS, VALUES, fill, job_succeed

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LOW = {"p": 0.1, "low": True, "marks": [[0, 10]], "signal": "token probability",
       "calibrated": True}  # fmt: skip
HIGH = {"p": 0.95, "low": False, "marks": [], "signal": "token probability", "calibrated": True}


def stored_job(alice: Any, **result: Any) -> Any:
    version = TemplateVersion.objects.get(template__slug="referral")
    draft = services.draft_create(owner=alice, version=version, values=dict(VALUES))
    job = services.draft_infill_request(draft=draft, user=alice, preset="fast")
    job_succeed(job, **result)
    return draft, job


def style(locator: Any, prop: str) -> str:
    return str(locator.evaluate(f"e => getComputedStyle(e).{prop}"))


def test_a_flagged_span_looks_different_says_so_comes_first_and_needs_accept_anyway(
    live_server: Any, page: Any, alice: Any, referral: None, dispatched: list[str]
) -> None:
    draft, _ = stored_job(alice, confidence={"summary": LOW, "reason": HIGH, "urgency": HIGH})
    log_in(page, live_server.url)
    page.goto(f"{live_server.url}/drafts/{draft.id}/review/")

    cards = page.locator("li.span-card")
    assert cards.first.get_by_role("heading").inner_text().startswith("Clinical summary")
    flagged, plain = span_card(page, "Clinical summary"), span_card(page, "Reason for referral")
    assert confidence.LOW_WORDS in flagged.inner_text()
    assert confidence.CONFIDENT_WORDS in plain.inner_text()
    assert style(flagged, "borderTopStyle") == "dashed" != style(plain, "borderTopStyle")
    assert style(flagged, "backgroundColor") != style(plain, "backgroundColor")
    mark = flagged.locator("blockquote mark.unsure")
    assert mark.count() == 1  # the least-sure words, named for a screen reader too
    assert mark.text_content() == f"[least sure: {FILLS['summary'][:10]}]"
    # No ordinary Accept for a guess: only a deliberate "accept anyway", from the keyboard.
    assert flagged.get_by_role("button", name="Accept Clinical summary").count() == 0
    assert plain.get_by_role("button", name="Accept Reason for referral").count() == 1
    opener = flagged.locator("summary", has_text="Accept anyway")
    opener.focus()
    page.keyboard.press("Enter")
    confirm = flagged.get_by_role("button", name="Yes, accept anyway Clinical summary")
    assert confirm.is_visible()
    page.keyboard.press("Tab")
    assert confirm.evaluate("e => e === document.activeElement")
    scrolled = page.evaluate("window.scrollY")
    click_and_settle(page, confirm)
    assert page.url.endswith(f"/drafts/{draft.id}/review/")  # updated in place, no jump
    assert page.evaluate("document.activeElement.id") == f"span-h-{fill(draft, 'summary').id}"
    assert abs(page.evaluate("window.scrollY") - scrolled) < 400
    assert fill(draft, "summary").status == Fragment.Status.ACCEPTED


def test_needs_a_person_offers_writing_by_hand_and_saves_the_persons_text(
    live_server: Any, page: Any, alice: Any, referral: None, dispatched: list[str]
) -> None:
    draft, job = stored_job(
        alice, confidence={"summary": LOW, "reason": LOW, "urgency": LOW}, needs_person=True,
        domain={"score": 8.1, "unfamiliar": True, "threshold": 4.0},
    )  # fmt: skip
    base = live_server.url
    log_in(page, base)
    page.goto(f"{base}/jobs/{job.id}/")
    assert "Needs a person" in page.locator("#needs-person").inner_text()
    assert page.locator("#domain-warning").inner_text().endswith(confidence.DOMAIN_WARNING)
    page.goto(f"{base}/drafts/{draft.id}/")
    assert page.locator("#needs-person").is_visible()
    assert confidence.DOMAIN_WARNING in page.locator("#domain-warning").inner_text()

    page.locator("#needs-person").get_by_role("link", name="review page").click()
    box = page.get_by_label("Write Clinical summary yourself")
    box.fill("Two months of exertional angina.")
    click_and_settle(page, page.get_by_role("button", name="Save my text for Clinical summary"))
    card = span_card(page, "Clinical summary")
    assert "written by a person" in card.inner_text()
    assert "Two months of exertional angina." in card.locator("blockquote").inner_text()
    assert confidence.LOW_WORDS not in card.inner_text()
    summary = fill(draft, "summary")
    assert (summary.text, summary.written_by) == ("Two months of exertional angina.", "person")
    newest = DraftRevision.objects.filter(draft=draft).order_by("-number").first()
    assert newest is not None and newest.reason == "write" and newest.created_by == alice
    assert re.search("written by a person", page.locator(".revisions").inner_text())
