"""Staff teach Stencil a corpus in real headless Chromium: import (one bad file) → train at a
tiny budget → the evaluation table → promote → roll back."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corpora import selectors, services
from tests.workers import PLACEHOLDER_MODEL

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
PASSWORD = "pw-sam-12345"


@pytest.fixture
def sam(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="sam", password=PASSWORD, is_staff=True)


@pytest.fixture
def train_in_background(monkeypatch: pytest.MonkeyPatch, settings: Any,
                        tmp_path: Path) -> Iterator[list[threading.Thread]]:  # fmt: skip
    """A started run is trained on a thread here, as the train worker would, not sent."""
    from research.finetune_job import finetune_run

    settings.STENCIL_MODEL_DIR = PLACEHOLDER_MODEL
    settings.STENCIL_MODEL_VERSIONS_DIR = tmp_path / "versions"
    settings.STENCIL_TRAIN_DIR = tmp_path / "train"
    threads: list[threading.Thread] = []

    def train(run_id: str) -> None:
        from django.db import connections

        try:
            finetune_run(run_id)
        finally:
            connections.close_all()

    def dispatch(*, run_id: str) -> bool:
        thread = threading.Thread(target=train, args=(run_id,), daemon=True)
        thread.start()
        threads.append(thread)
        return True

    monkeypatch.setattr(services, "training_run_dispatch", dispatch)
    yield threads
    for thread in threads:
        thread.join(timeout=120)


def test_import_train_evaluate_promote_and_roll_back(
    page: Any, live_server: Any, sam: Any, train_in_background: Any, tmp_path: Path
) -> None:
    base = live_server.url
    letters = []
    for n in range(1, 7):
        path = tmp_path / f"renewal-{n}.txt"
        path.write_text(f"Dear Ms Ode,\n\nYour tenancy at {n} Elm Row renews on 2027-05-0{n}. "
                        f"The rent is ${n},100.00 a month.\n\nYours sincerely,\nJo Brown")  # fmt: skip
        letters.append(str(path))
    bad = tmp_path / "scan.pdf"
    bad.write_bytes(b"%PDF-1.4")
    page.goto(f"{base}/accounts/login/")
    page.get_by_label("Username").fill("sam")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.goto(f"{base}/corpora/")
    page.get_by_label("Name of a new corpus").fill("Renewals")
    page.get_by_role("button", name="Create corpus").click()
    page.get_by_label("Plain text, Markdown or Word").set_input_files([*letters, str(bad)])
    page.get_by_role("button", name="Import").click()
    assert "6 added, 1 skipped" in page.locator("#import-summary").inner_text()
    assert "unsupported file type (.pdf)" in page.locator("#import-report").inner_text()
    page.get_by_role("link", name="Back to Renewals").click()
    page.get_by_label("Exact steps").fill("3")
    page.get_by_label("Held-out cases per hole kind").fill("2")
    page.get_by_label("Original test-split cases per hole kind").fill("1")
    page.get_by_label("CPU threads").fill("1")
    page.get_by_role("button", name="Start training").click()
    page.wait_for_selector("#run-state:text('succeeded')", timeout=120_000)  # the page refreshes
    assert page.locator("#eval-held_out tbody tr").count() >= 1
    page.get_by_role("button", name="Promote").click()
    version = selectors.model_version_for_template(None)
    assert version is not None and version.corpus is not None and version.corpus.name == "Renewals"
    assert "now serves the default" in page.locator(".messages").inner_text()
    page.locator("#in-force").get_by_role("button", name="Roll back").click()
    assert "Rolled back" in page.locator(".messages").inner_text()
    assert selectors.model_version_for_template(None) is None
