"""The Celery app: configuration comes from Django settings (CELERY_* names)."""

from __future__ import annotations

import os
from pathlib import Path

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stencil.settings")

app = Celery("stencil")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["gpu_worker", "audit", "research"])


@app.on_after_configure.connect
def _filesystem_broker_folders(sender: Celery, **kwargs: object) -> None:
    """The embedded filesystem transport needs its folders before the first message."""
    options = sender.conf.broker_transport_options or {}
    for key in ("data_folder_in", "data_folder_out", "processed_folder", "control_folder"):
        if options.get(key):
            Path(options[key]).mkdir(parents=True, exist_ok=True)
