"""Writes: templates, drafts, fragments, review actions and infill job requests.

Every function is named ``<entity>_<action>`` and takes keyword-only arguments. A person's bad
input raises :class:`UserError` (or :class:`~drafting.templating.TemplateError`) before
anything is written, so nothing already saved is lost.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from drafting import docformat, metrics, signals
from drafting.admission import admission_check
from drafting.authoring import template_version_create  # noqa: F401 (re-exported)
from drafting.canvas_check import (  # noqa: F401 (CANVAS_KEYS: re-exported)
    CANVAS_KEYS,
    MAX_HINT_CHARS,
    MAX_PURPOSE_CHARS,
    canvas_request_check,
)
from drafting.checks import draft_document_violations, version_parse
from drafting.confidence import span_confidence_clean
from drafting.errors import AdmissionError, ConflictError, UserError  # noqa: F401 (AdmissionError: re-exported)
from drafting.models import (
    Draft,
    DraftRevision,
    Fragment,
    InfillJob,
    TemplateVersion,
)
from drafting.templating import (
    MAX_HOLE_TOKENS,
    field_errors,
)

logger = logging.getLogger(__name__)

DRAFT_TITLE_MAX = 200
CHARS_PER_TOKEN_ESTIMATE = 3  # sizing a hole for text a person unlocked: ~3 chars per token
MIN_UNLOCKED_HOLE_TOKENS = 4
# A regenerate asks for different text: a fresh seed alone changes nothing at temperature 0
# (argmax), so it samples (SamplerConfig.temperature); the variation a person picks sets how far.
VARIATIONS = {"small": 0.5, "medium": 0.8, "large": 1.2}
DEFAULT_VARIATION = "medium"
RUN_INFILL_TASK = "gpu_worker.tasks.run_infill"  # enqueued by name: the web app never imports the worker


def rewrite_budget(text: str) -> int:
    """Hole size for rewriting ``text``: room for a rewrite about twice its estimated tokens."""
    estimate = 2 * len(text) // CHARS_PER_TOKEN_ESTIMATE + 2
    return min(MAX_HOLE_TOKENS, max(MIN_UNLOCKED_HOLE_TOKENS, estimate))


# -- drafts ---------------------------------------------------------------------------------
def _clean_values(version: TemplateVersion, values: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(values, dict):
        raise UserError("field values must be a JSON object")
    return docformat.values_clean(version.fields, values)


def draft_values_check(*, version: TemplateVersion, values: dict[str, Any]) -> dict[str, Any]:
    """Cleaned values, or UserError with a message per field."""
    cleaned = _clean_values(version, values)
    nul = sorted(k for k, v in cleaned.items() if isinstance(v, str) and "\x00" in v)
    if nul:
        raise UserError("Some fields need attention.",
                        errors={k: "This field contains a NUL character." for k in nul})  # fmt: skip
    errors = field_errors(
        cleaned, version.fields, max_field_length=settings.STENCIL_MAX_FIELD_LENGTH
    )
    if errors:
        raise UserError("Some fields need attention.", errors=errors)
    return cleaned


def _field_text(version: TemplateVersion, fragment_spec: dict[str, Any], name: str,
                values: dict[str, Any]) -> str:  # fmt: skip
    """A field's value as it stands in the document: display format, escaped for its place."""
    declared: dict[str, Any] = next((f for f in version.fields if f["name"] == name), {})
    context = fragment_spec.get("context") or docformat.CONTEXT_TEXT
    return docformat.field_text(values.get(name), declared, context=context,
                                doc_format=version.doc_format)  # fmt: skip


