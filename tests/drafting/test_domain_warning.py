"""Saving a template says, in plain words, when the model was not trained on documents like it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.test import Client

from drafting.auth import api_token_create
from drafting.authoring import UNFAMILIAR_WARNING
from drafting.management.commands.load_demo import template_authors_group
from tests.drafting.helpers import REFERRAL_SOURCE

DENOISER = Path(__file__).resolve().parents[2] / "models" / "stencil-denoiser"
FOREIGN_SOURCE = """Release notes for version 4.2

This release fixes the crash when exporting large spreadsheets to CSV on older browsers and
adds keyboard shortcuts for the chart editor. {% infill "highlights", max_tokens=24 %}the highlights{% endinfill %}

Upgrade by running the installer again; your settings are kept.
"""


def post(client: Client, url: str, body: Any) -> Any:
    return client.post(url, json.dumps(body), content_type="application/json")


def author_client(user: Any) -> Client:
    user.groups.add(template_authors_group())
    return Client(HTTP_AUTHORIZATION=f"Token {api_token_create(user=user, name='a')[1]}")


def test_a_foreign_template_is_saved_with_the_warning_and_its_score(
    user: Any, settings: Any, version: Any
) -> None:
    settings.STENCIL_MODEL_DIR = DENOISER
    client = author_client(user)
    saved = post(client, "/api/v1/templates/referral/versions", {"source": FOREIGN_SOURCE})
    assert saved.status_code == 201, saved.content
    domain = saved.json()["domain"]
    assert domain["unfamiliar"] is True and domain["warning"] == UNFAMILIAR_WARNING
    assert domain["score"] > domain["threshold"]
    checked = post(client, "/api/v1/templates/preview", {"source": FOREIGN_SOURCE}).json()
    assert checked["domain"]["warning"] == UNFAMILIAR_WARNING


def test_a_template_of_a_trained_kind_has_no_warning(user: Any, settings: Any) -> None:
    settings.STENCIL_MODEL_DIR = DENOISER
    checked = post(author_client(user), "/api/v1/templates/preview", {"source": REFERRAL_SOURCE})
    domain = checked.json()["domain"]
    assert domain["unfamiliar"] is False and domain["warning"] == "", domain


def test_a_model_without_a_profile_says_nothing(user: Any, settings: Any, tmp_path: Path) -> None:
    settings.STENCIL_MODEL_DIR = tmp_path
    checked = post(author_client(user), "/api/v1/templates/preview", {"source": FOREIGN_SOURCE})
    assert checked.status_code == 200 and checked.json()["domain"] is None
