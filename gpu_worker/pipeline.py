"""Running an infill job inside a worker: claim, route, attempts, validation, fallback, result.

Called by the Celery adapter (gpu_worker/tasks.py) with a job id. The job row is the truth:
a claim is a conditional update, a redelivered message finds nothing to do, and a result is
written only by the worker that holds the current claim (its delivery number).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from drafting import metrics
from drafting.models import InfillJob
from drafting.router import RouteDecision, route_choose
from drafting.services import draft_apply_job_result

log = logging.getLogger(__name__)
PROGRESS_MIN_INTERVAL_S = 0.2  # at most five progress writes a second per job
CANCEL_POLL_TTL_S = 0.005  # a batch's cancel flags are read once per step (see _CancelPoll)


class JobBusy(Exception):
    """Another worker holds a live claim; try again after ``retry_after`` seconds."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"job is running elsewhere; retry in {retry_after}s")
        self.retry_after = retry_after


@dataclass(frozen=True)
class Claim:
    job: InfillJob
    delivery: int  # the claim token: only this delivery may write the result


def _lease() -> timedelta:
    return timedelta(seconds=settings.STENCIL_JOB_LEASE_SECONDS)


def job_claim(*, job_id: str, worker: str) -> Claim | None:
    """Claim a queued job (or one whose worker died); None when there is nothing to do."""
    now = timezone.now()
    fresh = Q(state=InfillJob.State.QUEUED, cancel_requested=False)
    orphaned = Q(
        state__in=[InfillJob.State.RUNNING, InfillJob.State.VALIDATING],
        lease_expires__lt=now,
        delivery_count__lt=settings.STENCIL_MAX_DELIVERIES,
    )
    claimed = InfillJob.objects.filter(Q(pk=job_id) & (fresh | orphaned)).update(
        state=InfillJob.State.RUNNING,
        delivery_count=F("delivery_count") + 1,
        worker=worker,
        started=now,
        lease_expires=now + _lease(),
        progress={},
    )
    job = InfillJob.objects.filter(pk=job_id).first()
    if job is None:
        log.warning("job %s does not exist; dropping the message", job_id)
        return None
    if claimed:
        return Claim(job=job, delivery=job.delivery_count)
    if job.is_final:
        return None  # another delivery got there first and finished it
    if job.state == InfillJob.State.QUEUED and job.cancel_requested:
        _finish(job, None, state=InfillJob.State.CANCELLED, reasons=["cancelled before it started"])
        return None
    lease_left = (job.lease_expires - now).total_seconds() if job.lease_expires else 0
    if lease_left > 0:
        raise JobBusy(retry_after=int(lease_left) + 1)
    # The lease is gone and the delivery cap is reached: a poison job ends here.
    _finish(job, None, state=InfillJob.State.FAILED, reasons=[
        f"worker lost {job.delivery_count} times while running this job (delivery cap "
        f"{settings.STENCIL_MAX_DELIVERIES}); it was not retried again"
    ])  # fmt: skip
    metrics.JOB_FAILURES.labels(reason="poison").inc()
    return None


def _finish(job: InfillJob, delivery: int | None, *, state: str, reasons: list[str] | None = None,
            result: dict[str, Any] | None = None) -> bool:  # fmt: skip
    """Write the final state once; False when this worker no longer holds the claim."""
    query = InfillJob.objects.filter(pk=job.pk).exclude(state__in=InfillJob.FINAL_STATES)
    if delivery is not None:
        query = query.filter(delivery_count=delivery)
    changes: dict[str, Any] = {"state": state, "finished": timezone.now(), "lease_expires": None}
    if reasons is not None:
        changes["reasons"] = reasons
    if result is not None:
        changes["result"] = result
    changes["attempts"] = job.attempts
    changes["route"] = job.route
    changes["route_reason"] = job.route_reason
    written = query.update(**changes) == 1
    job.refresh_from_db()
    return written


