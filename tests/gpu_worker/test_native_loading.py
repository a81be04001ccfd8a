"""Loading real checkpoints: sharded weights and their identity, and a one-line error naming
the file and the fix for each way a model directory can be wrong."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from gpu_worker import infill as cli
from gpu_worker.engine.backends import load_backend, model_dtype
from gpu_worker.engine.checkpoint import CheckpointError
from gpu_worker.engine.external import RemoteCodeRefused
from gpu_worker.engine.native.weights import check_fits

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "native"
INDEX = "model.safetensors.index.json"


def _copy(family: str, tmp_path: Path, name: str | None = None) -> Path:
    target = tmp_path / (name or f"{family}-copy")
    shutil.copytree(FIXTURES / f"{family}-tiny", target)
    return target


def _edit_config(directory: Path, **changes: object) -> None:
    path = directory / "config.json"
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


def _shard(directory: Path, parts: int = 2, *, nudge: str | None = None) -> None:
    """Rewrite model.safetensors as ``parts`` shards and an index, as the Hub lays out a large
    checkpoint; ``nudge`` names a tensor to change slightly (another model, same layout)."""
    state = load_file(directory / "model.safetensors")
    if nudge is not None:
        state[nudge] = state[nudge] + 1.0
    names = sorted(state)
    weight_map = {}
    for part in range(parts):
        shard = f"model-{part + 1:05d}-of-{parts:05d}.safetensors"
        chunk = {k: state[k] for k in names[part::parts]}
        save_file(chunk, str(directory / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(chunk, shard))
    total = sum(t.numel() * t.element_size() for t in state.values())
    (directory / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (directory / "model.safetensors").unlink()


# -- sharded checkpoints and identity ----------------------------------------------------------
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_sharded_checkpoint_gives_the_single_files_logits(family: str, tmp_path: Path) -> None:
    directory = _copy(family, tmp_path)
    _shard(directory, parts=3)
    ids = load_file(FIXTURES / f"{family}-tiny" / "reference.safetensors")["ids"][:1]
    with torch.no_grad():
        sharded = load_backend(directory).network(ids)
        single = load_backend(FIXTURES / f"{family}-tiny").network(ids)
    assert torch.equal(sharded, single)


def test_two_sharded_models_with_the_same_index_have_different_weights_hashes(tmp_path: Path) -> None:
    first, second = _copy("llada", tmp_path, "first"), _copy("llada", tmp_path, "second")
    _shard(first)
    _shard(second, nudge="model.transformer.ln_f.weight")
    assert (first / INDEX).read_bytes() == (second / INDEX).read_bytes()
    assert load_backend(first).weights_sha256 != load_backend(second).weights_sha256


def test_a_sharded_models_hash_covers_every_shard(tmp_path: Path) -> None:
    directory = _copy("dream", tmp_path)
    _shard(directory)
    before = load_backend(directory).weights_sha256
    shard = directory / "model-00002-of-00002.safetensors"
    state = load_file(shard)
    name = sorted(state)[0]
    state[name] = state[name] * 2
    save_file(state, str(shard), metadata={"format": "pt"})
    assert load_backend(directory).weights_sha256 != before


def test_the_weights_dtype_follows_the_operator_setting() -> None:
    assert model_dtype(torch.device("cpu"), "auto") == torch.float32
    assert model_dtype(torch.device("cuda"), "auto") == torch.bfloat16
    assert model_dtype(torch.device("cpu"), "bf16") == torch.bfloat16
    with pytest.raises(ValueError, match="STENCIL_MODEL_DTYPE='fp8'"):
        model_dtype(torch.device("cpu"), "fp8")


def test_a_model_that_does_not_fit_the_device_is_refused_before_loading() -> None:
    with pytest.raises(CheckpointError, match=r"needs about 16\.0 GiB .* 10\.0 of 80\.0 GiB are free"):
        check_fits(16 << 30, 10 << 30, 80 << 30, where="cuda:0")
    check_fits(16 << 30, 20 << 30, 80 << 30, where="cuda:0")


# -- one-line errors ----------------------------------------------------------------------------
def _refused(directory: Path) -> str:
    with pytest.raises(CheckpointError) as caught:
        load_backend(directory)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_missing_shard_names_the_index_the_shard_and_the_fix(tmp_path: Path) -> None:
    directory = _copy("llada", tmp_path)
    _shard(directory)
    (directory / "model-00002-of-00002.safetensors").unlink()
    message = _refused(directory)
    assert INDEX in message
    assert "model-00002-of-00002.safetensors" in message
    assert "download every shard" in message


def test_a_mask_id_on_an_ordinary_token_is_refused_with_the_mask_tokens_id(tmp_path: Path) -> None:
    directory = _copy("llada", tmp_path)
    mask = json.loads((directory / "config.json").read_text())["mask_token_id"]
    _edit_config(directory, mask_token_id=65)  # a byte token
    message = _refused(directory)
    assert "config.json: mask_token_id 65 is the ordinary token" in message
    assert f"<|mdm_mask|> is {mask}" in message


def test_a_mask_id_outside_the_tokenizer_is_refused(tmp_path: Path) -> None:
    directory = _copy("dream", tmp_path)
    _edit_config(directory, mask_token_id=440)  # an embedding row past the tokenizer
    assert "mask_token_id 440 is not one of the tokenizer's 404 ids" in _refused(directory)


def test_a_missing_mask_id_names_config_json_and_the_tokenizers_mask_token(tmp_path: Path) -> None:
    directory = _copy("llada", tmp_path)
    mask = json.loads((directory / "config.json").read_text())["mask_token_id"]
    _edit_config(directory, mask_token_id=None)
    message = _refused(directory)
    assert "config.json: no mask token id" in message
    assert f"set mask_token_id to the id of the tokenizer's mask token (<|mdm_mask|> is {mask})" in message


def test_a_tokenizer_larger_than_the_embedding_is_refused(tmp_path: Path) -> None:
    directory = _copy("dream", tmp_path)
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.add_tokens([f"extra{i}" for i in range(60)])  # 464 tokens for 448 rows
    tokenizer.save(str(directory / "tokenizer.json"))
    message = _refused(directory)
    assert "tokenizer.json has 464 tokens but the network's embedding has 448 rows" in message
    assert "the checkpoint's own tokenizer.json" in message


def test_an_unknown_architecture_is_refused_naming_what_runs(tmp_path: Path) -> None:
    directory = _copy("llada", tmp_path)
    _edit_config(directory, model_type="mamba_diffusion", architectures=["MambaDiffusion"], auto_map=None)
    message = _refused(directory)
    assert "model_type 'mamba_diffusion'" in message
    assert "LLaDA, Dream" in message


def test_an_unknown_architecture_with_code_needs_the_operators_permission(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STENCIL_TRUST_REMOTE_CODE", raising=False)
    directory = _copy("llada", tmp_path)
    _edit_config(directory, model_type="mdlm", architectures=["MDLM"],
                 auto_map={"AutoModelForMaskedLM": "modeling_mdlm.MDLM"})  # fmt: skip
    with pytest.raises(RemoteCodeRefused, match="STENCIL_TRUST_REMOTE_CODE=1"):
        load_backend(directory)


@pytest.mark.parametrize(("model_type", "name"), [("sdar_moe", "SDAR-MoE"), ("llada2_moe", "LLaDA2"),
                                                  ("Fast_dLLM_Qwen", "Fast-dLLM v2")])  # fmt: skip
def test_a_block_diffusion_checkpoint_is_refused_with_the_reason(
    tmp_path: Path, model_type: str, name: str
) -> None:
    directory = _copy("dream", tmp_path)
    _edit_config(directory, model_type=model_type, architectures=None)
    message = _refused(directory)
    assert f"{name} is a block-diffusion model" in message
    assert "causal across blocks" in message
    assert "the block-diffusion family it runs is SDAR" in message


def test_an_unknown_causal_lm_with_a_mask_token_and_a_block_size_is_refused_as_block_diffusion(
    tmp_path: Path,
) -> None:
    directory = _copy("dream", tmp_path)
    _edit_config(directory, model_type="blockdlm", architectures=["BlockDLMForCausalLM"], bd_size=32)
    message = _refused(directory)
    assert "blockdlm (bd_size=32) is a block-diffusion model" in message
    assert "SDAR" in message


def test_a_llada_variant_the_network_does_not_run_is_named(tmp_path: Path) -> None:
    directory = _copy("llada", tmp_path)
    _edit_config(directory, block_type="sequential")
    assert "block_type='sequential' is a LLaDA variant Stencil does not run" in _refused(directory)


def test_weights_that_do_not_fit_the_config_are_refused(tmp_path: Path) -> None:
    directory = _copy("dream", tmp_path)
    _edit_config(directory, intermediate_size=96)
    message = _refused(directory)
    assert "model.safetensors:" in message
    assert "use the checkpoint's own config.json" in message


def test_a_config_with_fewer_layers_than_the_weights_is_refused(tmp_path: Path) -> None:
    directory = _copy("llada", tmp_path)
    _edit_config(directory, n_layers=1)
    assert "which this config.json's network does not have" in _refused(directory)


def test_pickled_weights_are_refused_for_safetensors(tmp_path: Path) -> None:
    directory = _copy("llada", tmp_path)
    torch.save(load_file(directory / "model.safetensors"), directory / "pytorch_model.bin")
    (directory / "model.safetensors").unlink()
    assert "safetensors only" in _refused(directory)


def test_the_cli_prints_one_line_for_a_bad_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = _copy("llada", tmp_path)
    _shard(directory)
    (directory / "model-00001-of-00002.safetensors").unlink()
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"segments": [{"text": "Dear "}, {"hole": "name", "max_tokens": 4}]}))
    code = cli.main(["--model", str(directory), str(request)])
    err = capsys.readouterr().err
    assert code != 0
    assert err.count("\n") == 1
    assert "model-00001-of-00002.safetensors" in err
    assert "Traceback" not in err
