"""Span confidence: the calibration curve is monotone, scores stay in [0, 1], marks stay in
their span, a model directory's calibration is read, and the CLI answer carries it all."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_worker.engine.backends import load_backend
from gpu_worker.engine.confidence import (
    ANY_CLASS,
    CALIBRATION_FILE,
    UNFAMILIAR,
    Calibration,
    Isotonic,
    RouteCalibration,
    SpanTokens,
    hole_confidence,
    load_calibration,
    token_marks,
)
from gpu_worker.engine.outcome import AR, DIFFUSION
from gpu_worker.engine.run import run
from gpu_worker.infill import main

MODELS = Path(__file__).resolve().parents[2] / "models"
PLACEHOLDER = MODELS / "stencil-placeholder"
AR_MODEL = MODELS / "stencil-ar-fim"
REQUEST = {
    "segments": [
        {"text": "Dear Dr. Patel,\n\nRE: Maria Lopez\n\nI am referring "},
        {"hole": "patient", "max_tokens": 6},
        {"text": " for an opinion. "},
        {"hole": "history", "max_tokens": 20},
        {"text": "\n\nKind regards,\nDr. Ann Hughes\n"},
    ],
    "seed": 3,
}
scores = st.floats(min_value=-20, max_value=0, allow_nan=False)
probabilities = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(scores, st.booleans()), min_size=1, max_size=60),
    st.lists(scores, min_size=2, max_size=20),
)
def test_calibration_is_monotone_in_the_signal(
    data: list[tuple[float, bool]], probes: list[float]
) -> None:
    curve = Isotonic.fit([s for s, _ in data], [y for _, y in data])
    mapped = [curve(x) for x in sorted(probes)]
    assert all(b >= a for a, b in zip(mapped, mapped[1:], strict=False))
    assert all(0.0 <= p <= 1.0 for p in mapped)


@settings(max_examples=200, deadline=None)
@given(st.lists(probabilities, min_size=0, max_size=40), st.booleans())
def test_confidence_lies_in_zero_one_and_marks_inside_the_span(
    probs: list[float], calibrated: bool
) -> None:
    offsets = [(3 * i, 3 * i + 3) for i in range(len(probs))]
    route = RouteCalibration("mean_logp", {ANY_CLASS: Isotonic((-5.0, -0.1), (0.1, 0.9))},
                             {ANY_CLASS: 0.5}, mark_below=0.6) if calibrated else None  # fmt: skip
    c = hole_confidence(SpanTokens(probs, offsets, "free"), route)
    assert 0.0 <= c["p"] <= 1.0 and c["calibrated"] is calibrated
    assert c["low"] == (c["p"] < 0.5) or calibrated  # uncalibrated: low under 0.5
    for start, end in c["marks"]:
        assert 0 <= start < end <= 3 * len(probs)


def test_the_least_sure_tokens_are_marked_and_sure_ones_never() -> None:
    tokens = SpanTokens(
        [0.99, 0.2, 0.95, 0.1, 0.97], [(0, 4), (4, 9), (9, 12), (12, 18), (18, 20)], "free"
    )
    assert token_marks(tokens, 0.5) == [[4, 9], [12, 18]]
    assert token_marks(tokens, 0.05) == []


def test_a_route_marks_positions_inside_each_hole_text_and_scores_every_hole() -> None:
    for loaded, route in ((load_backend(PLACEHOLDER), DIFFUSION), (load_backend(AR_MODEL), AR)):
        outcome = run(route, loaded, REQUEST)
        assert set(outcome.confidence) == {"patient", "history"}
        for name, c in outcome.confidence.items():
            assert 0.0 <= c["p"] <= 1.0 and isinstance(c["low"], bool)
            for start, end in c["marks"]:
                assert 0 <= start < end <= len(outcome.holes[name]), (name, c, outcome.holes[name])


def test_a_model_without_a_calibration_gives_uncalibrated_scores_and_one_with_it_calibrated(
    tmp_path: Path,
) -> None:
    copy = tmp_path / "model"
    shutil.copytree(PLACEHOLDER, copy)
    loaded = load_backend(copy)
    bare = run(DIFFUSION, loaded, REQUEST)
    assert {c["calibrated"] for c in bare.confidence.values()} == {False}
    never_right = Isotonic((-10.0, 0.0), (0.01, 0.02))  # whatever the signal: almost never right
    calibration = Calibration({DIFFUSION: RouteCalibration("min_logp", {ANY_CLASS: never_right},
                                                           {ANY_CLASS: 0.5}, 0.3)})  # fmt: skip
    (copy / CALIBRATION_FILE).write_text(json.dumps(calibration.to_json()))
    assert load_calibration(copy) == calibration
    scored = run(DIFFUSION, loaded, REQUEST)
    assert all(c["calibrated"] and c["low"] and c["signal"] == "min_logp" and c["p"] <= 0.02
               for c in scored.confidence.values())  # fmt: skip


def test_a_calibration_file_with_a_falling_curve_is_refused() -> None:
    with pytest.raises(ValueError, match="must not decrease"):
        Isotonic((0.0, 1.0), (0.8, 0.2))


def test_the_shipped_models_are_calibrated_for_their_route() -> None:
    for directory, route in ((MODELS / "stencil-denoiser", DIFFUSION), (AR_MODEL, AR)):
        calibration = load_calibration(directory)
        assert calibration is not None and route in calibration.routes
        curve = calibration.routes[route].curve("free")
        assert all(0.0 <= y <= 1.0 for y in curve.y) and not math.isnan(curve(-1.0))


def test_the_cli_answer_carries_confidence_and_domain(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "canvas.json"
    path.write_text(json.dumps(REQUEST))
    assert main([str(path), "--model", str(AR_MODEL)]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert set(answer["confidence"]) == set(answer["holes"])
    for c in answer["confidence"].values():
        assert set(c) == {"p", "low", "marks", "signal", "calibrated"} and c["calibrated"] is True
    assert set(answer["domain"]) == {"score", "unfamiliar", "threshold"}


@settings(max_examples=100, deadline=None)
@given(st.lists(probabilities, min_size=1, max_size=20), st.floats(0.0, 1.0))
def test_a_canvas_unlike_the_corpus_uses_the_unfamiliar_curve(
    probs: list[float], domain: float
) -> None:
    """Over the domain bar a span takes the unfamiliar curve (fitted on text unlike the
    corpus), whatever its token probabilities; under it, its class's; the file keeps both."""
    sure = Isotonic((-5.0, -0.01), (0.2, 0.99))
    route = RouteCalibration("mean_logp", {ANY_CLASS: sure, UNFAMILIAR: Isotonic((-5.0, 0.0), (0.01, 0.04))},
                             {ANY_CLASS: 0.1, UNFAMILIAR: 0.5}, mark_below=0.5,
                             signals={UNFAMILIAR: "min_logp"}, unfamiliar_above=0.6)  # fmt: skip
    again = RouteCalibration.from_json(json.loads(json.dumps(route.to_json())))
    offsets = [(i, i + 1) for i in range(len(probs))]
    for r in (route, again):
        c = hole_confidence(SpanTokens(probs, offsets, "free"), r, domain_score=domain)
        if domain > 0.6:
            assert c["p"] <= 0.04 and c["low"] and c["signal"] == "min_logp"
        else:
            assert c["p"] >= 0.2 and c["signal"] == "mean_logp"
    legacy = {k: v for k, v in route.to_json().items() if k not in ("signals", "unfamiliar_above")}
    old = RouteCalibration.from_json(legacy)  # a file written before the unfamiliar curve
    assert old.hole_key("free", 1.0) == "free"
