"""A draft's canvas carries what an instruction model's preamble reads: the template's purpose
and each hole's hint; the API takes both and refuses them when they are not text."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from drafting import services
from drafting.models import Draft

pytestmark = pytest.mark.django_db

CANVAS = {"segments": [{"text": "Dear "}, {"hole": "name", "max_tokens": 4, "hint": "the patient"}],
          "purpose": "A thank-you letter."}  # fmt: skip


def _post(client: Client, body: Any) -> Any:
    return client.post("/api/v1/infill", json.dumps(body), content_type="application/json")


def test_a_drafts_canvas_names_the_templates_purpose_and_each_holes_hint(draft: Draft) -> None:
    request = services.draft_canvas_plan(draft=draft).request
    assert request["purpose"] == "A GP refers a patient to a specialist."
    hints = {s["hole"].rsplit("_", 1)[0]: s.get("hint") for s in request["segments"] if "hole" in s}
    assert hints["reason"] == "why the patient is referred"
    assert hints["summary"] == "history and findings"


def test_the_api_takes_a_purpose_and_hints(token_client: Client) -> None:
    response = _post(token_client, CANVAS)
    assert response.status_code == 202, response.content


@pytest.mark.parametrize("bad", [{"purpose": 7}, {"purpose": "x" * 2001},
                                 {"segments": [{"hole": "name", "max_tokens": 4, "hint": ["a"]}]}])  # fmt: skip
def test_a_purpose_or_hint_that_is_not_text_is_a_clear_400(token_client: Client, bad: dict[str, Any]) -> None:
    response = _post(token_client, {**CANVAS, **bad})
    assert response.status_code == 400
    assert "purpose" in response.content.decode() or "hint" in response.content.decode()
