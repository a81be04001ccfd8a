"""Reviewing and accepting: what the page says matches what the draft holds."""

from __future__ import annotations

import re
from typing import Any

import pytest

from drafting import services
from drafting.models import Draft, TemplateVersion
from tests.browser.pages import click_and_settle, log_in, span_card
from tests.drafting.helpers import VALUES, provisional_draft

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ACCEPT_DRAFT = re.compile(r"^Accept (draft|this text)")
# Each element's text as a sighted reader sees it (without the words only a screen reader hears).
SEEN_TEXT = """els => els.map(e => { const c = e.cloneNode(true);
    c.querySelectorAll('.visually-hidden').forEach(h => h.remove()); return c.textContent; })"""


def referral_draft(alice: Any) -> Draft:
    version = TemplateVersion.objects.get(template__slug="referral")
    return services.draft_create(owner=alice, version=version, values=dict(VALUES))


def review(page: Any, base: str, draft: Draft) -> None:
    log_in(page, base)
    page.goto(f"{base}/drafts/{draft.id}/review/")


def click_in_card(page: Any, label: str, button: str) -> None:
    click_and_settle(page, span_card(page, label).get_by_role("button",
                                                              name=re.compile(f"^{button}")))


def test_a_rejected_span_blocks_accepting_and_is_named(
    live_server: Any, page: Any, alice: Any, referral: None, dispatched: list[str]
) -> None:
    draft = provisional_draft(referral_draft(alice), alice)
    review(page, live_server.url, draft)
    click_in_card(page, "Reason for referral", "Accept")
    click_in_card(page, "Urgency", "Accept")
    click_in_card(page, "Clinical summary", "Reject")
    page.wait_for_function("!document.querySelector('li.span-card.status-provisional')")

    accept = page.get_by_role("button", name=ACCEPT_DRAFT)
    assert accept.is_disabled()
    problems = page.locator("#accept-problems").inner_text()
    assert "Clinical summary is empty" in problems
    # A form sent anyway (another tab, no JavaScript) is refused with the same names.
    page.evaluate("document.querySelector('#accept-form button').disabled = false")
    accept.click()
    assert "Clinical summary is empty" in page.locator(".messages").inner_text()
    draft.refresh_from_db()
    assert draft.accepted_revision is None


def test_a_value_edited_after_acceptance_is_no_longer_called_accepted(
    live_server: Any, page: Any, alice: Any, referral: None, dispatched: list[str]
) -> None:
    from tests.browser.test_documents import download_text
    from tests.drafting.helpers import reviewed_draft

    draft = reviewed_draft(referral_draft(alice), alice)
    services.draft_accept(draft=draft, expected_revision=draft.revision, user=alice)
    base = live_server.url
    log_in(page, base)
    row = page.get_by_role("row").filter(has=page.get_by_role("link", name=draft.title))
    assert "accepted" in row.inner_text()

    page.goto(f"{base}/drafts/{draft.id}/")
    page.get_by_label("Patient name").fill("Ada Berg")
    page.get_by_role("button", name="Save values").click()
    page.goto(f"{base}/")
    assert "changed since accepted" in row.inner_text()

    page.goto(f"{base}/drafts/{draft.id}/review/")
    current = download_text(page, "Plain text (.txt)")
    assert current.startswith("[DRAFT, NOT ACCEPTED: changed after revision")
    assert "Ada Berg" in current
    accepted = download_text(page, re.compile(r"^revision \d+ \(\.txt\)"))
    assert accepted.startswith("Dear Dr. Imani Okafor,") and "Jonas Berg" in accepted


def test_the_revision_a_page_names_is_the_newest_one_listed(
    live_server: Any, page: Any, alice: Any, referral: None, dispatched: list[str]
) -> None:
    from tests.drafting.helpers import reviewed_draft

    draft = reviewed_draft(referral_draft(alice), alice)
    base = live_server.url
    log_in(page, base)
    page.goto(f"{base}/drafts/{draft.id}/")
    for _ in range(2):  # locking changes no text: no revision, and no number moves
        page.get_by_role("button", name="Unlock Urgency", exact=True).click()
        page.get_by_role("button", name="Lock Urgency", exact=True).click()
    page.get_by_label("Patient name").fill("Ada Berg")
    page.get_by_role("button", name="Save values").click()
    page.goto(f"{base}/drafts/{draft.id}/review/")

    newest = page.locator("ol.revisions li").first.inner_text()
    shown = page.locator("#draft-revision").inner_text()
    assert newest.startswith(shown.capitalize() + ":"), (shown, newest)
    assert "form values changed" in newest
    page.get_by_role("button", name=ACCEPT_DRAFT).click()
    number = re.search(r"Accepted as revision (\d+)", page.locator(".messages").inner_text())
    assert number is not None
    assert page.locator("#draft-revision").inner_text() == f"revision {number.group(1)}"
    assert page.locator("#draft-status").inner_text() == "accepted"
    assert page.locator("ol.revisions li").first.inner_text().startswith(
        f"Revision {number.group(1)}: the whole text accepted")


