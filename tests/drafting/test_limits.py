"""Limits hold under concurrency: one active infill per draft, per-user and global admission.

Real PostgreSQL, one thread (and one connection) per request, all released together.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from drafting import services
from drafting.models import Draft, InfillJob
from tests.drafting.helpers import VALUES

ACTIVE = [InfillJob.State.QUEUED, InfillJob.State.RUNNING, InfillJob.State.VALIDATING]


def _together(n: int, work: Callable[[int], object]) -> list[BaseException]:
    """Run ``work(i)`` for i < n on n threads released at once; the errors they raised."""
    gate = threading.Barrier(n)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            gate.wait()
            work(i)
        except BaseException as exc:  # collected for the assertions
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


@pytest.fixture
def _postgres() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row and advisory locks are PostgreSQL's; SQLite writes one at a time")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("_postgres")
def test_concurrent_infill_requests_on_one_draft_queue_exactly_one_job(draft: Draft) -> None:
    errors = _together(6, lambda _i: services.draft_infill_request(
        draft=Draft.objects.get(pk=draft.pk), user=draft.owner, preset="balanced"))  # fmt: skip
    assert InfillJob.objects.filter(draft=draft, state__in=ACTIVE).count() == 1
    assert len(errors) == 5
    assert all(isinstance(e, services.UserError) and "already running" in str(e) for e in errors)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("_postgres")
def test_concurrent_requests_by_one_user_never_pass_the_per_user_limit(
    user: Any, version: Any, settings: Any
) -> None:
    settings.STENCIL_MAX_QUEUED_JOBS_PER_USER = 3
    drafts = [services.draft_create(owner=user, version=version, values=dict(VALUES))
              for _ in range(10)]  # fmt: skip
    errors = _together(10, lambda i: services.draft_infill_request(
        draft=drafts[i], user=user, preset="balanced"))  # fmt: skip
    assert InfillJob.objects.filter(owner=user, state__in=ACTIVE).count() == 3
    assert len(errors) == 7
    assert all(isinstance(e, services.AdmissionError) for e in errors)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("_postgres")
def test_concurrent_requests_by_many_users_never_pass_the_global_limit(
    version: Any, settings: Any, django_user_model: Any
) -> None:
    settings.STENCIL_MAX_QUEUED_JOBS = 4
    users = [django_user_model.objects.create_user(username=f"u{i}") for i in range(12)]
    drafts = [services.draft_create(owner=u, version=version, values=dict(VALUES)) for u in users]
    errors = _together(12, lambda i: services.draft_infill_request(
        draft=drafts[i], user=users[i], preset="balanced"))  # fmt: skip
    assert InfillJob.objects.filter(state__in=ACTIVE).count() == 4
    assert len(errors) == 8
    assert all(isinstance(e, services.AdmissionError) for e in errors)
