"""Learning from review: an accepted draft of an opted-in template joins that template's
corpus, encrypted and deduplicated; the correction share is reported per template and model."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.samples import Sample

from corpora.models import Corpus, CorpusDocument, ReviewFeed
from corpora.selectors import document_text
from drafting import services, signals
from drafting.metrics import REVIEW_REGISTRY
from drafting.models import Draft, Fragment, InfillJob
from tests.drafting.helpers import REFERRAL_SOURCE, VALUES, reviewed_draft

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs are rows here; a stand-in worker writes their results (tests.drafting.helpers)."""
    monkeypatch.setattr(services, "job_dispatch", lambda *, job_id: None)


@pytest.fixture
def draft(user: Any) -> Draft:
    version = services.template_version_create(
        slug="referral", title="Referral letter", kind="referral_letter", source=REFERRAL_SOURCE)
    return services.draft_create(owner=user, version=version, values=dict(VALUES))


def accept(draft: Draft, user: Any, capture: Any) -> Any:
    with capture(execute=True):
        return services.draft_accept(draft=draft, expected_revision=draft.revision, user=user)


def test_an_accepted_draft_of_an_opted_in_template_joins_its_corpus(
    draft: Draft, user: Any, corpus: Corpus, django_capture_on_commit_callbacks: Any,
) -> None:  # fmt: skip
    feed = ReviewFeed.objects.create(template=draft.template_version.template, corpus=corpus)
    reviewed_draft(draft, user)
    revision = accept(draft, user, django_capture_on_commit_callbacks)
    (document,) = CorpusDocument.objects.filter(corpus=corpus)
    assert document_text(document=document) == revision.text.strip()  # as an upload: trimmed
    assert "Jonas Berg" in revision.text and document.name.startswith("review/referral/")
    assert ReviewFeed.objects.get(pk=feed.pk).documents_added == 1
    corpus.refresh_from_db()
    assert corpus.documents == 1 and corpus.tokens > 0


def test_the_same_text_accepted_again_is_not_added_twice(
    draft: Draft, user: Any, corpus: Corpus, django_capture_on_commit_callbacks: Any,
) -> None:  # fmt: skip
    ReviewFeed.objects.create(template=draft.template_version.template, corpus=corpus)
    reviewed_draft(draft, user)
    accept(draft, user, django_capture_on_commit_callbacks)
    accept_again = draft.revision
    with pytest.raises(services.ConflictError):  # the same text is not accepted twice...
        accept(draft, user, django_capture_on_commit_callbacks)
    draft.refresh_from_db()
    assert CorpusDocument.objects.filter(corpus=corpus).count() == 1
    services.draft_values_update(draft=draft, values={**VALUES, "sender": "Dr. Ana Ruiz"})
    draft.refresh_from_db()
    assert draft.revision > accept_again
    accept(draft, user, django_capture_on_commit_callbacks)  # ...a changed text is a new document
    texts = sorted(document_text(document=d) for d in CorpusDocument.objects.filter(corpus=corpus))
    assert len(texts) == 2 and "Dr. Ana Ruiz" in texts[0] + texts[1]


@pytest.mark.parametrize("enabled", [False, None])
def test_without_an_enabled_feed_nothing_is_collected(
    draft: Draft, user: Any, corpus: Corpus, django_capture_on_commit_callbacks: Any,
    enabled: bool | None,
) -> None:  # fmt: skip
    if enabled is not None:
        ReviewFeed.objects.create(template=draft.template_version.template, corpus=corpus,
                                  enabled=enabled)  # fmt: skip
    reviewed_draft(draft, user)
    accept(draft, user, django_capture_on_commit_callbacks)
    assert not CorpusDocument.objects.exists()


def test_a_failing_receiver_never_undoes_the_acceptance(
    draft: Draft, user: Any, django_capture_on_commit_callbacks: Any,
) -> None:  # fmt: skip
    def broken(**_: Any) -> None:
        raise RuntimeError("the corpus store is down")

    signals.draft_accepted.connect(broken, dispatch_uid="test.broken")
    try:
        reviewed_draft(draft, user)
        revision = accept(draft, user, django_capture_on_commit_callbacks)
    finally:
        signals.draft_accepted.disconnect(dispatch_uid="test.broken")
    draft.refresh_from_db()
    assert draft.accepted_revision_id == revision.pk


def test_the_correction_share_is_reported_per_template_and_model(draft: Draft, user: Any) -> None:
    reviewed_draft(draft, user)
    summary = draft.fragments.get(kind=Fragment.Kind.FILL, name="summary")
    Fragment.objects.filter(pk=summary.pk).update(status=Fragment.Status.REJECTED)
    samples: list[Sample] = [s for family in REVIEW_REGISTRY.collect()
                             if family.name == "stencil_user_correction_ratio_by_template"
                             for s in family.samples]  # fmt: skip
    assert [(s.labels, round(s.value, 3)) for s in samples] == [
        ({"template": "referral", "model": "unknown"}, round(1 / 3, 3))]


def test_the_correction_share_is_labelled_with_the_name_of_the_version_that_wrote_it(
    draft: Draft, user: Any,
) -> None:  # fmt: skip
    reviewed_draft(draft, user)
    version = {"id": 7, "name": "tuned", "scope": "template:referral", "weights_sha256": "ab"}
    job = InfillJob.objects.get(draft=draft)
    InfillJob.objects.filter(pk=job.pk).update(
        result={**(job.result or {}), "model": "tiny-denoiser", "model_version": version})
    summary = draft.fragments.get(kind=Fragment.Kind.FILL, name="summary")
    Fragment.objects.filter(pk=summary.pk).update(status=Fragment.Status.EDITED)
    samples = [s for family in REVIEW_REGISTRY.collect()
               if family.name == "stencil_user_correction_ratio_by_template"
               for s in family.samples]  # fmt: skip
    assert [(s.labels, round(s.value, 3)) for s in samples] == [
        ({"template": "referral", "model": "tuned"}, round(1 / 3, 3))]
