from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from audit.selectors import log_verify
from audit.services import CheckpointRefused, checkpoint_write


class Command(BaseCommand):
    help = (
        "Sign a checkpoint covering log entries not yet checkpointed (catch-up), only after "
        "the whole log verifies: a checkpoint never vouches for a tampered state."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        report = log_verify()
        if not report.ok:
            for finding in report.findings:
                self.stdout.write(str(finding))
            raise CommandError(
                f"refusing to sign: {len(report.findings)} finding(s); investigate them first"
            )
        try:
            checkpoint = checkpoint_write()
        except CheckpointRefused as exc:
            raise CommandError(str(exc)) from exc
        if checkpoint is None:
            self.stdout.write("nothing new to checkpoint")
        else:
            self.stdout.write(f"checkpoint at size {checkpoint.size}, root {checkpoint.root}")
