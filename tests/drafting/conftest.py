"""Drafting fixtures: a referral-letter template, drafts of it, logged-in clients, a token."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from drafting import services
from drafting.auth import api_token_create
from drafting.models import Draft, TemplateVersion
from tests.drafting.helpers import REFERRAL_SOURCE, VALUES


@pytest.fixture(autouse=True)
def _no_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs are rows here; nothing is sent to a broker (no worker runs in these tests)."""
    monkeypatch.setattr(services, "job_dispatch", lambda *, job_id: None)


@pytest.fixture
def version(db: Any) -> TemplateVersion:
    return services.template_version_create(
        slug="referral", title="Referral letter", kind="referral_letter", source=REFERRAL_SOURCE,
        description="A GP refers a patient to a specialist.",
    )  # fmt: skip


@pytest.fixture
def draft(user: Any, version: TemplateVersion) -> Draft:
    return services.draft_create(owner=user, version=version, values=dict(VALUES))


@pytest.fixture
def other_draft(other_user: Any, version: TemplateVersion) -> Draft:
    return services.draft_create(owner=other_user, version=version, values=dict(VALUES))


@pytest.fixture
def client_in(client: Client, user: Any) -> Client:
    client.force_login(user)
    return client


@pytest.fixture
def token(user: Any) -> str:
    return api_token_create(user=user, name="script")[1]


@pytest.fixture
def token_client(token: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Token {token}")
