"""The services the pages and the API call: bad input changes nothing; accept is compare-and-set."""

from __future__ import annotations

from typing import Any

import pytest

from drafting import services
from drafting.auth import AuthError, api_token_create, user_from_authorization
from drafting.models import ApiToken, Draft, DraftRevision, Fragment, InfillJob, TemplateVersion
from drafting.templating import TemplateError
from tests.drafting.helpers import (
    REFERRAL_SOURCE,
    VALUES,
    fill,
    job_succeed,
    provisional_draft,
    reviewed_draft,
)

pytestmark = pytest.mark.django_db


def state(draft: Draft) -> tuple[Any, ...]:
    draft.refresh_from_db()
    fragments = [(f.position, f.kind, f.text, f.locked, f.status) for f in draft.fragments.all()]
    return draft.revision, draft.values, fragments, draft.revisions.count()


# -- templates --------------------------------------------------------------------------------
def test_saving_the_same_source_twice_keeps_one_version(version: TemplateVersion) -> None:
    again = services.template_version_create(slug="referral", title="Referral letter",
                                             kind="referral_letter", source=REFERRAL_SOURCE)  # fmt: skip
    assert again.pk == version.pk


def test_a_draft_keeps_the_version_it_was_made_from(draft: Draft) -> None:
    newer = services.template_version_create(
        slug="referral", title="Referral letter", kind="referral_letter",
        source=REFERRAL_SOURCE.replace("Kind regards", "Yours sincerely"),
    )  # fmt: skip
    assert newer.number == 2
    draft.refresh_from_db()
    assert draft.template_version.number == 1
    assert "Kind regards" in "".join(f.text for f in draft.fragments.all())


def test_a_malformed_template_saves_nothing(db: Any) -> None:
    with pytest.raises(TemplateError, match="not allowed"):
        services.template_version_create(slug="bad", title="Bad", kind="letter",
                                         source="{% for x in y %}{% endfor %}")  # fmt: skip
    assert not TemplateVersion.objects.exists()


def test_a_broken_schema_in_a_new_version_leaves_the_old_one(version: TemplateVersion) -> None:
    broken = REFERRAL_SOURCE.replace('max_tokens=32,', 'max_tokens=32, schema={"type": "bogus"},')
    with pytest.raises(TemplateError, match="not a valid JSON Schema"):
        services.template_version_create(slug="referral", title="Referral letter",
                                         kind="referral_letter", source=broken)  # fmt: skip
    assert list(TemplateVersion.objects.values_list("number", flat=True)) == [1]


# -- drafts -----------------------------------------------------------------------------------
def test_invalid_values_create_no_draft(user: Any, version: TemplateVersion) -> None:
    with pytest.raises(services.UserError) as info:
        services.draft_create(owner=user, version=version, values={**VALUES, "doctor": 5})
    assert info.value.errors == {"doctor": "Referring to must be text."}
    assert not Draft.objects.exists()


def test_oversized_values_are_refused_and_the_saved_draft_is_unchanged(
    draft: Draft, settings: Any
) -> None:
    settings.STENCIL_MAX_FIELD_LENGTH = 50
    before = state(draft)
    with pytest.raises(services.UserError) as info:
        services.draft_values_update(draft=draft, values={"patient_name": "P" * 55})
    assert info.value.errors["patient_name"] == "Patient name is too long: at most 50 characters."
    assert state(draft) == before


def test_values_that_are_not_an_object_are_refused(draft: Draft) -> None:
    before = state(draft)
    with pytest.raises(services.UserError, match="JSON object"):
        services.draft_values_update(draft=draft, values=["a"])  # type: ignore[arg-type]
    assert state(draft) == before


# -- regeneration -----------------------------------------------------------------------------
def test_regenerating_a_whole_locked_fragment_unlocks_it_and_targets_it_alone(
    draft: Draft, user: Any
) -> None:
    closing = draft.fragments.get(text="\n\nKind regards,\n")
    job = services.fragment_regenerate(fragment=closing, user=user, preset="fast")
    closing.refresh_from_db()
    assert closing.locked is False
    assert [t["fragment"] for t in job.target_fragments] == [closing.id]


def test_regenerating_a_form_value_is_refused(draft: Draft, user: Any) -> None:
    field = draft.fragments.filter(kind=Fragment.Kind.FIELD).first()
    assert field is not None
    with pytest.raises(services.UserError, match="form value"):
        services.fragment_regenerate(fragment=field, user=user, preset="fast")


def test_a_refused_regeneration_leaves_the_draft_as_it_was(draft: Draft, user: Any) -> None:
    """The split happens only if the job is queued: a busy draft keeps its fragments."""
    services.draft_infill_request(draft=draft, user=user, preset="fast")
    before = state(draft)
    closing = draft.fragments.get(text="\n\nKind regards,\n")
    with pytest.raises(services.UserError, match="already running"):
        services.fragment_regenerate(fragment=closing, user=user, preset="fast", start=2, end=6)
    assert state(draft) == before


