"""Stencil's own forward for LLaMA-style diffusion checkpoints (LLaDA, Dream, SDAR).

One network for the three families: pre-norm residual blocks of grouped-query attention with
half-split rotary embeddings (the GPT-NeoX layout they use) and a SwiGLU feed-forward. What
differs is read from the checkpoint's config.json into :class:`NativeConfig` (see
:mod:`gpu_worker.engine.native.llada`, ``.dream`` and ``.sdar``): qkv biases, per-head q/k
norms, the head width, where RoPE is computed in bf16, whether logits are shifted, and the
attention: bidirectional (LLaDA, Dream), or block-causal for a block-diffusion model (SDAR:
bidirectional inside each block of ``block_size`` positions, causal across blocks; its cache
is :mod:`gpu_worker.engine.native.block_cache`). Dream is adapted from an
autoregressive model: its logits at position i predict token i+1, and its own generation reads
position i from the logits of position i-1 (position 0 from its own). The network shifts them
here, so the sampler reads position i from logits[i] for every backend.

It offers the sampler the contract of :class:`~gpu_worker.engine.model.StencilTransformer`:
``model(ids, attention_mask) -> logits [B, L, V]`` and ``forward_window`` with a
:class:`~gpu_worker.engine.model.KVCache`, so the Stencil transformer's forward caches
(:mod:`gpu_worker.engine.model_cache`, the sampler's ForwardCache protocol) run on it.

Shapes: B batch, L sequence, W window, H query heads, Hkv key/value heads, D head dim,
C model width, F feed-forward width, V embedding rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gpu_worker.engine import model_cache
from gpu_worker.engine.model import KVCache


@dataclass(frozen=True)
class NativeConfig:
    """The architecture of a native checkpoint, read from its config.json."""

    family: str  # "llada" | "dream" | "sdar"
    vocab_size: int  # embedding rows (may exceed the tokenizer's size)
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    max_len: int
    rope_theta: float
    norm_eps: float
    qkv_bias: bool  # Dream (Qwen2) has biases on q, k and v
    tie_embeddings: bool  # the output head is the input embedding
    shift_logits: bool  # Dream: position i is read from the logits of position i-1
    rope_fp32: bool  # LLaDA rotates q and k in fp32; Dream in the activations' dtype
    embed_scale: float = 1.0  # LLaDA's input_emb_norm multiplies embeddings by sqrt(C)
    logit_scale: float = 1.0  # LLaDA's scale_logits multiplies logits by 1/sqrt(C)
    head_size: int = 0  # the head width when config.json names it (SDAR); 0: C / H
    qk_norm: bool = False  # SDAR (Qwen3) RMS-norms each head's queries and keys before RoPE
    # Block diffusion (SDAR): positions attend bidirectionally inside their block of
    # block_size (from position 0) and causally to earlier blocks; 0: bidirectional everywhere.
    block_size: int = 0

    @property
    def head_dim(self) -> int:
        return self.head_size or self.d_model // self.n_heads

    def num_parameters(self) -> int:
        d, f, hd = self.d_model, self.ffn_hidden, self.head_dim
        attention = d * (self.n_heads + 2 * self.n_kv_heads) * hd + self.n_heads * hd * d
        bias = (self.n_heads + 2 * self.n_kv_heads) * hd if self.qkv_bias else 0
        bias += 2 * hd if self.qk_norm else 0
        per_layer = attention + bias + 3 * d * f + 2 * d
        head = 0 if self.tie_embeddings else self.vocab_size * d
        return self.n_layers * per_layer + self.vocab_size * d + d + head


@dataclass(frozen=True)
class Window:
    """Which cached positions a forward's W query positions are: ``positions`` [B, W], each
    row its own, ascending, distinct and inside the cache. ``from_cache`` [B, W] marks
    positions that keep the cache's keys and values (a row's filler, a left neighbour read as
    a query only); with ``overwrite`` the cache's tensors take the window's keys and values in
    place. (The Stencil transformer's cached windows, for bidirectional networks.)"""

    positions: torch.Tensor
    from_cache: torch.Tensor | None = None
    overwrite: bool = False


def splice(cached: torch.Tensor, fresh: torch.Tensor, window: Window, dim: int = 2) -> torch.Tensor:
    """Cached [B, H, Lc, D] (or [B, Lc] with ``dim`` 1) with the window's positions replaced
    by ``fresh`` (except where ``from_cache``); in place with ``window.overwrite``."""
    shape = [fresh.shape[0]] + [1] * (dim - 1) + [fresh.shape[dim]] + [1] * (fresh.dim() - dim - 1)
    index = window.positions.view(shape).expand_as(fresh)
    if window.from_cache is not None:
        keep = window.from_cache.view(shape).expand_as(fresh)
        fresh = torch.where(keep, cached.gather(dim, index), fresh)
    if window.overwrite:
        return cached.scatter_(dim, index, fresh)
    return cached.scatter(dim, index, fresh)


class RMSNorm(nn.Module):
    """x / rms(x) in fp32, cast back, then times the weight (both families' order of ops)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.float()
        normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return self.weight * normed


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: NativeConfig) -> None:
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, (cfg.n_heads + 2 * cfg.n_kv_heads) * hd, bias=cfg.qkv_bias)
        self.out = nn.Linear(cfg.n_heads * hd, cfg.d_model, bias=False)
        self.q_norm = RMSNorm(hd, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(hd, cfg.norm_eps) if cfg.qk_norm else None

    def forward(
        self,
        x: torch.Tensor,  # [B, W, C]
        cos: torch.Tensor,  # [B or 1, 1, W, D]
        sin: torch.Tensor,
        attn_mask: torch.Tensor | None,  # [B, 1, W, Lk] bool, True = may attend
        past: tuple[torch.Tensor, torch.Tensor] | None,  # cached [B, Hkv, Lc, D] each
        window: Window | None,  # None: the whole sequence, no cache
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        b, w, _ = x.shape
        hd = cfg.head_dim
        q, k, v = self.qkv(x).split([cfg.n_heads * hd, cfg.n_kv_heads * hd, cfg.n_kv_heads * hd], -1)
        q = q.view(b, w, cfg.n_heads, hd)  # [B, W, H, D]
        k = k.view(b, w, cfg.n_kv_heads, hd)  # [B, W, Hkv, D]
        if self.q_norm is not None and self.k_norm is not None:  # per head, before RoPE
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # [B, H, W, D], [B, Hkv, W, D]
        v = v.view(b, w, cfg.n_kv_heads, hd).transpose(1, 2)
        q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
        if past is not None and window is not None:
            k = splice(past[0], k, window)
            v = splice(past[1], v, window)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, enable_gqa=cfg.n_kv_heads != cfg.n_heads
        )  # [B, H, W, D]
        return self.out(y.transpose(1, 2).reshape(b, w, cfg.n_heads * hd)), k, v

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.cfg.rope_fp32:  # LLaDA: rotate in fp32, cast back
            x32 = x.float()
            return (x32 * cos + rotate_half(x32) * sin).to(x.dtype)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # Dream: tables cast to the activations' dtype
        return x * cos + rotate_half(x) * sin


class FeedForward(nn.Module):
    """down(silu(gate(x)) * up(x)); gate and up are one matrix (gate rows first)."""

    def __init__(self, cfg: NativeConfig) -> None:
        super().__init__()
        self.gate_up = nn.Linear(cfg.d_model, 2 * cfg.ffn_hidden, bias=False)
        self.down = nn.Linear(cfg.ffn_hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: NativeConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ffn = FeedForward(cfg)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn_mask: torch.Tensor | None,
        past: tuple[torch.Tensor, torch.Tensor] | None,
        window: Window | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h, k, v = self.attn(self.attn_norm(x), cos, sin, attn_mask, past, window)
        x = x + h
        return x + self.ffn(self.ffn_norm(x)), k, v


class NativeTransformer(nn.Module):
    """``logits = model(ids, attention_mask)`` over a LLaDA, Dream or SDAR checkpoint's weights."""

    def __init__(self, cfg: NativeConfig, *, mask_id: int, pad_id: int, eos_id: int) -> None:
        super().__init__()
        if (not cfg.head_size and cfg.d_model % cfg.n_heads) or cfg.n_heads % cfg.n_kv_heads:
            raise ValueError(
                f"d_model={cfg.d_model}, n_heads={cfg.n_heads}, n_kv_heads={cfg.n_kv_heads}: "
                "the width must split into heads and the heads into key/value groups"
            )
        self.config = cfg
        self.mask_id, self.pad_id, self.eos_id = mask_id, pad_id, eos_id
        self.max_len = cfg.max_len
        # The sampler's blocks must be these attention blocks (LoadedModel.fit_config); 0: any.
        self.attention_block = cfg.block_size
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(
        self,
        ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        room: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits [B, L, V] for ids [B, L]; attention_mask [B, L], True = real token. (``room``
        is for networks with a room embedding; these have none.)"""
        logits, _ = self.forward_window(ids, attention_mask=attention_mask)
        return logits

    def forward_window(
        self,
        ids: torch.Tensor,  # [B, W]
        *,
        start: int = 0,
        cache: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,  # [B, Lk] over all key positions
        write_cache: bool = False,
        positions: torch.Tensor | None = None,  # [B, W] long, instead of start
        from_cache: torch.Tensor | None = None,  # [B, W] bool, with positions
        outputs: torch.Tensor | None = None,  # [B, K] long indices into the window
        room: torch.Tensor | None = None,  # unused: no room embedding
    ) -> tuple[torch.Tensor, KVCache | None]:
        """Logits [B, W, V] of the window (or [B, K, V] of its ``outputs``), and with
        ``write_cache`` the cache of every layer's keys and values; the arguments mean what
        they mean for :meth:`StencilTransformer.forward_window`. Without ``cache`` the window
        is the whole sequence; with it, the positions ``start``..start+W or ``positions``.

        The cache also holds every position's token id: a shifted network reads a window's
        first position from its left neighbour, which may lie outside the window. That
        neighbour is then recomputed as a query whose keys and values stay the cache's.
        """
        b, w = ids.shape
        if cache is None:
            if start or positions is not None:
                raise ValueError(f"start={start} or positions need a cache")
            h, keys, values = self._hidden(ids, None, None, attention_mask, write_cache)
            if self.config.shift_logits:  # position i reads position i - 1's (0 its own)
                h = torch.cat([h[:, :1], h[:, :-1]], dim=1)
            logits = self._logits(h if outputs is None else _gather_rows(h, outputs))
            # the cache's own ids: later windows write into them in place
            return logits, (_cache(keys, values, ids.clone()) if write_cache else None)
        if cache.ids is None:
            raise ValueError("a window forward needs a cache written by this network")
        if positions is None:
            positions = torch.arange(start, start + w, device=ids.device).expand(b, w)
        if outputs is None:
            outputs = torch.arange(w, device=ids.device).expand(b, w)
        reads = outputs
        if self.config.shift_logits:
            wide = _widen(positions, from_cache, outputs, cache.length)
            ids = cache.ids.gather(1, wide.positions).scatter(1, wide.window_index, ids)
            positions, from_cache, reads = wide.positions, wide.from_cache, wide.reads
        window = Window(positions, from_cache, overwrite=write_cache)
        h, keys, values = self._hidden(ids, window, cache, attention_mask, write_cache)
        logits = self._logits(_gather_rows(h, reads))
        if not write_cache:
            return logits, None
        return logits, _cache(keys, values, splice(cache.ids, ids, window, dim=1))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward_cache(self, mode: str) -> model_cache.ExactForward | model_cache.DualCache:
        """The sampler's forward passes over this network for one batch ("none", "dual",
        "delayed" or "block"): the Stencil transformer's, which need only ``forward_window``;
        a block-diffusion network runs "block", its exact block KV cache (and so "dual" and
        "delayed", which a config frozen by ``LoadedModel.fit_config`` never names here)."""
        if mode == "block" and not self.config.block_size:
            raise ValueError("cache='block' needs a block-diffusion model (a block_size in its "
                             "config.json); use cache='none', 'dual' or 'delayed'")
        if self.config.block_size and mode != "none":
            from gpu_worker.engine.native.block_cache import BlockCache

            if mode != "block":
                model_cache.for_mode(self, mode)  # the mode's name is checked as for any network
            return BlockCache(self, self.config.block_size)
        return model_cache.for_mode(self, mode)

    # -- internals ----------------------------------------------------------------------------
    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        weight = self.embed.weight if self.head is None else self.head.weight
        logits = F.linear(h, weight)  # [B, K, V]
        return logits * self.config.logit_scale if self.config.logit_scale != 1.0 else logits

    def _hidden(
        self,
        ids: torch.Tensor,
        window: Window | None,
        cache: KVCache | None,
        attention_mask: torch.Tensor | None,
        write_cache: bool,
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """Final normed hidden states [B, W, C] of the window (None: the whole sequence) and,
        with ``write_cache``, every layer's spliced keys and values."""
        b, w = ids.shape
        total = cache.length if cache is not None else w
        if total > self.max_len:
            raise ValueError(f"sequence length {total} exceeds the model's max_len={self.max_len}")
        if window is None:
            positions = torch.arange(w, device=ids.device)[None, :]  # [1, W]
        else:
            positions = window.positions.to(ids.device)  # [B, W]
            if int(positions.max()) >= total or int(positions.min()) < 0:
                raise ValueError("per-row positions must lie inside the cache")
        cos, sin = self._rope(positions)
        attn_mask = _attention_mask(b, total, positions, attention_mask, ids.device,
                                    self.config.block_size)  # fmt: skip
        x = self.embed(ids)
        if self.config.embed_scale != 1.0:
            x = x * self.config.embed_scale
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        for i, block in enumerate(self.blocks):
            past = (cache.keys[i], cache.values[i]) if cache is not None else None
            x, k, v = block(x, cos, sin, attn_mask, past, window)
            if write_cache:
                keys.append(k)
                values.append(v)
        return self.norm(x), keys, values

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B or 1, 1, W, D] in fp32 for the absolute ``positions`` [B or 1, W]."""
        d = self.config.head_dim
        arange = torch.arange(0, d, 2, device=positions.device, dtype=torch.float32)
        inv_freq = 1.0 / (self.config.rope_theta ** (arange / d))  # [D/2]
        angles = positions[..., None].float() * inv_freq  # [B or 1, W, D/2]
        angles = torch.cat([angles, angles], dim=-1)[:, None]  # [B or 1, 1, W, D]
        return angles.cos(), angles.sin()


@dataclass(frozen=True)
class _Widened:
    positions: torch.Tensor  # [B, W'] ascending, distinct: the window plus the neighbours read
    from_cache: torch.Tensor  # [B, W'] bool: positions that keep the cache's keys and values
    window_index: torch.Tensor  # [B, W] where each original window position went
    reads: torch.Tensor  # [B, K] the widened index whose hidden state gives each output


def _widen(
    positions: torch.Tensor,  # [B, W]
    from_cache: torch.Tensor | None,  # [B, W]
    outputs: torch.Tensor,  # [B, K] indices into the window
    length: int,
) -> _Widened:
    """Each row's window with the left neighbour of every output position added (position 0
    reads itself), filled up to the widest row with further positions outside it."""
    device = positions.device
    rows = []
    for r in range(positions.shape[0]):
        own = positions[r].tolist()
        keep = [False] * len(own) if from_cache is None else from_cache[r].tolist()
        wanted = {max(0, own[j] - 1) for j in outputs[r].tolist()}
        extra = sorted(wanted - set(own))
        rows.append((own, keep, extra))
    width = max(len(own) + len(extra) for own, _, extra in rows)
    wide = torch.empty((len(rows), width), dtype=torch.long)
    cached = torch.ones((len(rows), width), dtype=torch.bool)
    window_index = torch.empty(positions.shape, dtype=torch.long)
    reads = torch.empty(outputs.shape, dtype=torch.long)
    for r, (own, keep, extra) in enumerate(rows):
        taken = set(own) | set(extra)
        filler = [] if len(taken) == width else [p for p in range(length) if p not in taken]
        merged = sorted(own + extra + filler[: width - len(taken)])
        where = {p: i for i, p in enumerate(merged)}
        wide[r] = torch.tensor(merged)
        for j, p in enumerate(own):
            window_index[r, j] = where[p]
            cached[r, where[p]] = keep[j]
        reads[r] = torch.tensor([where[max(0, own[j] - 1)] for j in outputs[r].tolist()])
    return _Widened(wide.to(device), cached.to(device), window_index.to(device), reads.to(device))


def _gather_rows(h: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """h [B, W, C] at ``index`` [B, K]: [B, K, C]."""
    return h.gather(1, index[..., None].expand(-1, -1, h.shape[-1]))


def _cache(keys: list[torch.Tensor], values: list[torch.Tensor], ids: torch.Tensor) -> KVCache:
    """A KVCache with every position's id. ``copy_keys`` is an empty [B, L, 0] tensor (there
    is no copy head): the sampler's row updates carry ``ids`` along with it."""
    empty = keys[0].new_zeros((ids.shape[0], ids.shape[1], 0))
    return KVCache(keys, values, empty, ids)


