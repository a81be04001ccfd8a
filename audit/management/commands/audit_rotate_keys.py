from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from audit.keys import encryption_key_generate_dev
from audit.services import keys_rotate


class Command(BaseCommand):
    help = (
        "Re-encrypt every diagnostic under the newest key of AUDIT_ENCRYPTION_KEYS. Put the new "
        "key first, run this, then drop the old key. --new-dev-key prepends a fresh key to the "
        "development key file first (DEBUG only)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--new-dev-key", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["new_dev_key"]:
            key = encryption_key_generate_dev()
            self.stdout.write(f"new development key {key.key_id}")
        report = keys_rotate(actor="manage.py audit_rotate_keys")
        self.stdout.write(
            f"re-encrypted {report.reencrypted} diagnostic(s) under key {report.newest_key_id}; "
            f"{report.already_current} already current"
        )
