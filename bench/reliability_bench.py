"""Reliability campaign: infill jobs through real workers while workers are SIGKILLed, the broker
goes away and the database drops every connection; counts lost, duplicated and stuck jobs and
how long the jobs each fault hit took to end.

    PYTHONPATH=. .venv/bin/python bench/reliability_bench.py            # run it (~2-4 min)
    PYTHONPATH=. .venv/bin/python bench/reliability_bench.py --report   # print the last table

Needs PostgreSQL and RabbitMQ (CELERY_BROKER_URL=amqp://...). It uses its own database
(STENCIL_BENCH_DATABASE_URL, default postgres://postgres@127.0.0.1:5432/stencil_reliability),
which it empties first, its own queues, and a relay in front of RabbitMQ for the broker outage
(tests/faults/inject.py), so the RabbitMQ other runs share keeps running. Writes
bench/reliability/results.json and bench/reliability/REPORT.md. ``--worker-checkout DIR`` runs
the workers from another checkout (the same database schema) and ``--compare RESULTS.json``
puts another run's row beside this one's, to compare versions.

The campaign: two workers (the trained denoiser, STENCIL_BATCH_MAX 8), 40 jobs from eight users
submitted in waves, and after each wave a fault: four SIGKILLs (of the worker running the most
jobs, while it runs them; it is started again), two terminations of every database session,
and one broker outage during which another wave is submitted. A job is *hit* by a fault when it was
running on the killed worker, running anywhere when the database dropped, or submitted during
the outage; its recovery time is from its last fault to its end. Each fault waits until the
jobs the previous one hit have ended.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import textwrap
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench" / "reliability"
COMMAND = "PYTHONPATH=. .venv/bin/python bench/reliability_bench.py"
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/stencil_reliability"
# One token per step over the referral letter's holes: a batch runs for seconds on a CPU.
SAMPLER = {"commit_rule": "even", "block_length": 32, "steps_per_block": 32,
           "max_steps": 256, "cache": "none", "remask": "none"}  # fmt: skip
FIRST_WAVE = 8  # jobs submitted before the first fault
WAVE = 4  # jobs submitted before each fault, so that it hits work in progress
FAULTS = ["kill", "db", "kill", "blip", "kill", "db", "kill"]  # the blip submits WAVE more
USERS = 8
FAULT_WAIT_S = 60  # how long a fault waits for work in progress to hit
RECOVERY_WAIT_S = 120  # how long a fault waits for the previous fault's jobs to end
BLIP_S = 6.0


@dataclass
class Fault:
    kind: str  # kill | db | blip
    at: float  # epoch seconds
    detail: str
    hit: list[str] = field(default_factory=list)


def _setup_django(database_url: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stencil.settings")
    os.environ.setdefault("DEBUG", "True")  # a development tool: development settings
    import psycopg

    name = database_url.rsplit("/", 1)[1]
    with psycopg.connect(database_url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            admin.execute(f'CREATE DATABASE "{name}"')
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    with open(os.devnull, "w") as quiet:
        call_command("load_demo", stdout=quiet)


class Campaign:
    def __init__(self, args: argparse.Namespace, broker: str) -> None:
        from django.contrib.auth.models import User

        from tests.faults.inject import Relay

        self.args = args
        self.relay = Relay(broker)
        self.prefix = f"bench-{uuid.uuid4().hex[:6]}-"
        self.var_dir = Path(tempfile.mkdtemp(prefix="stencil-reliability-"))
        self.users = [User.objects.create_user(username=f"bench{i}", password=uuid.uuid4().hex)
                      for i in range(USERS)]  # fmt: skip
        self.jobs: list[str] = []
        self.faults: list[Fault] = []
        self.workers: list[Any] = []
        self.started = time.time()

    # -- workers ---------------------------------------------------------------------------
    def start_worker(self, index: int) -> Any:
        from tests.workers import worker_start

        lease = str(self.args.lease)
        worker = worker_start(
            name=f"bench{index}", broker_url=self.relay.url, var_dir=self.var_dir,
            queue_prefix=self.prefix, log_dir=self.var_dir, repo=Path(self.args.worker_checkout),
            extra_env={"STENCIL_MODEL_DIR": str(self.model_dir()), "STENCIL_JOB_LEASE_SECONDS":
                       lease, "STENCIL_SWEEP_SECONDS": str(self.args.sweep),
                       "STENCIL_SWEEP_GRACE_SECONDS": str(self.args.sweep),
                       "STENCIL_MAX_REQUEST_STEPS": "4096"},
        )  # fmt: skip
        if index < len(self.workers):
            self.workers[index] = worker
        else:
            self.workers.append(worker)
        return worker

    def sampler(self) -> dict[str, Any]:
        return dict(SAMPLER)

    def model_dir(self) -> Path:
        from tests.workers import PLACEHOLDER_MODEL

        return PLACEHOLDER_MODEL if self.args.model == "placeholder" else REPO / "models" / (
            "stencil-denoiser")

    # -- work ------------------------------------------------------------------------------
    def submit(self, n: int) -> list[str]:
        from django.db import transaction

        from drafting.models import DocumentTemplate

        version = DocumentTemplate.objects.get(slug="referral-letter").latest_version()
        ids: list[str] = []
        with transaction.atomic():  # a burst: every id reaches the broker when all are queued
            self._submit(version, n, ids)
        return ids

    def _submit(self, version: Any, n: int, ids: list[str]) -> None:
        from drafting import services
        from tests.e2e.test_pipeline import REFERRAL_VALUES

        for _ in range(n):
            owner = self.users[len(self.jobs) % USERS]
            draft = services.draft_create(owner=owner, version=version, values=REFERRAL_VALUES)
            plan = services.draft_canvas_plan(draft=draft)
            job = services.infill_job_create(
                owner=owner, request={**plan.request, "sampler": self.sampler()}, preset="careful",
                draft=draft, targets=plan.targets,
            )  # fmt: skip
            self.jobs.append(str(job.pk))
            ids.append(str(job.pk))

    def _active(self, worker: Any = None, step: int = 0) -> list[str]:
        from drafting.models import InfillJob

        rows = InfillJob.objects.filter(pk__in=self.jobs, state__in=["running", "validating"],
                                        progress__step__gte=step)  # fmt: skip
        if worker is not None:
            rows = rows.filter(worker__startswith=f"{worker.name}@")
        return [str(pk) for pk in rows.values_list("pk", flat=True)]

    def _recovered(self) -> None:
        """Wait until the jobs the last fault hit are final: each fault is measured on its own,
        and no job is interrupted at three deliveries in a row (the cap would end it, by
        design; tests/e2e shows that case)."""
        from drafting.models import InfillJob

        last = next((f for f in reversed(self.faults) if f.hit), None)
        until = time.monotonic() + RECOVERY_WAIT_S
        while last is not None and time.monotonic() < until:
            if not InfillJob.objects.filter(pk__in=last.hit).exclude(
                state__in=InfillJob.FINAL_STATES
            ).exists():
                return
            time.sleep(0.1)

    def _wait_for_work(self, worker: Any = None) -> bool:
        until = time.monotonic() + FAULT_WAIT_S
        while time.monotonic() < until:
            if self._active(worker, step=3):
                return True
            time.sleep(0.05)
        return False

    # -- faults ----------------------------------------------------------------------------
    def kill(self) -> None:
        """SIGKILL the worker running the most jobs, then start it again."""
        if not self._wait_for_work():
            self.faults.append(Fault("kill", time.time(), "no batch to hit"))
            return
        index = max(range(len(self.workers)), key=lambda i: len(self._active(self.workers[i])))
        worker = self.workers[index]
        hit = self._active(worker)
        worker.kill()
        self.faults.append(Fault("kill", time.time(), f"SIGKILL {worker.name}", hit))
        self.start_worker(index)

    def db(self) -> None:
        from tests.faults.inject import terminate_other_backends

        if not self._wait_for_work():
            self.faults.append(Fault("db", time.time(), "no work to hit"))
            return
        hit = self._active()
        n = terminate_other_backends()
        self.faults.append(Fault("db", time.time(), f"{n} sessions terminated", hit))

    def blip(self, n: int) -> None:
        self.relay.down()
        at = time.time()
        hit = self._active() + self.submit(n)
        time.sleep(max(0.0, BLIP_S - (time.time() - at)))
        self.relay.up()
        self.faults.append(Fault("blip", at, f"broker away {time.time() - at:.1f}s, {n} submitted",
                                 hit))  # fmt: skip

    def run(self) -> None:
        from stencil.celery import app
        from tests.workers import producer_broker

        self.start_worker(0)
        self.start_worker(1)
        with producer_broker(app, self.relay.url, self.prefix):
            self.submit(FIRST_WAVE)
            for kind in FAULTS:
                self._recovered()
                self.submit(WAVE)
                if kind == "kill":
                    self.kill()
                elif kind == "db":
                    self.db()
                else:
                    self.blip(WAVE)
                fault = self.faults[-1]
                print(f"  {time.time() - self.started:6.1f}s  {kind}: {fault.detail}, "
                      f"{len(fault.hit)} jobs hit", flush=True)  # fmt: skip
            from tests.faults.ledger import settle

            self.tally = settle(self.jobs, deadline_s=self.args.deadline)
        self.ended = time.time()
        for worker in self.workers:
            worker.stop()
        self.relay.down()
        from tests.workers import queues_purge

        queues_purge(os.environ["CELERY_BROKER_URL"], self.prefix)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize(c: Campaign) -> dict[str, Any]:
    from drafting.models import InfillJob

    rows = {str(j.pk): j for j in InfillJob.objects.filter(pk__in=c.jobs)}
    finished = {pk: j.finished.timestamp() for pk, j in rows.items() if j.finished}
    recovery: dict[str, list[float]] = {"kill": [], "db": [], "blip": []}
    hit: dict[str, int] = {"kill": 0, "db": 0, "blip": 0}
    for pk, end in finished.items():
        hits = [f for f in c.faults if pk in f.hit and f.at <= end]
        if hits:
            last = max(hits, key=lambda f: f.at)
            hit[last.kind] += 1
            if rows[pk].state == InfillJob.State.SUCCEEDED:  # a lost job has no recovery
                recovery[last.kind].append(end - last.at)
    every = [s for values in recovery.values() for s in values]
    hit["all"] = sum(hit.values())
    by_batch: dict[int, list[float]] = {}
    for job in rows.values():
        if job.result and job.attempts:
            size = int(job.result.get("batch_size", 1))
            by_batch.setdefault(size, []).append(float(job.attempts[-1].get("seconds", 0.0)))
    injected = [f for f in c.faults if f.hit]
    rescued = [rows[pk] for f in c.faults if f.kind == "kill" for pk in f.hit if pk in rows]
    batch_sizes = [int((j.result or {}).get("batch_size", 0)) for j in rescued if j.result]
    last_fault = max((f.at for f in injected), default=c.started)
    return {
        "command": " ".join([COMMAND, *sys.argv[1:]]),
        "settings": {"jobs": len(c.jobs), "workers": 2, "lease_s": c.args.lease,
                     "sweep_s": c.args.sweep, "batch_max": 8, "model": c.model_dir().name,
                     "sampler": c.sampler(), "worker_checkout": str(c.args.worker_checkout)},
        "faults": [asdict(f) for f in c.faults],
        "injected": {kind: sum(1 for f in injected if f.kind == kind)
                     for kind in ("kill", "db", "blip")},  # fmt: skip
        "tally": c.tally.as_json(),
        "lost_jobs": c.tally.lost, "duplicated_jobs": c.tally.duplicated,
        "stuck_jobs": c.tally.stuck,
        "hit_jobs": len({pk for f in injected for pk in f.hit}),
        "recovery_s": {kind: {"hit": hit[kind], "n": len(v),
                              "p50": round(statistics.median(v), 1) if v else None,
                              "max": round(max(v), 1) if v else None}
                       for kind, v in {**recovery, "all": every}.items()},  # fmt: skip
        "attempt_seconds_by_batch_size": {str(size): round(statistics.median(v), 2)
                                          for size, v in sorted(by_batch.items())},  # fmt: skip
        "all_final_after_last_fault_s": round(max(finished.values(), default=last_fault)
                                              - last_fault, 1),  # fmt: skip
        "rescued_batch_size": {"p50": _percentile([float(b) for b in batch_sizes], 0.5),
                               "max": max(batch_sizes, default=0)},
        "delivery_counts": dict(sorted(
            {str(n): sum(1 for j in rows.values() if j.delivery_count == n)
             for n in {j.delivery_count for j in rows.values()}}.items())),  # fmt: skip
        "wall_s": round(c.ended - c.started, 1),
    }


def table(runs: list[dict[str, Any]]) -> str:
    """One row per run: the first is this run, the others the runs it is compared with."""

    def cell(r: dict[str, Any], kind: str) -> str:
        v = r["recovery_s"][kind]
        return f"{v['p50']} / {v['max']}" if v["n"] else "-"

    lines = [
        "| workers | faults injected | jobs | lost | duplicated | stuck | recovery p50 / max, s:"
        " all | SIGKILL | database | broker | kill-hit jobs rescued in batches of (median / max) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        t, inj, rb = r["tally"], r["injected"], r["rescued_batch_size"]
        lines.append(
            f"| {r['label']} | {inj['kill']} SIGKILLs ({r['recovery_s']['kill']['hit']} jobs hit), "
            f"{inj['db']} database terminations ({r['recovery_s']['db']['hit']}), {inj['blip']} "
            f"broker outage of {BLIP_S:.0f} s ({r['recovery_s']['blip']['hit']}) | {t['jobs']} | "
            f"{t['lost']} | {t['duplicated']} | {t['stuck']} | {cell(r, 'all')} | "
            f"{cell(r, 'kill')} | {cell(r, 'db')} | {cell(r, 'blip')} | "
            f"{rb['p50']:.0f} / {rb['max']} |"
        )  # fmt: skip
    return "\n".join(lines)


def report(r: dict[str, Any], others: list[dict[str, Any]]) -> str:
    s = r["settings"]
    paragraphs = [
        f"All jobs of this run were final {r['all_final_after_last_fault_s']} s after the last "
        f"fault; deliveries whose work began, per job: {r['delivery_counts']}; campaign wall "
        f"time {r['wall_s']} s. The first attempt's median seconds by batch size (what a batch "
        f"costs on this machine): {r['attempt_seconds_by_batch_size']}.",
        f"Settings: {s['jobs']} referral-letter jobs from {USERS} users in waves, {s['workers']} "
        f"workers, lease {s['lease_s']} s, sweep every {s['sweep_s']} s, batches of up to "
        f"{s['batch_max']}, the {s['model']} model on a shared 2-core CPU, sampler "
        f"`{json.dumps(s['sampler'])}`.",
        *(f"The row {o['label']!r} is the same campaign with the workers of another checkout "
          f"({o['settings']['worker_checkout']}, made with `git archive COMMIT | tar -x -C "
          f"DIR`), run with `{o['command']}`." for o in others),
        "How to read it: *lost* is a job that did not end succeeded (every job is valid and "
        "none is cancelled) or whose draft lacks its infill revision; *duplicated* is a draft "
        "with more infill revisions or succeeded jobs than it asked for; *stuck* is a job not "
        f"final {int(r['deadline_s'])} s after the last fault. A job is hit by a kill when it "
        "ran on the killed worker, by a database termination when it was running anywhere, by "
        "the outage when it was submitted during it; in brackets is how many jobs each kind of "
        "fault hit. Recovery is from a job's last fault to its successful end (a lost job has "
        "none). After a kill it is at least the lease: the dead worker's claims are taken over "
        "once their leases run out. Each fault waits until the jobs the previous one hit have "
        "ended. The raw figures, every fault with the jobs it hit, are in results.json.",
    ]  # fmt: skip
    body = "\n\n".join(textwrap.fill(p, width=100) for p in paragraphs)
    return f"""# Reliability campaign

