"""Native SDAR (block diffusion) against its own public code: tests/fixtures/native/sdar-tiny was
built and run with SDAR's modeling_sdar.py and generate.py (see the README there). Stencil's
forward must give the same logits under the block mask (bidirectional inside a block, causal
across blocks), its sampler must fill the blocks left to right in the order SDAR's
block_diffusion_generate commits, and its block KV cache must change nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from gpu_worker.engine.backends import load_backend
from gpu_worker.engine.canvas import Canvas, parse_canvas
from gpu_worker.engine.checkpoint import CheckpointError
from gpu_worker.engine.config import PRESETS, CommitRules, SamplerConfig, config_from_overrides
from gpu_worker.engine.infill import infill_request
from gpu_worker.engine.loaded import LoadedModel
from gpu_worker.engine.model_cache import ExactForward
from gpu_worker.engine.native import refuse_block_diffusion
from gpu_worker.engine.native.block_cache import BlockCache
from gpu_worker.engine.native.transformer import NativeTransformer
from gpu_worker.engine.sampler import StepInfo, denoise, denoise_batch, plan_blocks
from gpu_worker.engine.sampler.cache import forward_cache_for

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "native" / "sdar-tiny"
FP32_TOLERANCE = 1e-4
BF16_TOLERANCE = 0.125  # one bf16 step at the fixture's largest logits (16..32)
BLOCK = 4
NO_RULES = CommitRules(ban_adjacent_repeats=False, neighbour_threshold=0.0,
                       hold_shifted_repeats=False, pattern_runs=False)  # fmt: skip
LETTER = {
    "segments": [{"text": "Dear "}, {"hole": "name", "max_tokens": 5},
                 {"text": ",\nThank you for seeing "}, {"hole": "who", "max_tokens": 6},
                 {"text": " at the clinic.\nKind regards,\n"}, {"hole": "signature", "max_tokens": 4}],
    "seed": 3,
}  # fmt: skip


@pytest.fixture(scope="module")
def sdar() -> LoadedModel:
    return load_backend(FIXTURE)


def _network(loaded: LoadedModel) -> NativeTransformer:
    assert isinstance(loaded.network, NativeTransformer)
    return loaded.network


def _reference() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    return load_file(FIXTURE / "reference.safetensors"), json.loads((FIXTURE / "reference.json").read_text())


def _max_diff(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours.float() - theirs.float()).abs().max())


def _canvas(loaded: LoadedModel, request: dict[str, Any]) -> Canvas:
    network = _network(loaded)
    return parse_canvas(request, loaded.tokenizer, max_len=network.max_len,
                        vocab_size=network.config.vocab_size)  # fmt: skip


# -- logits -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("dtype", "tolerance", "key"), [("fp32", FP32_TOLERANCE, "logits"),
                                                         ("bf16", BF16_TOLERANCE, "logits_bf16")])  # fmt: skip
def test_sdar_logits_equal_sdar_code_under_the_block_mask_at_every_position(
    dtype: str, tolerance: float, key: str
) -> None:
    tensors, _ = _reference()
    real = tensors["attention_mask"].bool()  # row 1 is right-padded
    with torch.no_grad():
        ours = _network(load_backend(FIXTURE, dtype=dtype))(tensors["ids"], attention_mask=real)
    assert ours.shape == tensors[key].shape
    assert _max_diff(ours[real], tensors[key][real]) <= tolerance


def test_a_block_sees_its_own_block_and_earlier_ones_never_a_later_one(sdar: LoadedModel) -> None:
    tensors, _ = _reference()
    ids = tensors["ids"][:1]
    later, same = ids.clone(), ids.clone()
    later[0, 12] = (int(ids[0, 12]) + 1) % 256  # a token of block 3
    same[0, 9] = (int(ids[0, 9]) + 1) % 256  # a token of block 2
    with torch.no_grad():
        base, moved_later, moved_same = (_network(sdar)(x) for x in (ids, later, same))
    assert _max_diff(base[0, :12], moved_later[0, :12]) == 0.0  # blocks 0-2 cannot see block 3
    assert _max_diff(base[0, 8:9], moved_same[0, 8:9]) > 1e-3  # inside a block: bidirectional
    assert _max_diff(base[0, :8], moved_same[0, :8]) == 0.0


def test_a_cached_block_equals_sdar_codes_cached_forward(sdar: LoadedModel) -> None:
    """SDAR's generate stores blocks 0-3 in its KV cache and runs block 4 against it."""
    tensors, ref = _reference()
    start, stop = ref["cached_block"]
    ids = tensors["ids"][:1]
    network = _network(sdar)
    with torch.no_grad():
        _, cache = network.forward_window(ids[:, :stop], write_cache=True)
        assert cache is not None
        positions = torch.arange(start, stop)[None]
        ours, _ = network.forward_window(ids[:, start:stop], cache=cache, positions=positions)
    assert _max_diff(ours[0], tensors["cached_block_logits"][0]) <= FP32_TOLERANCE


