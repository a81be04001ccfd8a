"""Prometheus metrics (vLLM / TGI-like names), shared by web and worker processes.

Worker processes write to PROMETHEUS_MULTIPROC_DIR when it is set (``up`` and the tests set
it), and ``/metrics`` aggregates every process's files.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

QUEUE_WAIT = Histogram(
    "stencil_request_queue_time_seconds", "Time a job waited in the queue", buckets=LATENCY_BUCKETS
)
CANVAS_ENCODE = Histogram(
    "stencil_canvas_encode_seconds", "Time to build a canvas from a request", buckets=LATENCY_BUCKETS
)
TIME_TO_FIRST_STABLE = Histogram(
    "stencil_time_to_first_stable_text_seconds",
    "From the start of denoising to the first stable text in any hole",
    buckets=LATENCY_BUCKETS,
)
DENOISE_SECONDS = Histogram(
    "stencil_request_inference_time_seconds", "Sampling time of one attempt", ["route"],
    buckets=LATENCY_BUCKETS,
)
VALIDATION_SECONDS = Histogram(
    "stencil_validation_time_seconds", "Validation time of one attempt", buckets=LATENCY_BUCKETS
)
FALLBACK_SECONDS = Histogram(
    "stencil_fallback_time_seconds", "Time spent on fallback attempts", buckets=LATENCY_BUCKETS
)
END_TO_END = Histogram(
    "stencil_e2e_request_latency_seconds", "From request to final state", ["state"],
    buckets=LATENCY_BUCKETS,
)
RETRIES = Counter("stencil_retries_total", "Diffusion retries", ["outcome"])
FALLBACKS = Counter("stencil_fallbacks_total", "Attempts handed to the other route")
CANCELLATIONS = Counter("stencil_cancellations_total", "Jobs cancelled while running")
VALIDATION_FAILURES = Counter(
    "stencil_validation_failures_total", "Validation failures by reason", ["reason"]
)
JOB_FAILURES = Counter("stencil_job_failures_total", "Jobs ended failed, by cause", ["reason"])
JOB_SECONDS = Counter(
    "stencil_accelerator_seconds_total", "Worker seconds spent on jobs, by route", ["route"]
)
DISPATCH_FAILURES = Counter(
    "stencil_dispatch_failures_total", "Job ids the broker did not take (sent later by the sweeper)"
)
SWEPT = Counter(
    "stencil_swept_jobs_total", "Jobs the sweeper moved, by what it found", ["found"]
)
ADMISSION_REFUSALS = Counter(
    "stencil_admission_refusals_total",
    "Infill requests refused by admission control (answered 429), by limit",
    ["reason"],
)
SPANS_WRITTEN = Counter(
    "stencil_spans_total", "Spans a route wrote in a valid attempt, by route", ["route"]
)
SPANS_LOW = Counter(
    "stencil_spans_low_confidence_total",
    "Spans flagged low confidence, by route (share: over stencil_spans_total)", ["route"],
)
CONFIDENCE_ESCALATIONS = Counter(
    "stencil_confidence_escalations_total",
    "Valid results handed to the other route because a span's confidence was low, by route",
    ["route"],
)
REQUEUED = Counter(
    "stencil_jobs_requeued_total",
    "Jobs a worker gave back to the queue after a fault that was not theirs, by error",
    ["reason"],
)


class JobStateCollector:
    """Jobs by state at scrape time, and the stuck ones: running past their lease, or queued
    and never handed to the broker for longer than the sweeper's grace."""

    def collect(self) -> Iterator[Metric]:
        from datetime import timedelta

        from django.conf import settings
        from django.db.models import Count
        from django.utils import timezone

        from drafting.models import InfillJob

        states = GaugeMetricFamily("stencil_jobs", "Jobs by state", labels=["state"])
        counts = dict(InfillJob.objects.values_list("state").annotate(n=Count("pk")))
        for state in InfillJob.State.values:
            states.add_metric([state], counts.get(state, 0))
        yield states
        now = timezone.now()
        grace = timedelta(seconds=settings.STENCIL_SWEEP_GRACE_SECONDS)
        stuck = GaugeMetricFamily(
            "stencil_jobs_stuck", "Jobs nobody is moving right now", labels=["why"]
        )
        active = [InfillJob.State.RUNNING, InfillJob.State.VALIDATING]
        stuck.add_metric(["lease_expired"], InfillJob.objects.filter(
            state__in=active, lease_expires__lt=now).count())  # fmt: skip
        stuck.add_metric(["never_dispatched"], InfillJob.objects.filter(
            state=InfillJob.State.QUEUED, dispatched__isnull=True,
            created__lt=now - grace).count())  # fmt: skip
        yield stuck