@transaction.atomic
def draft_create(
    *, owner: Any, version: TemplateVersion, values: dict[str, Any], title: str = ""
) -> Draft:
    cleaned = draft_values_check(version=version, values=values)
    title = (title or version.template.title).strip()[:DRAFT_TITLE_MAX]
    draft = Draft.objects.create(
        owner=owner, template_version=version, title=title, values=cleaned, revision=1
    )
    parsed = version_parse(version)
    holes = {h["name"]: h for h in version.holes}
    specs = [
        {**holes.get(piece.name, {}), "context": context} if piece.kind == "fill"
        else {"context": context} if piece.kind == "field" else {}
        for piece, context in zip(parsed.pieces, parsed.contexts, strict=True)
    ]  # fmt: skip
    Fragment.objects.bulk_create(
        Fragment(
            draft=draft,
            position=i,
            kind=piece.kind,
            name=piece.name,
            text=_field_text(version, spec, piece.name, cleaned) if piece.kind == "field"
            else piece.text,
            locked=piece.kind != "fill",
            status=Fragment.Status.EMPTY if piece.kind == "fill" else Fragment.Status.FIXED,
            spec=spec,
        )
        for i, (piece, spec) in enumerate(zip(parsed.pieces, specs, strict=True))
    )  # fmt: skip
    draft_revision_record(draft=draft, reason="created", user=owner)
    return draft


@transaction.atomic
def draft_values_update(*, draft: Draft, values: dict[str, Any]) -> Draft:
    """Autosave the form: validate everything first, then rewrite the field fragments."""
    merged = {**draft.values, **values} if isinstance(values, dict) else values
    cleaned = draft_values_check(version=draft.template_version, values=merged)
    locked = Draft.objects.select_for_update().get(pk=draft.pk)
    locked.values = cleaned
    locked.revision = F("revision") + 1
    locked.save(update_fields=["values", "revision", "updated"])
    changed = False
    for fragment in locked.fragments.filter(kind=Fragment.Kind.FIELD):
        new_text = _field_text(locked.template_version, fragment.spec or {}, fragment.name,
                               cleaned)  # fmt: skip
        if fragment.text != new_text:
            fragment.text = new_text
            fragment.save(update_fields=["text"])
            changed = True
    locked.refresh_from_db()
    if changed:  # the text a person reads changed: that is a revision they can see and compare
        draft_revision_record(draft=locked, reason="values", user=locked.owner)
    return locked


def _bump(draft: Draft) -> None:
    Draft.objects.filter(pk=draft.pk).update(revision=F("revision") + 1, updated=timezone.now())
    draft.refresh_from_db(fields=["revision", "updated"])


def draft_snapshot(*, draft: Draft) -> list[dict[str, Any]]:
    return [
        {"id": f.id, "kind": f.kind, "name": f.name, "text": f.text, "locked": f.locked,
         "status": f.status}
        for f in draft.fragments.all()
    ]  # fmt: skip


def draft_revision_record(*, draft: Draft, reason: str, user: Any, accepted: bool = False
                          ) -> DraftRevision:  # fmt: skip
    fragments = draft_snapshot(draft=draft)
    last = draft.revisions.order_by("-number").first()
    return DraftRevision.objects.create(
        draft=draft,
        number=(last.number + 1) if last else 1,
        reason=reason,
        fragments=fragments,
        text="".join(f["text"] for f in fragments),
        accepted=accepted,
        created_by=user if getattr(user, "is_authenticated", False) else None,
    )


def draft_delete(*, draft: Draft) -> None:
    """Delete a draft with its fragments, revisions and jobs (audit records stay)."""
    with transaction.atomic():
        locked = Draft.objects.select_for_update().filter(pk=draft.pk).first()
        if locked is None:
            return
        if locked.jobs.exclude(state__in=InfillJob.FINAL_STATES).exists():
            raise UserError("An infill for this draft is still running: cancel it or let it "
                            "finish, then delete the draft.")  # fmt: skip
        locked.delete()


# -- fragments and review -------------------------------------------------------------------
def _json_punctuation_check(fragment: Fragment) -> None:
    """A JSON record's keys and punctuation are template text: the model never rewrites them."""
    if fragment.kind == Fragment.Kind.TEXT and fragment.draft.template_version.doc_format == "json":
        raise UserError("In a JSON record the keys and punctuation stay locked; "
                        "unlock or regenerate a value instead.")  # fmt: skip


