"""Prometheus metrics (vLLM / TGI-like names), shared by web and worker processes.

Worker processes write to PROMETHEUS_MULTIPROC_DIR when it is set (``up`` and the tests set
it), and ``/metrics`` aggregates every process's files.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

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
