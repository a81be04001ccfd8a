"""The audit queue's Celery task: replay one run record in the background."""

from __future__ import annotations

from celery import shared_task

from audit.models import RunRecord
from audit.services import run_replay as replay


@shared_task(name="audit.tasks.run_replay", acks_late=True)
def run_replay(run_id: str) -> str:
    report = replay(run=RunRecord.objects.get(pk=run_id))
    return report.summary
