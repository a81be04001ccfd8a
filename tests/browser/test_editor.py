"""A template author writes a letter template in the editor, publishes it, and the letter it
makes goes out as PDF and Word with its locked text and line breaks intact."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from drafting.models import DocumentTemplate, Draft
from tests.browser.pages import job_id_of, log_in, watch_job
from tests.browser.test_documents import accept_every_span
from tests.drafting.test_exports import docx_of, pdf_text

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LETTERHEAD = ["Harbour Family Practice", "12 Quay Street", "Portsmouth PO1 3AX"]
CLOSING = ["This letter is confidential.", "Kind regards,"]
SOURCE = "\n".join(LETTERHEAD) + """

Dear {{ field("doctor", label="Doctor") }},

{% infill "body", max_tokens=24, label="Body" %}Why we write{% endinfill %}

""" + "\n".join(CLOSING) + """
{{ field("sender", label="Your name") }}
"""
BROKEN = SOURCE.replace("12 Quay Street", "12 {% if x %}Quay{% endif %} Street")


@pytest.fixture
def author(alice: Any) -> Any:
    from drafting.management.commands.load_demo import template_authors_group

    alice.groups.add(template_authors_group())
    return alice


def set_source(page: Any, source: str) -> None:
    page.get_by_label("Template source").fill(source)


def test_write_publish_fill_accept_and_export_a_new_template(
    live_server: Any, page: Any, author: Any, dispatched: list[str],
    job_in_background: Callable[[str], threading.Thread], screenshot_dir: Path,
) -> None:  # fmt: skip
    base = live_server.url
    log_in(page, base)
    page.get_by_role("link", name="Templates").click()
    page.get_by_role("link", name="New template").click()
    page.get_by_label("Address name (slug)").fill("practice-letter")
    page.get_by_label("Title").fill("Practice letter")

    # 1. A construct the language refuses: the live preview names its line and column.
    set_source(page, BROKEN)
    page.wait_for_selector("#template-errors")
    error = page.locator("#template-errors .template-error").inner_text()
    assert error.startswith("Line 2, column 4:") and "if is not allowed" in error
    page.get_by_role("button", name="Save as a new version").click()  # refused, source kept
    assert "Line 2, column 4" in page.locator("#template-errors").inner_text()
    assert page.get_by_label("Template source").input_value().strip() == BROKEN.strip()
    assert not DocumentTemplate.objects.exists()

    # 2. Fixed: the preview shows the form and the locked text.
    set_source(page, SOURCE)
    page.wait_for_selector("#template-ok")
    assert page.locator(".preview-form").get_by_label("Doctor").count() == 1
    assert "12 Quay Street" in page.locator("#preview-document").inner_text()
    page.screenshot(path=str(screenshot_dir / "editor.png"), full_page=True)
    page.get_by_role("button", name="Save as a new version").click()
    assert "Saved as version 1 (not published" in page.locator(".messages").inner_text()
    page.goto(f"{base}/")
    assert page.get_by_role("link", name="Practice letter").count() == 0  # not published yet

    # 3. A second version, compared with the first, then published.
    page.goto(f"{base}/authoring/practice-letter/")
    set_source(page, SOURCE.replace("Portsmouth PO1 3AX", "Portsmouth PO1 3AY"))
    page.wait_for_selector("#template-ok")
    page.get_by_role("button", name="Save as a new version").click()
    page.get_by_role("link", name="source and changes of version 2").click()
    diff = page.locator("pre.diff").inner_text()
    assert "-Portsmouth PO1 3AX" in diff and "+Portsmouth PO1 3AY" in diff
    page.get_by_role("link", name="Practice letter").click()
    page.get_by_role("button", name="Publish version 1").click()
    assert "Version 1 is published" in page.locator(".messages").inner_text()

    # 4. Fill a draft of it, let the model write, review, accept.
    page.goto(f"{base}/")
    page.get_by_role("link", name="Practice letter").click()
    page.get_by_label("Doctor").fill("Dr. Núñez")
    page.get_by_label("Your name").fill("Dr. Lea Martin")
    page.get_by_role("button", name="Create draft").click()
    page.wait_for_url(re.compile(r".*/drafts/\d+/$"))
    assert Draft.objects.get().template_version.number == 1
    page.get_by_label("Preset").select_option("fast")
    page.get_by_role("button", name="Fill unlocked").click()
    assert watch_job(page, job_id_of(page), job_in_background) == "succeeded"
    page.get_by_role("link", name="Review the text").click()
    accept_every_span(page)
    page.get_by_role("button", name="Accept draft").click()
    assert "Accepted as revision" in page.locator(".messages").inner_text()
    page.screenshot(path=str(screenshot_dir / "export.png"), full_page=True)

    # 5. The letter as PDF and as Word: locked text intact, every line break kept.
    with page.expect_download() as pdf:
        page.get_by_role("link", name="Letter as PDF (.pdf)").click()
    lines = [line.strip() for line in pdf_text(Path(pdf.value.path()).read_bytes()).splitlines()]
    assert lines[:3] == LETTERHEAD and "Dear Dr. Núñez," in lines and "DRAFT" not in lines
    at = lines.index(CLOSING[0])
    assert lines[at:at + 3] == [*CLOSING, "Dr. Lea Martin"]
    with page.expect_download() as docx:
        page.get_by_role("link", name="Word document (.docx)").click()
    paragraphs = [p.text for p in docx_of(Path(docx.value.path()).read_bytes()).paragraphs]
    assert paragraphs[0] == "\n".join(LETTERHEAD)
    assert paragraphs[1] == "Dear Dr. Núñez,"
    assert paragraphs[-1] == "\n".join([*CLOSING, "Dr. Lea Martin"])
