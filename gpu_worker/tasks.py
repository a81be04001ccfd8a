"""The worker's Celery task: take a job id from the denoise queue and run the job pipeline.

The web app enqueues by task name (``drafting.services.job_dispatch``), so nothing in the web
app or the engine imports this module.
"""

from __future__ import annotations

from celery import shared_task
from celery.app.task import Task
from celery.signals import worker_ready

from gpu_worker.claims import JobBusy
from gpu_worker.pipeline import job_run

RUN_INFILL = "gpu_worker.tasks.run_infill"


@shared_task(bind=True, name=RUN_INFILL, acks_late=True,
             reject_on_worker_lost=True, max_retries=None)  # fmt: skip
def run_infill(self: Task, job_id: str) -> str:
    try:
        return job_run(job_id=job_id, worker=str(self.request.hostname))
    except JobBusy as busy:
        raise self.retry(countdown=busy.retry_after) from busy


@worker_ready.connect
def _sweeper_start(**_kwargs: object) -> None:
    """Each worker sweeps for jobs nobody is moving (gpu_worker/sweeper.py)."""
    from gpu_worker.sweeper import timer_start

    timer_start()
