"""The Celery adapter: the only place gpu_worker meets Celery and Django. Tasks take ids."""

from __future__ import annotations

from celery import shared_task
from celery.app.task import Task


@shared_task(bind=True, name="gpu_worker.tasks.run_infill", acks_late=True,
             reject_on_worker_lost=True, max_retries=None)  # fmt: skip
def run_infill(self: Task, job_id: str) -> str:
    from drafting.jobs import JobBusy, job_run

    try:
        return job_run(job_id=job_id, worker=str(self.request.hostname))
    except JobBusy as busy:
        raise self.retry(countdown=busy.retry_after) from busy


@shared_task(name="gpu_worker.tasks.run_replay", acks_late=True)
def run_replay(run_id: str) -> str:
    from audit.models import RunRecord
    from audit.services import run_replay as replay

    report = replay(run=RunRecord.objects.get(pk=run_id))
    return str(getattr(report, "summary", report))
