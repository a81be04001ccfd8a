"""A database connection the server dropped is replaced before the next request uses it.

The request cycle is driven through Django's own signals, as its WSGI handler does (the test
client and the live server close or pin connections on purpose, so they cannot show this).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.core.signals import request_finished, request_started
from django.db import connection

from drafting import selectors

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


def _terminate_other_backends() -> int:
    """Kill every other session on the test database, as a server restart or failover would."""
    params = connection.get_connection_params()
    kept = {k: params[k] for k in ("dbname", "user", "host", "port") if params.get(k)}
    with psycopg.connect(**kept, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return len(rows)


def _request(user: Any) -> int:
    """One request's worth of database work between the handler's signals."""
    request_started.send(sender=None)
    try:
        return len(list(selectors.draft_list_for_user(user=user)))
    finally:
        request_finished.send(sender=None)


def test_a_request_after_the_database_dropped_its_connection_reconnects(user: Any) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("terminating backends is PostgreSQL's")
    assert connection.settings_dict["CONN_MAX_AGE"] > 0  # connections are kept between requests
    _request(user)
    kept = connection.connection
    assert _terminate_other_backends() >= 1  # among them the connection just kept
    assert _request(user) == 0  # no OperationalError: the dead connection was replaced
    assert connection.connection is not kept