Jobs through real workers (PostgreSQL, RabbitMQ, two Celery worker processes) while workers are
killed, the database drops every connection and the broker goes away. Reproduce with

    {r["command"]}

and print this table again with `{COMMAND} --report`.

{table([r, *others])}

{body}
"""


def _label(checkout: Path) -> str:
    import subprocess

    if checkout.resolve() != REPO:
        return checkout.name
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                          capture_output=True).stdout.strip()  # fmt: skip
    return f"this checkout ({head})" if head else "this checkout"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", action="store_true", help="print the last run's table")
    parser.add_argument("--lease", type=int, default=10, help="STENCIL_JOB_LEASE_SECONDS")
    parser.add_argument("--sweep", type=int, default=2, help="STENCIL_SWEEP_SECONDS")
    parser.add_argument("--deadline", type=float, default=300.0)
    parser.add_argument("--worker-checkout", type=Path, default=REPO)
    parser.add_argument("--label", help="the workers' row label (default: the checkout)")
    parser.add_argument("--compare", type=Path, action="append", default=[],
                        help="results.json of another run, shown as a row beside this one")
    parser.add_argument("--model", choices=["placeholder", "denoiser"], default="denoiser",
                        help="the trained denoiser (models/) or the placeholder (fast)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.report:
        results = json.loads((args.out / "results.json").read_text())
        print(table([results, *results.get("compared", [])]))
        return 0
    broker = os.environ.get("CELERY_BROKER_URL", "")
    if not broker.startswith("amqp"):
        print("set CELERY_BROKER_URL=amqp://... (RabbitMQ)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO))
    _setup_django(os.environ.get("STENCIL_BENCH_DATABASE_URL", DEFAULT_DB))
    campaign = Campaign(args, broker)
    campaign.run()
    others = [json.loads(path.read_text()) for path in args.compare]
    for other in others:
        other.pop("compared", None)
    results = {**summarize(campaign), "deadline_s": args.deadline,
               "label": args.label or _label(args.worker_checkout), "compared": others}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "REPORT.md").write_text(report(results, others))
    print(table([results, *others]))
    return 0 if campaign.tally.clean else 1


if __name__ == "__main__":
    sys.exit(main())
