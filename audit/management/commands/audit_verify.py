from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.selectors import log_verify


class Command(BaseCommand):
    help = (
        "Verify every audit record against the log, the signed checkpoints and the witness. "
        "Record the size it prints somewhere else and pass it back as --expect-size."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--expect-size", type=int, default=None,
            help="a checkpoint size recorded earlier: fewer signed entries mean a cut tail",
        )  # fmt: skip

    def handle(self, *args: Any, **options: Any) -> None:
        report = log_verify(expect_size=options["expect_size"])
        for warning in report.warnings:
            self.stderr.write(f"WARNING: {warning}")
        for finding in report.findings:
            self.stdout.write(str(finding))
        if not report.ok:
            raise CommandError(f"{len(report.findings)} finding(s) in {report.records} records")
        self.stdout.write(
            f"OK: {report.records} records, checkpoint at size {report.checkpoint_size} verified"
        )
