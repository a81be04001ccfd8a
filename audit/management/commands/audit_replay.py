from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.models import RunRecord
from audit.replay import ReplayError
from audit.services import run_replay


class Command(BaseCommand):
    help = "Re-run a recorded run and compare its trace step by step."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id")
        parser.add_argument("--json", action="store_true", help="print the full report as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        run = RunRecord.objects.filter(pk=options["run_id"]).first()
        if run is None:
            raise CommandError(f"no run record {options['run_id']}")
        try:
            report = run_replay(run=run, actor="manage.py audit_replay")
        except ReplayError as exc:
            raise CommandError(str(exc)) from exc
        if options["json"]:
            self.stdout.write(json.dumps(report.to_json(), indent=2, sort_keys=True))
        else:
            self.stdout.write(f"run {run.pk}: {report.summary}")
        if not report.identical:
            raise CommandError("replay diverged")
