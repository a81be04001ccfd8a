"""Reads. Access to a user's objects goes through ``<entity>_get_for_user`` (others get 404)."""

from __future__ import annotations

import difflib
import uuid
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet
from django.http import Http404

from drafting.models import (
    DocumentTemplate,
    Draft,
    DraftRevision,
    Fragment,
    InfillJob,
    TemplateVersion,
)

User = AbstractBaseUser | AnonymousUser


def template_list() -> QuerySet[DocumentTemplate]:
    return DocumentTemplate.objects.prefetch_related("versions").order_by("title")


def template_get(*, slug: str) -> DocumentTemplate:
    try:
        return DocumentTemplate.objects.get(slug=slug)
    except DocumentTemplate.DoesNotExist as exc:
        raise Http404("no such template") from exc


def template_version_live(*, template: DocumentTemplate) -> TemplateVersion:
    """The published version new drafts use (404 while the template is unpublished)."""
    version = template.published_version
    if version is None:
        raise Http404("the template is not published")
    return version


def template_list_live() -> list[DocumentTemplate]:
    return list(DocumentTemplate.objects.filter(published_version__isnull=False)
                .select_related("published_version").order_by("title"))  # fmt: skip


def template_version_latest(*, template: DocumentTemplate) -> TemplateVersion:
    version = template.latest_version()
    if version is None:
        raise Http404("the template has no version")
    return version


def draft_list_for_user(*, user: Any) -> QuerySet[Draft]:
    return (Draft.objects.filter(owner=user)
            .select_related("template_version__template", "accepted_revision")
            .prefetch_related("fragments"))  # fmt: skip


DRAFT_STATUS_WORDS = {
    "accepted": "accepted",
    "changed": "changed since accepted",
    "draft": "draft, not accepted",
}


def draft_status(*, draft: Draft) -> str:
    """accepted (the text is the accepted revision's) | changed (edited after acceptance) |
    draft (never accepted)."""
    accepted = draft.accepted_revision
    if accepted is None:
        return "draft"
    return "accepted" if accepted.text == draft_text(draft=draft) else "changed"


def draft_get_for_user(*, user: Any, draft_id: int | str) -> Draft:
    try:
        return Draft.objects.select_related("template_version__template").get(
            id=int(draft_id), owner=user
        )
    except (Draft.DoesNotExist, ValueError, TypeError) as exc:
        raise Http404("no such draft") from exc


def fragment_get_for_user(*, user: Any, draft: Draft, fragment_id: int | str) -> Fragment:
    try:
        return draft.fragments.get(id=int(fragment_id), draft__owner=user)
    except (Fragment.DoesNotExist, ValueError, TypeError) as exc:
        raise Http404("no such fragment") from exc


def job_get_for_user(*, user: Any, job_id: str | uuid.UUID) -> InfillJob:
    try:
        return InfillJob.objects.get(id=uuid.UUID(str(job_id)), owner=user)
    except (InfillJob.DoesNotExist, ValueError) as exc:
        raise Http404("no such job") from exc


def job_latest_for_draft(*, draft: Draft) -> InfillJob | None:
    return draft.jobs.order_by("-created").first()


def job_latest_result_for_draft(*, draft: Draft) -> InfillJob | None:
    """The draft's newest job that wrote a result (its confidence and domain notes hold)."""
    return draft.jobs.filter(result__isnull=False).order_by("-created").first()


def draft_model_notes(*, draft: Draft) -> dict[str, Any]:
    """What the model said about its own text for this draft, in the page's terms.

    ``needs_person``: the newest result says every route's text was low-confidence, and one
    of its spans still waits for a person (flagged low and not reviewed, or empty). ``domain``: the newest result's domain score, or
    the one saved with the template version (None when neither was measured)."""
    from drafting import confidence

    job = job_latest_result_for_draft(draft=draft)
    result = job.result if job else None
    targets = {t.get("fragment") for t in (job.target_fragments if job else [])}
    waiting = [f for f in draft.fragments.filter(id__in=targets)
               if f.status in {Fragment.Status.EMPTY, Fragment.Status.REJECTED}
               or (f.status == Fragment.Status.PROVISIONAL and (f.confidence or {}).get("low"))]
    domain = confidence.result_domain(result) or confidence.version_domain(draft.template_version)
    return {
        "needs_person": confidence.result_needs_person(result) and bool(waiting),
        "domain": domain,
        "domain_unfamiliar": bool(domain and domain["unfamiliar"]),
        "domain_warning": confidence.DOMAIN_WARNING,
    }


def queue_position(*, job: InfillJob) -> int:
    """How many queued jobs were created before this one (0 = next)."""
    if job.state != InfillJob.State.QUEUED:
        return 0
    return InfillJob.objects.filter(state=InfillJob.State.QUEUED, created__lt=job.created).count()


def draft_text(*, draft: Draft) -> str:
    return "".join(f.text for f in draft.fragments.all())


def draft_has_provisional(*, draft: Draft) -> bool:
    return draft.fragments.filter(status=Fragment.Status.PROVISIONAL).exists()


def job_list_for_user(*, user: Any, limit: int = 50) -> QuerySet[InfillJob]:
    return InfillJob.objects.filter(owner=user).order_by("-created")[:limit]


def draft_revision_list(*, draft: Draft) -> QuerySet[DraftRevision]:
    return draft.revisions.order_by("-number")


def job_active_for_draft(*, draft: Draft) -> InfillJob | None:
    """The draft's queued or running job, if any."""
    return draft.jobs.exclude(state__in=InfillJob.FINAL_STATES).order_by("-created").first()


def revision_diff(*, draft: Draft) -> str:
    """Unified diff of the two newest revisions ('' when there is only one)."""
    newest = list(draft.revisions.order_by("-number")[:2])
    if len(newest) < 2:
        return ""
    new, old = newest
    return "".join(
        difflib.unified_diff(
            old.text.splitlines(keepends=True), new.text.splitlines(keepends=True),
            fromfile=f"revision {old.number}", tofile=f"revision {new.number}",
        )
    )  # fmt: skip
