"""The pages: form generation and validation, locks, selection, fill, progress, review, accept."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from drafting import services
from drafting.models import Draft, DraftRevision, Fragment, InfillJob
from tests.drafting.helpers import VALUES, fill, job_succeed, provisional_draft

pytestmark = pytest.mark.django_db


def text(response: Any) -> str:
    return str(response.content.decode())


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


# -- home and the generated form --------------------------------------------------------------
def test_home_lists_templates_and_my_drafts(client_in: Client, draft: Draft) -> None:
    html = text(client_in.get("/"))
    assert "/templates/referral/new/" in html and "Referral letter" in html
    assert f"/drafts/{draft.id}/" in html


def test_every_page_says_when_the_model_is_an_untrained_placeholder(
    client_in: Client, draft: Draft, settings: Any
) -> None:
    settings.STENCIL_MODEL_DIR = settings.MODELS_DIR / "stencil-placeholder"
    for url in ["/", f"/drafts/{draft.id}/", f"/drafts/{draft.id}/review/", "/tokens/"]:
        assert "model: untrained placeholder" in text(client_in.get(url)), url
    assert "model: untrained placeholder" in text(Client().get("/accounts/login/"))


def test_new_draft_form_has_a_labelled_input_per_declared_field(
    client_in: Client, version: Any
) -> None:
    html = text(client_in.get("/templates/referral/new/"))
    for name in ["doctor", "patient_name", "birth_date", "sender"]:
        assert f'<label for="field-{name}">' in html
        assert f'id="field-{name}" name="{name}"' in html
    assert 'type="date"' in html and 'maxlength="60"' in html
    assert "csrfmiddlewaretoken" in html


def test_invalid_form_keeps_every_value_and_explains_each_field(
    client_in: Client, version: Any
) -> None:
    data = {**VALUES, "patient_name": "", "birth_date": "yesterday", "doctor": "D" * 61,
            "title": "Mr Berg's referral"}  # fmt: skip
    response = client_in.post("/templates/referral/new/", data)
    assert response.status_code == 400
    html = text(response)
    assert "Patient name is required." in html
    assert "Date of birth is not a real date" in html
    assert "Referring to is too long: at most 60 characters." in html
    assert 'value="yesterday"' in html and 'value="Dr. Lea Martin"' in html
    assert "D" * 61 in html and "Mr Berg&#x27;s referral" in html
    assert 'aria-invalid="true"' in html
    assert not Draft.objects.exists()


def test_valid_form_creates_the_draft_and_opens_it(client_in: Client, version: Any) -> None:
    response = client_in.post("/templates/referral/new/", {**VALUES, "title": "Berg"})
    draft = Draft.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/drafts/{draft.id}/"
    assert draft.title == "Berg" and draft.values["patient_name"] == "Jonas Berg"


def test_unknown_template_is_404(client_in: Client, db: Any) -> None:
    assert client_in.get("/templates/nope/new/").status_code == 404


# -- the draft page ---------------------------------------------------------------------------
def test_draft_page_shows_fragments_in_order_with_lock_controls(client_in: Client,
                                                                draft: Draft) -> None:  # fmt: skip
    html = text(client_in.get(f"/drafts/{draft.id}/"))
    ids = [int(i) for i in re.findall(r'class="frag[^"]*" data-fragment="(\d+)"', html)]
    assert ids == list(draft.fragments.order_by("position").values_list("id", flat=True))
    lockable = [f for f in draft.fragments.exclude(kind="field") if f.text.strip() or f.kind == "fill"]
    assert html.count('class="lock-toggle"') == len(lockable)
    assert 'aria-label="Lock Reason for referral"' in html
    assert 'aria-label="Unlock template text “Kind regards,”"' in html
    assert "Field <strong>Referring to</strong>" in html
    assert "[Reason for referral]" in html
    assert 'data-autosave-url="/api/v1/drafts/' in html


def test_lock_and_unlock_a_fragment(client_in: Client, draft: Draft) -> None:
    reason = fill(draft, "reason")
    response = client_in.post(f"/drafts/{draft.id}/fragments/{reason.id}/lock/", {"locked": "1"})
    assert response.status_code == 302
    reason.refresh_from_db()
    assert reason.locked is True
    client_in.post(f"/drafts/{draft.id}/fragments/{reason.id}/lock/", {"locked": "0"})
    reason.refresh_from_db()
    assert reason.locked is False


def test_saving_invalid_values_rerenders_them_and_leaves_the_draft_unchanged(
    client_in: Client, draft: Draft
) -> None:
    before = (draft.revision, dict(draft.values))
    data = {**VALUES, "birth_date": "31.12.1999", "sender": "S" * 70}
    response = client_in.post(f"/drafts/{draft.id}/values/", data)
    assert response.status_code == 400
    html = text(response)
    assert 'value="31.12.1999"' in html and "S" * 70 in html
    assert "Your name is too long" in html and "Nothing was saved" in html
    draft.refresh_from_db()
    assert (draft.revision, draft.values) == before


def test_saving_values_rewrites_the_field_fragments(client_in: Client, draft: Draft) -> None:
    client_in.post(f"/drafts/{draft.id}/values/", {**VALUES, "patient_name": "Ada Berg"})
    draft.refresh_from_db()
    assert "Ada Berg" in "".join(f.text for f in draft.fragments.all())


def test_fill_unlocked_queues_a_job_and_shows_its_progress(client_in: Client,
                                                           draft: Draft) -> None:  # fmt: skip
    response = client_in.post(f"/drafts/{draft.id}/fill/", {"preset": "careful"})
    job = InfillJob.objects.get()
    assert response["Location"] == f"/jobs/{job.id}/"
    assert job.preset == "careful" and len(job.target_fragments) == 3
    assert "An infill is queued" in text(client_in.get(f"/drafts/{draft.id}/"))


def test_fill_refused_by_admission_control_says_so(client_in: Client, draft: Draft,
                                                   settings: Any) -> None:  # fmt: skip
    settings.STENCIL_MAX_QUEUED_JOBS = 0
    response = client_in.post(f"/drafts/{draft.id}/fill/", {"preset": "fast"}, follow=True)
    assert not InfillJob.objects.exists()
    (message,) = messages_of(response)
    assert "Not queued" in message and "busy" in message and "seconds" in message


def test_regenerate_a_selected_span_splits_it_into_its_own_fill(client_in: Client,
                                                                 draft: Draft) -> None:  # fmt: skip
    closing = draft.fragments.get(text="\n\nKind regards,\n")
    response = client_in.post(f"/drafts/{draft.id}/regenerate/",
                              {"fragment": closing.id, "start": 2, "end": 6, "preset": "fast"})  # fmt: skip
    job = InfillJob.objects.get()
    assert response["Location"] == f"/jobs/{job.id}/"
    span = Fragment.objects.get(pk=job.target_fragments[0]["fragment"])
    assert span.text == "Kind" and not span.locked
    assert "".join(f.text for f in draft.fragments.all()).count("Kind regards,") == 1


def test_regenerate_with_a_bad_selection_explains_and_changes_nothing(
    client_in: Client, draft: Draft
) -> None:
    closing = draft.fragments.get(text="\n\nKind regards,\n")
    count = draft.fragments.count()
    response = client_in.post(f"/drafts/{draft.id}/regenerate/",
                              {"fragment": closing.id, "start": 5, "end": 500}, follow=True)  # fmt: skip
    assert "outside the fragment" in messages_of(response)[0]
    assert draft.fragments.count() == count and not InfillJob.objects.exists()


# -- live progress ----------------------------------------------------------------------------
def test_progress_page_shows_step_share_stable_text_and_a_marked_provisional_snapshot(
    client_in: Client, draft: Draft, user: Any
) -> None:
    job = services.draft_infill_request(draft=draft, user=user, preset="fast")
    hole = job.target_fragments[0]["hole"]
    InfillJob.objects.filter(pk=job.pk).update(state="running", progress={
        "attempt": 0, "step": 4, "max_steps": 16, "committed": 12, "positions": 48,
        "holes": {hole: {"stable": "worsening chest", "provisional": "worsening chest pain on"}}})  # fmt: skip
    html = text(client_in.get(f"/jobs/{job.id}/"))
    assert "4 (at most 16)" in html and "25%" in html
    stable = html.split('id="stable"', 1)[1].split("</div>\n  </div>", 1)[0]
    assert 'aria-live="polite"' in html.split('id="stable"', 1)[1][:120]
    assert "worsening chest" in stable and "Reason for referral" in stable
    snapshot = html.split('id="provisional"', 1)[1][:400]
    assert 'aria-hidden="true"' in snapshot and "provisional" in snapshot
    assert f'action="/jobs/{job.id}/cancel/"' in html
    assert f'data-job-url="/api/v1/jobs/{job.id}"' in html


def test_queued_job_shows_its_queue_position(client_in: Client, draft: Draft, user: Any,
                                             other_user: Any) -> None:  # fmt: skip
    canvas = {"segments": [{"text": "Hi "}, {"hole": "a", "max_tokens": 4}]}
    services.infill_job_create(owner=other_user, request=canvas)
    job = services.draft_infill_request(draft=draft, user=user, preset="fast")
    html = text(client_in.get(f"/jobs/{job.id}/"))
    assert re.search(r'id="queue-position">2<', html)


def test_cancel_from_the_page(client_in: Client, draft: Draft, user: Any) -> None:
    job = services.draft_infill_request(draft=draft, user=user, preset="fast")
    response = client_in.post(f"/jobs/{job.id}/cancel/", follow=True)
    job.refresh_from_db()
    assert job.state == InfillJob.State.CANCELLED
    assert "Cancelled." in messages_of(response)


def test_failed_job_reasons_are_shown_to_the_person(client_in: Client, draft: Draft,
                                                    user: Any) -> None:  # fmt: skip
    job = services.draft_infill_request(draft=draft, user=user, preset="fast")
    reason = "attempt 3 (ar): urgency: 'whenever' is not one of the choices"
    InfillJob.objects.filter(pk=job.pk).update(state="failed", reasons=[reason])
    assert "whenever" in text(client_in.get(f"/jobs/{job.id}/"))
    page = text(client_in.get(f"/drafts/{draft.id}/"))
    assert "The last infill failed" in page and "whenever" in page


# -- review and accept ------------------------------------------------------------------------
def test_review_highlights_provisional_text_and_shows_the_diff(client_in: Client, draft: Draft,
                                                               user: Any) -> None:  # fmt: skip
    provisional_draft(draft, user)
    html = text(client_in.get(f"/drafts/{draft.id}/review/"))
    assert html.count("frag kind-fill status-provisional") == 3
    assert "(provisional)" in html
    assert '<span class="d-add">+' in html and "worsening exertional chest pain" in html
    assert re.search(r"<button[^>]*disabled[^>]*>Accept draft", html)


def test_accept_reject_and_edit_spans(client_in: Client, draft: Draft, user: Any) -> None:
    provisional_draft(draft, user)
    reason, urgency, summary = (fill(draft, n) for n in ("reason", "urgency", "summary"))
    url = f"/drafts/{draft.id}/fragments/{{}}/review/"
    client_in.post(url.format(reason.id), {"action": "accept"})
    client_in.post(url.format(urgency.id), {"action": "reject"})
    client_in.post(url.format(summary.id), {"action": "edit", "text": "Stable angina."})
    statuses = {f.name: (f.status, f.text) for f in draft.fragments.filter(kind="fill")}
    assert statuses == {
        "reason": ("accepted", "worsening exertional chest pain"),
        "urgency": ("rejected", ""),
        "summary": ("edited", "Stable angina."),
    }


def test_regenerate_a_provisional_span_from_review(client_in: Client, draft: Draft,
                                                   user: Any) -> None:  # fmt: skip
    provisional_draft(draft, user)
    summary = fill(draft, "summary")
    response = client_in.post(f"/drafts/{draft.id}/regenerate/",
                              {"fragment": summary.id, "next": "review"})  # fmt: skip
    job = InfillJob.objects.exclude(state="succeeded").get()
    assert response["Location"] == f"/jobs/{job.id}/"
    assert [t["fragment"] for t in job.target_fragments] == [summary.id]


def _accept_all(draft: Draft, user: Any) -> None:
    for f in draft.fragments.filter(status=Fragment.Status.PROVISIONAL):
        services.fragment_review(fragment=f, action="accept", user=user)
    draft.refresh_from_db()


def test_accept_draft_makes_an_immutable_revision_and_shows_it(client_in: Client, draft: Draft,
                                                               user: Any) -> None:  # fmt: skip
    provisional_draft(draft, user)
    _accept_all(draft, user)
    response = client_in.post(f"/drafts/{draft.id}/accept/", {"revision": draft.revision},
                              follow=True)  # fmt: skip
    draft.refresh_from_db()
    assert draft.accepted_revision is not None
    html = text(response)
    assert f"Accepted revision {draft.accepted_revision.number}" in html
    assert "cannot change" in html
    assert 'id="accept-form"' not in html and "has not changed since" in html
    with pytest.raises(ValueError):
        draft.accepted_revision.save()


def test_double_click_or_stale_tab_cannot_accept_twice(client_in: Client, draft: Draft,
                                                       user: Any) -> None:  # fmt: skip
    provisional_draft(draft, user)
    _accept_all(draft, user)
    seen = draft.revision
    client_in.post(f"/drafts/{draft.id}/accept/", {"revision": seen})
    second = client_in.post(f"/drafts/{draft.id}/accept/", {"revision": seen}, follow=True)
    assert DraftRevision.objects.filter(draft=draft, accepted=True).count() == 1
    message = messages_of(second)[-1]
    assert "Not accepted" in message and "already accepted" in message


def test_stale_tab_after_an_edit_cannot_accept_the_old_text(client_in: Client, draft: Draft,
                                                            user: Any) -> None:  # fmt: skip
    provisional_draft(draft, user)
    _accept_all(draft, user)
    stale = draft.revision
    services.fragment_review(fragment=fill(draft, "summary"), action="edit", user=user,
                             text="Changed in another tab.")  # fmt: skip
    response = client_in.post(f"/drafts/{draft.id}/accept/", {"revision": stale}, follow=True)
    draft.refresh_from_db()
    assert draft.accepted_revision is None
    assert "changed since the page was loaded" in messages_of(response)[0]


def test_export_txt_and_md_after_accept(client_in: Client, draft: Draft, user: Any) -> None:
    provisional_draft(draft, user)
    _accept_all(draft, user)
    services.draft_accept(draft=draft, expected_revision=draft.revision, user=user)
    txt = client_in.get(f"/drafts/{draft.id}/export.txt")
    assert txt["Content-Type"].startswith("text/plain")
    assert txt["Content-Disposition"] == f'attachment; filename="draft-{draft.id}.txt"'
    body = txt.content.decode()
    assert body.startswith("Dear Dr. Imani Okafor,") and "NOT ACCEPTED" not in body
    md = client_in.get(f"/drafts/{draft.id}/export.md").content.decode()
    assert md.startswith("# Referral letter") and "Accepted revision" in md
    assert client_in.get(f"/drafts/{draft.id}/export.odt").status_code == 404


def test_export_before_accept_is_marked_not_accepted(client_in: Client, draft: Draft) -> None:
    body = client_in.get(f"/drafts/{draft.id}/export.txt").content.decode()
    assert body.startswith("[DRAFT, NOT ACCEPTED]")


# -- forms, CSRF, ops -------------------------------------------------------------------------
def test_every_post_form_carries_a_csrf_token(client_in: Client, draft: Draft,
                                              user: Any) -> None:  # fmt: skip
    provisional_draft(draft, user)
    job = InfillJob.objects.get()
    for url in ["/", "/templates/referral/new/", f"/drafts/{draft.id}/",
                f"/drafts/{draft.id}/review/", f"/jobs/{job.id}/", "/tokens/"]:  # fmt: skip
        html = text(client_in.get(url))
        forms = re.findall(r"<form[^>]*method=\"post\".*?</form>", html, flags=re.S)
        assert forms, url
        for form in forms:
            assert "csrfmiddlewaretoken" in form, (url, form[:80])


def test_post_without_csrf_token_is_refused(user: Any, draft: Draft) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.post(f"/drafts/{draft.id}/fill/", {"preset": "fast"}).status_code == 403
    assert not InfillJob.objects.exists()


def test_metrics_and_healthz(client: Client, db: Any) -> None:
    metrics = client.get("/metrics")
    assert metrics.status_code == 200 and b"stencil_" in metrics.content
    assert client.get("/healthz").json() == {"ok": True, "database": "ok"}


def test_metrics_aggregate_worker_files_in_multiprocess_mode(
    client: Client, db: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    response = client.get("/metrics")
    assert response.status_code == 200  # an empty directory is an empty, valid exposition


def test_job_result_applied_by_the_worker_shows_on_review(client_in: Client, draft: Draft,
                                                          user: Any) -> None:  # fmt: skip
    job = services.draft_infill_request(draft=draft, user=user, preset="fast")
    job_succeed(job, {"reason": "a bespoke reason"})
    assert "a bespoke reason" in text(client_in.get(f"/drafts/{draft.id}/review/"))


def test_admin_adds_a_template_version_through_the_validating_service(
    client: Client, django_user_model: Any, version: Any
) -> None:
    admin = django_user_model.objects.create_superuser("root", "root@example.com", "pw-root-123")
    client.force_login(admin)
    for url in ["/admin/drafting/draft/", "/admin/drafting/infilljob/",
                "/admin/drafting/templateversion/", "/admin/drafting/apitoken/"]:  # fmt: skip
        assert client.get(url).status_code == 200, url
    add = "/admin/drafting/templateversion/add/"
    data = {"template": version.template.id, "source": "{% if x %}{% endif %}", "route_hint": "auto"}
    broken = client.post(add, data)
    assert broken.status_code == 200 and "not allowed" in text(broken)
    data["source"] = version.source.replace("Kind regards", "Best wishes")
    assert client.post(add, data).status_code == 302
    assert version.template.versions.count() == 2
