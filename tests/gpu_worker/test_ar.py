"""The AR-FIM route: left-to-right infill with the KV cache, constraints, determinism."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from gpu_worker.engine.ar import fim_prompt, infill_request_ar
from gpu_worker.engine.backends import load_backend
from gpu_worker.engine.canvas import parse_canvas
from gpu_worker.engine.loaded import LoadedModel
from gpu_worker.engine.model import StencilTransformer, save_model
from gpu_worker.engine.outcome import Hooks
from gpu_worker.engine.tokenizer import StencilTokenizer
from tests.gpu_worker.conftest import make_model


def _ar_model(tokenizer: StencilTokenizer, seed: int = 0) -> StencilTransformer:
    """The conftest's tiny peaky random model, made causal (kind ar_fim)."""
    dense = make_model(tokenizer, seed=seed)
    model = StencilTransformer(replace(dense.config, kind="ar_fim"))
    model.load_state_dict(dense.state_dict())
    return model.eval()


@pytest.fixture(scope="module")
def ar_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer: StencilTokenizer) -> Path:
    directory = tmp_path_factory.mktemp("tiny-ar-fim")
    save_model(_ar_model(tokenizer), directory, dtype=torch.float32)
    tokenizer.save(directory / "tokenizer.json")
    return directory


@pytest.fixture(scope="module")
def ar(ar_dir: Path) -> LoadedModel:
    return load_backend(ar_dir)


def _request(**sampler: Any) -> dict[str, Any]:
    return {
        "segments": [
            {"text": "Dear "}, {"hole": "name", "max_tokens": 6},
            {"text": ", thank you for seeing me at "}, {"hole": "place", "max_tokens": 5},
            {"text": " about "}, {"hole": "thing", "max_tokens": 4, "constraint": {"choices": ["the report", "order 77", "a note"]}},
            {"text": ". Age: "}, {"hole": "age", "max_tokens": 4, "constraint": {"pattern": "[1-9][0-9]"}},
            {"text": "."},
        ],
        "seed": 3,
        "sampler": sampler,
    }  # fmt: skip


def test_locked_text_survives_and_every_hole_is_filled_within_its_budget(ar: LoadedModel) -> None:
    outcome = infill_request_ar(ar, _request())
    assert outcome.route == "ar" and not outcome.cancelled
    doc = outcome.document
    expected = ("Dear " + outcome.holes["name"] + ", thank you for seeing me at " + outcome.holes["place"]
                + " about " + outcome.holes["thing"] + ". Age: " + outcome.holes["age"] + ".")  # fmt: skip
    assert doc == expected
    assert not [v for v in outcome.violations if v["name"].startswith("locked")]
    for name, budget in (("name", 6), ("place", 5)):
        decoded = [e for e in outcome.trace if e["hole"] == name]
        assert 1 <= len(decoded) <= budget


def test_choice_hole_takes_one_whole_candidate(ar: LoadedModel) -> None:
    assert infill_request_ar(ar, _request()).holes["thing"] in {"the report", "order 77", "a note"}


def test_pattern_hole_matches_its_pattern(ar: LoadedModel) -> None:
    for temperature in (0.0, 1.5):
        outcome = infill_request_ar(ar, _request(temperature=temperature))
        assert re.fullmatch("[1-9][0-9]", outcome.holes["age"]), outcome.holes["age"]
        assert not outcome.violations


def test_greedy_decoding_ignores_the_seed(ar: LoadedModel) -> None:
    a = infill_request_ar(ar, {**_request(), "seed": 1})
    b = infill_request_ar(ar, {**_request(), "seed": 99})
    assert a.holes == b.holes and a.trace_sha256 == b.trace_sha256


def test_sampling_is_reproducible_from_the_seed_and_leaves_global_rng_alone(ar: LoadedModel) -> None:
    torch.manual_seed(0)
    before = torch.get_rng_state()
    a = infill_request_ar(ar, _request(temperature=2.0))
    assert torch.equal(torch.get_rng_state(), before)
    b = infill_request_ar(ar, _request(temperature=2.0))
    assert a.holes == b.holes and a.trace_sha256 == b.trace_sha256
    others = {tuple(infill_request_ar(ar, {**_request(temperature=2.0), "seed": s}).holes.values())
              for s in range(6)}  # fmt: skip
    assert len(others) > 1


