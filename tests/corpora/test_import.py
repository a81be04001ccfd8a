"""Importing documents: every supported kind, each skip with its reason, text sealed at rest."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from audit.crypto import DecryptionError
from corpora import selectors, services
from corpora.models import Corpus, CorpusDocument, CorpusImport
from tests.corpora.conftest import LETTER, docx_bytes, zip_bytes

pytestmark = pytest.mark.django_db


def _reasons(outcome: services.ImportOutcome) -> dict[str, str]:
    return {e["name"]: e["reason"] for e in outcome.skipped}


def test_import_reads_text_markdown_docx_and_zip_members(corpus: Corpus, staff: Any) -> None:
    files = [
        ("a.txt", LETTER.encode()),
        ("b.md", b"# Notice\n\nThe rent rises to $1,450.00 a month.\r\n"),
        ("c.docx", docx_bytes("Dear Mr Ode,", "Your deposit of $900.00 is returned.")),
        ("bundle.zip", zip_bytes({"inner/d.txt": b"Second letter.", ".DS_Store": b"\0\0"})),
    ]
    outcome = services.corpus_import(corpus=corpus, user=staff, files=files)
    assert [e["name"] for e in outcome.added] == ["a.txt", "b.md", "c.docx", "bundle.zip/inner/d.txt"]
    assert outcome.skipped == []
    texts = {name: text for _, name, text in selectors.corpus_texts(corpus=corpus)}
    assert texts["b.md"] == "# Notice\n\nThe rent rises to $1,450.00 a month."  # CRLF normalised
    assert texts["c.docx"] == "Dear Mr Ode,\nYour deposit of $900.00 is returned."
    corpus.refresh_from_db()
    assert corpus.documents == 4
    assert corpus.tokens == sum(e["tokens"] for e in outcome.added) > 0


def test_each_skipped_file_names_its_reason(corpus: Corpus, staff: Any, settings: Any) -> None:
    settings.STENCIL_CORPUS_MAX_FILE_BYTES = 200
    files = [
        ("first.txt", LETTER.encode()),
        ("again.txt", LETTER.encode() + b"\n\n"),  # the same text once normalised
        ("blank.md", b"  \n\n \t\n"),
        ("big.txt", b"x" * 201),
        ("latin1.txt", "Caf\xe9".encode("latin-1")),
        ("broken.docx", b"PK\x03\x04 not really a zip"),
        ("scan.pdf", b"%PDF-1.4"),
        ("nested.zip", zip_bytes({"deeper.zip": b"PK"})),
    ]
    outcome = services.corpus_import(corpus=corpus, user=staff, files=files)
    reasons = _reasons(outcome)
    assert [e["name"] for e in outcome.added] == ["first.txt"]
    assert reasons["again.txt"] == "duplicate of first.txt"
    assert reasons["blank.md"].startswith("empty")
    assert reasons["big.txt"].startswith("over the limit: 201 bytes")
    assert reasons["latin1.txt"].startswith("unreadable: not UTF-8")
    assert reasons["broken.docx"].startswith("unreadable: not a Word document")
    assert reasons["scan.pdf"].startswith("unsupported file type (.pdf)")
    assert reasons["nested.zip/deeper.zip"].startswith("unsupported: a zip inside a zip")
    batch = CorpusImport.objects.get(pk=outcome.batch.pk)
    assert (batch.added, batch.skipped) == (1, 7)


def test_a_bad_upload_loses_nothing_already_imported(corpus: Corpus, staff: Any) -> None:
    services.corpus_import(corpus=corpus, user=staff, files=[("a.txt", LETTER.encode())])
    outcome = services.corpus_import(corpus=corpus, user=staff,
                                     files=[("a copy.txt", LETTER.encode()), ("x.exe", b"MZ")])  # fmt: skip
    assert outcome.added == []
    corpus.refresh_from_db()
    assert corpus.documents == 1
    assert [t for _, _, t in selectors.corpus_texts(corpus=corpus)] == [LETTER]


def test_documents_are_stored_sealed_and_bound_to_their_row(corpus: Corpus, staff: Any) -> None:
    services.corpus_import(corpus=corpus, user=staff, files=[("a.txt", LETTER.encode())])
    document = CorpusDocument.objects.get(corpus=corpus)
    assert b"Patel" not in bytes(document.ciphertext)
    assert selectors.document_text(document=document) == LETTER
    other = services.corpus_create(owner=staff, name="Other")
    CorpusDocument.objects.filter(pk=document.pk).update(corpus=other)  # moved to another corpus
    document.refresh_from_db()
    with pytest.raises(DecryptionError):
        selectors.document_text(document=document)


def test_upload_page_shows_each_file_outcome(staff_client: Client, corpus: Corpus) -> None:
    from django.core.files.uploadedfile import SimpleUploadedFile

    files = [SimpleUploadedFile("a.txt", LETTER.encode()), SimpleUploadedFile("b.pdf", b"%PDF")]
    response = staff_client.post(f"/corpora/{corpus.id}/upload/", {"files": files}, follow=True)
    assert response.status_code == 200
    page = response.content.decode()
    assert "1 added, 1 skipped" in page
    assert "unsupported file type (.pdf)" in page
    assert "skipped 1 file(s)" in page


def test_api_upload_returns_the_report(staff_client: Client, corpus: Corpus) -> None:
    from django.core.files.uploadedfile import SimpleUploadedFile

    response = staff_client.post(f"/api/v1/corpora/{corpus.id}/documents",
                                 {"files": [SimpleUploadedFile("a.md", b"# Hello")]})  # fmt: skip
    assert response.status_code == 201
    body = response.json()
    assert body["import"]["added"] == 1 and body["corpus"]["documents"] == 1
    doc_id = CorpusDocument.objects.get(corpus=corpus).id
    detail = staff_client.get(f"/api/v1/corpora/{corpus.id}/documents/{doc_id}").json()
    assert detail["text"] == "# Hello"


def test_management_command_imports_a_directory(tmp_path: Any, staff: Any, capsys: Any) -> None:
    (tmp_path / "letters").mkdir()
    (tmp_path / "letters" / "one.txt").write_text(LETTER)
    (tmp_path / "letters" / "two.md").write_text("Another letter.")
    (tmp_path / "letters" / "notes.toml").write_text("x = 1")
    call_command("corpus_import", str(tmp_path / "letters"), "--name", "Letters", "--user", "sam")
    out = capsys.readouterr().out
    corpus = Corpus.objects.get(name="Letters")
    assert corpus.documents == 2
    assert "skipped  notes.toml: unsupported file type (.toml)" in out
    assert f"corpus {corpus.id} (Letters): 2 added, 1 skipped" in out
