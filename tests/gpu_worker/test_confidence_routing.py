"""The router acts on confidence: a calibrated low diffusion span escalates to the AR route,
and a job whose every route is low ends as needing a person; the metrics count the spans."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from prometheus_client import REGISTRY

from drafting.models import InfillJob
from gpu_worker.engine.confidence import (
    ANY_CLASS,
    CALIBRATION_FILE,
    Calibration,
    Isotonic,
    RouteCalibration,
)
from gpu_worker.engine.config import config_from_overrides
from gpu_worker.pipeline import job_run

pytestmark = [pytest.mark.django_db(transaction=True)]

MODELS = Path(__file__).resolve().parents[2] / "models"
REQUEST = {"segments": [{"text": "Dear "}, {"hole": "name", "max_tokens": 6},
                        {"text": ",\nThank you for your letter."}]}  # fmt: skip


def calibrated_copy(source: Path, target: Path, route: str, p: float) -> Path:
    """``source`` copied with a calibration that gives every span of ``route`` probability p."""
    shutil.copytree(source, target)
    flat = Isotonic((-100.0, 100.0), (p, p))
    calibration = Calibration({route: RouteCalibration("mean_logp", {ANY_CLASS: flat},
                                                       {ANY_CLASS: 0.5}, 0.5)})  # fmt: skip
    (target / CALIBRATION_FILE).write_text(json.dumps(calibration.to_json()))
    return target


def run_job(owner: Any, targets: list[dict[str, Any]] | None = None,
            ) -> tuple[InfillJob, dict[str, Any]]:  # fmt: skip
    config = config_from_overrides("fast", {})
    job = InfillJob.objects.create(
        owner=owner, request={**REQUEST, "seed": 5}, config=config.to_dict(),
        config_sha256=config.sha256, seed=5, preset="fast", dispatched=timezone.now(),
        target_fragments=targets or [],
    )  # fmt: skip
    job_run(job_id=str(job.pk), worker="w-confidence")
    job.refresh_from_db()
    assert job.result is not None, (job.state, job.reasons)
    return job, job.result


def spans(route: str, low: bool = False) -> float:
    name = "stencil_spans_low_confidence_total" if low else "stencil_spans_total"
    return REGISTRY.get_sample_value(name, {"route": route}) or 0.0


def test_a_low_diffusion_span_escalates_to_ar_and_every_route_low_needs_a_person(
    user: Any, worker_settings: Any, tmp_path: Path
) -> None:
    worker_settings.STENCIL_MODEL_DIR = calibrated_copy(
        MODELS / "stencil-placeholder", tmp_path / "d", "diffusion", 0.1
    )
    worker_settings.STENCIL_AR_MODEL_DIR = calibrated_copy(
        MODELS / "stencil-ar-fim", tmp_path / "a", "ar", 0.1
    )
    before = (spans("diffusion"), spans("diffusion", low=True), spans("ar", low=True))
    job, result = run_job(user)
    assert job.state == InfillJob.State.SUCCEEDED, job.reasons
    assert [a["route"] for a in job.attempts] == ["diffusion", "ar"]  # no diffusion retry first
    assert result["needs_person"] is True
    assert result["confidence"]["name"]["low"] is True
    assert spans("diffusion") == before[0] + 1 and spans("diffusion", low=True) == before[1] + 1
    assert spans("ar", low=True) == before[2] + 1


def test_a_confident_ar_result_after_escalation_is_kept_and_needs_no_person(
    user: Any, worker_settings: Any, tmp_path: Path
) -> None:
    worker_settings.STENCIL_MODEL_DIR = calibrated_copy(
        MODELS / "stencil-placeholder", tmp_path / "d", "diffusion", 0.1
    )
    worker_settings.STENCIL_AR_MODEL_DIR = calibrated_copy(
        MODELS / "stencil-ar-fim", tmp_path / "a", "ar", 0.9
    )
    job, result = run_job(user)
    assert job.state == InfillJob.State.SUCCEEDED, job.reasons
    assert result["route"] == "ar" and result["needs_person"] is False
    assert result["confidence"]["name"] == {
        **result["confidence"]["name"],
        "p": 0.9,
        "low": False,
    }


def test_a_confident_diffusion_result_does_not_escalate(
    user: Any, worker_settings: Any, tmp_path: Path
) -> None:
    worker_settings.STENCIL_MODEL_DIR = calibrated_copy(
        MODELS / "stencil-placeholder", tmp_path / "d", "diffusion", 0.9
    )
    job, result = run_job(user)
    assert [a["route"] for a in job.attempts] == ["diffusion"]
    assert result["route"] == "diffusion" and result["needs_person"] is False


def test_a_low_regenerate_is_not_escalated_the_person_asked_for_another_text(
    user: Any, worker_settings: Any, tmp_path: Path
) -> None:
    """The AR model's text for the same context is near-deterministic: escalating a regenerate
    would hand back the text it replaces. The diffusion variation stays, flagged low."""
    worker_settings.STENCIL_MODEL_DIR = calibrated_copy(
        MODELS / "stencil-placeholder", tmp_path / "d", "diffusion", 0.1
    )
    worker_settings.STENCIL_AR_MODEL_DIR = calibrated_copy(
        MODELS / "stencil-ar-fim", tmp_path / "a", "ar", 0.1
    )
    job, result = run_job(user, targets=[{"hole": "name", "previous": "Sam", "previous_run": "r0"}])
    assert job.state == InfillJob.State.SUCCEEDED, job.reasons
    assert [a["route"] for a in job.attempts] == ["diffusion"]
    assert result["route"] == "diffusion" and result["confidence"]["name"]["low"] is True
