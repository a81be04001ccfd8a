"""The JSON API: token and session auth, every draft action, ad-hoc infill, clear errors."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from prometheus_client import REGISTRY

from drafting.models import Draft, Fragment, InfillJob
from tests.drafting.helpers import VALUES, fill, job_succeed, provisional_draft

pytestmark = pytest.mark.django_db

CANVAS = {
    "segments": [
        {"text": "Dear "}, {"hole": "name", "max_tokens": 8},
        {"text": ",\nYour appointment is "},
        {"hole": "when", "max_tokens": 4, "constraint": {"choices": ["Monday", "Friday"]}},
        {"text": "."},
    ],
    "seed": 7,
}


def post(client: Client, url: str, body: Any) -> Any:
    return client.post(url, json.dumps(body), content_type="application/json")


# -- auth ------------------------------------------------------------------------------------
def test_token_authenticates_without_csrf(token_client: Client, draft: Draft) -> None:
    response = post(token_client, f"/api/v1/drafts/{draft.id}/infill", {"preset": "fast"})
    assert response.status_code == 202


def test_session_write_without_csrf_token_is_403(user: Any, draft: Draft) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    response = post(client, f"/api/v1/drafts/{draft.id}/infill", {"preset": "fast"})
    assert response.status_code == 403
    assert "CSRF" in response.json()["error"]
    assert not InfillJob.objects.exists()


def test_session_write_with_csrf_header_is_allowed(user: Any, draft: Draft) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.get(f"/drafts/{draft.id}/")  # sets the csrftoken cookie, as the page does
    csrf = client.cookies["csrftoken"].value
    response = client.patch(f"/api/v1/drafts/{draft.id}", json.dumps({"values": {"doctor": "Dr. B"}}),
                            content_type="application/json", HTTP_X_CSRFTOKEN=csrf)  # fmt: skip
    assert response.status_code == 200
    assert response.json()["values"]["doctor"] == "Dr. B"


def test_session_reads_need_no_csrf(client_in: Client, draft: Draft) -> None:
    assert client_in.get(f"/api/v1/drafts/{draft.id}").status_code == 200


def test_token_page_shows_a_key_once_and_it_works(client_in: Client) -> None:
    html = client_in.post("/tokens/", {"name": "ci"}).content.decode()
    key = html.split('id="new-key">', 1)[1].split("<", 1)[0]
    assert Client(HTTP_AUTHORIZATION=f"Token {key}").get("/api/v1/drafts").status_code == 200
    assert key not in client_in.get("/tokens/").content.decode()


def test_revoked_token_stops_working(client_in: Client, user: Any, token: str) -> None:
    token_id = user.api_tokens.get().id
    client_in.post(f"/tokens/{token_id}/revoke/")
    assert Client(HTTP_AUTHORIZATION=f"Token {token}").get("/api/v1/drafts").status_code == 401


def test_revoking_someone_elses_token_is_a_404_and_keeps_it(user: Any, other_user: Any,
                                                             token: str) -> None:  # fmt: skip
    token_id = user.api_tokens.get().id
    other = Client()
    other.force_login(other_user)
    answer = other.post(f"/tokens/{token_id}/revoke/")
    assert answer.status_code == 404
    assert Client(HTTP_AUTHORIZATION=f"Token {token}").get("/api/v1/drafts").status_code == 200


# -- templates and drafts ---------------------------------------------------------------------
def test_templates_list_declares_fields_and_holes(token_client: Client, version: Any) -> None:
    (template,) = token_client.get("/api/v1/templates").json()["templates"]
    assert template["slug"] == "referral"
    assert [f["name"] for f in template["fields"]] == ["doctor", "patient_name", "birth_date",
                                                       "sender"]  # fmt: skip
    assert [h["name"] for h in template["holes"]] == ["reason", "urgency", "summary"]


def test_create_draft_returns_fragments_in_order(token_client: Client, version: Any) -> None:
    response = post(token_client, "/api/v1/drafts", {"template": "referral", "values": VALUES})
    assert response.status_code == 201
    body = response.json()
    assert [f["position"] for f in body["fragments"]] == list(range(len(body["fragments"])))
    assert "Jonas Berg" in "".join(f["text"] for f in body["fragments"])


def test_create_draft_with_invalid_values_gives_a_message_per_field(
    token_client: Client, version: Any
) -> None:
    bad = {**VALUES, "birth_date": "17/04/1961", "doctor": "x" * 61}
    response = post(token_client, "/api/v1/drafts", {"template": "referral", "values": bad})
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert "not a real date" in errors["birth_date"]
    assert "at most 60 characters" in errors["doctor"]
    assert not Draft.objects.exists()


def test_create_draft_from_unknown_template_is_404(token_client: Client, db: Any) -> None:
    response = post(token_client, "/api/v1/drafts", {"template": "nope", "values": {}})
    assert response.status_code == 404


def test_autosave_rejects_bad_values_and_keeps_the_saved_draft(
    token_client: Client, draft: Draft
) -> None:
    before = (draft.revision, dict(draft.values))
    response = token_client.patch(f"/api/v1/drafts/{draft.id}",
                                  json.dumps({"values": {"patient_name": ""}}),
                                  content_type="application/json")  # fmt: skip
    assert response.status_code == 400
    assert response.json()["errors"] == {"patient_name": "Patient name is required."}
    draft.refresh_from_db()
    assert (draft.revision, draft.values) == before


def test_lock_then_review_edit_accept_draft_and_export(token_client: Client, draft: Draft,
                                                      user: Any) -> None:  # fmt: skip
    base = f"/api/v1/drafts/{draft.id}"
    reason = fill(draft, "reason")
    locked = post(token_client, f"{base}/fragments/{reason.id}/lock", {"locked": True}).json()
    assert locked["locked"] is True
    post(token_client, f"{base}/fragments/{reason.id}/lock", {"locked": False})
    provisional_draft(draft, user)
    body = token_client.get(base).json()
    assert body["has_provisional"] is True
    for f in body["fragments"]:
        if f["kind"] == "fill":
            assert f["provisional"] is True
            action = {"action": "edit", "text": "routine"} if f["name"] == "urgency" else {
                "action": "accept"}  # fmt: skip
            assert post(token_client, f"{base}/fragments/{f['id']}/review", action).status_code == 200
    revision = token_client.get(base).json()["revision"]
    accepted = post(token_client, f"{base}/accept", {"revision": revision})
    assert accepted.status_code == 200 and accepted.json()["accepted"] is True
    again = post(token_client, f"{base}/accept", {"revision": revision})
    assert again.status_code == 409
    export = token_client.get(f"{base}/export?format=md")
    assert export["Content-Type"].startswith("text/markdown")
    assert "Urgency: routine." in export.content.decode()
    revisions = token_client.get(f"{base}/revisions").json()
    assert revisions["revisions"][0]["accepted"] is True


def test_regenerate_a_selection_queues_a_job_for_that_span_only(
    token_client: Client, draft: Draft
) -> None:
    first = draft.fragments.order_by("position").first()
    assert first is not None and first.text == "Dear "
    response = post(token_client, f"/api/v1/drafts/{draft.id}/fragments/{first.id}/regenerate",
                    {"start": 0, "end": 4, "preset": "careful"})  # fmt: skip
    assert response.status_code == 202
    job = InfillJob.objects.get(pk=response.json()["id"])
    assert job.preset == "careful" and len(job.target_fragments) == 1
    span = Fragment.objects.get(pk=job.target_fragments[0]["fragment"])
    assert (span.text, span.locked, span.kind) == ("Dear", False, "fill")


def test_infill_when_nothing_is_unlocked_says_so(token_client: Client, draft: Draft) -> None:
    for f in draft.fragments.filter(locked=False):
        post(token_client, f"/api/v1/drafts/{draft.id}/fragments/{f.id}/lock", {"locked": True})
    response = post(token_client, f"/api/v1/drafts/{draft.id}/infill", {})
    assert response.status_code == 400
    assert "nothing is unlocked" in response.json()["error"]


# -- ad-hoc infill and jobs -------------------------------------------------------------------
def test_adhoc_canvas_infill_returns_a_job_id(token_client: Client, user: Any) -> None:
    response = post(token_client, "/api/v1/infill", {**CANVAS, "preset": "fast"})
    assert response.status_code == 202
    job = InfillJob.objects.get(pk=response.json()["id"])
    assert job.draft is None and job.seed == 7 and job.preset == "fast"
    assert response.json()["state"] == "queued"


def test_job_detail_shows_progress_and_marks_the_result_provisional(
    token_client: Client, user: Any
) -> None:
    job_id = post(token_client, "/api/v1/infill", CANVAS).json()["id"]
    InfillJob.objects.filter(pk=job_id).update(state="running", progress={
        "attempt": 0, "step": 3, "max_steps": 12, "committed": 6, "positions": 12,
        "holes": {"name": {"stable": "Ms", "provisional": "Ms Novak"}}})  # fmt: skip
    body = token_client.get(f"/api/v1/jobs/{job_id}").json()
    assert body["progress"]["step"] == 3 and body["progress"]["committed_share"] == 0.5
    assert body["progress"]["holes"]["name"]["stable"] == "Ms"
    InfillJob.objects.filter(pk=job_id).update(state="succeeded", result={
        "holes": {"name": "Ms Novak", "when": "Friday"}, "document": "Dear Ms Novak..."})  # fmt: skip
    body = token_client.get(f"/api/v1/jobs/{job_id}").json()
    assert body["final"] is True and body["result"]["provisional"] is True


def test_cancel_a_queued_job_ends_it(token_client: Client, user: Any) -> None:
    job_id = post(token_client, "/api/v1/infill", CANVAS).json()["id"]
    body = post(token_client, f"/api/v1/jobs/{job_id}/cancel", {}).json()
    assert body["state"] == "cancelled" and body["reasons"]


def test_admission_control_answers_429_with_retry_after(token_client: Client, user: Any,
                                                        settings: Any) -> None:  # fmt: skip
    settings.STENCIL_MAX_QUEUED_JOBS_PER_USER = 1
    assert post(token_client, "/api/v1/infill", CANVAS).status_code == 202
    response = post(token_client, "/api/v1/infill", CANVAS)
    assert response.status_code == 429
    assert int(response["Retry-After"]) > 0
    assert "waiting" in response.json()["error"]
    refused = REGISTRY.get_sample_value("stencil_admission_refusals_total",
                                        {"reason": "user_limit"})  # fmt: skip
    assert post(token_client, "/api/v1/infill", CANVAS).status_code == 429
    assert REGISTRY.get_sample_value("stencil_admission_refusals_total",
                                     {"reason": "user_limit"}) == (refused or 0) + 1  # fmt: skip


def test_failed_job_reasons_are_in_the_answer(token_client: Client, draft: Draft) -> None:
    job_id = post(token_client, f"/api/v1/drafts/{draft.id}/infill", {}).json()["id"]
    InfillJob.objects.filter(pk=job_id).update(
        state="failed", reasons=["attempt 1 (diffusion): urgency: not one of the choices"])
    body = token_client.get(f"/api/v1/jobs/{job_id}").json()
    assert body["reasons"] == ["attempt 1 (diffusion): urgency: not one of the choices"]
    assert token_client.get(f"/api/v1/drafts/{draft.id}").json()["latest_job"]["state"] == "failed"


# -- hostile input ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"segments": "abc"}', "segments must be a non-empty list"),
        ('{"segments": [{"hole": "a", "max_tokens": "8"}]}', "max_tokens must be an integer"),
        ('{"segments": [{"hole": "a", "max_tokens": 8}], "evil": 1}', "unknown field"),
        ('{"segments": [{"hole": "a", "max_tokens": 8, "constraint": {"grammar": "x"}}]}',
         "unsupported constraint"),
        ('{"segments": [{"hole": "a", "max_tokens": 8, "constraint": {"schema": {"type": 5}}}]}',
         "not a valid JSON Schema"),
        ('{"segments": [{"hole": "a", "max_tokens": 8, "constraint": {"pattern": "("}}]}',
         "not a valid regex"),
        ('{"segments": [{"hole": "a", "max_tokens": 8, "constraint": {"pattern": '
         '"((a{100}){100}){100}"}}]}', "nested repeats multiply"),
        ('{"segments": [{"text": "x"}]}', "no hole"),
        ('{"segments": [{"hole": "a", "max_tokens": 8}], "preset": "reckless"}', "preset"),
        ('{"segments": [{"hole": "a", "max_tokens": 8}], "preset": 3}', "preset"),
        ('{"segments": [{"hole": "a", "max_tokens": 8}], "seed": -1}', "seed"),
        ('{"segments": [{"hole": "a", "max_tokens": 8}], "sampler": {"warp": 9}}', "sampler"),
        ("[" * 100_000, "not valid JSON"),
        ('{"segments": [{"hole": "a", "max_tokens": 8}], "seed": 100000000000000000000}', "seed"),
        ('{"segments": [{"text": "a\\u0000"}, {"hole": "a", "max_tokens": 8}]}', "NUL"),
        ('{"segments": [{"text": "a\\ud800"}, {"hole": "a", "max_tokens": 8}]}', "lone surrogate"),
        ('{"segments": [{"text": "\\uffff"}, {"hole": "a", "max_tokens": 8}]}', "noncharacter"),
        ('{"segments": [{"hole": "a", "max_tokens": 8}], "sampler": ' + "[" * 500 + "]" * 500
         + "}", "nested deeper"),
        ('{"segments": [{"hole": "a", "max_tokens": 8}], "sampler": ' + '{"a":' * 900 + "1"
         + "}" * 900 + "}", "nested deeper"),
    ],
)
def test_hostile_canvas_input_is_400_with_a_message(token_client: Client, user: Any,
                                                    body: str, message: str) -> None:  # fmt: skip
    response = token_client.post("/api/v1/infill", body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert message in response.json()["error"]
    assert not InfillJob.objects.exists()


def test_a_body_over_one_megabyte_is_refused(token_client: Client, user: Any) -> None:
    body = json.dumps({"segments": [{"text": "x" * 1_100_000}, {"hole": "a", "max_tokens": 4}]})
    response = token_client.post("/api/v1/infill", body, content_type="application/json")
    assert response.status_code == 413
    assert "larger than" in response.json()["error"]


def test_a_canvas_with_more_text_than_the_limit_is_413_before_it_is_queued(
    token_client: Client, user: Any, settings: Any,
) -> None:  # fmt: skip
    body = {"segments": [{"text": "x" * 900_000}, {"hole": "a", "max_tokens": 4}]}
    response = post(token_client, "/api/v1/infill", body)
    assert response.status_code == 413, response.content
    assert f"the limit is {settings.STENCIL_MAX_CANVAS_CHARS:,}" in response.json()["error"]
    assert not InfillJob.objects.exists()


@pytest.mark.parametrize(
    ("url", "body", "field"),
    [
        ("/api/v1/drafts/{d}", {"values": "doctor"}, "values"),
        ("/api/v1/drafts/{d}", {"values": {"doctor": ["a"]}}, "doctor"),
        ("/api/v1/drafts/{d}", {"values": {"shoe_size": 9}}, "__all__"),
        ("/api/v1/drafts/{d}", {"values": {"doctor": "Dr.\x00"}}, None),
        ("/api/v1/drafts/{d}/accept", {"revision": "3"}, "revision"),
        ("/api/v1/drafts/{d}/accept", {}, "revision"),
        ("/api/v1/drafts/{d}/infill", {"fragments": ["a"]}, "fragments"),
        ("/api/v1/drafts/{d}/infill", {"fragments": [999999]}, None),
        ("/api/v1/drafts/{d}/fragments/{f}/lock", {"locked": "yes"}, "locked"),
        ("/api/v1/drafts/{d}/fragments/{f}/review", {"action": "approve"}, None),
        ("/api/v1/drafts/{d}/fragments/{f}/regenerate", {"start": 0}, None),
        ("/api/v1/drafts/{d}/fragments/{f}/regenerate", {"start": 5, "end": 2}, None),
    ],
)
def test_wrong_types_and_unknown_fields_are_400_and_change_nothing(
    token_client: Client, draft: Draft, url: str, body: dict[str, Any], field: str | None
) -> None:
    before = (draft.revision, dict(draft.values), draft.fragments.count())
    target = url.format(d=draft.id, f=draft.fragments.order_by("position").first().id)  # type: ignore[union-attr]
    method = token_client.patch if url == "/api/v1/drafts/{d}" else token_client.post
    response = method(target, json.dumps(body), content_type="application/json")
    assert response.status_code == 400, response.content
    answer = response.json()
    assert answer["error"]
    if field is not None:
        assert field in answer["errors"]
    draft.refresh_from_db()
    assert (draft.revision, draft.values, draft.fragments.count()) == before
    assert not InfillJob.objects.exists()


def test_wrong_method_is_405(token_client: Client, draft: Draft) -> None:
    response = token_client.put(f"/api/v1/drafts/{draft.id}")
    assert response.status_code == 405 and "GET" in response["Allow"]


def test_only_staff_create_templates_and_broken_templates_get_a_message(
    token_client: Client, user: Any
) -> None:
    body = {"slug": "t", "title": "T", "kind": "letter", "source": "Hi {{ field('n') }}"}
    assert post(token_client, "/api/v1/templates", body).status_code == 403
    user.is_staff = True
    user.save()
    broken = post(token_client, "/api/v1/templates", {**body, "source": "{% for x in y %}{% endfor %}"})
    assert broken.status_code == 400 and "not allowed" in broken.json()["error"]
    created = post(token_client, "/api/v1/templates", body)
    assert created.status_code == 201 and created.json()["version"] == 1


# -- the OpenAPI document ---------------------------------------------------------------------
def test_openapi_document_describes_every_api_route(client: Client) -> None:
    from django.urls import get_resolver

    doc = client.get("/api/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    api = next(p for p in get_resolver().url_patterns if str(p.pattern) == "api/v1/")
    api_routes = {
        "/api/v1/" + str(p.pattern).replace("<int:", "{").replace("<uuid:", "{")
        .replace("<slug:", "{").replace(">", "}")
        for p in api.url_patterns  # type: ignore[union-attr]
    }  # fmt: skip
    assert api_routes == set(doc["paths"])
    for path_item in doc["paths"].values():
        for op in path_item.values():
            assert op["responses"] and op["summary"]


def test_job_canvas_from_job_succeed_helper_is_applied(token_client: Client, draft: Draft,
                                                       user: Any) -> None:  # fmt: skip
    job = InfillJob.objects.get(pk=post(token_client, f"/api/v1/drafts/{draft.id}/infill",
                                        {}).json()["id"])  # fmt: skip
    job_succeed(job)
    assert "worsening exertional chest pain" in token_client.get(
        f"/api/v1/drafts/{draft.id}").json()["fragments"][7]["text"]


@pytest.mark.parametrize("day", ["2025-02-30", "2031-13-45", "next month"])
def test_an_impossible_date_is_refused_by_the_server(token_client: Client, version: Any,
                                                     day: str) -> None:  # fmt: skip
    response = post(token_client, "/api/v1/drafts",
                    {"template": "referral", "values": {**VALUES, "birth_date": day}})  # fmt: skip
    assert response.status_code == 400
    assert "not a real date" in response.json()["errors"]["birth_date"]
    assert not Draft.objects.exists()


def test_a_date_written_out_is_stored_as_a_calendar_date(token_client: Client, version: Any
                                                         ) -> None:  # fmt: skip
    response = post(token_client, "/api/v1/drafts",
                    {"template": "referral", "values": {**VALUES, "birth_date": "17 April 1961"}})
    assert response.status_code == 201
    assert response.json()["values"]["birth_date"] == "1961-04-17"
    assert "born 17 April 1961" in "".join(f["text"] for f in response.json()["fragments"])


def test_deleting_a_draft_through_the_api_leaves_nothing_of_it(token_client: Client,
                                                               draft: Draft, user: Any) -> None:
    from drafting import services

    job = services.draft_infill_request(draft=draft, user=user, preset="fast")
    busy = token_client.delete(f"/api/v1/drafts/{draft.id}")
    assert busy.status_code == 409 and Draft.objects.filter(pk=draft.pk).exists()
    services.infill_job_cancel(job=job)
    assert token_client.delete(f"/api/v1/drafts/{draft.id}").status_code == 204
    assert not Draft.objects.filter(pk=draft.pk).exists()
    assert token_client.get(f"/api/v1/drafts/{draft.id}").status_code == 404
