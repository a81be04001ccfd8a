"""The training task, on its own ``train`` queue (never the serving workers' queues).

The web app enqueues it by name (``corpora.services.FINETUNE_TASK``) with a run id; the run
row is the truth and the task only translates: claim, train, evaluate, register
(:func:`research.finetune_job.finetune_run`). Serving workers import this module at start
(Celery autodiscovery) but nothing heavy until a run arrives.
"""

from __future__ import annotations

from celery import shared_task
from django.conf import settings


@shared_task(name="research.tasks.finetune_run", acks_late=True, reject_on_worker_lost=True,
             soft_time_limit=settings.STENCIL_TRAIN_TIME_LIMIT - 60,
             time_limit=settings.STENCIL_TRAIN_TIME_LIMIT)  # fmt: skip
def finetune_run(run_id: str) -> None:
    from research.finetune_job import finetune_run as run

    run(run_id)
