from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from audit.services import diagnostics_purge


class Command(BaseCommand):
    help = "Delete encrypted diagnostics older than the retention age (recorded as an audit event)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than-days",
            type=int,
            default=settings.AUDIT_DIAGNOSTIC_RETENTION_DAYS,
            help="default: AUDIT_DIAGNOSTIC_RETENTION_DAYS",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        count = diagnostics_purge(
            older_than_days=options["older_than_days"], actor="manage.py audit_purge_diagnostics"
        )
        self.stdout.write(f"purged {count} diagnostic(s)")
