"""Staff teach Stencil a corpus in real headless Chromium: import (one bad file) → train at a
tiny budget → the evaluation table → promote for a template → a draft of that template filled
by a real Celery worker with the promoted version, which its run record in the admin names →
roll back, and the next fill names the version's parent."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corpora import selectors, services
from drafting.models import DocumentTemplate, InfillJob
from tests.browser.pages import FINAL, job_id_of
from tests.workers import PLACEHOLDER_MODEL

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
PASSWORD = "pw-sam-12345"


@pytest.fixture
def sam(django_user_model: Any) -> Any:
    """Staff who may also read run records in the admin."""
    from django.contrib.auth.models import Permission

    sam = django_user_model.objects.create_user(username="sam", password=PASSWORD, is_staff=True)
    sam.user_permissions.add(Permission.objects.get(codename="view_runrecord"))
    return sam


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


def fill_the_draft(page: Any, base: str, draft_id: int) -> InfillJob:
    """Ask for the draft's unlocked holes to be filled and wait on the job page until the
    worker process (not this one) has finished the job."""
    page.goto(f"{base}/drafts/{draft_id}/")
    page.get_by_label("Preset").select_option("fast")
    page.get_by_role("button", name="Fill unlocked").click()
    job_id = job_id_of(page)
    page.wait_for_function(
        f"'{FINAL}'.includes(document.getElementById('progress').dataset.state)", timeout=90_000
    )
    job = InfillJob.objects.get(pk=job_id)
    assert job.state == InfillJob.State.SUCCEEDED, job.reasons
    return job


def run_record_bodies(page: Any, base: str, job: InfillJob) -> list[dict[str, Any]]:
    """Each run record of the job as the admin's run record page shows its body."""
    page.goto(f"{base}/admin/audit/runrecord/?q={job.pk}")
    links = page.locator("#result_list tbody tr th a")
    urls = [links.nth(i).get_attribute("href") for i in range(links.count())]
    assert urls, f"no run record of job {job.pk} in the admin"
    bodies = []
    for url in urls:
        page.goto(f"{base}{url}")
        bodies.append(json.loads(page.locator(".field-body_pretty .readonly").inner_text()))
    return bodies


def test_import_train_evaluate_promote_fill_and_roll_back(
    page: Any, live_server: Any, sam: Any, train_in_background: Any, tmp_path: Path,
    referral: None, amqp_worker: Any, worker_settings: Any,
) -> None:  # fmt: skip
    base = live_server.url
    template = DocumentTemplate.objects.get(slug="referral")
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
    page.get_by_label("Promote for these templates (none chosen: as the default)").select_option(
        "referral")  # fmt: skip
    page.get_by_role("button", name="Promote").click()
    assert "now serves referral" in page.locator(".messages").inner_text()
    version = selectors.model_version_for_template(template)
    assert version is not None and version.corpus is not None and version.corpus.name == "Renewals"
    assert selectors.model_version_for_template(None) is None  # the default is untouched
    parent = version.parent
    assert parent is not None and parent.weights_sha256 != version.weights_sha256

    # A draft of that template, filled by the worker process with the promoted version.
    page.goto(f"{base}/")
    page.get_by_role("link", name="Referral letter").click()
    page.get_by_label("Referring to").fill("Dr. Imani Okafor")
    page.get_by_label("Patient name").fill("Jonas Berg")
    page.get_by_label("Date of birth").fill("1961-04-17")
    page.get_by_label("Your name").fill("Dr. Lea Martin")
    page.get_by_role("button", name="Create draft").click()
    draft_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    tuned = fill_the_draft(page, base, draft_id)
    assert tuned.worker.startswith(amqp_worker.name)  # the worker process ran it
    for body in run_record_bodies(page, base, tuned):
        assert body["stencil.model_version"] == {
            "id": version.pk, "name": version.name, "scope": "template:referral",
            "weights_sha256": version.weights_sha256,
        }  # fmt: skip
        assert body["stencil.model"]["dir"] == version.directory
        assert body["stencil.model"]["weights_sha256"] == version.weights_sha256

    # Roll back: the next fill of the same draft runs, and names, the version's parent.
    page.goto(f"{base}/corpora/models/")
    page.locator("#in-force tr", has_text="Referral letter").get_by_role(
        "button", name="Roll back").click()  # fmt: skip
    assert "Rolled back" in page.locator(".messages").inner_text()
    assert selectors.model_version_for_template(template) is None
    after = fill_the_draft(page, base, draft_id)
    assert after.worker == tuned.worker
    for body in run_record_bodies(page, base, after):
        assert body["stencil.model_version"]["id"] == parent.pk
        assert body["stencil.model_version"]["scope"] == "configured"
        assert body["stencil.model"]["weights_sha256"] == parent.weights_sha256
