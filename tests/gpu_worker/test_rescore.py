"""Re-reading finished spans (gpu_worker.engine.rescore): the filled sequence keeps every
written token and no pad, the denoiser's ELBO and the AR-FIM re-read are replayable
log-probabilities that read a sentence as likelier than its words shuffled, and a calibration
whose signal reads them makes the route compute them."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_worker.engine.backends import load_backend
from gpu_worker.engine.canvas import parse_canvas
from gpu_worker.engine.confidence import (
    ANY_CLASS,
    CALIBRATION_FILE,
    Calibration,
    Isotonic,
    RouteCalibration,
    span_signal,
)
from gpu_worker.engine.outcome import AR, DIFFUSION
from gpu_worker.engine.rescore import filled_sequence, span_elbo, span_reread
from gpu_worker.engine.run import run
from tests.gpu_worker.test_confidence import AR_MODEL, MODELS, PLACEHOLDER, REQUEST

DENOISER = MODELS / "stencil-denoiser"
SENTENCE = "The patient reports chest pain on exertion for the past three weeks."
LETTER = {"segments": [{"text": "Dear Dr. Shah,\n\nRE: Ana Ruiz\n\n"},
                       {"hole": "history", "max_tokens": 24},
                       {"text": " I would be grateful for your opinion.\n\nYours sincerely,\nDr. Lee\n"}],
          "seed": 1}  # fmt: skip


def _canvas(loaded, request):
    return parse_canvas(request, loaded.tokenizer, max_len=loaded.network.config.max_len,
                        vocab_size=loaded.network.config.vocab_size)  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 7), min_size=2, max_size=2), st.integers(0, 2**16))
def test_the_filled_sequence_keeps_each_written_token_and_drops_the_pad_tails(
    lengths: list[int], seed: int
) -> None:
    loaded = load_backend(PLACEHOLDER)
    canvas = _canvas(loaded, REQUEST)
    ids = canvas.ids.clone()
    rng = random.Random(seed)
    for hole, n in zip(canvas.holes, lengths, strict=True):
        n = min(n, hole.max_len)
        ids[hole.start : hole.end] = canvas.pad_id
        ids[hole.start : hole.start + n] = torch.tensor([rng.randrange(10, 200) for _ in range(n)])
    seq, ranges = filled_sequence(canvas, ids)
    written = sum(len(canvas.kept_tokens(ids, h)) for h in canvas.holes)
    locked = int(canvas.protect.sum())
    assert len(seq) == locked + written and canvas.pad_id not in seq
    for hole, (a, b) in zip(canvas.holes, ranges, strict=True):
        assert seq[a:b] == canvas.kept_tokens(ids, hole)
    outside = [t for i, t in enumerate(seq) if not any(a <= i < b for a, b in ranges)]
    assert outside == canvas.ids[canvas.protect].tolist()


def test_the_span_elbo_is_a_log_probability_and_replays_alike() -> None:
    loaded = load_backend(PLACEHOLDER)
    outcome = run(DIFFUSION, loaded, REQUEST)
    canvas = _canvas(loaded, REQUEST)
    ids = _final_ids(canvas, loaded, outcome.holes)
    first = span_elbo(loaded.network, canvas, ids, passes=4)
    assert first == span_elbo(loaded.network, canvas, ids, passes=4)
    assert set(first) == {name for name, text in outcome.holes.items() if text}
    for got in first.values():
        assert got["elbo_min"] <= got["elbo"] <= 0.0
    with pytest.raises(ValueError, match="at least 1"):
        span_elbo(loaded.network, canvas, ids, passes=0)


def _final_ids(canvas, loaded, texts):
    """The canvas with each hole holding ``texts``' tokens, pad after them."""
    ids = canvas.ids.clone()
    for hole in canvas.holes:
        tokens = loaded.tokenizer.encode(hole.prefix + texts[hole.group])[: hole.max_len]
        ids[hole.start : hole.end] = canvas.pad_id
        ids[hole.start : hole.start + len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    return ids


@pytest.mark.parametrize("model", [DENOISER, AR_MODEL], ids=["elbo", "reread"])
def test_a_sentence_reads_likelier_than_its_words_shuffled(model: Path) -> None:
    loaded = load_backend(model)
    canvas = _canvas(loaded, LETTER)
    words = SENTENCE.split(" ")
    shuffled = " ".join(random.Random(0).sample(words, len(words)))
    scores = {}
    for name, text in (("original", SENTENCE), ("shuffled", shuffled)):
        ids = _final_ids(canvas, loaded, {"history": text})
        if model == DENOISER:
            scores[name] = span_elbo(loaded.network, canvas, ids, passes=8)["history"]["elbo"]
        else:
            scores[name] = span_reread(loaded.network, canvas, ids)["history"]["reread"]
            assert scores[name] == span_reread(loaded.network, canvas, ids)["history"]["reread"]
    assert scores["shuffled"] + 0.5 < scores["original"] <= 0.0, scores


def test_a_calibration_reading_the_elbo_makes_the_diffusion_route_compute_it(tmp_path: Path) -> None:
    copy = tmp_path / "model"
    shutil.copytree(PLACEHOLDER, copy)
    curve = Isotonic((-12.0, 0.0), (0.1, 0.9))
    route = RouteCalibration("logp_elbo", {ANY_CLASS: curve}, {ANY_CLASS: 0.5}, 0.3, elbo_passes=4)
    (copy / CALIBRATION_FILE).write_text(json.dumps(Calibration({DIFFUSION: route}).to_json()))
    outcome = run(DIFFUSION, load_backend(copy), REQUEST)
    assert "rescore" in outcome.timings
    for name, c in outcome.confidence.items():
        if outcome.holes[name]:
            assert c["signal"] == "logp_elbo" and c["calibrated"] and 0.1 <= c["p"] <= 0.9
    data = route.to_json()
    data["elbo_passes"] = 0
    with pytest.raises(ValueError, match="elbo_passes"):
        RouteCalibration.from_json(data)
    with pytest.raises(ValueError, match="needs the span's re-read 'elbo'"):
        span_signal("logp_elbo", [0.5])
    with pytest.raises(ValueError, match="needs the span's re-read 'reread'"):
        span_signal("logp_reread", [0.5], {"elbo": -1.0, "elbo_min": -2.0})


def test_a_calibration_reading_the_reread_makes_the_ar_route_compute_it(tmp_path: Path) -> None:
    copy = tmp_path / "model"
    shutil.copytree(AR_MODEL, copy)
    curve = Isotonic((-12.0, 0.0), (0.1, 0.9))
    route = RouteCalibration("logp_reread", {ANY_CLASS: curve}, {ANY_CLASS: 0.5}, 0.3)
    (copy / CALIBRATION_FILE).write_text(json.dumps(Calibration({AR: route}).to_json()))
    assert RouteCalibration.from_json(route.to_json()) == route  # no ELBO passes needed
    outcome = run(AR, load_backend(copy), LETTER)
    assert "rescore" in outcome.timings
    c = outcome.confidence["history"]
    assert c["signal"] == "logp_reread" and c["calibrated"] and 0.1 <= c["p"] <= 0.9
