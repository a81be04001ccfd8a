"""The Stencil transformer's layers: RMSNorm, rotary embeddings, attention over a window of
positions with a KV cache, SwiGLU, the pre-norm block, and the copy head.

Shapes: B batch, L sequence length, W window length, K output positions, H heads, D head dim,
C model width, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gpu_worker.engine.model_config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused op, the same formula
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * self.weight.float()).to(dtype)


def rope_tables(max_len: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / sin tables [max_len, head_dim // 2] for rotary position embeddings."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """Rotate x [..., B, H, W, D] by its positions' rotation [B or 1, 1, W, D/2] (complex
    cos + i sin): each pair (x[2i], x[2i+1]) is a complex number times its rotation."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * rotation).flatten(-2).to(x.dtype)


@dataclass
class KVCache:
    """Per-layer keys and values [B, H, Lc, D] of a sequence's positions.

    The denoiser's dual cache holds every position of the canvas, computed once per block; a
    window forward then recomputes only the active block and reads the rest from here. The AR
    model appends to it one token at a time. With a copy head it also holds the copy keys
    [B, Lc, Dc] and the token ids [B, Lc] they point at.
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    copy_keys: torch.Tensor | None = None
    ids: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return int(self.keys[0].shape[2]) if self.keys else 0

    def select_rows(self, index: torch.Tensor) -> KVCache:
        """The cache of the batch rows in ``index`` [A] (a copy)."""

        def pick(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.index_select(0, index)

        return KVCache(
            [k.index_select(0, index) for k in self.keys],
            [v.index_select(0, index) for v in self.values],
            pick(self.copy_keys),
            pick(self.ids),
        )

    def put_rows(self, index: torch.Tensor, fresh: KVCache) -> KVCache:
        """This cache with the batch rows in ``index`` replaced by ``fresh``'s (in place)."""
        for old, new in zip(self.keys + self.values, fresh.keys + fresh.values, strict=True):
            old[index] = new
        if self.copy_keys is not None and self.ids is not None:
            assert fresh.copy_keys is not None and fresh.ids is not None, "a copy head's cache"
            self.copy_keys[index] = fresh.copy_keys
            self.ids[index] = fresh.ids
        return self


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.d_model // cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(
        self,
        x: torch.Tensor,  # [B, W, C]
        rotation: torch.Tensor,  # [B or 1, 1, W, D/2] complex, see apply_rope
        attn_mask: torch.Tensor | None,  # [B, 1, W, Lk] bool, True = may attend
        past: tuple[torch.Tensor, torch.Tensor] | None,  # cached [B, H, Lc, D] each
        window: Window,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, w, c = x.shape
        qkv = self.qkv(x).view(b, w, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = apply_rope(qkv[:2], rotation)  # [B, H, W, D] each, rotated in one call
        v = qkv[2]
        if past is not None:
            k = _splice(past[0], k, window)
            v = _splice(past[1], v, window)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)  # [B, H, W, D]
        return self.out(y.transpose(1, 2).reshape(b, w, c)), k, v


@dataclass(frozen=True)
class Window:
    """Which sequence positions a forward's W query positions are.

    Either one run ``start``..start+W shared by every row, or ``positions`` [B, W]: each row its
    own positions, ascending, distinct and inside the cache (the active blocks of a batch's
    rows, wherever they lie, locked text between their holes left out). ``from_cache`` [B, W]
    marks positions that keep the cache's keys and values (a row's filler up to the widest
    row's W): their outputs are computed but meaningless, and every other position sees
    exactly what a window of the row's own positions would give. With ``overwrite`` the
    cache's tensors take the window's keys and values in place (see ``_splice``).
    """

    start: int = 0
    positions: torch.Tensor | None = None
    from_cache: torch.Tensor | None = None
    overwrite: bool = False

    def last(self, w: int) -> int:
        """One past the furthest position of any row."""
        if self.positions is not None:
            return int(self.positions.max()) + 1
        return self.start + w

    def absolute(self, w: int, device: torch.device) -> torch.Tensor:
        """[B, W] (per row) or [1, W] absolute positions of the window."""
        if self.positions is not None:
            return self.positions.to(device)
        return torch.arange(self.start, self.start + w, device=device)[None, :]


