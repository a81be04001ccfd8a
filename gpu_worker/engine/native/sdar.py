"""The SDAR family (JetLM SDAR-1.7B / 4B / 8B-Chat, any block size): config.json and weight
names.

SDAR is a block-diffusion model adapted from Qwen3: the sequence is cut into blocks of
``block_size`` positions from position 0; a position attends bidirectionally inside its
block and causally to every earlier block, never to a later one. Its checkpoints are
Qwen3-style: ``model.embed_tokens``, each ``model.layers.<i>`` an RMSNorm / grouped-query
attention whose queries and keys are RMS-normed per head (``q_norm``, ``k_norm``) before
the rotary embedding / RMSNorm / SwiGLU block, ``model.norm`` and the head ``lm_head``; the
head width ``head_dim`` is its own key (not ``hidden_size / num_attention_heads``). Position
i's logits predict position i: no shift. The MoE variant (``sdar_moe``) is not this network.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_worker.engine.native.qwen_names import ignored, weight_map
from gpu_worker.engine.native.transformer import NativeConfig
from gpu_worker.engine.native.weights import CheckpointError

MODEL_TYPES = ("sdar",)
ARCHITECTURES = ("SDARForCausalLM",)
DEFAULT_ROPE_THETA = 10000.0  # SDARConfig's default
DEFAULT_MAX_LEN = 32768


def is_sdar(config: dict[str, Any]) -> bool:
    return config.get("model_type") in MODEL_TYPES or any(
        a in ARCHITECTURES for a in config.get("architectures") or []
    )


def read_config(config: dict[str, Any], path: Path) -> NativeConfig:
    """The network an SDAR config.json describes; CheckpointError for a variant it is not."""
    for key in ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
                "vocab_size", "block_size"):  # fmt: skip
        value = config.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise CheckpointError(f"{path}: an SDAR config.json needs a positive integer {key!r}")
    scaling = config.get("rope_scaling") or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type != "default":
        raise CheckpointError(
            f"{path}: rope type {rope_type!r} is an SDAR variant Stencil does not run (it runs "
            "the default rotary embedding, as SDAR-1.7B/4B/8B do)"
        )
    for key in ("use_sliding_window", "attention_bias"):
        if config.get(key):
            raise CheckpointError(f"{path}: {key} is an SDAR variant Stencil does not run")
    if config.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{path}: hidden_act={config['hidden_act']!r}: Stencil runs SDAR with silu")
    heads = int(config["num_attention_heads"])
    head_dim = config.get("head_dim") or int(config["hidden_size"]) // heads
    return NativeConfig(
        family="sdar",
        vocab_size=int(config["vocab_size"]),
        d_model=int(config["hidden_size"]),
        n_layers=int(config["num_hidden_layers"]),
        n_heads=heads,
        n_kv_heads=int(config.get("num_key_value_heads") or heads),
        ffn_hidden=int(config["intermediate_size"]),
        max_len=int(config.get("max_position_embeddings", DEFAULT_MAX_LEN)),
        rope_theta=float(config.get("rope_theta", DEFAULT_ROPE_THETA)),
        norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        qkv_bias=False,
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        shift_logits=False,
        rope_fp32=False,  # SDAR casts its rotary tables to the activations' dtype
        head_size=int(head_dim),
        qk_norm=True,
        block_size=int(config["block_size"]),
    )


__all__ = ["ignored", "is_sdar", "read_config", "weight_map"]
