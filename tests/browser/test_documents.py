"""What a person gets out: valid JSON records, real dates and numbers, exports that keep lines."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from drafting.models import Draft
from tests.browser.pages import (
    accept_span,
    click_and_settle,
    job_id_of,
    log_in,
    span_card,
    watch_job,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PATIENT = 'José "Pepe" Núñez'


def accept_every_span(page: Any) -> None:
    """Accept each provisional span on the review page, one card at a time."""
    cards = page.locator("li.span-card.status-provisional")
    while cards.count():
        before = cards.count()
        accept_span(page, cards.first)
        page.wait_for_function(
            f"document.querySelectorAll('li.span-card.status-provisional').length < {before}"
        )


def download_text(page: Any, link_name: str | re.Pattern[str]) -> str:
    with page.expect_download() as download:
        page.get_by_role("link", name=link_name).click()
    return Path(download.value.path()).read_text(encoding="utf-8")


def test_a_quoted_name_in_a_json_record_exports_as_valid_json(
    live_server: Any, page: Any, alice: Any, demo_templates: None, dispatched: list[str],
    job_in_background: Callable[[str], threading.Thread],
) -> None:  # fmt: skip
    base = live_server.url
    log_in(page, base)
    page.get_by_role("link", name="Clinic visit record (JSON)").click()
    page.get_by_label("Patient name").fill(PATIENT)
    page.get_by_label("Visit date").fill("2025-03-14")
    page.get_by_role("button", name="Create draft").click()
    page.wait_for_url(re.compile(r".*/drafts/\d+/$"))
    draft = Draft.objects.get(owner=alice)

    page.get_by_label("Preset").select_option("fast")
    page.get_by_role("button", name="Fill unlocked").click()
    assert watch_job(page, job_id_of(page), job_in_background) == "succeeded"
    page.get_by_role("link", name="Review the text").click()
    accept_every_span(page)
    page.get_by_role("button", name=re.compile(r"^Accept (draft|this text)")).click()
    assert "Accepted" in page.locator(".messages").inner_text()

    record = json.loads(download_text(page, "Plain text (.txt)"))
    assert record["patient"] == PATIENT
    assert record["visit_date"] == "2025-03-14"

    # A hand edit with quotes and a backslash stays inside its JSON string.
    summary = span_card(page, "Summary")
    summary.locator("summary", has_text="Edit by hand").click()
    summary.get_by_label(re.compile("New text for")).fill('Said "fine" \\ no pain')
    click_and_settle(page, summary.get_by_role("button", name=re.compile("Save edit")))
    page.get_by_role("button", name=re.compile(r"^Accept (draft|this text)")).click()
    assert json.loads(download_text(page, "Plain text (.txt)"))["summary"] == 'Said "fine" \\ no pain'

    # A bare value that breaks the record is refused, and the message says where.
    weeks = span_card(page, "Follow up weeks")
    weeks.locator("summary", has_text="Edit by hand").click()
    weeks.get_by_label(re.compile("New text for")).fill("twelve")
    click_and_settle(page, weeks.get_by_role("button", name=re.compile("Save edit")))
    assert page.get_by_role("button", name=re.compile(r"^Accept (draft|this text)")).is_disabled()
    problems = page.locator("#accept-problems").inner_text()
    assert "Follow up weeks" in problems and "form the template asks for" in problems
    draft.refresh_from_db()
    assert draft.accepted_revision is not None
    assert json.loads(draft.accepted_revision.text)["summary"] == 'Said "fine" \\ no pain'


OFFER = {"Company": "Northwind Analytics", "Candidate name": "Priya Shah",
         "Job title": "Senior Data Engineer", "Manager": "Sam Okoro"}  # fmt: skip


def as_typed(page: Any, label: str, text: str) -> None:
    """Type ``text`` as a person would where the browser does not check it (a plain text box:
    an older browser, a pasted value, a script): the server is the one that must say no."""
    field = page.get_by_label(label)
    field.evaluate("el => { el.type = 'text'; }")
    field.fill(text)


def test_an_offer_with_a_salary_in_words_and_impossible_dates_is_refused_and_kept(
    live_server: Any, page: Any, alice: Any, demo_templates: None,
) -> None:  # fmt: skip
    base = live_server.url
    log_in(page, base)
    page.get_by_role("link", name="Job offer letter").click()
    for label, text in OFFER.items():
        page.get_by_label(label).fill(text)
    as_typed(page, "Annual salary in US dollars", "ninety-two thousand")
    as_typed(page, "Start date", "next month")
    as_typed(page, "Date of the letter", "2025-02-30")
    as_typed(page, "Reply by", "2031-13-45")
    page.get_by_role("button", name="Create draft").click()

    assert "must be a number" in page.locator("#field-salary-error").inner_text()
    for name in ("start_date", "letter_date", "reply_by"):
        assert "not a real date" in page.locator(f"#field-{name}-error").inner_text()
    assert page.get_by_label("Candidate name").input_value() == "Priya Shah"
    assert not Draft.objects.exists()

    # Fixed, the letter reads the number and the dates the way a letter writes them.
    page.get_by_label("Annual salary in US dollars").fill("92000")
    page.get_by_label("Start date").fill("2025-03-03")
    page.get_by_label("Date of the letter").fill("2025-02-28")
    as_typed(page, "Reply by", "7 March 2025")  # a date written out is read as one
    page.get_by_role("button", name="Create draft").click()
    page.wait_for_url(re.compile(r".*/drafts/\d+/$"))
    document = page.locator("#document").inner_text()
    assert "$92,000 per year" in document and "start date will be 3 March 2025" in document
    assert "Reply by: 7 March 2025" in document
    assert Draft.objects.get().values["salary"] == 92000


OFFER_VALUES = {"company": "Northwind Analytics", "letter_date": "2025-02-28",
                "reply_by": "2025-03-07", "candidate": "Priya Shah",
                "role": "Senior Data Engineer", "salary": "92000", "start_date": "2025-03-03",
                "manager": "Sam Okoro"}  # fmt: skip


def test_the_markdown_export_keeps_the_letterhead_and_signature_lines(
    live_server: Any, page: Any, alice: Any, demo_templates: None,
) -> None:  # fmt: skip
    from markdown_it import MarkdownIt

    from drafting import services
    from drafting.models import TemplateVersion

    version = TemplateVersion.objects.filter(template__slug="offer-letter").first()
    assert version is not None
    draft = services.draft_create(owner=alice, version=version, values=dict(OFFER_VALUES))
    log_in(page, live_server.url)
    page.goto(f"{live_server.url}/drafts/{draft.id}/review/")
    html = MarkdownIt("commonmark").render(download_text(page, "Markdown (.md)"))
    assert "Northwind Analytics<br />\n28 February 2025<br />\nReply by: 7 March 2025</p>" in html
    assert "Yours sincerely,<br />\nSam Okoro<br />\nNorthwind Analytics</p>" in html
