"""/metrics answers the operator's scrapers only: allowed networks or the bearer token."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client


@pytest.mark.django_db
def test_metrics_answer_loopback_by_default() -> None:
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 200


@pytest.mark.django_db
def test_metrics_refuse_other_clients(settings: Any) -> None:
    answer = Client(REMOTE_ADDR="203.0.113.9").get("/metrics")
    assert answer.status_code == 403
    assert b"stencil_" not in answer.content


@pytest.mark.django_db
def test_metrics_answer_an_allowed_network_and_the_token(settings: Any) -> None:
    settings.STENCIL_METRICS_ALLOW = ["10.1.0.0/16"]
    settings.STENCIL_METRICS_TOKEN = "scrape-secret"
    assert Client(REMOTE_ADDR="10.1.2.3").get("/metrics").status_code == 200
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 403
    outside = Client(REMOTE_ADDR="203.0.113.9")
    assert outside.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-secret").status_code == 200
    assert outside.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
