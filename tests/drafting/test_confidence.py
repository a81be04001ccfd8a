"""What the model does not know, in the draft: span confidence, needs a person, domain, variation."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.test import Client
from hypothesis import given
from hypothesis import strategies as st

from drafting import confidence, services
from drafting.models import Draft, DraftRevision, Fragment, InfillJob
from tests.drafting.helpers import FILLS, fill, job_succeed

LOW = {"p": 0.12, "low": True, "marks": [[0, 3], [10, 14]], "signal": "token probability",
       "calibrated": True}  # fmt: skip
HIGH = {"p": 0.93, "low": False, "marks": [], "signal": "token probability", "calibrated": True}
UNFAMILIAR = {"score": 7.5, "unfamiliar": True, "threshold": 4.0}


def filled(draft: Draft, user: Any, **extra: Any) -> InfillJob:
    job = services.draft_infill_request(draft=draft, user=user, preset="fast")
    job_succeed(job, **extra)
    draft.refresh_from_db()
    return job


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200
    return str(response.content.decode())


def card_order(html: str) -> list[str]:
    return re.findall(r'<h3 id="span-h-\d+" tabindex="-1">([^<]+?) <span', html)


# -- carried onto the draft -------------------------------------------------------------------
@pytest.mark.django_db
def test_a_results_confidence_is_carried_onto_each_span(draft: Draft, user: Any) -> None:
    filled(draft, user, confidence={"summary": LOW, "reason": HIGH})
    summary, reason, urgency = fill(draft, "summary"), fill(draft, "reason"), fill(draft, "urgency")
    assert summary.confidence == LOW and summary.written_by == "model"
    assert reason.confidence == HIGH
    assert urgency.confidence == {}  # this hole had no measurement: not measured, not confident


@pytest.mark.django_db
def test_malformed_confidence_is_dropped_and_marks_are_kept_inside_the_text(
    draft: Draft, user: Any
) -> None:
    filled(draft, user, confidence={
        "summary": {"p": 0.2, "low": True, "marks": [[40, 9000], [-5, 2], "x", [3, 1]]},
        "reason": {"p": "high", "low": True}, "urgency": ["not", "an", "object"],
    })  # fmt: skip
    summary = fill(draft, "summary")
    assert summary.confidence["marks"] == [[0, 2], [40, len(FILLS["summary"])]]
    assert fill(draft, "reason").confidence == {} and fill(draft, "urgency").confidence == {}


@given(text=st.text(max_size=40),
       marks=st.lists(st.lists(st.integers(-50, 80), min_size=2, max_size=2), max_size=8))
def test_marked_pieces_join_back_to_the_text_and_marks_stay_inside_it(
    text: str, marks: list[list[int]]
) -> None:
    cleaned = confidence.marks_clean(marks, len(text))
    assert all(0 <= s < e <= len(text) for s, e in cleaned)
    assert all(a[1] < b[0] for a, b in zip(cleaned, cleaned[1:], strict=False))  # merged
    pieces = confidence.marked_segments(text, marks)
    assert "".join(piece for piece, _ in pieces) == text
    assert [p for p, marked in pieces if marked] == [text[s:e] for s, e in cleaned]


# -- the review page --------------------------------------------------------------------------
@pytest.mark.django_db
def test_the_review_page_lists_a_low_span_first_and_says_why(
    client_in: Client, draft: Draft, user: Any
) -> None:
    filled(draft, user, confidence={"summary": LOW, "reason": HIGH, "urgency": HIGH})
    html = page(client_in, f"/drafts/{draft.id}/review/")
    assert card_order(html) == ["Clinical summary", "Reason for referral", "Urgency"]
    assert confidence.LOW_WORDS in html and "About 12% likely to be right" in html
    assert html.count(confidence.CONFIDENT_WORDS + "</strong>") == 2
    text = FILLS["summary"]
    assert f'<span class="visually-hidden">[least sure: </span>{text[0:3]}' in html
    assert "Yes, accept anyway" in html


@pytest.mark.django_db
def test_an_older_job_without_confidence_says_it_was_not_measured(
    client_in: Client, draft: Draft, user: Any
) -> None:
    job = filled(draft, user)
    html = page(client_in, f"/drafts/{draft.id}/review/")
    assert html.count(confidence.UNMEASURED_WORDS) == 3
    assert card_order(html) == ["Reason for referral", "Urgency", "Clinical summary"]
    assert confidence.LOW_WORDS not in html and "accept anyway" not in html
    job_page = page(client_in, f"/jobs/{job.id}/")
    assert "Confidence not measured for this job." in job_page
    assert re.search(r'id="needs-person"[^>]*hidden', job_page)


@pytest.mark.django_db
def test_a_low_span_is_accepted_only_when_the_person_says_accept_anyway(
    client_in: Client, token_client: Client, draft: Draft, user: Any
) -> None:
    filled(draft, user, confidence={"summary": LOW})
    summary = fill(draft, "summary")
    url = f"/drafts/{draft.id}/fragments/{summary.id}/review/"
    response = client_in.post(url, {"action": "accept"}, follow=True)
    assert "flagged low-confidence" in response.content.decode()
    summary.refresh_from_db()
    assert summary.status == Fragment.Status.PROVISIONAL
    api = f"/api/v1/drafts/{draft.id}/fragments/{summary.id}/review"
    refused = token_client.post(api, json.dumps({"action": "accept"}),
                                content_type="application/json")  # fmt: skip
    assert refused.status_code == 400 and "Accept anyway" in refused.json()["error"]
    assert token_client.post(api, json.dumps({"action": "accept", "accept_anyway": "yes"}),
                             content_type="application/json").status_code == 400  # fmt: skip
    client_in.post(url, {"action": "accept", "accept_anyway": "1"})
    summary.refresh_from_db()
    assert summary.status == Fragment.Status.ACCEPTED


@pytest.mark.django_db
def test_the_api_gives_each_spans_confidence(token_client: Client, draft: Draft, user: Any) -> None:
    filled(draft, user, confidence={"summary": LOW})
    fragments = token_client.get(f"/api/v1/drafts/{draft.id}").json()["fragments"]
    by_name = {f["name"]: f for f in fragments if f["kind"] == "fill"}
    assert by_name["summary"]["confidence"] == LOW
    assert by_name["reason"]["confidence"] is None


# -- needs a person ---------------------------------------------------------------------------
@pytest.mark.django_db
def test_needs_a_person_is_said_on_the_job_and_draft_pages_and_offers_writing_by_hand(
    client_in: Client, draft: Draft, user: Any
) -> None:
    job = filled(draft, user, confidence={"summary": LOW, "reason": LOW, "urgency": LOW},
                 needs_person=True)  # fmt: skip
    job_page = page(client_in, f"/jobs/{job.id}/")
    assert not re.search(r'id="needs-person"[^>]*hidden', job_page)
    assert "Needs a person:" in job_page
    assert "Needs a person:" in page(client_in, f"/drafts/{draft.id}/")
    review = page(client_in, f"/drafts/{draft.id}/review/")
    summary = fill(draft, "summary")
    assert f'id="write-{summary.id}"' in review

    url = f"/drafts/{draft.id}/fragments/{summary.id}/review/"
    client_in.post(url, {"action": "write", "text": "Angina for two months, ST depression."})
    summary.refresh_from_db()
    assert summary.text == "Angina for two months, ST depression."
    assert (summary.status, summary.written_by, summary.confidence) == ("edited", "person", {})
    revision = DraftRevision.objects.filter(draft=draft).order_by("-number").first()
    assert revision is not None and revision.reason == "write" and revision.created_by == user
    assert f'id="write-{summary.id}"' not in page(client_in, f"/drafts/{draft.id}/review/")


@pytest.mark.django_db
def test_no_needs_a_person_once_every_flagged_span_is_written(
    client_in: Client, draft: Draft, user: Any
) -> None:
    filled(draft, user, confidence={"summary": LOW}, needs_person=True)
    summary = fill(draft, "summary")
    assert "Needs a person:" in page(client_in, f"/drafts/{draft.id}/")
    services.fragment_review(fragment=summary, action="write", user=user, text="By hand.")
    assert "Needs a person:" not in page(client_in, f"/drafts/{draft.id}/")


# -- domain -----------------------------------------------------------------------------------
@pytest.mark.django_db
def test_an_unfamiliar_template_is_warned_about_on_the_draft_and_job_pages(
    client_in: Client, draft: Draft, user: Any
) -> None:
    job = filled(draft, user, domain=UNFAMILIAR)
    for url in (f"/drafts/{draft.id}/", f"/drafts/{draft.id}/review/", f"/jobs/{job.id}/"):
        html = page(client_in, url)
        assert confidence.DOMAIN_WARNING in html, url
        assert not re.search(r'id="domain-warning"[^>]*hidden', html), url


@pytest.mark.django_db
def test_a_familiar_template_has_no_domain_warning(
    client_in: Client, draft: Draft, user: Any
) -> None:
    job = filled(draft, user, domain={**UNFAMILIAR, "unfamiliar": False, "score": 1.0})
    assert confidence.DOMAIN_WARNING not in page(client_in, f"/drafts/{draft.id}/")
    assert re.search(r'id="domain-warning"[^>]*hidden', page(client_in, f"/jobs/{job.id}/"))


@pytest.mark.django_db
def test_a_template_measured_unfamiliar_is_warned_about_before_any_fill(
    client_in: Client, user: Any, settings: Any, draft: Draft
) -> None:
    """A draft of a template whose locked text the shipped denoiser's corpus never has says so
    before the model has written anything; a draft of a corpus kind does not."""
    from tests.drafting.test_domain_warning import DENOISER, FOREIGN_SOURCE

    settings.STENCIL_MODEL_DIR = DENOISER
    foreign = services.template_version_create(slug="release-notes", title="Release notes",
                                               kind="release_notes", source=FOREIGN_SOURCE)  # fmt: skip
    notes = services.draft_create(owner=user, version=foreign, values={})
    assert confidence.DOMAIN_WARNING in page(client_in, f"/drafts/{notes.id}/")
    assert confidence.DOMAIN_WARNING not in page(client_in, f"/drafts/{draft.id}/")  # a referral


# -- regenerate -------------------------------------------------------------------------------
@pytest.mark.django_db
@pytest.mark.parametrize("variation", sorted(services.VARIATIONS))
def test_a_regenerate_samples_at_its_variation_and_keeps_the_text_it_replaces(
    client_in: Client, draft: Draft, user: Any, variation: str
) -> None:
    first = filled(draft, user)
    summary = fill(draft, "summary")
    response = client_in.post(f"/drafts/{draft.id}/regenerate/",
                              {"fragment": summary.id, "variation": variation})  # fmt: skip
    assert response.status_code == 302
    job = InfillJob.objects.exclude(pk=first.pk).get()
    assert job.config["temperature"] == services.VARIATIONS[variation] > 0
    assert job.seed != first.seed  # a fresh seed (a collision is 1 in 2**31)
    (target,) = job.target_fragments
    assert target["previous"] == FILLS["summary"] and target["previous_run"] == "r1"
    assert target["variation"] == variation


@pytest.mark.django_db
def test_an_unknown_variation_is_refused_and_nothing_is_queued(
    client_in: Client, token_client: Client, draft: Draft, user: Any
) -> None:
    filled(draft, user)
    summary = fill(draft, "summary")
    response = client_in.post(f"/drafts/{draft.id}/regenerate/",
                              {"fragment": summary.id, "variation": "wild"}, follow=True)  # fmt: skip
    assert "variation must be one of small, medium, large" in response.content.decode()
    api = token_client.post(f"/api/v1/drafts/{draft.id}/fragments/{summary.id}/regenerate",
                            json.dumps({"variation": 3}), content_type="application/json")
    assert api.status_code == 400
    assert InfillJob.objects.count() == 1


@pytest.mark.django_db
def test_the_review_page_shows_the_previous_text_beside_the_regenerated_one(
    client_in: Client, draft: Draft, user: Any
) -> None:
    filled(draft, user)
    summary = fill(draft, "summary")
    job = services.fragment_regenerate(fragment=summary, user=user, preset="fast")
    job_succeed(job, texts={"summary": "Chest pain on exertion since March."})
    html = page(client_in, f"/drafts/{draft.id}/review/")
    compare = html[html.index(f'id="compare-{summary.id}"'):]
    assert "Chest pain on exertion since March." in compare
    assert "Previous text (before regenerating)" in compare and FILLS["summary"] in compare
