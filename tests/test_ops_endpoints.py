"""Operations endpoints: /metrics for the operator's scrapers only; JSON 404s under /api/."""

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


@pytest.mark.django_db
def test_an_unknown_api_path_answers_a_json_404(settings: Any) -> None:
    settings.DEBUG = False
    answer = Client().get("/api/v1/no-such-thing")
    assert answer.status_code == 404
    assert answer["Content-Type"].startswith("application/json")
    assert "no API endpoint" in answer.json()["error"]
    assert Client().get("/no-such-page/").status_code == 404