def test_admission_control_refusal_undoes_the_split(draft: Draft, user: Any,
                                                    settings: Any) -> None:  # fmt: skip
    settings.STENCIL_MAX_QUEUED_JOBS = 0
    before = state(draft)
    closing = draft.fragments.get(text="\n\nKind regards,\n")
    with pytest.raises(services.AdmissionError) as info:
        services.fragment_regenerate(fragment=closing, user=user, preset="fast", start=2, end=6)
    assert info.value.retry_after > 0
    assert state(draft) == before and not InfillJob.objects.exists()


def test_a_selection_needs_both_ends(draft: Draft, user: Any) -> None:
    closing = draft.fragments.get(text="\n\nKind regards,\n")
    with pytest.raises(services.UserError, match="start and its end"):
        services.fragment_regenerate(fragment=closing, user=user, preset="fast", start=2)


# -- results, review, accept ------------------------------------------------------------------
def test_a_result_never_overwrites_text_the_person_locked_meanwhile(draft: Draft,
                                                                   user: Any) -> None:  # fmt: skip
    job = services.draft_infill_request(draft=draft, user=user, preset="fast")
    services.fragment_review(fragment=fill(draft, "summary"), action="edit", user=user,
                             text="Written by hand.")  # fmt: skip
    job_succeed(job)
    assert fill(draft, "summary").text == "Written by hand."
    assert fill(draft, "reason").status == Fragment.Status.PROVISIONAL


def test_accept_is_refused_while_spans_are_provisional(draft: Draft, user: Any) -> None:
    provisional_draft(draft, user)
    with pytest.raises(services.UserError, match="provisional"):
        services.draft_accept(draft=draft, expected_revision=draft.revision, user=user)
    assert not DraftRevision.objects.filter(accepted=True).exists()


def test_accept_is_compare_and_set_on_the_revision(draft: Draft, user: Any) -> None:
    reviewed_draft(draft, user)
    seen = draft.revision
    revision = services.draft_accept(draft=draft, expected_revision=seen, user=user)
    assert revision.accepted and revision.text.startswith("Dear Dr. Imani Okafor")
    with pytest.raises(services.ConflictError):
        services.draft_accept(draft=draft, expected_revision=seen, user=user)
    assert DraftRevision.objects.filter(accepted=True).count() == 1


def test_only_a_reviewer_may_accept_a_draft(writer: Any, version: Any) -> None:
    from django.core.exceptions import PermissionDenied

    own = services.draft_create(owner=writer, version=version, values=dict(VALUES))
    with pytest.raises(PermissionDenied, match="reviewer"):
        services.draft_accept(draft=own, expected_revision=own.revision, user=writer)
    assert not DraftRevision.objects.filter(accepted=True).exists()


def test_accepting_text_that_is_already_accepted_is_refused(draft: Draft, user: Any) -> None:
    reviewed_draft(draft, user)
    services.draft_accept(draft=draft, expected_revision=draft.revision, user=user)
    draft.refresh_from_db()
    with pytest.raises(services.ConflictError, match="already accepted"):
        services.draft_accept(draft=draft, expected_revision=draft.revision, user=user)
    assert DraftRevision.objects.filter(accepted=True).count() == 1


def test_field_values_with_nul_characters_are_refused_per_field(draft: Draft) -> None:
    before = dict(draft.values)
    with pytest.raises(services.UserError) as refused:
        services.draft_values_update(draft=draft, values={"patient": "Ann\x00"})
    assert "NUL" in refused.value.errors["patient"]
    draft.refresh_from_db()
    assert draft.values == before


# -- API tokens -------------------------------------------------------------------------------
def test_only_a_hash_of_a_token_is_stored_and_it_identifies_its_user(user: Any) -> None:
    token, key = api_token_create(user=user, name="laptop")
    assert key not in token.key_sha256 and token.prefix == key[:8]
    assert user_from_authorization(f"Token {key}") == user
    assert ApiToken.objects.get().last_used is not None


@pytest.mark.parametrize("header", ["Bearer abc", "Token", "Token wrong", "abc"])
def test_malformed_or_unknown_tokens_are_refused(user: Any, header: str) -> None:
    api_token_create(user=user, name="laptop")
    with pytest.raises(AuthError):
        user_from_authorization(header)


def test_an_inactive_users_token_is_refused(user: Any) -> None:
    _, key = api_token_create(user=user, name="laptop")
    user.is_active = False
    user.save()
    with pytest.raises(AuthError):
        user_from_authorization(f"Token {key}")


def test_a_token_needs_a_name(user: Any) -> None:
    with pytest.raises(services.UserError) as info:
        api_token_create(user=user, name="  ")
    assert "name" in info.value.errors