class ReviewCollector:
    """Quality and cost by route, read from the database at scrape time.

    - ``stencil_user_correction_ratio{route}``: of the model spans a person reviewed, the
      share rejected or edited by hand;
    - ``stencil_accelerator_seconds_per_accepted_result{route}``: sampler seconds of every
      attempt of the jobs behind accepted drafts, per accepted draft.
    Only the newest SCRAPE_JOBS jobs are read, so a scrape stays cheap.
    """

    SCRAPE_JOBS = 2000

    def collect(self) -> Iterator[Metric]:
        from drafting.models import Fragment, InfillJob

        corrections = GaugeMetricFamily(
            "stencil_user_correction_ratio",
            "Share of reviewed model spans that were rejected or edited", labels=["route"],
        )  # fmt: skip
        reviewed = (
            Fragment.objects.filter(job__isnull=False, status__in=["accepted", "edited", "rejected"])
            .values_list("job__route", "status")
        )  # fmt: skip
        counts: dict[str, list[int]] = {}
        for route, status in reviewed.iterator():
            total_corrected = counts.setdefault(route, [0, 0])
            total_corrected[0] += 1
            total_corrected[1] += status != "accepted"
        for route, (total, corrected) in sorted(counts.items()):
            corrections.add_metric([route], corrected / total)
        yield corrections
        yield self._corrections_by_template()

        cost = GaugeMetricFamily(
            "stencil_accelerator_seconds_per_accepted_result",
            "Sampler seconds spent per accepted draft, by route", labels=["route"],
        )  # fmt: skip
        jobs = (
            InfillJob.objects.filter(draft__accepted_revision__isnull=False)
            .order_by("-created")
            .values_list("route", "draft_id", "attempts")[: self.SCRAPE_JOBS]
        )
        seconds: dict[str, float] = {}
        drafts: dict[str, set[int]] = {}
        for route, draft_id, attempts in jobs:
            seconds[route] = seconds.get(route, 0.0) + sum(
                float(a.get("seconds", 0.0)) for a in attempts or []
            )
            drafts.setdefault(route, set()).add(draft_id)
        for route in sorted(seconds):
            cost.add_metric([route], seconds[route] / max(1, len(drafts[route])))
        yield cost


    def _corrections_by_template(self) -> Metric:
        """The correction share per template and the model (version) that wrote the spans."""
        from drafting.models import Fragment

        family = GaugeMetricFamily(
            "stencil_user_correction_ratio_by_template",
            "Share of reviewed model spans rejected or edited, by template and model version",
            labels=["template", "model"],
        )  # fmt: skip
        reviewed = Fragment.objects.filter(
            job__isnull=False, status__in=["accepted", "edited", "rejected"]
        ).values_list("draft__template_version__template__slug", "job__result", "status")
        counts: dict[tuple[str, str], list[int]] = {}
        for slug, result, status in reviewed.iterator():
            result = result if isinstance(result, dict) else {}
            version = result.get("model_version")
            name = version.get("name") if isinstance(version, dict) else version
            model = str(name or result.get("model") or "unknown")
            total_corrected = counts.setdefault((slug, model), [0, 0])
            total_corrected[0] += 1
            total_corrected[1] += status != "accepted"
        for (slug, model), (total, corrected) in sorted(counts.items()):
            family.add_metric([slug, model], corrected / total)
        return family


REVIEW_REGISTRY = CollectorRegistry(auto_describe=False)
REVIEW_REGISTRY.register(ReviewCollector())
REVIEW_REGISTRY.register(JobStateCollector())
