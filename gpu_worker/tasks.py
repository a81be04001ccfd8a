"""The worker's Celery task: take a job id from the denoise queue and run the job pipeline.

The web app enqueues by task name (``drafting.services.job_dispatch``), so nothing in the web
app or the engine imports this module. The message is acknowledged only after the pipeline
returns (``acks_late``): a worker killed meanwhile leaves it to the broker to deliver again.
A message is sent again later (a retry) while another worker holds the job, while the database
cannot be reached to claim it, and when the pipeline could not write the job's end.
"""

from __future__ import annotations

from celery import shared_task
from celery.app.task import Task
from celery.signals import worker_ready
from django.conf import settings
from django.db import connection

from gpu_worker.claims import JobBusy
from gpu_worker.pipeline import ABANDONED, TRANSIENT_ERRORS, job_run

RUN_INFILL = "gpu_worker.tasks.run_infill"
DATABASE_RETRY_S = 5  # the database was unreachable before a claim: ask again this much later


@shared_task(bind=True, name=RUN_INFILL, acks_late=True,
             reject_on_worker_lost=True, max_retries=None)  # fmt: skip
def run_infill(self: Task, job_id: str) -> str:
    try:
        state = job_run(job_id=job_id, worker=str(self.request.hostname))
    except JobBusy as busy:
        raise self.retry(countdown=busy.retry_after) from busy
    except TRANSIENT_ERRORS as exc:  # while claiming: the claim may or may not have been taken
        connection.close_if_unusable_or_obsolete()
        raise self.retry(countdown=DATABASE_RETRY_S) from exc
    if state == ABANDONED:  # claimed, its end unwritten: claim it again once the lease is over
        raise self.retry(countdown=settings.STENCIL_JOB_LEASE_SECONDS + 1)
    return state


@worker_ready.connect
def _sweeper_start(**_kwargs: object) -> None:
    """Each worker sweeps for jobs nobody is moving (gpu_worker/sweeper.py)."""
    from gpu_worker.sweeper import timer_start

    timer_start()
