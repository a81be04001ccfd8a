"""The LLaDA family (LLaDA-8B-Base / -Instruct, LLaDA-1.5): config.json and weight names.

LLaDA checkpoints are OLMo-style: ``model.transformer.wte`` embeds, each of
``model.transformer.blocks.<i>`` is a LLaMA block (``block_type: "llama"``: RMSNorm, q/k/v
projections, rotary embeddings, SwiGLU feed-forward ``ff_out(act(ff_proj(x)) * up_proj(x))``),
``ln_f`` norms and ``ff_out`` is the output head (unless ``weight_tying``). Attention is
bidirectional and position i's logits predict position i: no shift. A key config.json leaves
out takes LLaDA's own default (its ``ModelConfig``); a variant this network does not run (ALiBi,
the sequential block, LayerNorm, q/k norms, ...) is refused by name.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from gpu_worker.engine.native.transformer import NativeConfig
from gpu_worker.engine.native.weights import CheckpointError, Target

MODEL_TYPES = ("llada",)
ARCHITECTURES = ("LLaDAModelLM",)
PREFIX = "model.transformer."

# LLaDA's ModelConfig defaults for the keys read here (a config.json may leave them out).
DEFAULTS: dict[str, Any] = {
    "n_kv_heads": None, "multi_query_attention": None, "mlp_ratio": 4, "mlp_hidden_size": None,
    "activation_type": "swiglu", "block_type": "sequential", "block_group_size": 1,
    "alibi": False, "rope": False, "rope_full_precision": True, "rope_theta": 10000.0,
    "attention_layer_norm": False, "input_emb_norm": False, "layer_norm_type": "default",
    "layer_norm_with_affine": True, "rms_norm_eps": 1e-5, "max_sequence_length": 1024,
    "include_qkv_bias": False, "include_bias": False, "bias_for_layer_norm": None,
    "scale_logits": False, "embedding_size": 50304, "weight_tying": True,
}  # fmt: skip
# What this network runs: key -> the value it needs (a LLaDA-8B config.json has every one).
SUPPORTED: dict[str, Any] = {
    "block_type": "llama", "activation_type": "silu", "rope": True, "alibi": False,
    "layer_norm_type": "rms", "layer_norm_with_affine": True, "attention_layer_norm": False,
    "include_bias": False, "block_group_size": 1,
}  # fmt: skip


def is_llada(config: dict[str, Any]) -> bool:
    return config.get("model_type") in MODEL_TYPES or any(
        a in ARCHITECTURES for a in config.get("architectures") or []
    )


def read_config(config: dict[str, Any], path: Path) -> NativeConfig:
    """The network a LLaDA config.json describes; CheckpointError for a variant it is not."""

    def get(key: str) -> Any:
        return config.get(key, DEFAULTS.get(key))

    for key in ("d_model", "n_heads", "n_layers", "vocab_size"):
        if not isinstance(config.get(key), int):
            raise CheckpointError(f"{path}: a LLaDA config.json needs an integer {key!r}")
    for key, wanted in SUPPORTED.items():
        if get(key) != wanted:
            raise CheckpointError(
                f"{path}: {key}={get(key)!r} is a LLaDA variant Stencil does not run (it runs "
                f"{key}={wanted!r}, as LLaDA-8B and LLaDA-1.5 are)"
            )
    if get("bias_for_layer_norm"):
        raise CheckpointError(f"{path}: bias_for_layer_norm is a LLaDA variant Stencil does not run")
    d_model = int(config["d_model"])
    n_heads = int(config["n_heads"])
    n_kv = get("n_kv_heads")
    if n_kv is None:
        n_kv = 1 if get("multi_query_attention") else n_heads
    hidden = get("mlp_hidden_size")
    rows = get("embedding_size") or config["vocab_size"]
    return NativeConfig(
        family="llada",
        vocab_size=int(rows),
        d_model=d_model,
        n_layers=int(config["n_layers"]),
        n_heads=n_heads,
        n_kv_heads=int(n_kv),
        ffn_hidden=int(hidden) if hidden is not None else int(get("mlp_ratio")) * d_model,
        max_len=int(get("max_sequence_length")),
        rope_theta=float(get("rope_theta")),
        norm_eps=float(get("rms_norm_eps")),
        qkv_bias=bool(get("include_qkv_bias")),
        tie_embeddings=bool(get("weight_tying")),
        shift_logits=False,
        rope_fp32=bool(get("rope_full_precision")),
        embed_scale=math.sqrt(d_model) if get("input_emb_norm") else 1.0,
        logit_scale=1.0 / math.sqrt(d_model) if get("scale_logits") else 1.0,
    )


def weight_map(cfg: NativeConfig) -> dict[str, Target]:
    """Checkpoint tensor name -> where it goes in :class:`NativeTransformer`."""
    hd = cfg.head_dim
    q, kv, f = cfg.n_heads * hd, cfg.n_kv_heads * hd, cfg.ffn_hidden
    names = {f"{PREFIX}wte.weight": Target("embed.weight"), f"{PREFIX}ln_f.weight": Target("norm.weight")}
    if not cfg.tie_embeddings:
        names[f"{PREFIX}ff_out.weight"] = Target("head.weight")
    for i in range(cfg.n_layers):
        ours, theirs = f"blocks.{i}.", f"{PREFIX}blocks.{i}."
        parts = {"q_proj": slice(0, q), "k_proj": slice(q, q + kv), "v_proj": slice(q + kv, q + 2 * kv)}
        for name, rows in parts.items():
            names[f"{theirs}{name}.weight"] = Target(f"{ours}attn.qkv.weight", rows)
            if cfg.qkv_bias:
                names[f"{theirs}{name}.bias"] = Target(f"{ours}attn.qkv.bias", rows)
        names.update({
            f"{theirs}attn_out.weight": Target(f"{ours}attn.out.weight"),
            f"{theirs}attn_norm.weight": Target(f"{ours}attn_norm.weight"),
            f"{theirs}ff_norm.weight": Target(f"{ours}ffn_norm.weight"),
            f"{theirs}ff_proj.weight": Target(f"{ours}ffn.gate_up.weight", slice(0, f)),
            f"{theirs}up_proj.weight": Target(f"{ours}ffn.gate_up.weight", slice(f, 2 * f)),
            f"{theirs}ff_out.weight": Target(f"{ours}ffn.down.weight"),
        })  # fmt: skip
    return names


def ignored(name: str, cfg: NativeConfig) -> bool:
    """Checkpoint tensors with no place that may stay behind: a tied checkpoint's saved head."""
    return cfg.tie_embeddings and name == "model.transformer.ff_out.weight"


__all__ = ["ignored", "is_llada", "read_config", "weight_map"]
