"""Concurrent appenders get a gapless log, and the checkpoints written after commit cover it."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection

from audit.models import LogEntry
from audit.selectors import log_verify
from audit.services import audit_event_append

THREADS = 8
APPENDS = 10


@pytest.mark.django_db(transaction=True)
def test_concurrent_appends_give_a_gapless_checkpointed_log(audit_settings: Any) -> None:
    if connection.vendor == "sqlite" and connection.settings_dict["NAME"].startswith(
        "file:memorydb"
    ):
        pytest.skip("in-memory SQLite shares one connection across threads")
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(APPENDS):
                audit_event_append(kind="run_replayed", actor=f"t{n}", subject=f"{n}:{i}")
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    seqs = list(LogEntry.objects.order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(THREADS * APPENDS))
    report = log_verify()
    assert report.ok, [str(f) for f in report.findings]
    assert report.checkpoint_size == THREADS * APPENDS
