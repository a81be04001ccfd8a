"""Another person's draft, job and export are unreachable through the pages and the API (404)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from drafting import services
from drafting.models import Draft, InfillJob
from tests.drafting.helpers import fill

pytestmark = pytest.mark.django_db


@pytest.fixture
def other_job(other_draft: Draft, other_user: Any) -> InfillJob:
    return services.draft_infill_request(draft=other_draft, user=other_user, preset="fast")


def test_pages_of_another_users_draft_are_404(client_in: Client, other_draft: Draft) -> None:
    for url in [
        f"/drafts/{other_draft.id}/",
        f"/drafts/{other_draft.id}/review/",
        f"/drafts/{other_draft.id}/export.txt",
        f"/drafts/{other_draft.id}/export.md",
    ]:
        assert client_in.get(url).status_code == 404, url


def test_page_writes_to_another_users_draft_are_404_and_change_nothing(
    client_in: Client, other_draft: Draft
) -> None:
    frag = fill(other_draft, "reason")
    before = other_draft.revision
    posts = [
        (f"/drafts/{other_draft.id}/values/", {"doctor": "Eve"}),
        (f"/drafts/{other_draft.id}/fill/", {"preset": "fast"}),
        (f"/drafts/{other_draft.id}/regenerate/", {"fragment": frag.id}),
        (f"/drafts/{other_draft.id}/fragments/{frag.id}/lock/", {"locked": "1"}),
        (f"/drafts/{other_draft.id}/fragments/{frag.id}/review/", {"action": "edit", "text": "x"}),
        (f"/drafts/{other_draft.id}/accept/", {"revision": before}),
    ]
    for url, data in posts:
        assert client_in.post(url, data).status_code == 404, url
    other_draft.refresh_from_db()
    assert other_draft.revision == before
    assert other_draft.values["doctor"] != "Eve"
    assert not InfillJob.objects.filter(draft=other_draft).exists()


def test_own_fragment_id_under_another_draft_is_404(
    client_in: Client, draft: Draft, other_draft: Draft
) -> None:
    """Mixing my draft id with another draft's fragment id reaches nothing."""
    theirs = fill(other_draft, "reason")
    url = f"/drafts/{draft.id}/fragments/{theirs.id}/lock/"
    assert client_in.post(url, {"locked": "1"}).status_code == 404
    theirs.refresh_from_db()
    assert theirs.locked is False


def test_job_page_and_cancel_of_another_user_are_404(
    client_in: Client, other_job: InfillJob
) -> None:
    assert client_in.get(f"/jobs/{other_job.id}/").status_code == 404
    assert client_in.post(f"/jobs/{other_job.id}/cancel/").status_code == 404
    other_job.refresh_from_db()
    assert other_job.state == InfillJob.State.QUEUED and not other_job.cancel_requested


def test_api_reads_of_another_users_objects_are_404(
    token_client: Client, other_draft: Draft, other_job: InfillJob
) -> None:
    for url in [
        f"/api/v1/drafts/{other_draft.id}",
        f"/api/v1/drafts/{other_draft.id}/revisions",
        f"/api/v1/drafts/{other_draft.id}/export?format=txt",
        f"/api/v1/jobs/{other_job.id}",
    ]:
        response = token_client.get(url)
        assert response.status_code == 404, url
        assert "error" in response.json()


def test_api_writes_to_another_users_objects_are_404(
    token_client: Client, other_draft: Draft, other_job: InfillJob
) -> None:
    frag = fill(other_draft, "reason")
    base = f"/api/v1/drafts/{other_draft.id}"
    calls = [
        ("patch", base, {"values": {"doctor": "Eve"}}),
        ("post", f"{base}/infill", {"preset": "fast"}),
        ("post", f"{base}/fragments/{frag.id}/lock", {"locked": True}),
        ("post", f"{base}/fragments/{frag.id}/review", {"action": "edit", "text": "x"}),
        ("post", f"{base}/fragments/{frag.id}/regenerate", {}),
        ("post", f"{base}/accept", {"revision": other_draft.revision}),
        ("post", f"/api/v1/jobs/{other_job.id}/cancel", {}),
    ]
    for method, url, body in calls:
        response = getattr(token_client, method)(url, body, content_type="application/json")
        assert response.status_code == 404, url
    other_job.refresh_from_db()
    assert not other_job.cancel_requested


def test_lists_show_only_my_drafts_and_jobs(
    token_client: Client, draft: Draft, other_draft: Draft, other_job: InfillJob
) -> None:
    drafts = token_client.get("/api/v1/drafts").json()["drafts"]
    assert [d["id"] for d in drafts] == [draft.id]
    assert token_client.get("/api/v1/jobs").json()["jobs"] == []


def test_home_lists_only_my_drafts(client_in: Client, draft: Draft, other_draft: Draft,
                                   other_user: Any) -> None:  # fmt: skip
    Draft.objects.filter(pk=other_draft.pk).update(title="Mallory's secret letter")
    html = client_in.get("/").content.decode()
    assert f"/drafts/{draft.id}/" in html
    assert "Mallory&#x27;s secret letter" not in html and f"/drafts/{other_draft.id}/" not in html


def test_anonymous_pages_redirect_to_login_and_api_answers_401(draft: Draft) -> None:
    anonymous = Client()
    response = anonymous.get(f"/drafts/{draft.id}/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    api = anonymous.get(f"/api/v1/drafts/{draft.id}")
    assert api.status_code == 401 and api["WWW-Authenticate"].startswith("Token")


def test_a_wrong_token_is_401_not_someone_else(draft: Draft) -> None:
    response = Client(HTTP_AUTHORIZATION="Token not-a-real-key").get("/api/v1/drafts")
    assert response.status_code == 401
    assert "not valid" in response.json()["error"]
