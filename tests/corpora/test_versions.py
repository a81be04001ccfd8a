"""Model versions: promote for templates or as the default, roll back, and what a worker asks."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from corpora import selectors, services
from corpora.models import ModelVersion
from drafting import services as drafting_services
from drafting.models import DocumentTemplate
from drafting.services import UserError
from tests.drafting.helpers import REFERRAL_SOURCE

pytestmark = pytest.mark.django_db


@pytest.fixture
def shipped(settings: Any) -> ModelVersion:
    return services.model_version_for_directory(directory=Path(settings.STENCIL_MODEL_DIR))


@pytest.fixture
def tuned(tmp_path: Path, settings: Any, shipped: ModelVersion) -> ModelVersion:
    """A second version: a copy of the configured model's directory."""
    directory = tmp_path / "tuned"
    shutil.copytree(settings.STENCIL_MODEL_DIR, directory)
    version = services.model_version_for_directory(directory=directory, name="tuned",
                                                   state=ModelVersion.State.REGISTERED)  # fmt: skip
    ModelVersion.objects.filter(pk=version.pk).update(parent=shipped)
    return version


def _template(slug: str) -> DocumentTemplate:
    version = drafting_services.template_version_create(
        slug=slug, title=slug.title(), kind="referral_letter", source=REFERRAL_SOURCE)
    return version.template


def test_nothing_promoted_means_the_configured_model(db: Any) -> None:
    assert selectors.model_version_for_template(_template("referral")) is None
    assert selectors.model_version_for_template(None) is None


def test_a_default_promotion_serves_every_template(tuned: ModelVersion, staff: Any) -> None:
    referral = _template("referral")
    services.model_version_promote(version=tuned, user=staff)
    assert selectors.model_version_for_template(referral) == tuned
    assert selectors.model_version_for_template(None) == tuned


def test_a_template_promotion_wins_over_the_default(tuned: ModelVersion, shipped: ModelVersion,
                                                    staff: Any) -> None:  # fmt: skip
    referral, other = _template("referral"), _template("other")
    services.model_version_promote(version=shipped, user=staff)
    services.model_version_promote(version=tuned, user=staff, templates=[referral])
    assert selectors.model_version_for_template(referral) == tuned
    assert selectors.model_version_for_template(other) == shipped


def test_rollback_brings_back_the_version_before(tuned: ModelVersion, shipped: ModelVersion,
                                                 staff: Any) -> None:  # fmt: skip
    referral = _template("referral")
    services.model_version_promote(version=shipped, user=staff, templates=[referral])
    services.model_version_promote(version=tuned, user=staff, templates=[referral])
    ended = services.promotion_roll_back(user=staff, template=referral)
    assert ended.model_version == tuned and ended.rolled_back is not None
    assert selectors.model_version_for_template(referral) == shipped
    services.promotion_roll_back(user=staff, template=referral)
    assert selectors.model_version_for_template(referral) is None
    with pytest.raises(UserError, match="nothing to roll back"):
        services.promotion_roll_back(user=staff, template=referral)


def test_a_version_whose_weights_are_gone_is_not_promoted(tuned: ModelVersion, staff: Any) -> None:
    shutil.rmtree(tuned.directory)
    with pytest.raises(UserError, match="not on this machine"):
        services.model_version_promote(version=tuned, user=staff)
    assert selectors.model_version_for_template(None) is None


def test_staff_promote_and_roll_back_on_the_page(staff_client: Client, tuned: ModelVersion) -> None:
    referral = _template("referral")
    response = staff_client.post(f"/corpora/models/{tuned.id}/promote/",
                                 {"templates": ["referral"]}, follow=True)  # fmt: skip
    assert b"tuned now serves referral" in response.content
    assert selectors.model_version_for_template(referral) == tuned
    response = staff_client.post("/corpora/models/rollback/", {"template": "referral"}, follow=True)
    assert b"Rolled back tuned" in response.content
    assert selectors.model_version_for_template(referral) is None


def test_staff_promote_and_roll_back_through_the_api(staff_client: Client, tuned: ModelVersion) -> None:
    _template("referral")
    response = staff_client.post(f"/api/v1/model-versions/{tuned.id}/promote", "{}",
                                 content_type="application/json")  # fmt: skip
    assert response.status_code == 201
    listing = staff_client.get("/api/v1/model-versions").json()
    assert listing["in_force"] == [{"template": None, "model_version": tuned.id,
                                    "since": listing["in_force"][0]["since"]}]  # fmt: skip
    bad = staff_client.post(f"/api/v1/model-versions/{tuned.id}/promote",
                            '{"templates": ["nope"]}', content_type="application/json")  # fmt: skip
    assert bad.status_code == 400 and "No template nope" in bad.json()["error"]
    back = staff_client.post("/api/v1/model-versions/rollback", "{}", content_type="application/json")
    assert back.json() == {"rolled_back": tuned.id, "in_force": None}
