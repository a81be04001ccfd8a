"""Dispatch benchmark: throughput and latency of 1, 4 and 8 concurrent drafts, batching on/off.

Real parts: PostgreSQL (a scratch database), RabbitMQ, and one Celery worker process
(concurrency 1, the model loaded once). For each setting the worker is started with
STENCIL_BATCH_MAX=8 (batching on) or 1 (off); N drafts are requested at once and timed from
their job rows. Writes bench/dispatch/results.json and bench/dispatch/REPORT.md.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/stencil_bench \\
    CELERY_BROKER_URL=amqp://guest:guest@127.0.0.1:5672// \\
    .venv/bin/python bench/dispatch_bench.py [--model models/stencil-denoiser] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
OUT = REPO / "bench" / "dispatch"
CONCURRENCY = (1, 4, 8)
OFFER_VALUES = {
    "company": "Northwind Analytics", "letter_date": "2 May 2025", "candidate": "Priya Shah",
    "role": "Senior Data Engineer", "salary": "$128,000", "start_date": "1 July 2025",
    "manager": "Tom Becker",
}  # fmt: skip


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _start_worker(env: dict[str, str], batch_max: int, prefix: str) -> subprocess.Popen[bytes]:
    worker_env = {**env, "STENCIL_BATCH_MAX": str(batch_max), "STENCIL_QUEUE_PREFIX": prefix}
    log = (OUT / f"worker-batch{batch_max}.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "stencil", "worker", "-Q", f"{prefix}denoise",
         "--concurrency", "1", "--pool", "solo", "--loglevel", "WARNING", "--without-gossip",
         "--without-mingle", "-n", f"bench{batch_max}@%h"],
        cwd=REPO, env=worker_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    time.sleep(4.0)  # connect and import; the model loads with the first job (warm-up below)
    return process


def _run_round(n: int, owner: Any, version: Any, preset: str) -> list[dict[str, Any]]:
    from django.db import transaction

    from drafting import services
    from drafting.models import InfillJob

    drafts = [services.draft_create(owner=owner, version=version, values=OFFER_VALUES)
              for _ in range(n)]  # fmt: skip
    with transaction.atomic():  # every job is queued before the first id reaches the broker
        jobs = [services.draft_infill_request(draft=d, user=owner, preset=preset) for d in drafts]
    ids = [j.pk for j in jobs]
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        rows = list(InfillJob.objects.filter(pk__in=ids))
        if all(r.state in InfillJob.FINAL_STATES for r in rows):
            break
        time.sleep(0.05)
    out = []
    for row in rows:
        attempt = row.attempts[0] if row.attempts else {}
        e2e = (row.finished - row.created).total_seconds() if row.finished else float("nan")
        out.append({
            "state": row.state, "e2e_s": e2e,
            "queue_s": (row.started - row.created).total_seconds() if row.started else None,
            "sampler_s": attempt.get("seconds", 0.0), "batch": len(attempt.get("batch", [])),
            "forward_passes": attempt.get("forward_passes"),
        })  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--preset", default="balanced")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stencil.settings")
    os.environ.setdefault("DEBUG", "True")  # a development tool: development settings
    os.environ["STENCIL_MAX_QUEUED_JOBS_PER_USER"] = "64"
    if args.model:
        os.environ["STENCIL_MODEL_DIR"] = str(args.model.resolve())
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.core.management import call_command

    from drafting.models import DocumentTemplate

    if not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        raise SystemExit("run the benchmark on PostgreSQL: set DATABASE_URL=postgres://...")
    call_command("migrate", verbosity=0)
    call_command("load_demo", verbosity=0, stdout=open(os.devnull, "w"))  # noqa: SIM115
    owner, _ = User.objects.get_or_create(username="bench")
    version = DocumentTemplate.objects.get(slug="offer-letter").latest_version()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "2"}
    results: dict[str, Any] = {"model": settings.STENCIL_MODEL_DIR.name, "preset": args.preset,
                               "rounds": args.rounds, "settings": {}}  # fmt: skip
    for batch_max in (1, 8):
        prefix = f"bench-{uuid.uuid4().hex[:6]}-"
        from django.test import override_settings

        worker = _start_worker(env, batch_max, prefix)
        try:
            with override_settings(QUEUE_DENOISE=f"{prefix}denoise"):
                _run_round(1, owner, version, args.preset)  # warm-up: load the model
                for n in CONCURRENCY:
                    rows: list[dict[str, Any]] = []
                    spans: list[float] = []
                    for _ in range(args.rounds):
                        started = time.monotonic()
                        rows += _run_round(n, owner, version, args.preset)
                        spans.append(time.monotonic() - started)
                    e2e = [r["e2e_s"] for r in rows]
                    overhead = [r["e2e_s"] - r["sampler_s"] for r in rows]
                    key = f"batch{'on' if batch_max > 1 else 'off'}_n{n}"
                    results["settings"][key] = {
                        "batching": batch_max > 1, "concurrent": n,
                        "succeeded": sum(r["state"] == "succeeded" for r in rows),
                        "jobs": len(rows),
                        "throughput_jobs_per_s": n * args.rounds / sum(spans),
                        "latency_p50_s": statistics.median(e2e),
                        "latency_p95_s": _percentile(e2e, 0.95),
                        "overhead_p50_ms": 1000 * statistics.median(overhead),
                        "mean_batch": statistics.mean(r["batch"] or 1 for r in rows),
                    }  # fmt: skip
                    print(key, json.dumps(results["settings"][key]))
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=60)
    s = results["settings"]
    single = s["batchoff_n1"]["latency_p95_s"]
    results["ratios"] = {
        "throughput_8_batched_vs_sequential": s["batchon_n8"]["throughput_jobs_per_s"]
        / s["batchoff_n8"]["throughput_jobs_per_s"],
        "p95_8_batched_vs_single_draft": s["batchon_n8"]["latency_p95_s"] / single,
    }
    (OUT / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        "# Dispatch benchmark", "",
        f"Model `{results['model']}`, preset `{args.preset}`, one worker process (concurrency 1), "
        f"PostgreSQL + RabbitMQ, {args.rounds} rounds per row. Command: see bench/dispatch_bench.py.",
        "", "| batching | concurrent drafts | throughput (jobs/s) | p50 latency (s) | "
        "p95 latency (s) | e2e minus sampler p50 (ms) | mean batch |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for row in s.values():
        lines.append(
            f"| {'on' if row['batching'] else 'off'} | {row['concurrent']} | "
            f"{row['throughput_jobs_per_s']:.2f} | {row['latency_p50_s']:.2f} | "
            f"{row['latency_p95_s']:.2f} | {row['overhead_p50_ms']:.0f} | {row['mean_batch']:.1f} |"
        )
    ratios = results["ratios"]
    lines += ["", f"- throughput with 8 concurrent drafts, batched / one at a time: "
              f"**{ratios['throughput_8_batched_vs_sequential']:.2f}x** (target >= 2.5x)",
              f"- p95 latency with 8 batched / a single draft's: "
              f"**{ratios['p95_8_batched_vs_single_draft']:.2f}x** (target <= 1.5x)",
              f"- service overhead (end to end minus sampler time) of a single draft, p50: "
              f"**{s['batchoff_n1']['overhead_p50_ms']:.0f} ms** (target < 100 ms); with several "
              "drafts the column also holds the time a job waits behind the others", ""]  # fmt: skip
    (OUT / "REPORT.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
