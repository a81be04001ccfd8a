"""A person drafts a referral letter in real headless Chromium, from login to export."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from drafting import services
from drafting.models import Draft, DraftRevision, InfillJob
from tests.browser.pages import (
    accept_span,
    click_and_settle,
    job_id_of,
    log_in,
    span_card,
    watch_job,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

def test_draft_a_referral_letter_from_login_to_export(
    live_server: Any, page: Any, alice: Any, referral: None, dispatched: list[str],
    job_in_background: Callable[[str], threading.Thread], slow_steps: None, screenshot_dir: Path,
) -> None:  # fmt: skip
    base = live_server.url
    log_in(page, base)

    # 1. Pick a template and fill its form: a mistake is explained and nothing typed is lost.
    page.get_by_role("link", name="Referral letter").click()
    page.get_by_label("Referring to").fill("Dr. Imani Okafor")
    page.get_by_label("Patient name").fill("Jonas Berg")
    page.get_by_label("Date of birth").fill("1961-04-17")
    page.get_by_role("button", name="Create draft").click()
    assert page.locator("#field-sender-error").inner_text() == "Your name is required."
    assert page.get_by_label("Patient name").input_value() == "Jonas Berg"
    page.screenshot(path=str(screenshot_dir / "form.png"), full_page=True)
    page.get_by_label("Your name").fill("Dr. Lea Martin")
    page.get_by_role("button", name="Create draft").click()
    page.wait_for_url(re.compile(r".*/drafts/\d+/$"))
    draft = Draft.objects.get(owner=alice)
    assert "Jonas Berg" in page.locator("#document").inner_text()

    # 2. Lock the urgency: the person will write it. Then fill everything still unlocked.
    page.get_by_role("button", name="Lock Urgency", exact=True).click()
    assert page.get_by_role("button", name="Unlock Urgency", exact=True).get_attribute(
        "aria-pressed") == "true"  # fmt: skip
    page.screenshot(path=str(screenshot_dir / "draft.png"), full_page=True)
    page.get_by_label("Preset").select_option("fast")
    page.get_by_role("button", name="Fill unlocked").click()
    job_id = job_id_of(page)
    assert dispatched == [job_id]
    assert page.locator("#stable").get_attribute("aria-live") == "polite"
    assert page.locator("#provisional").get_attribute("aria-hidden") == "true"
    state = watch_job(page, job_id, job_in_background, screenshot_dir / "progress.png")
    job = InfillJob.objects.get(pk=job_id)
    assert state == "succeeded", job.reasons
    assert len(job.target_fragments) == 2  # reason and summary; the locked urgency is not sent

    # 3. Review: model text is highlighted as provisional.
    page.get_by_role("link", name="Review the text").click()
    page.wait_for_url(f"{base}/drafts/{draft.id}/review/")
    assert page.locator("#document .status-provisional").count() == 2
    page.screenshot(path=str(screenshot_dir / "review.png"), full_page=True)

    # 4. Accept one span, write the locked one by hand, regenerate another.
    accept_span(page, span_card(page, "Reason for referral"))
    assert "accepted" in span_card(page, "Reason for referral").inner_text()
    urgency = span_card(page, "Urgency")
    urgency.locator("summary", has_text="Edit by hand").click()
    urgency.get_by_label("New text for Urgency").fill("soon")
    click_and_settle(page, urgency.get_by_role("button", name="Save edit"))
    reason_text = span_card(page, "Reason for referral").locator("blockquote").inner_text()
    span_card(page, "Clinical summary").get_by_role("button", name="Regenerate").click()
    second = job_id_of(page)
    state = watch_job(page, second, job_in_background)
    assert state == "succeeded", InfillJob.objects.get(pk=second).reasons
    page.get_by_role("link", name="Review the text").click()
    assert "Urgency: soon." in page.locator("#document").inner_text()
    assert page.locator("#document .status-provisional").count() == 1
    assert span_card(page, "Reason for referral").locator("blockquote").inner_text() == reason_text
    accept_span(page, span_card(page, "Clinical summary"))

    # 5. Accept the draft. A second tab opened before that cannot accept a second time.
    stale_tab = page.context.new_page()
    stale_tab.goto(page.url)
    page.get_by_role("button", name=re.compile(r"Accept draft")).click()
    assert "Accepted as revision" in page.locator(".messages").inner_text()
    assert page.locator("#accepted").is_visible()
    assert "has not changed since" in page.locator("#accept-state").inner_text()
    stale_tab.get_by_role("button", name=re.compile(r"Accept draft")).click()
    assert "already accepted" in stale_tab.locator(".messages").inner_text()
    stale_tab.close()
    assert DraftRevision.objects.filter(draft=draft, accepted=True).count() == 1
    page.screenshot(path=str(screenshot_dir / "review-accepted.png"), full_page=True)

    # 6. Export the accepted text.
    with page.expect_download() as txt:
        page.get_by_role("link", name="Plain text (.txt)").click()
    exported = Path(txt.value.path()).read_text()
    assert exported.startswith("Dear Dr. Imani Okafor,") and "Urgency: soon." in exported
    with page.expect_download() as md:
        page.get_by_role("link", name="Markdown (.md)").click()
    assert "Accepted revision" in Path(md.value.path()).read_text()
    with page.expect_download() as pdf:
        page.get_by_role("link", name="Letter as PDF (.pdf)").click()
    from tests.drafting.test_exports import docx_of, pdf_text

    letter = [line.strip() for line in pdf_text(Path(pdf.value.path()).read_bytes()).splitlines()]
    assert letter[0] == "Dear Dr. Imani Okafor," and "DRAFT" not in letter
    with page.expect_download() as docx:
        page.get_by_role("link", name="Word document (.docx)").click()
    paragraphs = [p.text for p in docx_of(Path(docx.value.path()).read_bytes()).paragraphs]
    assert paragraphs[-1] == "Kind regards,\nDr. Lea Martin"


def test_selecting_a_span_and_autosave_in_the_browser(
    live_server: Any, page: Any, alice: Any, referral: None, dispatched: list[str]
) -> None:
    from tests.drafting.helpers import VALUES

    draft = services.draft_create(owner=alice, version=referral_version(), values=dict(VALUES))
    log_in(page, live_server.url)
    page.goto(f"{live_server.url}/drafts/{draft.id}/")

    # Autosave: a bad value is explained next to its field and not saved; a good one is saved.
    page.get_by_label("Patient name").fill("")
    page.wait_for_function("document.getElementById('autosave-status').textContent.startsWith('Not saved')")
    assert page.locator("#field-patient_name-error").inner_text() == "Patient name is required."
    page.get_by_label("Patient name").fill("Ada Berg")
    page.wait_for_function("document.getElementById('autosave-status').textContent.startsWith('Saved')")
    draft.refresh_from_db()
    assert draft.values["patient_name"] == "Ada Berg"

    # Select "Kind" in "Kind regards," and ask for just that to be rewritten.
    closing = draft.fragments.get(text="\n\nKind regards,\n")
    page.evaluate(
        """id => { const node = document.getElementById('frag-' + id).firstChild;
                   const range = document.createRange(); range.setStart(node, 2); range.setEnd(node, 6);
                   const sel = window.getSelection(); sel.removeAllRanges(); sel.addRange(range); }""",
        closing.id,
    )
    button = page.get_by_role("button", name="Regenerate selection")
    page.wait_for_function("!document.getElementById('sel-submit').disabled")
    assert "Selected 4 characters" in page.locator("#sel-status").inner_text()
    button.click()
    job = InfillJob.objects.get(pk=job_id_of(page))
    assert [draft.fragments.get(pk=t["fragment"]).text for t in job.target_fragments] == ["Kind"]


def referral_version() -> Any:
    from drafting.models import TemplateVersion

    return TemplateVersion.objects.get(template__slug="referral")


def test_progress_view_polls_stable_text_into_the_live_region(
    live_server: Any, page: Any, alice: Any, referral: None, dispatched: list[str]
) -> None:
    from tests.drafting.helpers import VALUES

    draft = services.draft_create(owner=alice, version=referral_version(), values=dict(VALUES))
    job = services.draft_infill_request(draft=draft, user=alice, preset="fast")
    hole = job.target_fragments[0]["hole"]
    log_in(page, live_server.url)
    page.goto(f"{live_server.url}/jobs/{job.id}/")
    assert page.locator("#queue-position").inner_text() == "1"
    InfillJob.objects.filter(pk=job.pk).update(state="running", progress={
        "attempt": 0, "step": 5, "max_steps": 20, "committed": 10, "positions": 40,
        "holes": {hole: {"stable": "worsening chest", "provisional": "worsening chest pain at"}}})  # fmt: skip
    page.wait_for_function("document.getElementById('step').textContent === '5 (at most 20)'")
    live = page.locator("#stable")
    assert live.get_attribute("aria-live") == "polite"
    assert live.locator("h3").inner_text() == "Reason for referral"
    assert live.locator(".stable-text").inner_text() == "worsening chest"
    assert page.locator("#committed").inner_text() == "25%"
    snapshot = page.locator("#provisional")
    assert snapshot.get_attribute("aria-hidden") == "true"
    assert "worsening chest pain at" in snapshot.inner_text()
    page.get_by_role("button", name="Cancel").click()
    assert "Cancelling" in page.locator(".messages").inner_text()
    InfillJob.objects.filter(pk=job.pk).update(state="failed", reasons=["attempt 1: bad urgency"])
    page.wait_for_function("document.getElementById('progress').dataset.state === 'failed'")
    assert "attempt 1: bad urgency" in page.get_by_role("alert").inner_text()
    assert page.locator("#cancel-form").is_hidden()