@transaction.atomic
def fragment_lock_set(*, fragment: Fragment, locked: bool) -> Fragment:
    if not locked:
        _json_punctuation_check(fragment)
    fragment.locked = locked
    fragment.save(update_fields=["locked"])
    _bump(fragment.draft)
    return fragment


@transaction.atomic
def fragment_review(*, fragment: Fragment, action: str, user: Any, text: str | None = None,
                    accept_anyway: bool = False) -> Fragment:  # fmt: skip
    """accept | reject | edit | write a span. Rejecting empties it and unlocks it for a refill;
    ``write`` is a person writing a span the model could not (recorded as such). Model text
    flagged low-confidence is accepted only with ``accept_anyway``: a deliberate choice."""
    if fragment.kind == Fragment.Kind.TEXT and action not in {"edit", "write"}:
        raise UserError("template text has nothing to accept or reject")
    if action == "accept":
        if fragment.status not in {Fragment.Status.PROVISIONAL, Fragment.Status.EDITED}:
            raise UserError("only provisional or edited text can be accepted")
        if (fragment.status == Fragment.Status.PROVISIONAL and fragment.confidence.get("low")
                and not accept_anyway):  # fmt: skip
            raise UserError("this span is flagged low-confidence: check it, then choose "
                            "“Accept anyway”, or rewrite it")  # fmt: skip
        fragment.status, fragment.locked = Fragment.Status.ACCEPTED, True
    elif action == "reject":
        fragment.status, fragment.text, fragment.locked = Fragment.Status.REJECTED, "", False
    elif action in {"edit", "write"}:
        if text is None:
            raise UserError("an edit needs the new text")
        if len(text) > settings.STENCIL_MAX_FIELD_LENGTH:
            raise UserError(f"the text is longer than {settings.STENCIL_MAX_FIELD_LENGTH} characters")
        if fragment.kind == Fragment.Kind.FILL:  # a person types a value: write it for its place
            text = docformat.escape_edit(text, (fragment.spec or {}).get("context", ""))
        else:
            _json_punctuation_check(fragment)
        fragment.text, fragment.status, fragment.locked = text, Fragment.Status.EDITED, True
        fragment.written_by, fragment.confidence = "person", {}
    else:
        raise UserError(f"unknown review action {action!r}")
    fragment.save(update_fields=["status", "text", "locked", "written_by", "confidence"])
    _bump(fragment.draft)
    draft_revision_record(draft=fragment.draft, reason=action, user=user)
    return fragment


@transaction.atomic
def fragment_split_for_regeneration(*, fragment: Fragment, start: int, end: int) -> Fragment:
    """Cut [start, end) of a fragment's text into its own unlocked fill; returns that fill."""
    text = fragment.text
    if not 0 <= start < end <= len(text):
        raise UserError(f"the selection {start}..{end} is outside the fragment's text")
    pieces = [(t, role) for t, role in ((text[:start], "keep"), (text[start:end], "regenerate"),
                                        (text[end:], "keep")) if t]  # fmt: skip
    draft, first_position = fragment.draft, fragment.position
    later = draft.fragments.filter(position__gt=first_position).order_by("-position")
    for other in later:  # move from the end so positions stay unique
        other.position += len(pieces) - 1
        other.save(update_fields=["position"])
    middle = fragment
    for offset, (piece_text, role) in enumerate(pieces):
        target = fragment if offset == 0 else Fragment(
            draft=draft, kind=fragment.kind, name=fragment.name, locked=fragment.locked,
            status=fragment.status, spec=fragment.spec,
        )  # fmt: skip
        target.position, target.text = first_position + offset, piece_text
        if role == "regenerate":
            target.kind, target.locked = Fragment.Kind.FILL, False
            # A constraint describes the whole fragment, so it holds only for a whole selection.
            kept = fragment.spec if len(pieces) == 1 else {
                k: v for k, v in (fragment.spec or {}).items() if k in {"context", "label"}}
            target.spec = {**kept, "hint": piece_text,
                           "max_tokens": rewrite_budget(piece_text)}
            middle = target
        target.save()
    _bump(draft)
    return middle


