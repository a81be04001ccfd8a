"""Native LLaDA and Dream against their own public code: the fixtures in tests/fixtures/native
were built and run with LLaDA's and Dream's modeling code (see the README there); Stencil's
forward over the same safetensors must give the same logits, and its ``even`` rule at
temperature 0 the same commit order as LLaDA's generate.py and Dream's diffusion_generate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from gpu_worker.engine.backends import load_backend
from gpu_worker.engine.canvas import parse_canvas
from gpu_worker.engine.config import CommitRules, SamplerConfig
from gpu_worker.engine.loaded import LoadedModel
from gpu_worker.engine.native.transformer import NativeTransformer
from gpu_worker.engine.sampler import denoise

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "native"
FP32_TOLERANCE = 1e-4
BF16_TOLERANCE = 0.0625  # one bf16 step at the fixtures' largest logits (8..16)


def _load(family: str, dtype: str = "fp32") -> LoadedModel:
    return load_backend(FIXTURES / f"{family}-tiny", dtype=dtype)


def _reference(family: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    directory = FIXTURES / f"{family}-tiny"
    return load_file(directory / "reference.safetensors"), json.loads((directory / "reference.json").read_text())


def _network(loaded: LoadedModel) -> NativeTransformer:
    assert isinstance(loaded.network, NativeTransformer)
    return loaded.network


def _max_diff(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours.float() - theirs.float()).abs().max())


# -- logits -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("dtype", "tolerance", "key"), [("fp32", FP32_TOLERANCE, "logits"),
                                                         ("bf16", BF16_TOLERANCE, "logits_bf16")])  # fmt: skip
def test_llada_logits_equal_llada_code_at_every_position(dtype: str, tolerance: float, key: str) -> None:
    tensors, _ = _reference("llada")
    real = tensors["attention_mask"].bool()  # row 1 is right-padded
    with torch.no_grad():
        ours = _network(_load("llada", dtype))(tensors["ids"], attention_mask=real)
    assert ours.shape == tensors[key].shape
    assert _max_diff(ours[real], tensors[key][real]) <= tolerance


@pytest.mark.parametrize(("dtype", "tolerance", "key"), [("fp32", FP32_TOLERANCE, "read_logits"),
                                                         ("bf16", BF16_TOLERANCE, "read_logits_bf16")])  # fmt: skip
def test_dream_logits_equal_what_dream_generation_reads_at_every_position(
    dtype: str, tolerance: float, key: str
) -> None:
    """Dream's generation reads position i from the forward's logits at i - 1 (position 0
    from its own): the native network returns them already shifted."""
    tensors, _ = _reference("dream")
    with torch.no_grad():
        ours = _network(_load("dream", dtype))(tensors["read_ids"])
    assert ours.shape == tensors[key].shape
    assert _max_diff(ours, tensors[key]) <= tolerance


def test_dream_padded_batch_reads_the_forward_logits_shifted_by_one() -> None:
    tensors, _ = _reference("dream")
    real = tensors["attention_mask"].bool()
    theirs = tensors["logits"]  # the forward's own, unshifted
    with torch.no_grad():
        ours = _network(_load("dream"))(tensors["ids"], attention_mask=real)
    for row in range(ours.shape[0]):
        n = int(real[row].sum())
        assert _max_diff(ours[row, 0], theirs[row, 0]) <= FP32_TOLERANCE
        assert _max_diff(ours[row, 1:n], theirs[row, : n - 1]) <= FP32_TOLERANCE


def test_a_network_loaded_in_bf16_runs_in_bf16_and_says_so() -> None:
    loaded = _load("llada", "bf16")
    assert {p.dtype for p in loaded.network.parameters()} == {torch.bfloat16}
    assert loaded.identity()["precision"] == "bf16"
    assert _load("llada").identity()["precision"] == "fp32"


# -- commit order -----------------------------------------------------------------------------
def _even_order(loaded: LoadedModel, prompt: str, gen_length: int, steps: int, block_length: int,
                prompt_ids: list[int]) -> tuple[list[list[int]], list[int]]:  # fmt: skip
    """Per step, the positions Stencil's even rule commits at temperature 0 on the canvas
    prompt + one hole of gen_length (the rules the reference generators lack turned off)."""
    network = _network(loaded)
    canvas = parse_canvas(
        {"segments": [{"text": prompt}, {"hole": "answer", "max_tokens": gen_length}]},
        loaded.tokenizer, max_len=network.max_len, vocab_size=network.config.vocab_size,
    )  # fmt: skip
    assert canvas.ids[: len(prompt_ids)].tolist() == prompt_ids  # the same canvas as theirs
    config = SamplerConfig(
        commit_rule="even", block_length=block_length, steps_per_block=steps * block_length // gen_length,
        cache="none", temperature=0.0, stop_on_eos=False,
        rules=CommitRules(ban_adjacent_repeats=False, neighbour_threshold=0.0,
                          hold_shifted_repeats=False, pattern_runs=False),
    )  # fmt: skip
    order: list[list[int]] = []
    result = denoise(network, canvas, config, torch.Generator().manual_seed(0),
                     on_step=lambda info: order.append(info.committed))  # fmt: skip
    return order, result.ids.tolist()


def test_llada_even_rule_commits_in_generate_py_order() -> None:
    """LLaDA's generate.py (low_confidence remasking, two blocks of 4, 2 steps a block)."""
    _, ref = _reference("llada")
    order, final = _even_order(_load("llada"), ref["prompt_text"], ref["gen_length"], ref["steps"],
                               ref["block_length"], ref["prompt_ids"])  # fmt: skip
    assert order == ref["commit_order"]
    assert final == ref["final_ids"]


