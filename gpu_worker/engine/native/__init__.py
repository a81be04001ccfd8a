"""Native backends: public diffusion LMs run by Stencil's own forward, no checkpoint code.

A Hugging Face model directory whose config.json names a family here (``model_type`` /
``architectures``) is loaded into :class:`~gpu_worker.engine.native.transformer.NativeTransformer`
from its safetensors, weight names mapped from the checkpoint's (see :mod:`.llada`,
:mod:`.dream`, :mod:`.sdar`); its own ``modeling_*.py`` is never imported. SDAR is a
block-diffusion family, run with its block-causal attention and block cache; every other
block-diffusion checkpoint (LLaDA2, SDAR's MoE, Fast-dLLM v2, or any causal LM with a mask
token and a block size) is refused with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpu_worker.engine.checkpoint import (
    CheckpointError,
    CheckpointTokenizer,
    check_tokenizer,
    precision_name,
    special_ids,
    weight_files,
    weights_sha256,
)
from gpu_worker.engine.loaded import LoadedModel, file_sha256
from gpu_worker.engine.native import dream, llada, sdar
from gpu_worker.engine.native.transformer import NativeConfig, NativeTransformer
from gpu_worker.engine.native.weights import Target, load_into, materialise

NATIVE_KIND = "external"  # a checkpoint from outside Stencil (the kind the routes know)


@dataclass(frozen=True)
class Family:
    """How one family's config.json and weight names read."""

    name: str
    matches: Callable[[dict[str, Any]], bool]
    read_config: Callable[[dict[str, Any], Path], NativeConfig]
    weight_map: Callable[[NativeConfig], dict[str, Target]]
    ignored: Callable[[str, NativeConfig], bool]


FAMILIES = (
    Family("llada", llada.is_llada, llada.read_config, llada.weight_map, llada.ignored),
    Family("dream", dream.is_dream, dream.read_config, dream.weight_map, dream.ignored),
    Family("sdar", sdar.is_sdar, sdar.read_config, sdar.weight_map, sdar.ignored),
)

# Block-diffusion families Stencil does not run: bidirectional inside a block, causal across
# blocks, with networks of their own (mixture-of-experts layers, or Fast-dLLM v2's own block
# layout). Run with full bidirectional attention they would see text they were never trained to
# see; with their own code's 2D-mask path, left context only. Refused, naming what runs.
BLOCK_DIFFUSION = {
    "llada2_moe": "LLaDA2", "LLaDA2MoeModelLM": "LLaDA2",
    "sdar_moe": "SDAR-MoE", "SDARMoeForCausalLM": "SDAR-MoE",
    "Fast_dLLM_Qwen": "Fast-dLLM v2", "Fast_dLLM_QwenForCausalLM": "Fast-dLLM v2",
}  # fmt: skip
BLOCK_KEYS = ("block_size", "bd_size", "block_length")  # how their config.json names the block


def family_of(config: dict[str, Any]) -> Family | None:
    """The native family a config.json names, if any."""
    return next((family for family in FAMILIES if family.matches(config)), None)


def refuse_block_diffusion(config: dict[str, Any], path: Path) -> None:
    """CheckpointError for a block-diffusion checkpoint Stencil does not run: a family of
    ``BLOCK_DIFFUSION``, or a causal LM with a mask token and a block size that is no native
    family (a masked LM's ``block_size``, BigBird's sparse attention, is not one)."""
    names = [config.get("model_type"), *(config.get("architectures") or [])]
    family = next((BLOCK_DIFFUSION[n] for n in names if isinstance(n, str) and n in BLOCK_DIFFUSION), None)
    if family is None and family_of(config) is None:
        causal = any(str(a).endswith(("ForCausalLM", "LMHeadModel")) for a in config.get("architectures") or [])
        block_key = next((k for k in BLOCK_KEYS if k in config), None)
        if causal and block_key is not None and any(k in config for k in ("mask_token_id", "mask_id")):
            family = f"{config.get('model_type') or 'this model'} ({block_key}={config[block_key]!r})"
    if family is not None:
        raise CheckpointError(
            f"{path}: {family} is a block-diffusion model (bidirectional inside a block, causal "
            "across blocks) whose network Stencil does not run; the block-diffusion family it "
            "runs is SDAR (model_type sdar: SDAR-1.7B/4B/8B-Chat), and LLaDA and Dream"
        )


def load_native(
    directory: Path,
    config: dict[str, Any],
    family: Family,
    *,
    device: torch.device,
    dtype: torch.dtype,
) -> LoadedModel:
    """Load a native family's checkpoint (see the module docstring)."""
    cfg = family.read_config(config, directory / "config.json")
    files = weight_files(directory)
    tokenizer_path = directory / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise CheckpointError(f"{directory} lacks tokenizer.json: copy the checkpoint's own tokenizer.json there")
    special = special_ids(directory, config)
    tokenizer = CheckpointTokenizer(tokenizer_path, special)
    check_tokenizer(directory, tokenizer, cfg.vocab_size)
    network = materialise(
        lambda: NativeTransformer(cfg, mask_id=special.mask, pad_id=special.pad, eos_id=special.eos),
        device=device, dtype=dtype, n_params=cfg.num_parameters(),
    )  # fmt: skip
    load_into(network, files, family.weight_map(cfg), ignore=lambda name: family.ignored(name, cfg))
    return LoadedModel(
        name=directory.name,
        directory=directory,
        network=network.eval(),
        tokenizer=tokenizer,
        weights_sha256=weights_sha256(files),
        tokenizer_sha256=file_sha256(tokenizer_path),
        kind=NATIVE_KIND,
        placeholder=False,
        precision=precision_name(dtype),
        family=family.name,
    )


__all__ = [
    "BLOCK_DIFFUSION",
    "FAMILIES",
    "CheckpointError",
    "Family",
    "family_of",
    "load_native",
    "refuse_block_diffusion",
]