def test_a_reviewer_reports_a_bad_span_and_sees_its_incident_status(
    live_server: Any, page: Any, alice: Any, referral: None, dispatched: list[str],
) -> None:  # fmt: skip
    from audit.models import Incident, RunRecord
    from audit.services import incident_status_set
    from gpu_worker.pipeline import job_run

    draft = referral_draft(alice)
    job = services.draft_infill_request(draft=draft, user=alice, preset="fast")
    assert job_run(job_id=str(job.id), worker="report-test") == "succeeded"
    review(page, live_server.url, draft)

    card = span_card(page, "Clinical summary")
    card.locator("summary", has_text="Report a problem").click()
    card.get_by_label("Note (optional)").fill("Invents an ECG result")
    card.get_by_role("button", name="Send report on Clinical summary").click()
    card = span_card(page, "Clinical summary")
    assert "Choose one of the reasons" in card.inner_text()
    assert card.get_by_label("Note (optional)").input_value() == "Invents an ECG result"
    assert not Incident.objects.exists()

    card.get_by_label("It states something wrong or invented").check()
    card.get_by_role("button", name="Send report on Clinical summary").click()
    incident = Incident.objects.get()
    job.refresh_from_db()  # the span's run: the one whose result the draft holds
    assert job.result is not None
    run = RunRecord.objects.filter(job_id=str(job.id)).get(pk=job.result["run_id"])
    assert (incident.kind, incident.run_id, incident.reporter_name) == ("user_report", run.pk,
                                                                         "alice")  # fmt: skip
    assert "Invents an ECG result" in incident.summary
    assert f"incident {incident.pk} is open" in span_card(page, "Clinical summary").inner_text()

    incident_status_set(incident=incident, status="investigating")
    page.reload()
    assert "is investigating" in span_card(page, "Clinical summary").inner_text()


def test_review_actions_update_in_place_and_keep_focus_on_the_span(
    live_server: Any, page: Any, browser: Any, alice: Any, referral: None, dispatched: list[str],
) -> None:  # fmt: skip
    draft = provisional_draft(referral_draft(alice), alice)
    reason = draft.fragments.get(name="reason")
    review(page, live_server.url, draft)
    for name in ("Accept Reason for referral", "Reject Clinical summary", "Regenerate Urgency",
                 "Save edit of Urgency", "Send report on Urgency"):  # fmt: skip
        found = page.get_by_role("button", name=name, exact=True, include_hidden=True)
        assert found.count() == 1, name  # (some stand in closed disclosures)
    page.evaluate("window.stayedOnPage = true")
    page.get_by_role("button", name="Accept Reason for referral").focus()
    page.keyboard.press("Enter")
    page.wait_for_function(f"document.activeElement.id === 'span-h-{reason.id}'")
    assert page.evaluate("window.stayedOnPage") is True  # no reload: the regions were swapped
    assert "accepted" in span_card(page, "Reason for referral").inner_text()
    assert "“Reason for referral” accepted." in page.locator("#messages").inner_text()

    page.goto(f"{live_server.url}/drafts/{draft.id}/")
    page.evaluate("window.stayedOnPage = true")
    page.get_by_role("button", name="Unlock Reason for referral").click()
    page.wait_for_function(f"document.getElementById('lock-{reason.id}').ariaPressed === 'false'")
    assert page.evaluate("document.activeElement.id") == f"lock-{reason.id}"  # the new button
    assert page.evaluate("window.stayedOnPage") is True

    # Without JavaScript the same forms work, and the page comes back at the span.
    context = browser.new_context(java_script_enabled=False)
    plain = context.new_page()
    review(plain, live_server.url, draft)
    plain.get_by_role("button", name="Accept Clinical summary").click()
    summary = draft.fragments.get(name="summary")
    assert plain.url.endswith(f"/review/#span-{summary.id}")
    assert "accepted" in span_card(plain, "Clinical summary").inner_text()
    context.close()


