"""Running an infill job inside a worker: claim, route, attempts, validation, fallback, result.

Called by the Celery task (gpu_worker/tasks.py) with a job id. The job row is the truth: a
claim is a conditional update (:mod:`gpu_worker.claims`), a redelivered message finds nothing
to do, and a result is written only by the worker that holds the current claim.

One job's story (:func:`job_run`): claim it and the compatible queued jobs it can batch
with; route each; run the diffusion ones' first attempt as one denoising batch; then, per
job, attempts in order (retries with escalation, then the other route's fallback) through
the engine's one entry point (``gpu_worker.engine.run``), each recorded as a run record
(audit) with its context built once (:func:`_run_context`); validation decides whether the
job succeeds or goes on. Anything that crashes ends its jobs FAILED with the reason.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from drafting import metrics
from drafting.models import InfillJob
from drafting.router import RouteDecision, route_choose
from drafting.services import draft_apply_job_result
from gpu_worker.claims import Claim, claim_batch_mates, job_claim, job_finish, lease
from gpu_worker.engine.outcome import AR, DIFFUSION

if TYPE_CHECKING:  # the engine (and torch) load with the first job, not with the web app
    import torch

    from audit.runbody import RunContext
    from gpu_worker.engine.loaded import LoadedModel
    from gpu_worker.engine.outcome import Hooks, Outcome

log = logging.getLogger(__name__)
PROGRESS_MIN_INTERVAL_S = 0.2  # at most five progress writes a second per job
CANCEL_POLL_TTL_S = 0.005  # a batch's cancel flags are read once per step (see _CancelPoll)


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
            progress=snapshot, lease_expires=timezone.now() + lease()
        )

    def should_stop(self) -> bool:
        return InfillJob.objects.filter(pk=self.job.pk, cancel_requested=True).exists()

    def hooks(self, should_stop: Callable[[], bool] | None = None) -> Hooks:
        """The engine's hooks for this attempt (``should_stop`` replaces the per-job poll)."""
        from gpu_worker.engine.outcome import Hooks

        return Hooks(on_step=self.on_step, should_stop=should_stop or self.should_stop,
                     on_snapshot=self.on_snapshot)  # fmt: skip


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
    claims = [claim, *claim_batch_mates(claim, worker)]
    try:
        decisions, first = _route_and_batch(claims)
    except Exception as exc:  # as in _run_guarded, for every job the batch claimed
        for c in claims:
            _observe_end(c.job, _crashed(c, exc))
        return InfillJob.State.FAILED
    states = [_run_guarded(c, decisions[c.job.pk], first.get(c.job.pk)) for c in claims]
    return states[0]


def _route_and_batch(claims: list[Claim]) -> tuple[dict[Any, RouteDecision], dict[Any, _Batched]]:
    """Route every claimed job; run the diffusion ones' first attempt as one batch."""
    decisions = {c.job.pk: _route(c.job) for c in claims}
    batched = [c for c in claims if decisions[c.job.pk].route == DIFFUSION]
    first = _first_attempt_batched(batched) if len(batched) > 1 else {}
    return decisions, first


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
    except Exception as exc:  # a bug, a lost database, an exhausted soft time limit
        state = _crashed(claim, exc)
    _observe_end(job, state)
    metrics.JOB_SECONDS.labels(route=job.route).inc(time.monotonic() - started)
    return state


def _crashed(claim: Claim, exc: Exception) -> str:
    """End a claimed job that crashed as FAILED, with the reason a person can read."""
    job = claim.job
    log.exception("job %s crashed", job.pk)
    name = type(exc).__name__
    reason = f"the worker stopped on an internal error ({name}: {exc})"
    if name == "SoftTimeLimitExceeded":
        reason = f"the job ran past its time limit of {settings.CELERY_TASK_SOFT_TIME_LIMIT}s"
    if not connection.in_atomic_block:  # a lost connection is dropped; the next query reconnects
        connection.close_if_unusable_or_obsolete()
    job_finish(job, claim.delivery, state=InfillJob.State.FAILED, reasons=[reason])
    metrics.JOB_FAILURES.labels(reason=name).inc()
    return InfillJob.State.FAILED


def _observe_end(job: InfillJob, state: str) -> None:
    metrics.END_TO_END.labels(state=state).observe((timezone.now() - job.created).total_seconds())


@dataclass
class _Batched:
    """A first attempt already run in a batch: its outcome (or the canvas error)."""

    outcome: Outcome | None
    error: str | None
    batch: list[str]
    snapshots: list[str]


def _first_attempt_batched(claims: list[Claim]) -> dict[Any, _Batched]:
    """One denoising batch for the first attempt of several jobs with one config."""
    from gpu_worker.engine.config import SamplerConfig
    from gpu_worker.engine.run import run_batch
    from gpu_worker.runtime import choose_device, model_get

    device = choose_device(settings.STENCIL_DEVICE)
    loaded = model_get(_model_dir(DIFFUSION), device=device)
    config = claims[0].job.config
    progress = [_Progress(c.job, c.delivery, 0, int(config["max_steps"]), with_texts=True)
                for c in claims]  # fmt: skip
    cancelled = _CancelPoll([c.job.pk for c in claims])
    hooks = [p.hooks(should_stop=functools.partial(cancelled.requested, c.job.pk))
             for p, c in zip(progress, claims, strict=True)]  # fmt: skip
    results = run_batch(
        DIFFUSION, loaded, [{**c.job.request, "seed": derive_seed(c.job.seed, 0)} for c in claims],
        SamplerConfig.from_json(config), hooks,
    )  # fmt: skip
    batch = [str(c.job.pk) for c in claims]
    return {
        c.job.pk: _Batched(outcome=None if isinstance(r, ValueError) else r,
                           error=str(r) if isinstance(r, ValueError) else None, batch=batch,
                           snapshots=p.snapshots)
        for c, r, p in zip(claims, results, progress, strict=True)
    }  # fmt: skip