class _Progress:
    """Sampler hooks of one attempt: progress rows, lease renewal, cancellation, snapshots.

    The diffusion route calls ``on_step`` then ``on_snapshot`` for every step, so the row is
    written from ``on_snapshot`` with that step's texts; the AR route has no snapshots and
    writes from ``on_step``. Writes are throttled to PROGRESS_MIN_INTERVAL_S.
    """

    def __init__(self, job: InfillJob, delivery: int, attempt: int, max_steps: int, *,
                 with_texts: bool, quiet: bool = False) -> None:  # fmt: skip
        from audit.services import diagnostics_wanted

        self.job, self.delivery, self.attempt = job, delivery, attempt
        self.max_steps, self.with_texts, self.quiet = max_steps, with_texts, quiet
        self.positions = sum(
            int(s.get("max_tokens", 0)) for s in job.request.get("segments", []) if "hole" in s
        )
        self.entry: dict[str, Any] = {}
        self.texts: dict[str, dict[str, str]] = {}
        self.last_write = 0.0
        self.started = time.monotonic()
        self.first_stable_seen = False
        # Raw intermediate drafts, kept (encrypted by audit) only for runs diagnostics samples.
        self.keep_snapshots = diagnostics_wanted(correlation_id=str(job.pk))
        self.snapshots: list[str] = []

    def on_step(self, entry: dict[str, Any]) -> None:
        self.entry = entry
        if not self.with_texts:
            self._write()

    def on_snapshot(self, step: int, provisional: dict[str, str], stable: dict[str, str]) -> None:
        self.texts = {name: {"stable": stable.get(name, ""), "provisional": text}
                      for name, text in provisional.items()}  # fmt: skip
        if not self.first_stable_seen and any(stable.values()):
            self.first_stable_seen = True
            metrics.TIME_TO_FIRST_STABLE.observe(time.monotonic() - self.started)
        if self.keep_snapshots:
            self.snapshots.append(json.dumps({"step": step, "holes": provisional}, sort_keys=True))
        self._write()

    def _write(self) -> None:
        now = time.monotonic()
        if self.quiet or now - self.last_write < PROGRESS_MIN_INTERVAL_S:
            return
        self.last_write = now
        snapshot = _progress_snapshot({**self.entry, "holes": self.texts}, self.attempt,
                                      self.positions)  # fmt: skip
        snapshot["max_steps"] = self.max_steps
        InfillJob.objects.filter(pk=self.job.pk, delivery_count=self.delivery).update(
            progress=snapshot, lease_expires=timezone.now() + _lease()
        )

    def should_stop(self) -> bool:
        return InfillJob.objects.filter(pk=self.job.pk, cancel_requested=True).exists()


class _CancelPoll:
    """Cancellation flags of a batch's jobs: one query per denoising step, not one per row.

    The sampler asks every active row at the start of a step, within microseconds; answers
    younger than CANCEL_POLL_TTL_S (far shorter than a step) are reused, so a cancel is
    still seen at the next step.
    """

    def __init__(self, job_ids: list[Any]) -> None:
        self.job_ids = job_ids
        self.flags: set[Any] = set()
        self.read_at = -1.0

    def requested(self, job_id: Any) -> bool:
        now = time.monotonic()
        if now - self.read_at > CANCEL_POLL_TTL_S:
            self.flags = set(InfillJob.objects.filter(pk__in=self.job_ids, cancel_requested=True)
                             .values_list("pk", flat=True))  # fmt: skip
            self.read_at = now
        return job_id in self.flags


def _progress_snapshot(entry: dict[str, Any], attempt: int, positions: int) -> dict[str, Any]:
    """What the progress view shows; ``entry`` is the sampler's trace entry for the step."""
    masked_left = int(entry.get("masked_left", 0))
    holes = entry.get("holes") or {}
    return {
        "attempt": attempt,
        "step": int(entry.get("step", 0)) + 1,
        "committed": positions - masked_left,
        "positions": positions,
        "holes": {
            name: {"stable": h.get("stable", ""), "provisional": h.get("provisional", "")}
            for name, h in holes.items()
        },
        "updated": timezone.now().isoformat(),
    }


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
    """Run one job (and the compatible queued jobs it batches) to a final state.

    Returns the state of ``job_id``'s job, or "skipped" when there was nothing to do.
    """
    claim = job_claim(job_id=job_id, worker=worker)
    if claim is None:
        return "skipped"
    claims = [claim, *_claim_batch_mates(claim, worker)]
    decisions = {c.job.pk: _route(c.job) for c in claims}
    batched = [c for c in claims if decisions[c.job.pk].route == "diffusion"]
    first: dict[Any, Any] = {}
    if len(batched) > 1:
        first = _first_attempt_batched(batched)
    states = [_run_guarded(c, decisions[c.job.pk], first.get(c.job.pk)) for c in claims]
    return states[0]