# -- the sampler --------------------------------------------------------------------------------
def _even(loaded: LoadedModel, cache: str, steps: int) -> SamplerConfig:
    config = SamplerConfig(commit_rule="even", steps_per_block=steps, temperature=0.0,
                           stop_on_eos=False, rules=NO_RULES).replace(cache=cache)  # fmt: skip
    return loaded.fit_config(config)


@pytest.mark.parametrize("cache", ["none", "dual", "delayed", "block"])
def test_even_rule_commits_in_block_diffusion_generate_order(sdar: LoadedModel, cache: str) -> None:
    """SDAR's block_diffusion_generate (low_confidence_static, block 4, 4 steps a block, argmax)
    on the prompt and whole blocks of masks: the same positions in the same steps, cached or
    not."""
    _, ref = _reference()
    canvas = _canvas(sdar, {"segments": [{"text": ref["prompt_text"]},
                                         {"hole": "answer", "max_tokens": ref["gen_length"]}]})  # fmt: skip
    assert canvas.ids[: len(ref["prompt_ids"])].tolist() == ref["prompt_ids"]
    order: list[list[int]] = []
    result = denoise(_network(sdar), canvas, _even(sdar, cache, ref["denoising_steps"]),
                     torch.Generator().manual_seed(0), on_step=lambda info: order.append(info.committed))  # fmt: skip
    assert order == ref["commit_order"]
    assert result.ids.tolist() == ref["final_ids"]


