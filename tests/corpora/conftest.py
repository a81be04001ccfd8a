"""Corpora fixtures: a staff member, logged-in clients, a corpus, files of every kind."""

from __future__ import annotations

import io
import zipfile
from typing import Any

import pytest
from django.test import Client

from corpora import services
from corpora.models import Corpus


@pytest.fixture
def staff(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="sam", password="pw-sam-12345",
                                                 is_staff=True)  # fmt: skip


@pytest.fixture
def staff_client(client: Client, staff: Any) -> Client:
    client.force_login(staff)
    return client


@pytest.fixture
def corpus(staff: Any) -> Corpus:
    return services.corpus_create(owner=staff, name="Tenancy letters")


def docx_bytes(*paragraphs: str) -> bytes:
    import docx

    document = docx.Document()
    for text in paragraphs:
        document.add_paragraph(text)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def zip_bytes(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return out.getvalue()


LETTER = "Dear Ms Patel,\n\nYour tenancy at 4 Elm Row renews on 1 May 2027.\n\nYours sincerely,\nJo Brown"
