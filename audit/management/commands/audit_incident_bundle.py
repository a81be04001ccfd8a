from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.models import Incident
from audit.selectors import incident_bundle_get


class Command(BaseCommand):
    help = "Print an incident's reproduction bundle as JSON."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("incident_id", type=int)
        parser.add_argument("--output", "-o", help="write to this file instead of stdout")

    def handle(self, *args: Any, **options: Any) -> None:
        incident = Incident.objects.filter(pk=options["incident_id"]).first()
        if incident is None:
            raise CommandError(f"no incident {options['incident_id']}")
        text = json.dumps(incident_bundle_get(incident=incident), indent=2, sort_keys=True)
        if options["output"]:
            with open(options["output"], "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
            self.stdout.write(f"wrote {options['output']}")
        else:
            self.stdout.write(text)
