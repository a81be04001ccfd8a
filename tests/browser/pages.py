"""What the browser tests do as a person would: log in, wait for a job, find a span's card."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

JOB_URL = re.compile(r".*/jobs/([0-9a-f-]{36})/$")
FINAL = "succeeded, failed, cancelled"
PASSWORD = "pw-alice-123"


def log_in(page: Any, base: str) -> None:
    page.goto(f"{base}/accounts/login/")
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base}/")


def job_id_of(page: Any) -> str:
    page.wait_for_url(JOB_URL)
    match = JOB_URL.match(page.url)
    assert match is not None
    return match.group(1)


def watch_job(page: Any, job_id: str, start: Callable[[str], threading.Thread],
              screenshot: Path | None = None) -> str:  # fmt: skip
    """Run the job the page is showing and wait until the page reports its final state."""
    thread = start(job_id)
    if screenshot is not None:
        page.wait_for_function(  # a step under way, or already over
            "document.getElementById('step').textContent.includes('at most') || "
            f"'{FINAL}'.includes(document.getElementById('progress').dataset.state)",
            timeout=120_000,
        )
        page.screenshot(path=str(screenshot), full_page=True)
    page.wait_for_function(
        f"'{FINAL}'.includes(document.getElementById('progress').dataset.state)", timeout=120_000
    )
    thread.join(timeout=120)
    return str(page.locator("#progress").get_attribute("data-state"))


def span_card(page: Any, label: str) -> Any:
    return page.locator("li.span-card").filter(has=page.get_by_role("heading", name=label))


def click_and_settle(page: Any, control: Any) -> None:
    """Click a control whose form updates the page in place, and wait for the new regions."""
    page.evaluate("""() => { window.stencilSwaps = 0;
        document.addEventListener('stencil:regions', () => { window.stencilSwaps += 1; },
                                  {once: true}); }""")
    control.click()
    page.wait_for_function("window.stencilSwaps > 0")


def accept_span(page: Any, card: Any) -> None:
    """Accept one provisional span as a person would: its Accept button, or, for a span the
    model flagged as a guess, the deliberate "Accept anyway…" and its confirmation."""
    plain = card.get_by_role("button", name=re.compile(r"^Accept (?!anyway)"))
    if plain.count():
        click_and_settle(page, plain.first)
        return
    card.locator("summary", has_text="Accept anyway").click()
    click_and_settle(page, card.get_by_role("button", name=re.compile(r"^Yes, accept anyway")))
