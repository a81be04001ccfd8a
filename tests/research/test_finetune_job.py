"""A training run from its row to a registered, evaluated model version (in this process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from corpora import selectors, services
from corpora.models import Corpus, ModelVersion, TrainingRun
from research.finetune_job import finetune_run, run_paths
from tests.workers import PLACEHOLDER_MODEL

pytestmark = pytest.mark.django_db
TINY = {"steps": 3, "eval_cases": 2, "regression_cases": 1, "threads": 1, "held_out_share": 0.25}


@pytest.fixture
def staff(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="sam", password="pw-sam-12345",
                                                 is_staff=True)  # fmt: skip


@pytest.fixture
def places(settings: Any, tmp_path: Path) -> Any:
    settings.STENCIL_MODEL_DIR = PLACEHOLDER_MODEL
    settings.STENCIL_MODEL_VERSIONS_DIR = tmp_path / "versions"
    settings.STENCIL_TRAIN_DIR = tmp_path / "train"
    return settings


@pytest.fixture
def letters(staff: Any, places: Any) -> Corpus:
    corpus = services.corpus_create(owner=staff, name="Renewals")
    files = [(f"l{n}.txt", (f"Dear Ms Ode,\n\nYour tenancy at {n} Elm Row renews on 2027-05-0{n}. "
                            f"The rent is ${n},100.00 a month.\n\nYours sincerely,\nJo Brown").encode())
             for n in range(1, 9)]  # fmt: skip
    services.corpus_import(corpus=corpus, user=staff, files=files)
    corpus.refresh_from_db()
    return corpus


def test_a_run_registers_an_evaluated_version(letters: Corpus, staff: Any) -> None:
    run = services.training_run_start(corpus=letters, user=staff, config=dict(TINY))
    assert finetune_run(str(run.id)) == TrainingRun.State.SUCCEEDED
    run.refresh_from_db()
    version = run.model_version
    assert version is not None and version.state == ModelVersion.State.REGISTERED
    assert version.parent == run.base_version and version.corpus == letters
    assert Path(version.directory) == run_paths(run)[1]
    assert len(run.held_out) == 2  # a quarter of 8 documents, chosen before training
    assert run.evaluation is not None
    held = run.evaluation["held_out"]["per_kind"]
    assert held and all(row["n"] >= 1 for row in held.values())
    assert set(run.evaluation["regression"]["per_kind"]) >= {"sentence", "number_date"}
    assert run.progress["step"] == 3 and run.progress["total_steps"] == 3
    assert version.training_config["steps"] == 3
    assert finetune_run(str(run.id)) == TrainingRun.State.SUCCEEDED  # a second delivery: nothing
    assert ModelVersion.objects.filter(state=ModelVersion.State.REGISTERED).count() == 1


def test_the_run_page_shows_the_table_and_promotes(letters: Corpus, staff: Any, client: Client) -> None:
    run = services.training_run_start(corpus=letters, user=staff, config=dict(TINY))
    finetune_run(str(run.id))
    run.refresh_from_db()
    client.force_login(staff)
    page = client.get(f"/corpora/runs/{run.id}/").content.decode()
    assert 'id="eval-held_out"' in page and 'id="eval-regression"' in page
    assert "entity_left" in page or "sentence" in page
    assert run.model_version is not None
    client.post(f"/corpora/models/{run.model_version.id}/promote/", {})
    assert selectors.model_version_for_template(None) == run.model_version


def test_a_run_cancelled_while_queued_never_trains(letters: Corpus, staff: Any) -> None:
    run = services.training_run_start(corpus=letters, user=staff, config=dict(TINY))
    services.training_run_cancel(run=run)
    assert finetune_run(str(run.id)) == TrainingRun.State.CANCELLED
    run.refresh_from_db()
    assert run.state == TrainingRun.State.CANCELLED and run.model_version is None
    assert not run_paths(run)[0].exists()


def test_bad_settings_are_refused_by_name(letters: Corpus, staff: Any, client: Client) -> None:
    client.force_login(staff)
    response = client.post(f"/api/v1/corpora/{letters.id}/train", '{"minutes": -1, "lr": "fast"}',
                           content_type="application/json")  # fmt: skip
    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"minutes", "lr"}
    assert TrainingRun.objects.count() == 0


def test_one_run_at_a_time_per_corpus(letters: Corpus, staff: Any) -> None:
    from drafting.services import UserError

    services.training_run_start(corpus=letters, user=staff, config=dict(TINY))
    with pytest.raises(UserError, match="already queued or running"):
        services.training_run_start(corpus=letters, user=staff, config=dict(TINY))
