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

from gpu_worker.engine.native.transformer import NativeConfig
from gpu_worker.engine.native.weights import CheckpointError, Target

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


def weight_map(cfg: NativeConfig) -> dict[str, Target]:
    """Checkpoint tensor name -> where it goes in :class:`NativeTransformer`."""
    hd = cfg.head_dim
    q, kv, f = cfg.n_heads * hd, cfg.n_kv_heads * hd, cfg.ffn_hidden
    names = {"model.embed_tokens.weight": Target("embed.weight"), "model.norm.weight": Target("norm.weight")}
    if not cfg.tie_embeddings:
        names["lm_head.weight"] = Target("head.weight")
    for i in range(cfg.n_layers):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        parts = {"q_proj": slice(0, q), "k_proj": slice(q, q + kv), "v_proj": slice(q + kv, q + 2 * kv)}
        for name, rows in parts.items():
            names[f"{theirs}self_attn.{name}.weight"] = Target(f"{ours}attn.qkv.weight", rows)
            names[f"{theirs}self_attn.{name}.bias"] = Target(f"{ours}attn.qkv.bias", rows)
        names.update({
            f"{theirs}self_attn.o_proj.weight": Target(f"{ours}attn.out.weight"),
            f"{theirs}input_layernorm.weight": Target(f"{ours}attn_norm.weight"),
            f"{theirs}post_attention_layernorm.weight": Target(f"{ours}ffn_norm.weight"),
            f"{theirs}mlp.gate_proj.weight": Target(f"{ours}ffn.gate_up.weight", slice(0, f)),
            f"{theirs}mlp.up_proj.weight": Target(f"{ours}ffn.gate_up.weight", slice(f, 2 * f)),
            f"{theirs}mlp.down_proj.weight": Target(f"{ours}ffn.down.weight"),
        })  # fmt: skip
    return names


def ignored(name: str, cfg: NativeConfig) -> bool:
    """Checkpoint tensors with no place that may stay behind: saved rotary tables, and a tied
    checkpoint's saved head."""
    return name.endswith("rotary_emb.inv_freq") or (cfg.tie_embeddings and name == "lm_head.weight")


__all__ = ["ignored", "is_dream", "read_config", "weight_map"]