@transaction.atomic
def draft_accept(*, draft: Draft, expected_revision: int, user: Any) -> DraftRevision:
    """Make an immutable accepted revision; compare-and-set on the draft's revision.

    Only reviewers (the ``drafting.accept_draft`` permission) accept; accepting text that is
    already the accepted revision is refused rather than recorded twice.
    """
    if not user.has_perm("drafting.accept_draft"):
        raise PermissionDenied("accepting a draft needs the reviewer role")
    if draft.fragments.filter(status=Fragment.Status.PROVISIONAL).exists():
        raise UserError("accept or reject every provisional span first")
    problems = draft_document_violations(draft=draft)
    if problems:
        raise UserError("the document is not ready: " + "; ".join(map(str, problems)),
                        errors={p.where or "__all__": p.message for p in problems})  # fmt: skip
    updated = Draft.objects.filter(pk=draft.pk, revision=expected_revision).update(
        revision=F("revision") + 1, updated=timezone.now()
    )
    if updated == 0:
        raise ConflictError("the draft changed since this page was loaded (or was already accepted)")
    draft.refresh_from_db()
    current = "".join(f.text for f in draft.fragments.all())
    if draft.accepted_revision is not None and draft.accepted_revision.text == current:
        raise ConflictError(f"this text is already accepted as revision {draft.accepted_revision.number}")
    revision = draft_revision_record(draft=draft, reason="accepted", user=user, accepted=True)
    Draft.objects.filter(pk=draft.pk).update(accepted_revision=revision)
    draft.refresh_from_db()
    transaction.on_commit(lambda: _announce_accepted(draft, revision, user))
    return revision


def _announce_accepted(draft: Draft, revision: DraftRevision, user: Any) -> None:
    for receiver, answer in signals.draft_accepted.send_robust(
        sender=Draft, draft=draft, revision=revision, user=user
    ):  # fmt: skip
        if isinstance(answer, Exception):
            logger.error("after draft %s was accepted, %r failed: %s", draft.pk, receiver, answer,
                         exc_info=answer)  # fmt: skip


# -- infill requests ------------------------------------------------------------------------
@dataclass(frozen=True)
class CanvasPlan:
    request: dict[str, Any]  # Canvas JSON
    targets: list[dict[str, Any]]  # [{"fragment": id, "hole": name}]


def _hole_for(fragment: Fragment) -> dict[str, Any]:
    spec = fragment.spec or {}
    if fragment.kind == Fragment.Kind.FILL and spec.get("max_tokens"):
        max_tokens = int(spec["max_tokens"])
    else:  # a person unlocked fixed text: give the model room for a rewrite of similar size
        max_tokens = rewrite_budget(fragment.text)
    hole: dict[str, Any] = {"hole": f"{fragment.name or 'span'}_{fragment.id}",
                            "max_tokens": max_tokens}
    if isinstance(spec.get("hint"), str) and spec["hint"].strip():  # read by an instruct model's preamble
        hole["hint"] = spec["hint"][:MAX_HINT_CHARS]
    if spec.get("constraint"):
        hole["constraint"] = spec["constraint"]
    elif spec.get("context") == docformat.CONTEXT_JSON_STRING:
        hole["constraint"] = {"pattern": docformat.JSON_STRING_PATTERN}
    return hole