def test_fit_config_makes_the_samplers_blocks_the_models_attention_blocks(sdar: LoadedModel) -> None:
    config = sdar.fit_config(PRESETS["balanced"])
    assert (config.block_scope, config.block_length, config.cache) == ("attention", BLOCK, "block")
    canvas = _canvas(sdar, LETTER)
    for block in plan_blocks(canvas, config):
        assert len({int(p) // BLOCK for p in block}) == 1
    assert sorted(int(p) for b in plan_blocks(canvas, config) for p in b) == [
        p for hole in canvas.holes for p in range(hole.start, hole.end)
    ]


def test_the_sampler_refuses_blocks_that_are_not_the_models(sdar: LoadedModel) -> None:
    canvas = _canvas(sdar, LETTER)
    with pytest.raises(ValueError, match="block_scope='attention', block_length=4"):
        denoise(_network(sdar), canvas, PRESETS["balanced"], torch.Generator().manual_seed(0))


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_blocks_fill_left_to_right_every_earlier_block_finished(sdar: LoadedModel, preset: str) -> None:
    canvas = _canvas(sdar, LETTER)
    config = sdar.fit_config(config_from_overrides(preset))
    mask = canvas.mask_id
    seen: list[StepInfo] = []
    denoise(_network(sdar), canvas, config, torch.Generator().manual_seed(1), on_step=seen.append)
    blocks = [int(p) // BLOCK for info in seen if not info.flush for p in info.committed]
    assert blocks == sorted(blocks) and blocks
    for info in seen:
        if info.committed and not info.flush:
            first = min(info.committed) // BLOCK
            assert not bool((info.ids[: first * BLOCK] == mask).any())


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_cached_and_uncached_runs_agree(sdar: LoadedModel, preset: str) -> None:
    """Two canvases of different lengths in one batch: the block cache (any cached mode) gives
    the ids and per-step commits of exact decoding."""
    short = {"segments": [{"text": "Dear "}, {"hole": "name", "max_tokens": 7}, {"text": ", thanks."}]}
    canvases = [_canvas(sdar, LETTER), _canvas(sdar, short)]
    exact = sdar.fit_config(config_from_overrides(preset)).replace(cache="none")
    runs = {}
    for cache in ("none", "dual", "delayed", "block"):
        traces: list[list[list[int]]] = [[], []]

        def record(row: int, info: StepInfo, traces: list[list[list[int]]] = traces) -> None:
            traces[row].append(info.committed)

        results = denoise_batch(
            _network(sdar), canvases, exact.replace(cache=cache),
            [torch.Generator().manual_seed(5), torch.Generator().manual_seed(6)], on_step=record,
        )  # fmt: skip
        runs[cache] = ([r.ids.tolist() for r in results], traces)
    assert runs["dual"] == runs["none"]
    assert runs["delayed"] == runs["none"]
    assert runs["block"] == runs["none"]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_frozen_config_names_the_cache_that_runs(sdar: LoadedModel, preset: str) -> None:
    """A cached preset runs the block KV cache on a block-diffusion model, and its frozen config
    (the outcome's, which the run record stores) says "block", never "dual" or "delayed"."""
    asked = config_from_overrides(preset)
    fitted = sdar.fit_config(asked)
    assert fitted.cache == ("none" if asked.cache == "none" else "block")
    assert sdar.fit_config(fitted) == fitted  # resolving twice changes nothing
    assert type(forward_cache_for(_network(sdar), fitted.cache)) is (
        BlockCache if fitted.cache == "block" else ExactForward)  # fmt: skip
    outcome = infill_request(sdar, LETTER, config=fitted)
    assert outcome.config["cache"] == fitted.cache
    assert outcome.config_sha256 == fitted.sha256
    assert SamplerConfig.from_json(outcome.config) == fitted


def test_the_block_cache_is_refused_by_a_model_without_attention_blocks() -> None:
    """Asked of a model without attention blocks, cache="block" resolves to the exact forward
    (both exact); such a network asked for it directly says why it cannot run it."""
    from tests.workers import PLACEHOLDER_MODEL

    asked = PRESETS["balanced"].replace(cache="block")
    for directory in (PLACEHOLDER_MODEL, FIXTURE.parent / "llada-tiny"):
        loaded = load_backend(directory)
        assert loaded.fit_config(asked) == asked.replace(cache="none")
        assert loaded.fit_config(PRESETS["balanced"]).cache == "dual"
    assert isinstance(loaded.network, NativeTransformer)
    with pytest.raises(ValueError, match="cache='block' needs a block-diffusion model"):
        loaded.network.forward_cache("block")


def test_a_cached_step_computes_only_the_finished_and_active_blocks(sdar: LoadedModel) -> None:
    """The block cache's windows: from the first block not yet cached final to the end of the
    active block, never a later block."""
    network = _network(sdar)
    cache = network.forward_cache("dual")
    assert isinstance(cache, BlockCache)
    ids = _canvas(sdar, LETTER).ids[None]
    attention = torch.ones_like(ids, dtype=torch.bool)
    with torch.inference_mode():
        cache.full(ids, attention, [0], reads=[torch.tensor([9, 10])], room=None)
        assert cache.final == [2]
        windows = cache._windows(ids, [0], [torch.tensor([13])], [torch.tensor([13])])
    assert windows[0].tolist() == list(range(8, 16))
    assert cache.final == [3]


def test_every_preset_keeps_the_locked_text_on_sdar(sdar: LoadedModel) -> None:
    for preset in sorted(PRESETS):
        outcome = infill_request(sdar, LETTER, config=sdar.fit_config(config_from_overrides(preset)))
        holes = outcome.holes
        assert outcome.document == (f"Dear {holes['name']},\nThank you for seeing {holes['who']} at "
                                    f"the clinic.\nKind regards,\n{holes['signature']}")  # fmt: skip
        assert outcome.config["block_scope"] == "attention"
        assert outcome.model["family"] == "sdar"


# -- refusals -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("changes", "named"), [
    ({"attention_bias": True}, "attention_bias is an SDAR variant"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope type 'yarn' is an SDAR variant"),
    ({"block_size": None}, "needs a positive integer 'block_size'"),
])  # fmt: skip
def test_an_sdar_variant_the_network_does_not_run_is_named(
    tmp_path: Path, changes: dict[str, Any], named: str
) -> None:
    import shutil

    directory = tmp_path / "sdar"
    shutil.copytree(FIXTURE, directory)
    data = json.loads((directory / "config.json").read_text())
    data.update(changes)
    (directory / "config.json").write_text(json.dumps({k: v for k, v in data.items() if v is not None}))
    with pytest.raises(CheckpointError) as caught:
        load_backend(directory)
    assert named in str(caught.value) and "\n" not in str(caught.value)


def test_a_masked_lms_block_size_is_not_block_diffusion() -> None:
    """BigBird's block_size is sparse attention in a masked LM: not refused here."""
    refuse_block_diffusion({"model_type": "big_bird", "architectures": ["BigBirdForMaskedLM"],
                            "block_size": 64, "mask_token_id": 67}, Path("config.json"))  # fmt: skip
