from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from audit.services import checkpoint_write


class Command(BaseCommand):
    help = "Write a signed checkpoint covering log entries not yet checkpointed (catch-up)."

    def handle(self, *args: Any, **options: Any) -> None:
        checkpoint = checkpoint_write()
        if checkpoint is None:
            self.stdout.write("nothing new to checkpoint")
        else:
            self.stdout.write(f"checkpoint at size {checkpoint.size}, root {checkpoint.root}")