def _attention_mask(
    b: int,
    total: int,
    positions: torch.Tensor,  # [B or 1, W]
    attention_mask: torch.Tensor | None,
    device: torch.device,
    block_size: int = 0,
) -> torch.Tensor | None:
    """Bool [B, 1, W, total], True where a query may attend to a key; None when every key is
    real and attention is bidirectional (the cheaper attention path, same result). With
    ``block_size`` a query sees only keys in its own block or an earlier one."""
    if attention_mask is not None and attention_mask.shape != (b, total):
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)}, expected {(b, total)}"
        )
    k_pos = torch.arange(total, device=device)[None, None, None, :]
    if block_size:
        q_block = positions.to(device)[:, None, :, None] // block_size  # [B or 1, 1, W, 1]
        causal = k_pos // block_size <= q_block  # [B or 1, 1, W, total]
        if attention_mask is None:
            return causal
        return causal & attention_mask.bool()[:, None, None, :] | (k_pos == positions[:, None, :, None])
    if attention_mask is None or bool(attention_mask.all()):
        return None
    keys_ok = attention_mask.bool()[:, None, None, :]  # [B, 1, 1, total]
    # A padded query row with no allowed key would give NaN: let it see itself.
    return keys_ok | (k_pos == positions[:, None, :, None])


__all__ = ["NativeConfig", "NativeTransformer"]