def _run_claimed(job: InfillJob, delivery: int, decision: RouteDecision,
                 first: _Batched | None) -> str:  # fmt: skip
    from gpu_worker.runtime import choose_device, model_get

    device = choose_device(settings.STENCIL_DEVICE)
    plans = _attempt_plan(job, decision)
    reasons: list[str] = []
    for attempt, (route, config) in enumerate(plans):
        loaded = model_get(_model_dir(route), device=device)
        seed = derive_seed(job.seed, attempt)
        batch = [str(job.pk)]
        if attempt == 0 and first is not None:
            if first.outcome is None:
                return _fail_bad_canvas(job, delivery, str(first.error))
            outcome, batch, snapshots = first.outcome, first.batch, first.snapshots
        else:
            progress = _Progress(job, delivery, attempt, int(config["max_steps"]),
                                 with_texts=route == DIFFUSION)  # fmt: skip
            ran = _attempt(job, loaded, route, config, seed, progress)
            if isinstance(ran, str):  # the canvas itself is bad: no retry can help
                return _fail_bad_canvas(job, delivery, ran)
            outcome, snapshots = ran, progress.snapshots
        context = _run_context(job, attempt, route, seed, loaded, device, decision, batch)
        run_id = _record_attempt(job, context, outcome, snapshots)
        if outcome.cancelled:
            job_finish(job, delivery, state=InfillJob.State.CANCELLED,
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
                if job_finish(job, delivery, state=InfillJob.State.SUCCEEDED, result=result):
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
    job_finish(job, delivery, state=InfillJob.State.FAILED, reasons=reasons)
    return InfillJob.State.FAILED


def _run_shadow(job: InfillJob, delivery: int, decision: RouteDecision, primary: Outcome,
                device: torch.device) -> None:  # fmt: skip
    """Run the other route on the same request for comparison; the person never sees it."""
    from audit.services import run_record_create
    from gpu_worker.runtime import model_get

    route = str(decision.shadow)
    if not _model_available(route):
        return
    loaded = model_get(_model_dir(route), device=device)
    progress = _Progress(job, delivery, 0, int(job.config["max_steps"]), with_texts=True,
                         quiet=True)  # fmt: skip
    outcome = _attempt(job, loaded, route, dict(job.config), job.seed, progress)
    if isinstance(outcome, str):
        comparison: dict[str, Any] = {"route": route, "error": outcome}
    else:
        context = _run_context(job, 0, f"shadow-{route}", job.seed, loaded, device, decision,
                               [str(job.pk)])  # fmt: skip
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


def _fail_bad_canvas(job: InfillJob, delivery: int, error: str) -> str:
    job_finish(job, delivery, state=InfillJob.State.FAILED,
               reasons=[f"the request cannot be run: {error}"])  # fmt: skip
    metrics.JOB_FAILURES.labels(reason="bad_canvas").inc()
    return InfillJob.State.FAILED


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


def _model_dir(route: str) -> Path:
    return Path(settings.STENCIL_MODEL_DIR if route == DIFFUSION else settings.STENCIL_AR_MODEL_DIR)


def _model_available(route: str) -> bool:
    return (_model_dir(route) / "model.safetensors").is_file()


def _attempt(job: InfillJob, loaded: LoadedModel, route: str, config: dict[str, Any], seed: int,
             progress: _Progress) -> Outcome | str:  # fmt: skip
    """One attempt through the engine; a request the model cannot run comes back as why."""
    from gpu_worker.engine.config import SamplerConfig
    from gpu_worker.engine.run import run

    try:
        return run(route, loaded, {**job.request, "seed": seed}, SamplerConfig.from_json(config),
                   progress.hooks())  # fmt: skip
    except ValueError as exc:  # the canvas does not fit the model: the caller says why
        return str(exc)


def _run_context(job: InfillJob, attempt: int, route: str, seed: int, loaded: LoadedModel,
                 device: torch.device, decision: RouteDecision, batch: list[str]) -> RunContext:  # fmt: skip
    """Where and why one run happened, as its run record says it (built here only)."""
    from audit.runbody import RunContext
    from gpu_worker.runtime import device_name

    return RunContext(
        job_id=str(job.pk), attempt=attempt, route=route, model_dir=str(loaded.directory),
        request={**job.request, "seed": seed}, device=device_name(device),
        correlation_id=str(job.pk), batch_job_ids=tuple(batch),
        router_decision=decision.as_json(), template_version=_template_version(job),
    )  # fmt: skip


def _record_attempt(job: InfillJob, context: RunContext, outcome: Outcome,
                    snapshots: list[str]) -> str:  # fmt: skip
    """The attempt's run record, and its line in the job's attempts; returns the run id."""
    from audit.services import run_record_create

    run_id = str(run_record_create(context=context, outcome=outcome, snapshots=snapshots).pk)
    job.attempts = [*job.attempts, {
        "attempt": context.attempt, "route": context.route, "seed": context.request["seed"],
        "run_id": run_id, "steps": outcome.steps, "forward_passes": outcome.forward_passes,
        "violations": list(outcome.violations), "cancelled": outcome.cancelled,
        "seconds": round(float(outcome.timings.get("total", 0.0)), 4),
        "batch": list(context.batch_job_ids),
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