def _claim_batch_mates(claim: Claim, worker: str) -> list[Claim]:
    """Claim up to STENCIL_BATCH_MAX - 1 queued jobs with the same sampler config."""
    limit = settings.STENCIL_BATCH_MAX - 1
    if limit <= 0:
        return []
    candidates = (
        InfillJob.objects.filter(state=InfillJob.State.QUEUED, cancel_requested=False,
                                 config_sha256=claim.job.config_sha256)  # fmt: skip
        .exclude(pk=claim.job.pk)
        .order_by("created")
        .values_list("pk", flat=True)[:limit]
    )
    mates: list[Claim] = []
    for pk in list(candidates):
        now = timezone.now()
        taken = InfillJob.objects.filter(
            pk=pk, state=InfillJob.State.QUEUED, cancel_requested=False
        ).update(state=InfillJob.State.RUNNING, delivery_count=F("delivery_count") + 1,
                 worker=worker, started=now, lease_expires=now + _lease(), progress={})  # fmt: skip
        if taken:  # else another worker got there first
            job = InfillJob.objects.get(pk=pk)
            mates.append(Claim(job=job, delivery=job.delivery_count))
    return mates


def _route(job: InfillJob) -> RouteDecision:
    decision = route_choose(job=job)
    job.route, job.route_reason = decision.route, decision.as_json()
    InfillJob.objects.filter(pk=job.pk).update(route=job.route, route_reason=job.route_reason)
    return decision


def _run_guarded(claim: Claim, decision: RouteDecision, first: _Batched | None) -> str:
    job = claim.job
    metrics.QUEUE_WAIT.observe(((job.started or timezone.now()) - job.created).total_seconds())
    started = time.monotonic()
    try:
        state = _run_claimed(job, claim.delivery, decision, first)
    except Exception as exc:  # a bug or an exhausted soft time limit: end it with a reason
        log.exception("job %s crashed", job.pk)
        name = type(exc).__name__
        reason = f"the worker stopped on an internal error ({name}: {exc})"
        if name == "SoftTimeLimitExceeded":
            reason = f"the job ran past its time limit of {settings.CELERY_TASK_SOFT_TIME_LIMIT}s"
        _finish(job, claim.delivery, state=InfillJob.State.FAILED, reasons=[reason])
        metrics.JOB_FAILURES.labels(reason=name).inc()
        state = InfillJob.State.FAILED
    metrics.END_TO_END.labels(state=state).observe(
        (timezone.now() - job.created).total_seconds()
    )
    metrics.JOB_SECONDS.labels(route=job.route).inc(time.monotonic() - started)
    return state


@dataclass
class _Batched:
    """A first attempt already run in a batch: its outcome (or the canvas error)."""

    outcome: Any
    error: str | None
    batch: list[str]
    snapshots: list[str]


def _first_attempt_batched(claims: list[Claim]) -> dict[Any, _Batched]:
    """One denoising batch for the first attempt of several jobs with one config."""
    from gpu_worker.engine.config import SamplerConfig
    from gpu_worker.engine.infill import infill_batch
    from gpu_worker.runtime import choose_device, model_get

    device = choose_device(settings.STENCIL_DEVICE)
    loaded = model_get(_model_dir("diffusion"), device=device)
    config = claims[0].job.config
    hooks = [_Progress(c.job, c.delivery, 0, int(config["max_steps"]), with_texts=True)
             for c in claims]  # fmt: skip
    cancelled = _CancelPoll([c.job.pk for c in claims])
    results = infill_batch(
        loaded, [{**c.job.request, "seed": derive_seed(c.job.seed, 0)} for c in claims],
        config=SamplerConfig.from_json(config),
        on_step=lambda row, entry: hooks[row].on_step(entry),
        should_stop=lambda row: cancelled.requested(claims[row].job.pk),
        device=device,
        on_snapshot=lambda row, step, texts, stable: hooks[row].on_snapshot(step, texts, stable),
    )  # fmt: skip
    batch = [str(c.job.pk) for c in claims]
    return {
        c.job.pk: _Batched(outcome=None if isinstance(r, ValueError) else r,
                           error=str(r) if isinstance(r, ValueError) else None, batch=batch,
                           snapshots=h.snapshots)
        for c, r, h in zip(claims, results, hooks, strict=True)
    }  # fmt: skip


