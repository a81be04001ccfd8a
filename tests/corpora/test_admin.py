"""The admin lists corpora, documents (never their text), runs with progress, versions."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from corpora import services
from corpora.models import Corpus, TrainingRun
from tests.corpora.conftest import LETTER

pytestmark = pytest.mark.django_db


def test_admin_lists_runs_with_their_progress(client: Client, django_user_model: Any,
                                              corpus: Corpus, staff: Any, settings: Any) -> None:  # fmt: skip
    from pathlib import Path

    admin_user = django_user_model.objects.create_superuser("root", "r@example.com", "pw-root-1234")
    client.force_login(admin_user)
    services.corpus_import(corpus=corpus, user=staff, files=[("a.txt", LETTER.encode())])
    base = services.model_version_for_directory(directory=Path(settings.STENCIL_MODEL_DIR))
    TrainingRun.objects.create(corpus=corpus, base_version=base, state="running",
                               progress={"step": 7, "total_steps": 40, "loss": 2.5, "tokens": 900,
                                         "eta_seconds": 33.0})  # fmt: skip
    runs = client.get("/admin/corpora/trainingrun/").content.decode()
    assert "7 of 40" in runs and "2.500" in runs and "33 s" in runs
    for model in ("corpus", "corpusdocument", "corpusimport", "modelversion", "promotion"):
        assert client.get(f"/admin/corpora/{model}/").status_code == 200
    documents = client.get("/admin/corpora/corpusdocument/").content.decode()
    assert "a.txt" in documents and "Patel" not in documents