def test_dream_even_rule_commits_in_diffusion_generate_order() -> None:
    """Dream's diffusion_generate (maskgit_plus, eps=0: 8 tokens in 2 steps of 4)."""
    _, ref = _reference("dream")
    run = next(r for r in ref["generations"] if r["eps"] == 0.0)
    order, final = _even_order(_load("dream"), ref["prompt_text"], run["gen_length"], run["steps"],
                               run["gen_length"], ref["prompt_ids"])  # fmt: skip
    assert order == run["commit_order"]
    assert final == run["final_ids"]


def test_dream_one_token_a_step_commits_in_diffusion_generate_order() -> None:
    """With its default eps (1e-3) Dream's schedule, int(n * (1 - s/t)), commits nothing at
    its first step and two tokens at its last; Stencil's even rule commits one a step. The
    commits come in the same order, the last two from the same logits as a pair."""
    _, ref = _reference("dream")
    run = next(r for r in ref["generations"] if r["eps"] == 1e-3)
    order, final = _even_order(_load("dream"), ref["prompt_text"], run["gen_length"], run["steps"],
                               run["gen_length"], ref["prompt_ids"])  # fmt: skip
    theirs = [step for step in run["commit_order"] if step]
    assert [len(step) for step in theirs] == [1] * (len(theirs) - 1) + [2]
    assert order[: len(theirs) - 1] == theirs[:-1]
    assert sorted(p for step in order[len(theirs) - 1 :] for p in step) == theirs[-1]
    assert final == run["final_ids"]


# -- the window forward ------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_window_forward_on_an_unchanged_cache_equals_the_full_forward(family: str) -> None:
    """Per-row windows (one row's filled up with positions that keep the cache) read from a
    cache written by a full forward of the same ids give the full forward's logits; for Dream
    that includes a window's first position, read from its left neighbour outside it."""
    tensors, _ = _reference(family)
    network = _network(_load(family))
    ids = tensors["ids"][:1].repeat(2, 1)
    with torch.no_grad():
        full, cache = network.forward_window(ids, write_cache=True)
        assert cache is not None
        positions = torch.tensor([[10, 11, 12, 13], [20, 21, 3, 4]])
        from_cache = torch.tensor([[False] * 4, [False, False, True, True]])
        outputs = torch.tensor([[0, 1, 2, 3], [0, 1, 0, 1]])
        window, _ = network.forward_window(ids.gather(1, positions), cache=cache, positions=positions,
                                           from_cache=from_cache, outputs=outputs)  # fmt: skip
    expected = torch.stack([full[0, [10, 11, 12, 13]], full[1, [20, 21, 20, 21]]])
    assert _max_diff(window, expected) <= FP32_TOLERANCE


def test_dream_window_reads_a_neighbour_committed_after_the_cache_was_written() -> None:
    """The delayed cache writes a window's tokens back: a Dream window whose first position's
    neighbour changed since the full forward reads the neighbour's new token (kept in the
    cache with its keys and values)."""
    tensors, _ = _reference("dream")
    network = _network(_load("dream"))
    ids = tensors["ids"][:1].clone()
    changed = ids.clone()
    changed[0, 9] = (int(ids[0, 9]) + 1) % 256  # another byte token
    with torch.no_grad():
        _, cache = network.forward_window(ids, write_cache=True)
        assert cache is not None
        at_nine = torch.tensor([[9]])
        network.forward_window(changed[:, 9:10], cache=cache, positions=at_nine, write_cache=True)
        block = torch.tensor([[10, 11, 12]])
        stepped, _ = network.forward_window(changed.gather(1, block), cache=cache, positions=block)
        fresh, stale = network(changed), network(ids)
    assert cache.ids is not None
    assert int(cache.ids[0, 9]) == int(changed[0, 9])
    # The neighbour's own keys were rewritten by the step that wrote it; the rest are stale, so
    # the logits are close to a fresh forward's, not equal; reading position 9's old token
    # would give other logits altogether.
    assert _max_diff(stepped[0, 0], fresh[0, 10]) < _max_diff(stepped[0, 0], stale[0, 10])