def _run_claimed(job: InfillJob, delivery: int, decision: RouteDecision,
                 first: _Batched | None) -> str:  # fmt: skip
    from gpu_worker.runtime import choose_device, device_name, model_get

    device = choose_device(settings.STENCIL_DEVICE)
    plans = _attempt_plan(job, decision)
    reasons: list[str] = []
    for attempt, (route, config) in enumerate(plans):
        loaded = model_get(_model_dir(route), device=device)
        seed = derive_seed(job.seed, attempt)
        batch = [str(job.pk)]
        if attempt == 0 and first is not None:
            if first.error is not None:
                return _fail_bad_canvas(job, delivery, first.error)
            outcome, batch, snapshots = first.outcome, first.batch, first.snapshots
        else:
            hooks = _Progress(job, delivery, attempt, int(config["max_steps"]),
                              with_texts=route == "diffusion")  # fmt: skip
            outcome = _attempt(job, loaded, route, config, seed, hooks, device)
            if isinstance(outcome, str):  # the canvas itself is bad: no retry can help
                return _fail_bad_canvas(job, delivery, outcome)
            snapshots = hooks.snapshots
        run_id = _record_attempt(job, attempt, route, seed, outcome, loaded,
                                 device_name(device), decision, batch, snapshots)  # fmt: skip
        if outcome.cancelled:
            _finish(job, delivery, state=InfillJob.State.CANCELLED,
                    reasons=[f"cancelled at step {outcome.steps}"])  # fmt: skip
            metrics.CANCELLATIONS.inc()
            return InfillJob.State.CANCELLED
        InfillJob.objects.filter(pk=job.pk, delivery_count=delivery).update(
            state=InfillJob.State.VALIDATING
        )
        violations = [*outcome.violations, *_injected_violations(route)]
        metrics.VALIDATION_SECONDS.observe(outcome.timings.get("validate", 0.0))
        seconds = outcome.timings.get("denoise", outcome.timings.get("total", 0.0))
        (metrics.FALLBACK_SECONDS if route != decision.route else
         metrics.DENOISE_SECONDS.labels(route=route)).observe(seconds)  # fmt: skip
        if not violations:
            result = {"holes": outcome.holes, "document": outcome.document, "violations": [],
                      "route": route, "attempt": attempt, "run_id": run_id,
                      "forward_passes": outcome.forward_passes, "steps": outcome.steps,
                      "batch_size": len(batch), "model": loaded.name,
                      "placeholder_model": loaded.placeholder}  # fmt: skip
            with transaction.atomic():
                if _finish(job, delivery, state=InfillJob.State.SUCCEEDED, result=result):
                    draft_apply_job_result(job=job)
            if attempt:
                metrics.RETRIES.labels(outcome="recovered").inc()
            if decision.shadow and attempt == 0:
                _run_shadow(job, delivery, decision, outcome, device)
            return InfillJob.State.SUCCEEDED
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
    _finish(job, delivery, state=InfillJob.State.FAILED, reasons=reasons)
    return InfillJob.State.FAILED


