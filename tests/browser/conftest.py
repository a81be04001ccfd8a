"""Headless Chromium (Playwright, sync API) against pytest-django's live server.

Jobs run in-process here: ``job_in_background`` calls ``gpu_worker.pipeline.job_run`` on a thread,
as a worker would, while the browser polls the progress endpoint.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.pages import PASSWORD

# Playwright's sync API runs an event loop in this thread; Django's ORM is used beside it.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = os.getenv("STENCIL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "bench" / "screenshots"


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    context.set_default_timeout(15_000)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def screenshot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bench/screenshots when STENCIL_SCREENSHOTS=1 (refreshing the README's pictures),
    otherwise a temporary folder, so a test run leaves the tree clean."""
    path = SCREENSHOTS if os.getenv("STENCIL_SCREENSHOTS") == "1" else tmp_path_factory.mktemp("shots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def alice(django_user_model: Any) -> Any:
    from drafting.management.commands.load_demo import reviewers_group

    alice = django_user_model.objects.create_user(username="alice", password=PASSWORD)
    alice.groups.add(reviewers_group())  # a reviewer: she accepts the draft at the end
    return alice


@pytest.fixture
def referral(db: Any) -> None:
    from drafting import services
    from tests.drafting.helpers import REFERRAL_SOURCE

    services.template_version_create(
        slug="referral", title="Referral letter", kind="referral_letter", source=REFERRAL_SOURCE,
        description="A GP refers a patient to a specialist.",
    )  # fmt: skip


@pytest.fixture
def slow_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slow each denoising step a little so a person (and a screenshot) can watch it."""
    import time

    from gpu_worker import progress as jobs

    original = jobs.Progress.on_step

    def on_step(self: Any, info: Any) -> None:
        time.sleep(0.08)
        original(self, info)

    monkeypatch.setattr(jobs.Progress, "on_step", on_step)


@pytest.fixture
def dispatched(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Job ids the web process would send to the broker (none is sent in these tests)."""
    from drafting import services

    ids: list[str] = []
    monkeypatch.setattr(services, "job_dispatch", lambda *, job_id: ids.append(job_id))
    return ids


def _shared_connections() -> dict[str, Any]:
    """In-memory SQLite lives in one connection: share it, as Django's live server does."""
    from django.db import connections

    shared: dict[str, Any] = {}
    for conn in connections.all():
        if conn.vendor == "sqlite" and getattr(conn, "is_in_memory_db", lambda: False)():
            shared[conn.alias] = conn
    return shared


@pytest.fixture
def job_in_background() -> Iterator[Callable[[str], threading.Thread]]:
    """Start ``job_run(job_id)`` on a thread, the way a worker process would run it."""
    threads: list[threading.Thread] = []
    shared = _shared_connections()
    for conn in shared.values():
        conn.inc_thread_sharing()
    errors: list[BaseException] = []

    def start(job_id: str) -> threading.Thread:
        from django.db import connections

        from gpu_worker.pipeline import job_run

        def run() -> None:
            for alias, conn in shared.items():
                connections[alias] = conn
            try:
                job_run(job_id=job_id, worker="browser-test")
            except BaseException as exc:  # reported when the test ends
                errors.append(exc)
            finally:
                if not shared:
                    connections.close_all()

        thread = threading.Thread(target=run, name=f"job-{job_id[:8]}", daemon=True)
        thread.start()
        threads.append(thread)
        return thread

    yield start
    for thread in threads:
        thread.join(timeout=120)
    for conn in shared.values():
        conn.dec_thread_sharing()
    if errors:
        raise errors[0]