def test_words_to_regenerate_are_chosen_from_the_keyboard(
    live_server: Any, page: Any, alice: Any, referral: None, dispatched: list[str],
) -> None:  # fmt: skip
    from drafting.models import InfillJob
    from tests.browser.pages import job_id_of

    draft = referral_draft(alice)
    log_in(page, live_server.url)
    page.goto(f"{live_server.url}/drafts/{draft.id}/")
    row = page.locator("li.fragment-row").filter(has_text="Kind regards")
    row.locator("summary", has_text="Rewrite part").focus()
    page.keyboard.press("Enter")  # opens the disclosure
    box = row.get_by_label(re.compile("^Select the words to rewrite"))
    box.focus()
    page.keyboard.press("Control+Home")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowDown")
    for _ in range(4):
        page.keyboard.press("Shift+ArrowRight")
    assert row.get_by_label("Words to rewrite", exact=True).input_value() == "Kind"
    row.get_by_role("button", name="Regenerate these words").focus()
    page.keyboard.press("Enter")
    job = InfillJob.objects.get(pk=job_id_of(page))
    assert [draft.fragments.get(pk=t["fragment"]).text for t in job.target_fragments] == ["Kind"]


def test_stencil_explains_itself_and_a_draft_can_be_deleted(
    live_server: Any, page: Any, alice: Any, referral: None,
) -> None:  # fmt: skip
    base = live_server.url
    page.goto(f"{base}/")
    about = page.locator("main").inner_text()
    assert "Stencil drafts documents you can trust" in about and "provisional" in about
    log_in(page, base)
    steps = page.locator(".how").inner_text()
    assert all(step in steps for step in ("1. Fill", "2. Review", "3. Accept"))

    draft = referral_draft(alice)
    page.reload()
    page.get_by_role("link", name=f"Delete {draft.title}").click()
    page.get_by_role("button", name="Delete the draft").click()
    page.wait_for_url(f"{base}/")
    assert f"“{draft.title}” was deleted." in page.locator(".messages").inner_text()
    assert not Draft.objects.filter(pk=draft.pk).exists()


def test_regenerating_a_span_gives_different_text(
    live_server: Any, page: Any, alice: Any, referral: None, dispatched: list[str],
    job_in_background: Any,
) -> None:  # fmt: skip
    from drafting.confidence import confidence_view
    from drafting.models import InfillJob
    from tests.browser.pages import job_id_of, watch_job

    draft = referral_draft(alice)
    review(page, live_server.url, draft)
    page.goto(f"{live_server.url}/drafts/{draft.id}/")
    page.get_by_role("button", name="Fill unlocked").click()
    assert watch_job(page, job_id_of(page), job_in_background) == "succeeded"
    texts = [draft.fragments.get(name="summary").text]
    words = {v.words for v in map(confidence_view, [{}, {"p": 0.1, "low": True}, {"p": 0.9},
                                                    {"p": 0.5}])}  # fmt: skip
    for variation in ("Different", "Very different (less careful)"):
        page.goto(f"{live_server.url}/drafts/{draft.id}/review/")
        page.get_by_label("How different for Clinical summary").select_option(label=variation)
        page.get_by_role("button", name="Regenerate Clinical summary").click()
        job_id = job_id_of(page)
        assert watch_job(page, job_id, job_in_background) == "succeeded"
        job = InfillJob.objects.get(pk=job_id)
        assert job.config["temperature"] > 0
        assert job.target_fragments[0]["previous"] == texts[-1]  # the job keeps both texts
        texts.append(draft.fragments.get(name="summary").text)
        page.goto(f"{live_server.url}/drafts/{draft.id}/review/")
        card = span_card(page, "Clinical summary")
        # The worker's confidence (or, from a worker that measures none, that it was not).
        assert any(w in card.locator(".confidence").inner_text() for w in words)
        if texts[-1] != texts[-2]:  # the previous text stands beside the new one
            shown = card.locator(".compare blockquote").evaluate_all(SEEN_TEXT)
            assert shown == [texts[-1], texts[-2]]
    assert texts[1] != texts[2] and len(set(texts)) >= 2, texts
