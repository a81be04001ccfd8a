"""Only staff see corpora, train or promote: every page and API answer refuses anybody else."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from corpora import services
from corpora.models import Corpus, CorpusDocument
from tests.corpora.conftest import LETTER

pytestmark = pytest.mark.django_db


@pytest.fixture
def filled(corpus: Corpus, staff: Any) -> tuple[Corpus, CorpusDocument]:
    services.corpus_import(corpus=corpus, user=staff, files=[("a.txt", LETTER.encode())])
    return corpus, CorpusDocument.objects.get(corpus=corpus)


@pytest.fixture
def version(settings: Any) -> Any:
    from pathlib import Path

    return services.model_version_for_directory(directory=Path(settings.STENCIL_MODEL_DIR))


def _pages(corpus: Corpus, document: CorpusDocument, version: Any) -> list[tuple[str, str]]:
    return [
        ("get", "/corpora/"), ("post", "/corpora/"), ("get", f"/corpora/{corpus.id}/"),
        ("post", f"/corpora/{corpus.id}/upload/"), ("get", f"/corpora/{corpus.id}/documents/{document.id}/"),
        ("post", f"/corpora/{corpus.id}/train/"), ("get", "/corpora/models/"),
        ("post", f"/corpora/models/{version.id}/promote/"), ("post", "/corpora/models/rollback/"),
    ]  # fmt: skip


def _api(corpus: Corpus, document: CorpusDocument, version: Any) -> list[tuple[str, str]]:
    return [
        ("get", "/api/v1/corpora"), ("post", "/api/v1/corpora"), ("get", f"/api/v1/corpora/{corpus.id}"),
        ("post", f"/api/v1/corpora/{corpus.id}/documents"),
        ("get", f"/api/v1/corpora/{corpus.id}/documents/{document.id}"),
        ("post", f"/api/v1/corpora/{corpus.id}/train"), ("get", "/api/v1/model-versions"),
        ("post", f"/api/v1/model-versions/{version.id}/promote"), ("post", "/api/v1/model-versions/rollback"),
    ]  # fmt: skip


def test_non_staff_pages_answer_403(client: Client, user: Any, filled: Any, version: Any) -> None:
    client.force_login(user)  # a reviewer, not staff
    for method, url in _pages(filled[0], filled[1], version):
        response = getattr(client, method)(url, {"name": "x", "minutes": "1"})
        assert response.status_code == 403, (method, url)
        assert b"Patel" not in response.content


def test_non_staff_api_answers_403(user: Any, filled: Any, version: Any) -> None:
    from drafting.auth import api_token_create

    token = api_token_create(user=user, name="script")[1]
    api = Client(HTTP_AUTHORIZATION=f"Token {token}")
    for method, url in _api(filled[0], filled[1], version):
        if method == "get":
            response = api.get(url)
        else:
            response = api.post(url, "{}", content_type="application/json")
        assert response.status_code == 403, (method, url, response.content)
        assert b"Patel" not in response.content


def test_anonymous_is_sent_to_log_in_or_told_401(client: Client, filled: Any, version: Any) -> None:
    corpus, document = filled
    page = client.get(f"/corpora/{corpus.id}/documents/{document.id}/")
    assert page.status_code == 302 and "/accounts/login/" in page["Location"]
    assert client.get(f"/api/v1/corpora/{corpus.id}").status_code == 401


def test_nothing_was_written_by_refused_requests(client: Client, user: Any, filled: Any,
                                                 version: Any) -> None:  # fmt: skip
    from corpora.models import Promotion, TrainingRun

    client.force_login(user)
    for method, url in _pages(filled[0], filled[1], version):
        getattr(client, method)(url, {"name": "x"})
    assert Corpus.objects.count() == 1 and CorpusDocument.objects.count() == 1
    assert TrainingRun.objects.count() == 0 and Promotion.objects.count() == 0


def test_staff_read_the_document(staff_client: Client, filled: Any) -> None:
    corpus, document = filled
    page = staff_client.get(f"/corpora/{corpus.id}/documents/{document.id}/")
    assert page.status_code == 200 and b"Ms Patel" in page.content
