"""The admin's run record page: replay a run, open an incident on it, queue replays of many."""

from __future__ import annotations

from typing import Any

import pytest

from audit.models import AuditEvent, Incident, RunRecord
from drafting import services
from drafting.models import InfillJob, TemplateVersion
from tests.drafting.helpers import VALUES

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ADMIN_PASSWORD = "pw-root-123"


@pytest.fixture
def root(django_user_model: Any) -> Any:
    return django_user_model.objects.create_superuser(username="root", password=ADMIN_PASSWORD)


@pytest.fixture
def run(alice: Any, referral: None, dispatched: list[str]) -> RunRecord:
    """A real run record: the referral draft's infill, run by the worker's pipeline here."""
    from gpu_worker.pipeline import job_run

    version = TemplateVersion.objects.get(template__slug="referral")
    draft = services.draft_create(owner=alice, version=version, values=dict(VALUES))
    job = services.draft_infill_request(draft=draft, user=alice, preset="fast")
    assert job_run(job_id=str(job.id), worker="admin-test") == InfillJob.State.SUCCEEDED
    job.refresh_from_db()  # a low-confidence diffusion result escalates: the result's run is the one
    assert job.result is not None
    return RunRecord.objects.filter(job_id=str(job.id)).get(pk=job.result["run_id"])


def admin_log_in(page: Any, base: str) -> None:
    page.goto(f"{base}/admin/login/")
    page.get_by_label("Username").fill("root")
    page.get_by_label("Password").fill(ADMIN_PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base}/admin/")


def test_the_replay_button_on_a_run_record_replays_it(live_server: Any, page: Any, root: Any,
                                                      run: RunRecord) -> None:  # fmt: skip
    admin_log_in(page, live_server.url)
    page.goto(f"{live_server.url}/admin/audit/runrecord/{run.pk}/change/")
    with page.expect_response(lambda r: r.url.endswith("/replay/")) as answer:
        page.get_by_role("button", name="Replay this run and compare the trace").first.click()
    assert answer.value.status == 302  # not 403: the form is not nested in the change form
    assert "identical" in page.locator(".messagelist").inner_text()
    assert "identical" in page.locator("#last-replay").inner_text()
    assert AuditEvent.objects.filter(kind=AuditEvent.Kind.RUN_REPLAYED,
                                     subject=f"run:{run.pk}").count() == 1  # fmt: skip


def test_an_admin_opens_an_incident_from_a_run_record(live_server: Any, page: Any, root: Any,
                                                      run: RunRecord) -> None:  # fmt: skip
    admin_log_in(page, live_server.url)
    page.goto(f"{live_server.url}/admin/audit/runrecord/{run.pk}/change/")
    page.get_by_role("link", name="Open an incident on this run").click()
    page.get_by_role("button", name="Open the incident").click()
    assert "Say what is wrong" in page.locator("#summary-error").inner_text()
    page.get_by_label("What is wrong").fill("The summary invents an ECG result.")
    page.get_by_role("button", name="Open the incident").click()
    incident = Incident.objects.get()
    assert (incident.run_id, incident.reporter_name) == (run.pk, "root")
    assert f"Incident {incident.pk} opened" in page.locator(".messagelist").inner_text()


def test_the_list_action_queues_replays_instead_of_running_them(
    live_server: Any, page: Any, root: Any, run: RunRecord, monkeypatch: pytest.MonkeyPatch
) -> None:
    from audit import admin as audit_admin

    queued: list[str] = []
    monkeypatch.setattr(audit_admin, "replay_dispatch", lambda *, run_id: queued.append(run_id))
    admin_log_in(page, live_server.url)
    page.goto(f"{live_server.url}/admin/audit/runrecord/")
    page.locator(f"input.action-select[value='{run.pk}']").check()
    page.locator("select[name=action]").select_option("replay_selected")
    page.get_by_role("button", name="Go").click()
    assert "1 replay(s) queued" in page.locator(".messagelist").inner_text()
    assert queued == [str(run.pk)]
    assert not AuditEvent.objects.filter(kind=AuditEvent.Kind.RUN_REPLAYED).exists()
