"""The tensor names of Qwen-style checkpoints (``model.layers.N.self_attn.q_proj`` ...), shared
by the families built on them: Dream (Qwen2: q/k/v biases) and SDAR (Qwen3: per-head q/k
norms). The config says which of those a checkpoint has."""

from __future__ import annotations

from gpu_worker.engine.native.transformer import NativeConfig
from gpu_worker.engine.native.weights import Target


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
            if cfg.qkv_bias:
                names[f"{theirs}self_attn.{name}.bias"] = Target(f"{ours}attn.qkv.bias", rows)
        if cfg.qk_norm:
            for norm in ("q_norm", "k_norm"):
                names[f"{theirs}self_attn.{norm}.weight"] = Target(f"{ours}attn.{norm}.weight")
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
