"""Exports open in the programs people use: PDF and Word letters keep their lines."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.test import Client

from drafting import services
from drafting.models import Draft
from tests.drafting.helpers import reviewed_draft

LETTERHEAD = ("Harbour Family Practice", "12 Quay Street", "Portsmouth")


@pytest.fixture
def letterhead_version(db: Any) -> Any:
    source = "\n".join(LETTERHEAD) + (
        '\n\nDear {{ field("doctor", label="Doctor") }},\n\n'
        '{% infill "body", max_tokens=16 %}the body{% endinfill %}\n\n'
        'Kind regards,\n{{ field("sender", label="Sender") }}\n'
    )
    return services.template_version_create(slug="head", title="Letterhead", kind="letter",
                                            source=source)  # fmt: skip


@pytest.fixture
def letter(letterhead_version: Any, user: Any) -> Draft:
    draft = services.draft_create(owner=user, version=letterhead_version,
                                  values={"doctor": "Dr. Núñez", "sender": "Dr. Lea Martin"})
    body = draft.fragments.get(name="body")
    services.fragment_review(fragment=body, action="edit", user=user, text="Please see Jonas.")
    draft.refresh_from_db()
    return draft


def pdf_text(content: bytes) -> str:
    from pypdf import PdfReader

    return "\n".join(page.extract_text() for page in PdfReader(io.BytesIO(content)).pages)


def docx_of(content: bytes) -> Any:
    from docx import Document

    return Document(io.BytesIO(content))


def test_a_pdf_letter_keeps_its_letterhead_lines_and_locked_text(client_in: Client, letter: Draft,
                                                                 user: Any) -> None:  # fmt: skip
    services.draft_accept(draft=letter, expected_revision=letter.revision, user=user)
    response = client_in.get(f"/drafts/{letter.id}/export.pdf")
    assert response["Content-Type"] == "application/pdf"
    lines = [line.strip() for line in pdf_text(response.content).splitlines()]
    start = lines.index(LETTERHEAD[0])
    assert lines[start:start + 3] == list(LETTERHEAD)
    assert "Dear Dr. Núñez," in lines and "Kind regards," in lines
    assert lines[lines.index("Kind regards,") + 1] == "Dr. Lea Martin"
    assert "DRAFT" not in lines


def test_a_docx_letter_keeps_its_line_breaks_in_one_paragraph(client_in: Client, letter: Draft,
                                                             user: Any) -> None:  # fmt: skip
    services.draft_accept(draft=letter, expected_revision=letter.revision, user=user)
    response = client_in.get(f"/drafts/{letter.id}/export.docx")
    document = docx_of(response.content)
    paragraphs = [p.text for p in document.paragraphs]
    assert paragraphs[0] == "\n".join(LETTERHEAD)
    assert "Kind regards,\nDr. Lea Martin" in paragraphs
    assert not any("DRAFT" in p.text for p in document.sections[0].header.paragraphs)


def test_a_letter_not_accepted_is_watermarked_draft(client_in: Client, letter: Draft) -> None:
    pdf = pdf_text(client_in.get(f"/drafts/{letter.id}/export.pdf").content)
    assert "DRAFT" in pdf.split()
    header = docx_of(client_in.get(f"/drafts/{letter.id}/export.docx").content).sections[0].header
    assert header.paragraphs[0].text.startswith("DRAFT — Draft, not accepted")


def test_a_long_letter_wraps_and_runs_onto_more_pages(client_in: Client, draft: Draft,
                                                      user: Any) -> None:  # fmt: skip
    from pypdf import PdfReader

    reviewed_draft(draft, user)
    summary = draft.fragments.get(name="summary")
    services.fragment_review(fragment=summary, action="edit", user=user,
                             text="\n".join(f"Line {i} of a long story." for i in range(70)))
    content = client_in.get(f"/drafts/{draft.id}/export.pdf").content
    assert len(PdfReader(io.BytesIO(content)).pages) >= 2
    assert "Line 69 of a long story." in pdf_text(content)


def test_the_api_exports_pdf_and_refuses_an_unknown_format(token_client: Client, letter: Draft
                                                           ) -> None:  # fmt: skip
    ok = token_client.get(f"/api/v1/drafts/{letter.id}/export?format=pdf")
    assert ok.status_code == 200 and ok.content.startswith(b"%PDF")
    bad = token_client.get(f"/api/v1/drafts/{letter.id}/export?format=odt")
    assert bad.status_code == 400 and "pdf" in bad.json()["error"]