def draft_canvas_plan(*, draft: Draft, fragment_ids: list[int] | None = None) -> CanvasPlan:
    """Canvas JSON for a draft: targeted (or all unlocked) fragments are holes, the rest text."""
    fragments = list(draft.fragments.all())
    if fragment_ids is None:
        targets = [f for f in fragments if not f.locked]
    else:
        wanted = set(fragment_ids)
        targets = [f for f in fragments if f.id in wanted]
        if len(targets) != len(wanted):
            raise UserError("some of the selected fragments are not in this draft")
        if any(f.locked for f in targets):
            raise UserError("unlock a fragment before asking the model to rewrite it")
    if not targets:
        raise UserError("nothing is unlocked: unlock a fragment or an infill first")
    target_ids = {f.id for f in targets}
    segments: list[dict[str, Any]] = []
    plan_targets: list[dict[str, Any]] = []
    for fragment in fragments:
        if fragment.id in target_ids:
            hole = _hole_for(fragment)
            segments.append(hole)
            plan_targets.append({"fragment": fragment.id, "hole": hole["hole"]})
        elif fragment.text:
            if segments and "text" in segments[-1]:
                segments[-1]["text"] += fragment.text
            else:
                segments.append({"text": fragment.text})
    request: dict[str, Any] = {"segments": segments}
    purpose = draft.template_version.template.description.strip()
    if purpose:  # what the document is for, read by an instruct model's preamble
        request["purpose"] = purpose[:MAX_PURPOSE_CHARS]
    return CanvasPlan(request=request, targets=plan_targets)


def infill_job_create(
    *, owner: Any, request: dict[str, Any], preset: str = "balanced",
    draft: Draft | None = None, targets: list[dict[str, Any]] | None = None,
) -> InfillJob:  # fmt: skip
    """Queue an infill job; its id is sent to the broker when the transaction commits."""
    from gpu_worker.engine.config import PRESETS, config_from_overrides

    request = canvas_request_check(request)
    if preset not in PRESETS:
        raise UserError(f"preset must be one of {', '.join(PRESETS)}")
    try:
        config = config_from_overrides(preset, request.get("sampler") or {})
    except ValueError as exc:
        raise UserError(f"sampler settings: {exc}") from exc
    if config.max_steps > settings.STENCIL_MAX_REQUEST_STEPS:
        raise UserError(f"max_steps may be at most {settings.STENCIL_MAX_REQUEST_STEPS}")
    seed = request.get("seed")
    if seed is None:
        seed = secrets.randbelow(2**31)
    with transaction.atomic():
        admission_check(owner=owner)
        job = InfillJob.objects.create(
            owner=owner,
            draft=draft,
            preset=preset,
            request={**request, "seed": seed},
            config=config.to_dict(),
            config_sha256=config.sha256,
            seed=seed,
            target_fragments=targets or [],
            base_revision=draft.revision if draft else 0,
        )
        transaction.on_commit(lambda: job_dispatch(job_id=str(job.id)))
    return job


def job_dispatch(*, job_id: str) -> bool:
    """Send the job's id (never the job) to the denoise queue, naming the worker's task.

    The job row is the outbox: ``dispatched`` is stamped only once the broker took the id.
    When the broker is down the row stays queued and undispatched, and the worker's sweeper
    (gpu_worker/sweeper.py) sends it when the broker is back; the request still succeeds.
    """
    from celery import current_app as app
    from kombu.exceptions import OperationalError as BrokerError

    try:
        app.send_task(RUN_INFILL_TASK, (job_id,), queue=settings.QUEUE_DENOISE)
    except (BrokerError, OSError) as exc:
        logger.warning("broker unavailable, job %s waits for the sweeper: %s", job_id, exc)
        metrics.DISPATCH_FAILURES.inc()
        return False
    InfillJob.objects.filter(pk=job_id).update(dispatched=timezone.now())
    return True


def draft_infill_request(*, draft: Draft, user: Any, preset: str,
                         fragment_ids: list[int] | None = None,
                         sampler: dict[str, Any] | None = None) -> InfillJob:  # fmt: skip
    with transaction.atomic():
        # The draft's row lock makes "none running, so queue one" a single step: of concurrent
        # requests on one draft, the first queues its job and the others see it.
        Draft.objects.select_for_update().filter(pk=draft.pk).first()
        running = draft.jobs.filter(
            state__in=[InfillJob.State.QUEUED, InfillJob.State.RUNNING, InfillJob.State.VALIDATING]
        )
        if running.exists():
            raise UserError("an infill for this draft is already running; wait or cancel it")
        plan = draft_canvas_plan(draft=draft, fragment_ids=fragment_ids)
        if sampler:
            plan.request["sampler"] = dict(sampler)
        return infill_job_create(
            owner=user, request=plan.request, preset=preset, draft=draft, targets=plan.targets
        )


