"""What a worker writes while it runs jobs: progress rows, leases, cancellation polls.

:class:`Held` is the set of claims one run of the pipeline holds until each job ends: every
progress write renews all their leases (at most LEASE_RENEWALS_PER_LEASE times a lease), so a
job waiting its turn behind another job's retries keeps its claim, and a worker that dies stops
renewing them all at once. Every write carries the claim's token (:meth:`Claim.mine`): a worker
that lost a claim writes nothing more to that job.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.utils import timezone

from drafting import metrics
from drafting.models import InfillJob
from gpu_worker.claims import Claim, lease, leases_renew, work_begin

if TYPE_CHECKING:
    from gpu_worker.engine.outcome import Hooks

PROGRESS_MIN_INTERVAL_S = 0.2  # at most five progress writes a second per job
CANCEL_POLL_TTL_S = 0.005  # a batch's cancel flags are read once per step (see CancelPoll)
LEASE_RENEWALS_PER_LEASE = 4  # a held claim's lease is renewed this often per lease period


class Held:
    """The claims one pipeline run holds, and which of them began their work."""

    def __init__(self, first: Claim) -> None:
        self._claims: dict[Any, Claim] = {first.job.pk: first}
        self._order: list[Claim] = [first]
        self._begun: set[Any] = set()
        self._renewed = time.monotonic()

    def add(self, claim: Claim) -> None:
        self._claims[claim.job.pk] = claim
        self._order.append(claim)

    def all(self) -> list[Claim]:
        """Every claim taken, in the order taken (the message's own job first)."""
        return list(self._order)

    def drop(self, claim: Claim) -> None:
        """The job ended (or was given up): its lease is no longer this run's to renew."""
        self._claims.pop(claim.job.pk, None)

    def begin(self, claim: Claim) -> bool:
        """Mark the job's work as begun in this delivery (once); False when the claim is lost."""
        if claim.job.pk in self._begun:
            return True
        if not work_begin(claim):
            self.drop(claim)
            return False
        self._begun.add(claim.job.pk)
        return True

    def began(self, claim: Claim) -> bool:
        return claim.job.pk in self._begun

    def renew(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._renewed < lease().total_seconds() / LEASE_RENEWALS_PER_LEASE:
            return
        self._renewed = now
        leases_renew(self._claims.values())


class Progress:
    """Sampler hooks of one attempt: progress rows, lease renewal, cancellation, snapshots.

    The diffusion route calls ``on_step`` then ``on_snapshot`` for every step, so the row is
    written from ``on_snapshot`` with that step's texts; the AR route has no snapshots and
    writes from ``on_step``. Writes are throttled to PROGRESS_MIN_INTERVAL_S; a quiet one (a
    shadow run) writes no progress but still renews the run's leases.
    """

    def __init__(self, claim: Claim, held: Held, attempt: int, max_steps: int, *,
                 with_texts: bool, quiet: bool = False) -> None:  # fmt: skip
        from audit.services import diagnostics_wanted

        self.claim, self.held, self.attempt = claim, held, attempt
        self.max_steps, self.with_texts, self.quiet = max_steps, with_texts, quiet
        job = claim.job
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
        self.held.renew()
        now = time.monotonic()
        if self.quiet or now - self.last_write < PROGRESS_MIN_INTERVAL_S:
            return
        self.last_write = now
        snapshot = progress_snapshot({**self.entry, "holes": self.texts}, self.attempt,
                                     self.positions)  # fmt: skip
        snapshot["max_steps"] = self.max_steps
        InfillJob.objects.filter(self.claim.mine()).update(
            progress=snapshot, lease_expires=timezone.now() + lease()
        )

    def should_stop(self) -> bool:
        return InfillJob.objects.filter(pk=self.claim.job.pk, cancel_requested=True).exists()

    def hooks(self, should_stop: Callable[[], bool] | None = None) -> Hooks:
        """The engine's hooks for this attempt (``should_stop`` replaces the per-job poll)."""
        from gpu_worker.engine.outcome import Hooks

        return Hooks(on_step=self.on_step, should_stop=should_stop or self.should_stop,
                     on_snapshot=self.on_snapshot)  # fmt: skip


class CancelPoll:
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


def progress_snapshot(entry: dict[str, Any], attempt: int, positions: int) -> dict[str, Any]:
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


def fault_stall(held: Held) -> None:
    """Fault injection (tests only): ``stall:<seconds>`` holds the claims this long before any
    work begins, renewing their leases, as a slow model load would."""
    for item in settings.STENCIL_FAULT_INJECTION:
        if item.startswith("stall:"):
            until = time.monotonic() + float(item.split(":", 1)[1])
            while time.monotonic() < until:
                held.renew(force=True)
                time.sleep(min(0.25, lease().total_seconds() / LEASE_RENEWALS_PER_LEASE))
