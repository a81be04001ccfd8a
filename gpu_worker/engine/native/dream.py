"""The Dream family (Dream-v0-Base-7B / -Instruct-7B, Dream-Coder, DiffuCoder): config.json
and weight names.

Dream checkpoints are Qwen2-style: ``model.embed_tokens``, each ``model.layers.<i>`` an RMSNorm
/ grouped-query attention with biases on q, k and v / RMSNorm / SwiGLU block, ``model.norm``
and the output head ``lm_head``. Attention is bidirectional. Dream is adapted from an
autoregressive model: its logits at position i predict token i+1, and its own generation
shifts them right by one before reading them, so the network does (``shift_logits``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_worker.engine.native.qwen_names import ignored, weight_map
from gpu_worker.engine.native.transformer import NativeConfig
from gpu_worker.engine.native.weights import CheckpointError

MODEL_TYPES = ("Dream", "dream")
ARCHITECTURES = ("DreamModel",)
DEFAULT_ROPE_THETA = 10000.0  # DreamConfig's default
DEFAULT_MAX_LEN = 32768


def is_dream(config: dict[str, Any]) -> bool:
    return config.get("model_type") in MODEL_TYPES or any(
        a in ARCHITECTURES for a in config.get("architectures") or []
    )


def read_config(config: dict[str, Any], path: Path) -> NativeConfig:
    """The network a Dream config.json describes; CheckpointError for a variant it is not."""
    for key in ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size"):
        if not isinstance(config.get(key), int):
            raise CheckpointError(f"{path}: a Dream config.json needs an integer {key!r}")
    rope = config.get("rope_parameters") or {}  # the transformers 5 spelling
    scaling = config.get("rope_scaling") or {}
    rope_type = scaling.get("rope_type", scaling.get("type")) or rope.get("rope_type", "default")
    if rope_type != "default":
        raise CheckpointError(
            f"{path}: rope type {rope_type!r} is a Dream variant Stencil does not run (it runs "
            "the default rotary embedding, as Dream-v0 does)"
        )
    if config.get("use_sliding_window"):
        raise CheckpointError(f"{path}: use_sliding_window is a Dream variant Stencil does not run")
    if config.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{path}: hidden_act={config['hidden_act']!r}: Stencil runs Dream with silu")
    heads = int(config["num_attention_heads"])
    theta = config.get("rope_theta", rope.get("rope_theta", DEFAULT_ROPE_THETA))
    return NativeConfig(
        family="dream",
        vocab_size=int(config["vocab_size"]),
        d_model=int(config["hidden_size"]),
        n_layers=int(config["num_hidden_layers"]),
        n_heads=heads,
        n_kv_heads=int(config.get("num_key_value_heads") or heads),
        ffn_hidden=int(config["intermediate_size"]),
        max_len=int(config.get("max_position_embeddings", DEFAULT_MAX_LEN)),
        rope_theta=float(theta),
        norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        qkv_bias=True,
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        shift_logits=True,
        rope_fp32=False,
    )


__all__ = ["ignored", "is_dream", "read_config", "weight_map"]