def infill_job_cancel(*, job: InfillJob) -> InfillJob:
    """Ask a job to stop: a queued job ends now; a running one at its next denoising step."""
    with transaction.atomic():
        InfillJob.objects.filter(pk=job.pk, state=InfillJob.State.QUEUED).update(
            state=InfillJob.State.CANCELLED, cancel_requested=True, finished=timezone.now(),
            reasons=["cancelled before it started"],
        )  # fmt: skip
        InfillJob.objects.filter(
            Q(pk=job.pk) & ~Q(state__in=InfillJob.FINAL_STATES)
        ).update(cancel_requested=True)
    job.refresh_from_db()
    return job


@transaction.atomic
def draft_apply_job_result(*, job: InfillJob) -> None:
    """Write a succeeded job's fills into its draft as provisional text, plus a revision.

    Each span carries the worker's confidence in it (``result["confidence"][hole]``, checked;
    {} where the job measured none), so the review page can flag a guess."""
    if job.draft is None or not job.result:
        return
    holes: dict[str, str] = job.result.get("holes", {})
    confidence = job.result.get("confidence")
    confidence = confidence if isinstance(confidence, dict) else {}
    for target in job.target_fragments:
        fragment = Fragment.objects.filter(pk=target["fragment"], draft=job.draft).first()
        if fragment is None or fragment.locked:
            continue  # deleted or locked by the person meanwhile: their text wins
        fragment.text = holes.get(target["hole"], "")
        fragment.status, fragment.job, fragment.written_by = Fragment.Status.PROVISIONAL, job, "model"
        fragment.confidence = span_confidence_clean(confidence.get(target["hole"]), fragment.text)
        fragment.kind = Fragment.Kind.FILL
        fragment.save(update_fields=["text", "status", "job", "kind", "written_by", "confidence"])
    _bump(job.draft)
    draft_revision_record(draft=job.draft, reason="infill", user=None)


def fragment_regenerate(*, fragment: Fragment, user: Any, preset: str,
                        start: int | None = None, end: int | None = None,
                        variation: str = DEFAULT_VARIATION) -> InfillJob:  # fmt: skip
    """Ask the model to rewrite one fragment, or the [start, end) span of it, and nothing else.

    It samples at the variation's temperature (VARIATIONS) under a fresh seed, so a person gets
    different text. The job keeps the text it replaces and the run that wrote it, beside its
    own run: the review page shows both. The split and the unlock are undone when the job
    cannot be queued (busy, admission).
    """
    if fragment.kind == Fragment.Kind.FIELD:
        raise UserError("this text is a form value: change it in the form instead")
    _json_punctuation_check(fragment)
    if (start is None) != (end is None):
        raise UserError("a selection needs both its start and its end")
    if variation not in VARIATIONS:
        raise UserError(f"variation must be one of {', '.join(VARIATIONS)}")
    with transaction.atomic():
        if start is not None and end is not None:
            fragment = fragment_split_for_regeneration(fragment=fragment, start=start, end=end)
        elif fragment.locked:
            fragment = fragment_lock_set(fragment=fragment, locked=False)
        previous_run = (fragment.job.result or {}).get("run_id") if fragment.job else None
        job = draft_infill_request(
            draft=fragment.draft, user=user, preset=preset, fragment_ids=[fragment.id],
            sampler={"temperature": VARIATIONS[variation]},
        )
        job.target_fragments = [{**t, "previous": fragment.text, "previous_run": previous_run,
                                 "variation": variation} for t in job.target_fragments]  # fmt: skip
        job.save(update_fields=["target_fragments"])
        return job
