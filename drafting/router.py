"""Route choice per request: the diffusion denoiser or the AR-FIM model, with the reason.

Inputs: the template's hint, the holes' lengths and the recent measured success and latency of
each route. The decision and every number behind it go on the job and into the run record.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import Avg, Count, Q
from django.utils import timezone

from drafting.models import InfillJob
from gpu_worker.engine.outcome import AR, DIFFUSION, ROUTES

RECENT_WINDOW = timedelta(hours=1)
RECENT_MIN_JOBS = 20  # below this many recent jobs, the measured rates are not trusted
MIN_SUCCESS_RATE = 0.5  # a route that succeeds less often than this loses the traffic
SLOWER_RATIO = 2.0  # diffusion this many times slower than AR, at no better success, loses
SHORT_HOLE_TOKENS = 4  # holes this short gain nothing from parallel decoding


@dataclass(frozen=True)
class RouteDecision:
    route: str  # DIFFUSION | AR, the engine's route names
    reason: str
    shadow: str | None = None  # the other route, when this request is also run in shadow
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _recent_stats(route: str) -> dict[str, Any]:
    since = timezone.now() - RECENT_WINDOW
    rows = InfillJob.objects.filter(route=route, finished__gte=since).aggregate(
        total=Count("id"),
        ok=Count("id", filter=Q(state=InfillJob.State.SUCCEEDED)),
    )
    total = rows["total"] or 0
    return {"jobs": total, "success_rate": (rows["ok"] / total) if total else None,
            "latency_s": recent_latency(route)}  # fmt: skip


def _trusted(stats: dict[str, Any]) -> bool:
    return (stats["jobs"] >= RECENT_MIN_JOBS and stats["success_rate"] is not None
            and stats["latency_s"] is not None)  # fmt: skip


def route_choose(*, job: InfillJob, rng: random.Random | None = None) -> RouteDecision:
    holes = [s for s in job.request.get("segments", []) if "hole" in s]
    hint = "auto"
    if job.draft_id is not None and job.draft is not None:
        hint = job.draft.template_version.route_hint
    evidence: dict[str, Any] = {
        "template_hint": hint,
        "holes": len(holes),
        "max_hole_tokens": max((h["max_tokens"] for h in holes), default=0),
    }
    if hint in ROUTES:
        return _with_shadow(RouteDecision(hint, f"template asks for the {hint} route",
                                          evidence=evidence), rng)  # fmt: skip
    diffusion, ar = _recent_stats(DIFFUSION), _recent_stats(AR)
    evidence["recent_diffusion"], evidence["recent_ar"] = diffusion, ar
    if (
        diffusion["jobs"] >= RECENT_MIN_JOBS
        and diffusion["success_rate"] is not None
        and diffusion["success_rate"] < MIN_SUCCESS_RATE
    ):
        return _with_shadow(RouteDecision(
            AR, f"diffusion succeeded in only {diffusion['success_rate']:.0%} of recent jobs",
            evidence=evidence), rng)  # fmt: skip
    if _trusted(diffusion) and _trusted(ar) and (
        diffusion["latency_s"] > SLOWER_RATIO * ar["latency_s"]
        and ar["success_rate"] >= diffusion["success_rate"]
    ):
        return _with_shadow(RouteDecision(
            AR, f"diffusion took {diffusion['latency_s']:.2f}s against AR's "
            f"{ar['latency_s']:.2f}s recently, at no better success", evidence=evidence), rng)  # fmt: skip
    if len(holes) == 1 and evidence["max_hole_tokens"] <= SHORT_HOLE_TOKENS:
        evidence["note"] = "one short hole: both routes cost about one pass"
    return _with_shadow(RouteDecision(
        DIFFUSION, "default: parallel infill sees both sides of every hole", evidence=evidence
    ), rng)  # fmt: skip


def confidence_escalates(*, route: str, confidence: dict[str, dict[str, Any]],
                         variation: bool = False) -> bool:  # fmt: skip
    """Whether a valid result of ``route`` goes on to the AR route: a diffusion result with a
    span its model's calibration flags low (``Outcome.confidence``). An uncalibrated score
    is shown but not acted on; the AR route is the last one a low result escalates to.

    A ``variation`` (a regenerate: the person asked for another text) never escalates: the
    AR model's text for the same context is near-deterministic even when sampled, so it would
    give back the text the person wanted replaced; the new text keeps its flag instead."""
    if variation:
        return False
    return route == DIFFUSION and any(low_span(c) for c in confidence.values())


def low_span(confidence: dict[str, Any]) -> bool:
    """A span its model's calibration flags low (an uncalibrated ``low`` is advice only)."""
    return bool(confidence.get("low")) and bool(confidence.get("calibrated"))


def _with_shadow(decision: RouteDecision, rng: random.Random | None) -> RouteDecision:
    share = settings.STENCIL_SHADOW_SHARE
    if share <= 0 or (rng or random.Random()).random() >= share:
        return decision
    other = AR if decision.route == DIFFUSION else DIFFUSION
    return RouteDecision(decision.route, decision.reason, shadow=other, evidence=decision.evidence)


def recent_latency(route: str) -> float | None:
    since = timezone.now() - RECENT_WINDOW
    from django.db.models import DurationField, ExpressionWrapper, F

    value = (
        InfillJob.objects.filter(route=route, finished__gte=since, started__isnull=False)
        .annotate(d=ExpressionWrapper(F("finished") - F("started"), output_field=DurationField()))
        .aggregate(avg=Avg("d"))["avg"]
    )
    return value.total_seconds() if value else None