def _splice(
    cached: torch.Tensor, fresh: torch.Tensor, window: Window, dim: int = 2
) -> torch.Tensor:
    """Cached [B,H,Lc,D] (or [B,Lc,...] with ``dim`` 1) with the window's positions replaced
    by fresh, or appended when a shared run goes past the cache. Per-row positions with
    ``window.overwrite`` write into ``cached`` itself: the same values without copying the
    whole cache twice per layer."""
    if window.positions is None:
        end = window.start + fresh.shape[dim]
        parts = [cached.narrow(dim, 0, window.start), fresh]
        if end < cached.shape[dim]:
            parts.append(cached.narrow(dim, end, cached.shape[dim] - end))
        return torch.cat(parts, dim=dim)
    shape = [fresh.shape[0]] + [1] * (dim - 1) + [fresh.shape[dim]]
    shape += [1] * (fresh.dim() - dim - 1)
    index = window.positions.view(shape).expand_as(fresh)
    if window.from_cache is not None:
        keep = window.from_cache.view(shape).expand_as(fresh)
        fresh = torch.where(keep, cached.gather(dim, index), fresh)
    if window.overwrite:
        return cached.scatter_(dim, index, fresh)
    return cached.scatter(dim, index, fresh)


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up = nn.Linear(cfg.d_model, 2 * cfg.ffn_hidden, bias=False)
        self.down = nn.Linear(cfg.ffn_hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ffn = SwiGLU(cfg)

    def forward(
        self,
        x: torch.Tensor,
        rotation: torch.Tensor,
        attn_mask: torch.Tensor | None,
        past: tuple[torch.Tensor, torch.Tensor] | None,
        window: Window,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h, k, v = self.attn(self.attn_norm(x), rotation, attn_mask, past, window)
        x = x + h
        return x + self.ffn(self.ffn_norm(x)), k, v


class CopyHead(nn.Module):
    """Mixes the vocabulary distribution with a pointer over the sequence's tokens.

    p(w) = g * softmax(head(h))[w] + (1 - g) * sum of attention on the positions holding w,
    with g = sigmoid(gate(h)). Positions holding mask or pad (nothing to copy) and keys the
    attention mask hides are never pointed at. The result is returned as log-probabilities,
    which every consumer of logits (softmax, temperature, constraint masks) reads unchanged.

    With ``copy_twins`` the pointer's mass on a position holding token x goes to x with
    probability 1 - u, and with u to a twin of x: its spaced twin with probability s, its bare
    twin with 1 - s (x itself where it has none), with (u, s) = sigmoid(twin_gate(h)). With
    ``copy_lower`` each twin is, with probability l = sigmoid(lower_gate(h)), its lower-case
    spelling instead (the spaced or bare lower-case twin of x, see tokenizer.case_twins).
    """

    twins: torch.Tensor  # [2, V]: spaced twin, bare twin of each id (with copy_twins)
    lower_twins: torch.Tensor  # [2, V]: spaced, bare lower-case twin of each id (copy_lower)

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.query = nn.Linear(cfg.d_model, cfg.copy_dim, bias=False)
        self.key = nn.Linear(cfg.d_model, cfg.copy_dim, bias=False)
        self.gate = nn.Linear(cfg.d_model, 1)
        nn.init.zeros_(self.gate.bias)  # start at an even mix
        self.skip_ids = (cfg.mask_id, cfg.pad_id)
        self.scale = cfg.copy_dim**-0.5
        self.has_twins = cfg.copy_twins
        if cfg.copy_twins:
            self.twin_gate = nn.Linear(cfg.d_model, 2)
            # Rows: spaced twin, bare twin of each id (the id itself where it has none).
            self.register_buffer("twins", torch.arange(cfg.vocab_size).repeat(2, 1))
        self.has_lower = cfg.copy_lower
        if cfg.copy_lower:
            self.lower_gate = nn.Linear(cfg.d_model, 1)
            self.register_buffer("lower_twins", torch.arange(cfg.vocab_size).repeat(2, 1))

    def init_twin_gate(self) -> None:
        """u = sigmoid(-4) ~ 0.018 (almost every copy as is), s = 0.5, whatever h is."""
        nn.init.zeros_(self.twin_gate.weight)
        with torch.no_grad():
            self.twin_gate.bias.copy_(torch.tensor([-4.0, 0.0]))

    def init_lower_gate(self) -> None:
        """l = sigmoid(-4) ~ 0.018: a twin is copied as it is spelled, almost always."""
        nn.init.zeros_(self.lower_gate.weight)
        with torch.no_grad():
            self.lower_gate.bias.fill_(-4.0)

    def set_twins(self, spaced: list[int], bare: list[int]) -> None:
        """The twin table, from :func:`gpu_worker.engine.tokenizer.space_twins`."""
        self._set_table(self.twins, spaced, bare)

    def set_lower_twins(self, spaced: list[int], bare: list[int]) -> None:
        """The lower-case twin table, from :func:`gpu_worker.engine.tokenizer.case_twins`."""
        self._set_table(self.lower_twins, spaced, bare)

    @staticmethod
    def _set_table(buffer: torch.Tensor, spaced: list[int], bare: list[int]) -> None:
        table = torch.tensor([spaced, bare], dtype=torch.long)
        if table.shape != buffer.shape:
            raise ValueError(f"twin table has shape {tuple(table.shape)}, expected {tuple(buffer.shape)}")
        buffer.copy_(table)

    def _sources(
        self, attention: torch.Tensor, ids: torch.Tensor, queries: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The pointer's weights [B, K, S*Lk] and the ids [B, K, S*Lk] they land on: S = 1
        (each position's own id), with twins 3 (own id, spaced twin, bare twin), and with
        lower-case twins 5 (and the spaced and bare lower-case twins)."""
        index = ids[:, None, :].expand_as(attention)
        if not self.has_twins:
            return attention, index
        u, s = torch.sigmoid(self.twin_gate(queries)).unbind(-1)  # [B, K] each
        u, s = u[..., None], s[..., None]
        twin_weights = [u * s * attention, u * (1 - s) * attention]  # spaced, bare
        tables = [self.twins]
        if self.has_lower:
            low = torch.sigmoid(self.lower_gate(queries))  # [B, K, 1]
            twin_weights = [(1 - low) * w for w in twin_weights] + [low * w for w in twin_weights]
            tables.append(self.lower_twins)
        weights = torch.cat([(1 - u) * attention, *twin_weights], -1)
        twin_ids = [table[row][ids][:, None, :].expand_as(attention) for table in tables for row in (0, 1)]
        return weights, torch.cat([index, *twin_ids], -1)

    def forward(
        self,
        h: torch.Tensor,  # [B, W, C] final normed hidden states of the window
        logits: torch.Tensor,  # [B, K, V] vocabulary logits of the output positions
        ids: torch.Tensor,  # [B, W] the window's tokens
        window: Window,
        cache: KVCache | None,
        attn_mask: torch.Tensor | None,  # [B, 1, K, Lk] bool or None, the outputs' rows
        queries: torch.Tensor,  # [B, K, C] hidden states of the output positions
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probabilities [B, K, V], and the copy keys and ids of every position."""
        with torch.autocast(h.device.type, enabled=False):  # the mixture is computed in fp32
            h, queries = h.float(), queries.float()
            attention, keys, ids = self._attention(h, ids, window, cache, attn_mask, queries)
            weights, index = self._sources(attention, ids, queries)
            pointer = torch.zeros_like(logits, dtype=torch.float32).scatter_add_(
                -1, index, weights
            )  # [B, K, V]
            gate = torch.sigmoid(self.gate(queries))  # [B, K, 1]
            mixed = gate * torch.softmax(logits.float(), dim=-1) + (1 - gate) * pointer
            return torch.log(mixed.clamp_min(1e-30)), keys, ids

    def target_log_probs(
        self,
        h: torch.Tensor,  # [B, L, C]
        vocab: torch.Tensor,  # [B, L] log p_vocab(target)
        ids: torch.Tensor,  # [B, L]
        targets: torch.Tensor,  # [B, L]
        attn_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """log p(target) [B, L] of the mixture, gathered instead of scattered over V."""
        with torch.autocast(h.device.type, enabled=False):
            h = h.float()
            attention, _, ids = self._attention(h, ids, Window(), None, attn_mask, h)
            weights, index = self._sources(attention, ids, h)
            copied = (weights * (index == targets[:, :, None])).sum(-1)  # [B, L]
            gate = self.gate(h)[..., 0]  # [B, L] the mixing logit
            copy = F.logsigmoid(-gate) + torch.log(copied.clamp_min(1e-30))
            return torch.logaddexp(F.logsigmoid(gate) + vocab, copy)

    def _attention(
        self,
        h: torch.Tensor,
        ids: torch.Tensor,
        window: Window,
        cache: KVCache | None,
        attn_mask: torch.Tensor | None,
        queries: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Pointer attention [B, K, Lk] of the ``queries`` [B, K, C] (rows with nothing to
        point at are zero), and the copy keys [B, Lk, Dc] and ids [B, Lk] it points over."""
        keys = self.key(h)
        if cache is not None and cache.copy_keys is not None and cache.ids is not None:
            keys = _splice(cache.copy_keys, keys, window, dim=1)
            ids = _splice(cache.ids, ids, window, dim=1)
        scores = torch.einsum("bwc,blc->bwl", self.query(queries), keys) * self.scale
        allowed = (ids != self.skip_ids[0]) & (ids != self.skip_ids[1])  # [B, Lk]
        allowed = allowed[:, None, :].expand_as(scores)
        if attn_mask is not None:
            allowed = allowed & attn_mask[:, 0].expand_as(scores)
        attention = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        return attention.nan_to_num(0.0), keys, ids


def output_rows(attn_mask: torch.Tensor | None, outputs: torch.Tensor | None) -> torch.Tensor | None:
    """The attention mask [B, 1, W, Lk]'s query rows at ``outputs`` [B, K]: [B, 1, K, Lk]."""
    if attn_mask is None or outputs is None:
        return attn_mask
    b, k = outputs.shape
    rows = attn_mask.expand(b, -1, -1, -1)
    return rows.gather(2, outputs[:, None, :, None].expand(b, 1, k, rows.shape[-1]))


__all__ = [
    "Block", "CopyHead", "KVCache", "RMSNorm", "Window", "apply_rope", "output_rows", "rope_tables",
]  # fmt: skip
