"""Running an infill job inside a worker: claim, route, attempts, validation, fallback, result.

Called by the Celery task (gpu_worker/tasks.py) with a job id. The job row is the truth: a
claim is a conditional update (:mod:`gpu_worker.claims`), a redelivered message finds nothing
to do, and a result is written only by the worker that holds the current claim.

One job's story (:func:`job_run`): claim it and the queued or orphaned jobs with its sampler
config that it can batch with; route each; run the diffusion ones' first attempt as one
denoising batch; then, per job, attempts in order (retries with escalation, then the other
route's fallback) through the engine's one entry point (``gpu_worker.engine.run``), each
recorded as a run record (audit) with its context built once (:func:`_run_context`);
validation decides whether the job succeeds or goes on.

Every step after the first claim runs inside the error guard (:func:`_end_crashed`), for every
job the run holds: a lost database connection gives the job back to the queue for another
delivery; anything else (a bug, an exhausted soft time limit) ends it FAILED with the reason;
when even that cannot be written, the job's lease runs out and the sweeper sends it again.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction
from django.utils import timezone

from drafting import metrics
from drafting.models import InfillJob
from drafting.router import RouteDecision, confidence_escalates, low_span, route_choose
from drafting.services import draft_apply_job_result, job_dispatch
from gpu_worker.claims import Claim, claim_batch_mates, holds, job_claim, job_finish, job_release
from gpu_worker.engine.outcome import AR, DIFFUSION
from gpu_worker.model_choice import CONFIGURED, ModelChoice, model_choice
from gpu_worker.progress import CancelPoll, Held, Progress, fault_stall

if TYPE_CHECKING:  # the engine (and torch) load with the first job, not with the web app
    import torch

    from audit.runbody import RunContext
    from gpu_worker.engine.loaded import LoadedModel
    from gpu_worker.engine.outcome import Outcome

log = logging.getLogger(__name__)
# What job_run says of a job besides its final states:
SKIPPED = "skipped"  # nothing to do: already final, cancelled, unknown, or at its cap
REQUEUED = "requeued"  # given back to the queue after a fault that was not the job's
LOST = "lost"  # another worker holds the job now (this worker's lease had run out)
ABANDONED = "abandoned"  # its end could not be written: it is sent again once its lease runs out
TRANSIENT_ERRORS = (OperationalError, InterfaceError)  # the database went away, not the job


def derive_seed(seed: int, attempt: int) -> int:
    """Attempt 0 uses the job's seed; retries use a seed derived from it (recorded)."""
    if attempt == 0:
        return seed
    digest = hashlib.sha256(f"{seed}:{attempt}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def escalate(config: dict[str, Any], attempt: int) -> dict[str, Any]:
    """Retries spend more: exact attention, one token per step in the block, more steps."""
    if attempt == 0:
        return dict(config)
    return {
        **config,
        "commit_rule": "even",
        "cache": "none",
        "steps_per_block": config["block_length"],
        "max_steps": min(settings.STENCIL_MAX_REQUEST_STEPS, config["max_steps"] * 2),
    }


def job_run(*, job_id: str, worker: str) -> str:
    """Run one job (and the jobs it batches) until each is final, given back, or lost.

    Returns what became of ``job_id``'s job: a final state or one of the names above.
    """
    claim = job_claim(job_id=job_id, worker=worker)
    if claim is None:
        return SKIPPED
    held = Held(claim)
    try:
        for mate in claim_batch_mates(claim, worker):
            held.add(mate)
        fault_stall(held)
        decisions, choices, first = _route_and_batch(held)
    except Exception as exc:  # as in _run_guarded, for every job the run holds
        dropped = _session_dropped(exc)
        states = []
        for c in held.all():
            states.append(_end_crashed(c, exc, begun=held.began(c), dropped=dropped))
            held.drop(c)
            if states[-1] in InfillJob.FINAL_STATES:
                metrics.END_TO_END.labels(state=states[-1]).observe(_age(c.job))
        return states[0]
    states = [_run_guarded(c, held, decisions[c.job.pk], first.get(c.job.pk), choices[c.job.pk])
              for c in held.all()]  # fmt: skip
    return states[0]


def _route_and_batch(held: Held) -> tuple[dict[Any, RouteDecision], dict[Any, ModelChoice],
                                           dict[Any, _Batched]]:  # fmt: skip
    """Route every claimed job and choose its model (once per job: a promotion or rollback
    applies from the next job); run the first attempt of the diffusion ones that share a model
    as one batch."""
    claims = held.all()
    decisions = {c.job.pk: _route(c) for c in claims}
    choices = {c.job.pk: model_choice(c.job) for c in claims}
    groups: dict[ModelChoice, list[Claim]] = {}
    for c in claims:
        if decisions[c.job.pk].route == DIFFUSION:
            groups.setdefault(choices[c.job.pk], []).append(c)
    first: dict[Any, _Batched] = {}
    for choice, group in groups.items():
        if len(group) > 1:
            first.update(_first_attempt_batched(group, held, choice))
    return decisions, choices, first


def _route(claim: Claim) -> RouteDecision:
    job = claim.job
    decision = route_choose(job=job)
    job.route, job.route_reason = decision.route, decision.as_json()
    InfillJob.objects.filter(claim.mine()).update(route=job.route, route_reason=job.route_reason)
    return decision


def _run_guarded(claim: Claim, held: Held, decision: RouteDecision, first: _Batched | None,
                 choice: ModelChoice) -> str:  # fmt: skip
    job = claim.job
    metrics.QUEUE_WAIT.observe(((job.started or job.created) - job.created).total_seconds())
    started = time.monotonic()
    try:
        state = _run_claimed(claim, held, decision, first, choice)
    except Exception as exc:  # a bug, a lost database, an exhausted soft time limit
        state = _end_crashed(claim, exc, begun=held.began(claim), dropped=_session_dropped(exc))
    finally:
        held.drop(claim)
    if state in InfillJob.FINAL_STATES:
        metrics.END_TO_END.labels(state=state).observe(_age(job))
    # The batch's first attempt is shared: each of its jobs is charged its part of the batch.
    shared = first.seconds if first is not None else 0.0
    metrics.JOB_SECONDS.labels(route=job.route).inc(time.monotonic() - started + shared)
    return state


def _age(job: InfillJob) -> float:
    return (timezone.now() - job.created).total_seconds()


def _end_crashed(claim: Claim, exc: Exception, *, begun: bool, dropped: bool) -> str:
    """The error guard's end for a held job: given back on a database fault, else FAILED.

    When the database dropped the session itself (``dropped``, see :func:`_session_dropped`),
    the job is not what failed, and a delivery whose work had begun is not counted against its
    cap; a database error on a live connection (a deadlock, a timeout, a limit the job's data
    reached) still counts.
    """
    job, name = claim.job, type(exc).__name__
    try:
        if isinstance(exc, TRANSIENT_ERRORS):
            log.warning("job %s: database error (%s: %s); giving it back to the queue",
                        job.pk, name, exc)  # fmt: skip
            return _requeue(claim, name, refund=dropped and begun)
        if not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()
        log.error("job %s crashed", job.pk, exc_info=exc)
        reason = f"the worker stopped on an internal error ({name}: {exc})"
        if name == "SoftTimeLimitExceeded":
            reason = f"the job ran past its time limit of {settings.CELERY_TASK_SOFT_TIME_LIMIT}s"
        if not job_finish(job, claim.token, state=InfillJob.State.FAILED, reasons=[reason]):
            return LOST
        metrics.JOB_FAILURES.labels(reason=name).inc()
        return InfillJob.State.FAILED
    except DatabaseError as again:  # the database is still away: the lease runs out instead
        log.warning("job %s: its end could not be written (%s); the sweeper sends it again "
                    "when its lease runs out", job.pk, again)  # fmt: skip
        return ABANDONED


def _session_dropped(exc: Exception) -> bool:
    """Whether ``exc`` came with the loss of this process's database session (a restart, a
    failover, a terminated backend: the connection is unusable afterwards). A dead connection
    is dropped here, so the next query reconnects."""
    if not isinstance(exc, TRANSIENT_ERRORS):
        return False
    if isinstance(exc, InterfaceError) or connection.connection is None:
        return True
    if connection.in_atomic_block:
        return False  # the transaction's owner rolls back first; the connection is not ours
    try:
        if connection.is_usable():
            return False
        connection.close()
    except DatabaseError:
        pass
    return True


def _requeue(claim: Claim, cause: str, *, refund: bool) -> str:
    state = job_release(claim, refund=refund)
    if state is None:
        return LOST
    if state == InfillJob.State.QUEUED:
        metrics.REQUEUED.labels(reason=cause).inc()
        job_dispatch(job_id=str(claim.job.pk))  # when the broker is away too, the sweeper sends it
        return REQUEUED
    return state


@dataclass
class _Batched:
    """A first attempt already run in a batch: its outcome (or the canvas error)."""

    outcome: Outcome | None
    error: str | None
    batch: list[str]
    snapshots: list[str]
    seconds: float  # this job's share of the batch's wall time


def _first_attempt_batched(
    claims: list[Claim], held: Held, choice: ModelChoice
) -> dict[Any, _Batched]:
    """One denoising batch for the first attempt of several jobs with one config and model."""
    from gpu_worker.engine.config import SamplerConfig
    from gpu_worker.engine.run import run_batch
    from gpu_worker.runtime import ModelVersionUnavailable, choose_device

    device = choose_device(settings.STENCIL_DEVICE)
    try:
        loaded = _model_load(DIFFUSION, choice, device)
    except ModelVersionUnavailable:
        return {}  # each job then fails alone, saying why (_run_claimed)
    claims = [c for c in claims if held.begin(c)]  # the work of each begins now (the cap)
    if not claims:
        return {}
    started = time.monotonic()
    config = claims[0].job.config
    progress = [Progress(c, held, 0, int(config["max_steps"]), with_texts=True) for c in claims]
    cancelled = CancelPoll([c.job.pk for c in claims])
    hooks = [p.hooks(should_stop=functools.partial(cancelled.requested, c.job.pk))
             for p, c in zip(progress, claims, strict=True)]  # fmt: skip
    results = run_batch(
        DIFFUSION, loaded, [{**c.job.request, "seed": derive_seed(c.job.seed, 0)} for c in claims],
        SamplerConfig.from_json(config), hooks,
    )  # fmt: skip
    share = (time.monotonic() - started) / len(claims)
    batch = [str(c.job.pk) for c in claims]
    return {
        c.job.pk: _Batched(outcome=None if isinstance(r, ValueError) else r,
                           error=str(r) if isinstance(r, ValueError) else None, batch=batch,
                           snapshots=p.snapshots, seconds=share)
        for c, r, p in zip(claims, results, progress, strict=True)
    }  # fmt: skip


def _run_claimed(claim: Claim, held: Held, decision: RouteDecision,
                 first: _Batched | None, choice: ModelChoice) -> str:  # fmt: skip
    from gpu_worker.runtime import ModelVersionUnavailable, choose_device

    job = claim.job
    device = choose_device(settings.STENCIL_DEVICE)
    plans = _attempt_plan(job, decision)
    reasons: list[str] = []
    kept: _Kept | None = None  # a valid result with a low-confidence span, escalated from
    for attempt, (route, config) in enumerate(plans):
        if kept is not None and route == kept.route:
            continue  # escalated: the other route's attempt is next
        try:
            loaded = _model_load(route, choice, device)
        except ModelVersionUnavailable as exc:
            return _fail_model_version(claim, choice, exc)
        seed = derive_seed(job.seed, attempt)
        batch = [str(job.pk)]
        if attempt == 0 and first is not None:
            if first.outcome is None:
                return _fail_bad_canvas(claim, str(first.error))
            outcome, batch, snapshots = first.outcome, first.batch, first.snapshots
        else:
            if not held.begin(claim):
                return LOST
            progress = Progress(claim, held, attempt, int(config["max_steps"]),
                                with_texts=route == DIFFUSION)  # fmt: skip
            ran = _attempt(job, loaded, route, config, seed, progress)
            if isinstance(ran, str):  # the canvas itself is bad: no retry can help
                return _fail_bad_canvas(claim, ran)
            outcome, snapshots = ran, progress.snapshots
        if not holds(claim):  # a worker that lost its claim records nothing
            return LOST
        context = _run_context(job, attempt, route, seed, loaded, device, decision, batch, choice)
        run_id = _record_attempt(claim, context, outcome, snapshots)
        if outcome.cancelled:
            if not job_finish(job, claim.token, state=InfillJob.State.CANCELLED,
                              reasons=[f"cancelled at step {outcome.steps}"]):  # fmt: skip
                return LOST
            metrics.CANCELLATIONS.inc()
            return InfillJob.State.CANCELLED
        InfillJob.objects.filter(claim.mine()).update(state=InfillJob.State.VALIDATING)
        violations = [*outcome.violations, *_injected_violations(route)]
        _observe_attempt(outcome, route, decision)
        if not violations:
            this = _Kept(outcome, route, attempt, run_id, batch, loaded.name, loaded.placeholder,
                         dict(context.model_version or {}))  # fmt: skip
            low = _observe_confidence(outcome, route)
            if kept is None and low and confidence_escalates(
                route=route, confidence=outcome.confidence, variation=_is_variation(job)
            ) and any(r != route for r, _c in plans[attempt + 1 :]):  # fmt: skip
                metrics.CONFIDENCE_ESCALATIONS.labels(route=route).inc()
                kept = this
                continue
            # Not escalated: the other route was tried (or cannot be); every result is low.
            if kept is not None and low:  # the surer of the two stays
                this = max((kept, this), key=lambda k: _mean_p(k.outcome))
            state = _succeed(claim, this, needs_person=low)
            if state == InfillJob.State.SUCCEEDED and decision.shadow and attempt == 0:
                _run_shadow(claim, held, decision, outcome, device, choice)
            return state
        for v in violations:
            metrics.VALIDATION_FAILURES.labels(reason=str(v.get("name", "unknown"))).inc()
        reasons.extend(
            f"attempt {attempt + 1} ({route}): {v.get('hole') or 'document'}: "
            f"{v.get('message', v.get('name'))}"
            for v in violations
        )
        _open_incident(job, run_id, "validation_failure",
                       f"{route} attempt {attempt + 1} failed validation: "
                       + ", ".join(sorted({str(v.get('name')) for v in violations})))  # fmt: skip
        if attempt + 1 < len(plans):
            nxt = plans[attempt + 1][0]
            if nxt != route:
                metrics.FALLBACKS.inc()
                _open_incident(job, run_id, "fallback", f"falling back from {route} to {nxt}")
            else:
                metrics.RETRIES.labels(outcome="retry").inc()
    if kept is not None:  # the other route failed validation: the low result stays
        return _succeed(claim, kept, needs_person=True)
    if not job_finish(job, claim.token, state=InfillJob.State.FAILED, reasons=reasons):
        return LOST
    return InfillJob.State.FAILED


@dataclass
class _Kept:
    """A valid attempt's outcome and what its result says of it."""

    outcome: Outcome
    route: str
    attempt: int
    run_id: str
    batch: list[str]
    model: str
    placeholder: bool
    version: dict[str, Any]  # the model version that wrote it, as its run record names it


def _succeed(claim: Claim, kept: _Kept, *, needs_person: bool) -> str:
    """End the job SUCCEEDED with ``kept``'s result and the draft's revision."""
    job, outcome = claim.job, kept.outcome
    result = {"holes": outcome.holes, "document": outcome.document, "violations": [],
              "route": kept.route, "attempt": kept.attempt, "run_id": kept.run_id,
              "forward_passes": outcome.forward_passes, "steps": outcome.steps,
              "batch_size": len(kept.batch), "model": kept.model,
              "placeholder_model": kept.placeholder, "confidence": outcome.confidence,
              "domain": outcome.domain, "needs_person": needs_person,
              "model_version": kept.version,
              # the config that ran (the model's fit of the requested one on the row)
              "config": outcome.config, "config_sha256": outcome.config_sha256}  # fmt: skip
    with transaction.atomic():  # the result and the draft's revision, or neither
        written = job_finish(job, claim.token, state=InfillJob.State.SUCCEEDED, result=result)
        if written:
            draft_apply_job_result(job=job)
    if not written:
        return LOST
    if kept.attempt:
        metrics.RETRIES.labels(outcome="recovered").inc()
    return InfillJob.State.SUCCEEDED


def _observe_confidence(outcome: Outcome, route: str) -> bool:
    """Count the valid attempt's spans and its low ones; whether a calibrated span is low."""
    spans = outcome.confidence.values()
    metrics.SPANS_WRITTEN.labels(route=route).inc(len(outcome.confidence))
    metrics.SPANS_LOW.labels(route=route).inc(sum(bool(c.get("low")) for c in spans))
    return any(low_span(c) for c in spans)


def _mean_p(outcome: Outcome) -> float:
    ps = [float(c.get("p", 0.0)) for c in outcome.confidence.values()]
    return sum(ps) / len(ps) if ps else 0.0


def _observe_attempt(outcome: Outcome, route: str, decision: RouteDecision) -> None:
    metrics.CANVAS_ENCODE.observe(outcome.timings.get("encode", 0.0))
    metrics.VALIDATION_SECONDS.observe(outcome.timings.get("validate", 0.0))
    seconds = outcome.timings.get("denoise", outcome.timings.get("total", 0.0))
    (metrics.FALLBACK_SECONDS if route != decision.route else
     metrics.DENOISE_SECONDS.labels(route=route)).observe(seconds)  # fmt: skip


def _run_shadow(claim: Claim, held: Held, decision: RouteDecision, primary: Outcome,
                device: torch.device, choice: ModelChoice) -> None:  # fmt: skip
    """Run the other route on the same request for comparison; the person never sees it.

    The job is already final: whatever goes wrong here is logged and changes nothing of it.
    """
    try:
        _shadow(claim, held, decision, primary, device, choice)
    except Exception:
        log.exception("job %s: the shadow run failed", claim.job.pk)


def _shadow(claim: Claim, held: Held, decision: RouteDecision, primary: Outcome,
            device: torch.device, choice: ModelChoice) -> None:  # fmt: skip
    from audit.services import run_record_create

    job = claim.job
    route = str(decision.shadow)
    if not _model_available(route):
        return
    loaded = _model_load(route, choice, device)
    progress = Progress(claim, held, 0, int(job.config["max_steps"]), with_texts=True,
                        quiet=True)  # fmt: skip
    outcome = _attempt(job, loaded, route, dict(job.config), job.seed, progress)
    if isinstance(outcome, str):
        comparison: dict[str, Any] = {"route": route, "error": outcome}
    else:
        context = _run_context(job, 0, f"shadow-{route}", job.seed, loaded, device, decision,
                               [str(job.pk)], choice)  # fmt: skip
        run = run_record_create(context=context, outcome=outcome)
        comparison = {
            "route": route, "run_id": str(run.pk), "valid": not outcome.violations,
            "same_holes": outcome.holes == primary.holes,
            "seconds": round(float(outcome.timings.get("total", 0.0)), 4),
            "primary_seconds": round(float(primary.timings.get("total", 0.0)), 4),
        }  # fmt: skip
    InfillJob.objects.filter(pk=job.pk).update(
        route_reason={**decision.as_json(), "shadow_result": comparison}
    )


def _injected_violations(route: str) -> list[dict[str, str]]:
    """Fault injection (tests only, see settings): a named violation on every attempt."""
    if f"violate:{route}" not in settings.STENCIL_FAULT_INJECTION:
        return []
    return [{"name": "fault_injected", "hole": "",
             "message": f"fault injection: every {route} attempt fails validation"}]  # fmt: skip


def _fail_bad_canvas(claim: Claim, error: str) -> str:
    if not job_finish(claim.job, claim.token, state=InfillJob.State.FAILED,
                      reasons=[f"the request cannot be run: {error}"]):  # fmt: skip
        return LOST
    metrics.JOB_FAILURES.labels(reason="bad_canvas").inc()
    return InfillJob.State.FAILED


def _is_variation(job: InfillJob) -> bool:
    """A regenerate: the person asked for another text than the one its targets held."""
    return any("previous" in t for t in job.target_fragments or [])


def _attempt_plan(job: InfillJob, decision: RouteDecision) -> list[tuple[str, dict[str, Any]]]:
    """The attempts in order: the routed model with retries, then the other route's fallback."""
    plans: list[tuple[str, dict[str, Any]]] = []
    retries = settings.STENCIL_MAX_ATTEMPTS if decision.route == DIFFUSION else 1
    for i in range(retries):
        plans.append((decision.route, escalate(job.config, i)))
    if decision.route == DIFFUSION and _model_available(AR):
        plans.append((AR, dict(job.config)))
    elif decision.route == AR:
        plans.append((DIFFUSION, escalate(job.config, 1)))
    return plans


def _model_load(route: str, choice: ModelChoice, device: torch.device) -> LoadedModel:
    """The model of ``route`` for this job: its chosen version on the diffusion route."""
    from gpu_worker.runtime import model_get

    if route == DIFFUSION:
        return model_get(choice.directory, device=device, weights_sha256=choice.weights_sha256)
    return model_get(_model_dir(route), device=device)


def _fail_model_version(claim: Claim, choice: ModelChoice, exc: Exception) -> str:
    """A promoted version that cannot be served fails the job: it never runs on another model
    than the one staff promoted for its template."""
    log.error("job %s: %s cannot be served: %s", claim.job.pk, choice.describe(), exc)
    reason = (
        f"the {choice.describe()} cannot be used: {exc}; promote another version "
        "or roll this one back"
    )
    if not job_finish(claim.job, claim.token, state=InfillJob.State.FAILED, reasons=[reason]):
        return LOST
    metrics.JOB_FAILURES.labels(reason="model_version_unavailable").inc()
    return InfillJob.State.FAILED


def _model_dir(route: str) -> Path:
    return Path(settings.STENCIL_MODEL_DIR if route == DIFFUSION else settings.STENCIL_AR_MODEL_DIR)


def _model_available(route: str) -> bool:
    return (_model_dir(route) / "model.safetensors").is_file()


def _attempt(job: InfillJob, loaded: LoadedModel, route: str, config: dict[str, Any], seed: int,
             progress: Progress) -> Outcome | str:  # fmt: skip
    """One attempt through the engine; a request the model cannot run comes back as why."""
    from gpu_worker.engine.config import SamplerConfig
    from gpu_worker.engine.run import run

    try:
        return run(route, loaded, {**job.request, "seed": seed}, SamplerConfig.from_json(config),
                   progress.hooks())  # fmt: skip
    except ValueError as exc:  # the canvas does not fit the model: the caller says why
        return str(exc)


def _run_context(job: InfillJob, attempt: int, route: str, seed: int, loaded: LoadedModel,
                 device: torch.device, decision: RouteDecision, batch: list[str],
                 choice: ModelChoice) -> RunContext:  # fmt: skip
    """Where and why one run happened, as its run record says it (built here only)."""
    from audit.runbody import RunContext
    from gpu_worker.runtime import device_name

    return RunContext(
        job_id=str(job.pk), attempt=attempt, route=route, model_dir=str(loaded.directory),
        request={**job.request, "seed": seed}, device=device_name(device),
        correlation_id=str(job.pk), batch_job_ids=tuple(batch),
        router_decision=decision.as_json(), template_version=_template_version(job),
        model_version=_version_record(route, choice, loaded),
    )  # fmt: skip


def _version_record(route: str, choice: ModelChoice, loaded: LoadedModel) -> dict[str, Any]:
    """The model version a run ran with: the job's choice on the diffusion route, else the
    configured AR-FIM model's."""
    if not route.endswith(DIFFUSION):
        choice = ModelChoice(directory=loaded.directory, weights_sha256=None, version_id=None,
                             version_name=loaded.name, scope=CONFIGURED)  # fmt: skip
    return choice.record(loaded.weights_sha256)


def _record_attempt(claim: Claim, context: RunContext, outcome: Outcome,
                    snapshots: list[str]) -> str:  # fmt: skip
    """The attempt's run record, and its line in the job's attempts; returns the run id."""
    from audit.services import run_record_create

    job = claim.job
    run_id = str(run_record_create(context=context, outcome=outcome, snapshots=snapshots).pk)
    job.attempts = [*job.attempts, {
        "attempt": context.attempt, "route": context.route, "seed": context.request["seed"],
        "run_id": run_id, "steps": outcome.steps, "forward_passes": outcome.forward_passes,
        "violations": list(outcome.violations), "cancelled": outcome.cancelled,
        "seconds": round(float(outcome.timings.get("total", 0.0)), 4),
        "batch": list(context.batch_job_ids),
    }]  # fmt: skip
    InfillJob.objects.filter(claim.mine()).update(attempts=job.attempts)
    return run_id


def _template_version(job: InfillJob) -> str | None:
    if job.draft_id is None:
        return None
    version = job.draft.template_version if job.draft else None
    return f"{version.template.slug}@{version.number}" if version else None


def _open_incident(job: InfillJob, run_id: str, kind: str, summary: str) -> None:
    from audit.models import RunRecord
    from audit.services import incident_open

    incident_open(
        kind=kind,
        summary=summary,
        run=RunRecord.objects.filter(pk=uuid.UUID(run_id)).first(),
        job_id=str(job.id),
    )
