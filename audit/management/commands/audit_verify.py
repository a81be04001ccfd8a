from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from audit.selectors import log_verify


class Command(BaseCommand):
    help = "Verify every audit record against the log and the signed checkpoints."

    def handle(self, *args: Any, **options: Any) -> None:
        report = log_verify()
        for warning in report.warnings:
            self.stderr.write(f"WARNING: {warning}")
        for finding in report.findings:
            self.stdout.write(str(finding))
        if not report.ok:
            raise CommandError(f"{len(report.findings)} finding(s) in {report.records} records")
        self.stdout.write(
            f"OK: {report.records} records, checkpoint at size {report.checkpoint_size} verified"
        )