def _run_shadow(job: InfillJob, delivery: int, decision: RouteDecision, primary: Any,
                device: Any) -> None:  # fmt: skip
    """Run the other route on the same request for comparison; the person never sees it."""
    from gpu_worker.runtime import device_name, model_get

    route = str(decision.shadow)
    if not _model_available(route):
        return
    loaded = model_get(_model_dir(route), device=device)
    hooks = _Progress(job, delivery, 0, int(job.config["max_steps"]), with_texts=True, quiet=True)
    outcome = _attempt(job, loaded, route, dict(job.config), job.seed, hooks, device)
    if isinstance(outcome, str):
        comparison: dict[str, Any] = {"route": route, "error": outcome}
    else:
        from audit.services import run_record_create

        run = run_record_create(
            job_id=str(job.id), attempt=0, route=f"shadow-{route}", model_dir=str(_model_dir(route)),
            weights_sha256=loaded.weights_sha256, tokenizer_sha256=loaded.tokenizer_sha256,
            request={**job.request, "seed": job.seed}, outcome=outcome,
            batch_job_ids=[str(job.id)], device=device_name(device),
            router_decision=decision.as_json(), correlation_id=str(job.id),
        )  # fmt: skip
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


def _fail_bad_canvas(job: InfillJob, delivery: int, error: str) -> str:
    _finish(job, delivery, state=InfillJob.State.FAILED,
            reasons=[f"the request cannot be run: {error}"])  # fmt: skip
    metrics.JOB_FAILURES.labels(reason="bad_canvas").inc()
    return InfillJob.State.FAILED


def _attempt_plan(job: InfillJob, decision: RouteDecision) -> list[tuple[str, dict[str, Any]]]:
    """The attempts in order: the routed model with retries, then the other route's fallback."""
    plans: list[tuple[str, dict[str, Any]]] = []
    retries = settings.STENCIL_MAX_ATTEMPTS if decision.route == "diffusion" else 1
    for i in range(retries):
        plans.append((decision.route, escalate(job.config, i)))
    if decision.route == "diffusion" and _model_available("ar"):
        plans.append(("ar", dict(job.config)))
    elif decision.route == "ar":
        plans.append(("diffusion", escalate(job.config, 1)))
    return plans


def _model_dir(route: str) -> Path:
    return Path(settings.STENCIL_MODEL_DIR if route == "diffusion" else settings.STENCIL_AR_MODEL_DIR)


def _model_available(route: str) -> bool:
    return (_model_dir(route) / "model.safetensors").is_file()


def _attempt(job: InfillJob, loaded: Any, route: str, config: dict[str, Any], seed: int,
             hooks: _Progress, device: Any) -> Any:  # fmt: skip
    from gpu_worker.engine.config import SamplerConfig

    request = {**job.request, "seed": seed}
    sampler_config = SamplerConfig.from_json(config)
    try:
        if route == "ar":
            from gpu_worker.engine.ar import infill_request_ar

            return infill_request_ar(loaded, request, config=sampler_config,
                                     on_step=hooks.on_step, should_stop=hooks.should_stop)
        from gpu_worker.engine.infill import infill_request

        return infill_request(loaded, request, config=sampler_config, on_step=hooks.on_step,
                              should_stop=hooks.should_stop, device=device,
                              on_snapshot=hooks.on_snapshot)  # fmt: skip
    except ValueError as exc:  # the canvas does not fit the model: the caller says why
        return str(exc)


def _record_attempt(job: InfillJob, attempt: int, route: str, seed: int, outcome: Any,
                    loaded: Any, device: str, decision: RouteDecision, batch: list[str],
                    snapshots: list[str]) -> str:  # fmt: skip
    from audit.services import run_record_create

    run = run_record_create(
        job_id=str(job.id), attempt=attempt, route=route, model_dir=str(loaded.directory),
        weights_sha256=loaded.weights_sha256, tokenizer_sha256=loaded.tokenizer_sha256,
        request={**job.request, "seed": seed}, outcome=outcome, batch_job_ids=batch,
        device=device, router_decision=decision.as_json(), correlation_id=str(job.id),
        template_version=_template_version(job), snapshots=snapshots or None,
    )  # fmt: skip
    run_id = str(run.pk)
    job.attempts = [*job.attempts, {
        "attempt": attempt, "route": route, "seed": seed, "run_id": run_id,
        "steps": outcome.steps, "forward_passes": outcome.forward_passes,
        "violations": list(outcome.violations), "cancelled": outcome.cancelled,
        "seconds": round(float(outcome.timings.get("total", 0.0)), 4), "batch": batch,
    }]  # fmt: skip
    InfillJob.objects.filter(pk=job.pk).update(attempts=job.attempts)
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