@torch.no_grad()
def test_cached_decoding_equals_recomputing_the_whole_prefix(ar: LoadedModel) -> None:
    request = {"segments": [{"text": "Dear"}, {"hole": "x", "max_tokens": 8}, {"text": " thanks"}]}
    outcome = infill_request_ar(ar, request)
    network = ar.network
    assert isinstance(network, StencilTransformer)
    canvas = parse_canvas(request, ar.tokenizer, max_len=network.max_len)
    seq = fim_prompt(canvas, canvas.ids, 0, network)
    allowed = canvas.free_vocab.clone()
    allowed[list(canvas.terminators())] = True
    naive: list[int] = []
    for _ in range(8):  # greedy without a cache: a full forward per token
        logits = network(torch.tensor([seq + naive]))[0, -1]
        token = int(logits.masked_fill(~allowed, float("-inf")).argmax())
        if token in canvas.terminators():
            break
        naive.append(token)
    assert outcome.holes["x"] == ar.tokenizer.decode(naive)
    assert outcome.forward_passes == max(1, len(naive) + (len(naive) < 8))


def test_suffix_stops_at_the_next_hole(ar: LoadedModel) -> None:
    network = ar.network
    assert isinstance(network, StencilTransformer)
    canvas = parse_canvas(_request(), ar.tokenizer, max_len=network.max_len)
    prompt = fim_prompt(canvas, canvas.ids, 0, network)
    cfg = network.config
    suffix = prompt[prompt.index(cfg.fim_suffix_id) + 1 : prompt.index(cfg.fim_middle_id)]
    assert ar.tokenizer.decode(suffix) == ", thank you for seeing me at"


def test_with_hole_masks_the_prompt_shows_this_hole_and_the_later_ones_as_masks(ar: LoadedModel) -> None:
    network = StencilTransformer(replace(_ar_model(ar.tokenizer).config, fim_hole_masks=True))
    canvas = parse_canvas(_request(), ar.tokenizer, max_len=network.max_len)
    cfg = network.config
    budgets = [h.max_len for h in canvas.holes]
    for index in range(len(canvas.holes)):
        prompt = fim_prompt(canvas, canvas.ids, index, network)
        suffix = prompt[prompt.index(cfg.fim_suffix_id) + 1 : prompt.index(cfg.fim_middle_id)]
        assert suffix[: budgets[index]] == [cfg.mask_id] * budgets[index]  # this hole's size
        assert suffix.count(cfg.mask_id) == sum(budgets[index:])  # and every later hole's
        pieces: list[str] = []  # the locked text between the masks
        piece: list[int] = []
        for token in [*suffix, cfg.mask_id]:
            if token != cfg.mask_id:
                piece.append(token)
            elif piece:
                pieces.append(ar.tokenizer.decode(piece))
                piece = []
        assert pieces == [", thank you for seeing me at", " about", ". Age:", "."][index:]
    assert isinstance(ar.network, StencilTransformer)
    plain = fim_prompt(canvas, canvas.ids, 0, ar.network)  # without the flag: as before
    assert cfg.mask_id not in plain


def test_should_stop_cancels_before_the_next_hole(ar: LoadedModel) -> None:
    calls = iter([False, True, True, True, True, True, True, True, True])
    outcome = infill_request_ar(ar, _request(), hooks=Hooks(should_stop=lambda: next(calls, True)))
    assert outcome.cancelled


def test_a_denoiser_is_refused(model_dir: Path) -> None:
    with pytest.raises(ValueError, match="ar_fim"):
        infill_request_ar(load_backend(model_dir), _request())


def test_run_on_the_ar_route_is_this_route_and_a_batch_keeps_bad_requests_in_place(
    ar: LoadedModel,
) -> None:
    from gpu_worker.engine.run import route_for, run, run_batch

    assert route_for(ar) == "ar"
    alone = infill_request_ar(ar, _request())
    assert run("ar", ar, _request()).trace_sha256 == alone.trace_sha256
    bad = {"segments": [{"hole": "x"}]}
    first, second = run_batch("ar", ar, [_request(), bad])
    assert not isinstance(first, ValueError) and first.holes == alone.holes
    assert isinstance(second, ValueError) and "max_tokens" in str(second)
