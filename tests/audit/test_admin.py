from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import reverse

from audit.models import AuditEvent
from audit.services import incident_open
from tests.audit.conftest import SNAPSHOT_MARKER


@pytest.fixture
def staff(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(
        username="stan", password="pw-stan-123", is_staff=True
    )


@pytest.mark.parametrize(
    "query",
    ["", "?route=diffusion", "?has_incident=yes", "?has_incident=no",
     "?model_name=stencil-placeholder", "?created__gte=2000-01-01T00:00:00%2B00:00"],
)  # fmt: skip
def test_run_list_renders_with_filters(record_fake: Any, admin_client: Client, query: str) -> None:
    run = record_fake()
    incident_open(kind="fallback", summary="x", run=run)
    response = admin_client.get(reverse("admin:audit_runrecord_changelist") + query)
    assert response.status_code == 200


def test_run_page_shows_the_trace_timeline_and_replay_button(
    record_fake: Any, admin_client: Client
) -> None:
    run = record_fake()
    response = admin_client.get(reverse("admin:audit_runrecord_change", args=[run.pk]))
    html = response.content.decode()
    assert response.status_code == 200
    assert "Trace timeline (3 steps" in html
    assert reverse("admin:audit_runrecord_replay", args=[run.pk]) in html
    assert SNAPSHOT_MARKER not in html


def test_audit_rows_cannot_be_deleted_or_edited_in_the_admin(
    record_fake: Any, admin_client: Client
) -> None:
    run = record_fake()
    delete = admin_client.post(reverse("admin:audit_runrecord_delete", args=[run.pk]))
    assert delete.status_code == 403
    page = admin_client.get(reverse("admin:audit_runrecord_changelist")).content.decode()
    assert "delete_selected" not in page


def test_incident_list_and_bundle_export(record_fake: Any, admin_client: Client) -> None:
    incident = incident_open(kind="user_report", summary="wrong", run=record_fake())
    url = reverse("admin:audit_incident_changelist")
    assert admin_client.get(url + "?kind=user_report").status_code == 200
    response = admin_client.post(
        url, {"action": "export_bundles", "_selected_action": [incident.pk]}
    )
    assert response.status_code == 200
    assert response.json()["incident"]["id"] == incident.pk


def test_diagnostic_read_view_is_for_auditors_and_audited(
    record_fake: Any, client: Client, staff: Any
) -> None:
    diagnostic = record_fake().diagnostics.get()
    url = reverse("admin:audit_diagnostic_read", args=[diagnostic.pk])
    client.force_login(staff)
    assert client.get(url).status_code == 403
    staff.groups.add(Group.objects.get_or_create(name="auditors")[0])
    response = client.get(url)
    assert response.status_code == 200
    assert SNAPSHOT_MARKER in response.content.decode()
    kinds = set(AuditEvent.objects.values_list("kind", flat=True))
    assert {"diagnostic_read", "diagnostic_read_denied"} <= kinds


def test_replay_button_runs_the_replay_and_reports_it(
    record_fake: Any, admin_client: Client
) -> None:
    run = record_fake()  # a fake trace: the real sampler cannot match it
    response = admin_client.post(
        reverse("admin:audit_runrecord_replay", args=[run.pk]), follow=True
    )
    assert response.status_code == 200
    assert "diverged at step 0" in response.content.decode()


def test_replay_action_queues_a_replay_per_selected_run(
    record_fake: Any, admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from audit import admin as audit_admin

    queued: list[str] = []
    monkeypatch.setattr(audit_admin, "replay_dispatch", lambda *, run_id: queued.append(run_id))
    run = record_fake()
    response = admin_client.post(
        reverse("admin:audit_runrecord_changelist"),
        {"action": "replay_selected", "_selected_action": [str(run.pk)]},
        follow=True,
    )
    msgs = [str(m) for m in response.context["messages"]]
    assert any(m.startswith("1 replay(s) queued") for m in msgs), msgs
    assert queued == [str(run.pk)]
