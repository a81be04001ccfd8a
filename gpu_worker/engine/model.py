"""The Stencil transformer: one readable model file for the denoiser and the AR-FIM baseline.

Both models share this architecture (RoPE, RMSNorm, SwiGLU, pre-norm residual blocks); the
denoiser attends bidirectionally, the AR-FIM baseline causally. The config is saved beside the
weights (``config.json``) so a checkpoint describes itself.

Shapes: B batch, L sequence length, W window length, H heads, D head dim, V vocabulary.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

ModelKind = Literal["denoiser", "ar_fim"]
CONFIG_FORMAT = "stencil-transformer/1"


@dataclass(frozen=True)
class ModelConfig:
    """Architecture and special-token ids of a Stencil model; saved as ``config.json``."""

    kind: ModelKind  # "denoiser" (bidirectional, masked diffusion) or "ar_fim" (causal)
    vocab_size: int
    pad_id: int  # pads a hole's unused tail and a batch's short rows
    eos_id: int  # ends a document (and, for AR-FIM, a middle)
    mask_id: int  # the absorbing state of masked diffusion
    fim_prefix_id: int  # AR-FIM sentinels (PSM order: <pre> prefix <suf> suffix <mid> middle)
    fim_suffix_id: int
    fim_middle_id: int
    d_model: int = 256
    n_layers: int = 6
    n_heads: int = 4
    ffn_hidden: int = 688  # SwiGLU hidden width (~8/3 d_model, rounded to a multiple of 16)
    max_len: int = 512  # longest sequence the RoPE tables and training cover
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    # The copy head (a pointer over the sequence, as pointer-generator networks): the output
    # mixes the vocabulary softmax with a distribution over the tokens already in the
    # sequence, so copying a name from elsewhere in the document works for every token, rare
    # ones included, instead of being learned one token at a time. 0 = no copy head.
    copy_dim: int = 0
    # Copying across a space (needs the copy head): byte-level BPE spells a word at a line's
    # start without its leading space ("East" in a letterhead) and inside a line with it
    # (" East" in "Signed: Dr. Hogan, East ..."), two unrelated ids, so a pointer that copies
    # ids cannot copy a name's first token from a heading into a sentence. With copy_twins the
    # pointer can also copy a token as its spaced or bare twin (the same text with or without
    # one leading space; see CopyHead and tokenizer.space_twins). The twin table is part of the
    # weights (``copy.twins``). Its gate starts almost closed, so adding it to a trained model
    # changes its output by about 2% of the copy mass until it is trained.
    copy_twins: bool = False
    # Copying into lower case (needs copy_twins): an e-mail address spells a name in lower
    # case ("adam.diaz@..."), other tokens than " Adam" and " Diaz" (and other pieces, unless
    # the vocabulary has the lower-case words: corpus.email_name_words). With copy_lower a
    # twin copy may also be the twin's lower-case spelling (tokenizer.case_twins; the table is
    # ``copy.lower_twins``). Its gate starts almost closed too.
    copy_lower: bool = False
    # The room embedding: an input embedding, added to each position's token embedding, of
    # how many positions of its hole's budget are left from it (1..room_buckets, more is
    # clipped to room_buckets; 0 = not in a hole, or not known). Without it a model cannot
    # see where one hole ends and the next begins when no locked text lies between them (two
    # sentences in a row), and writes the first sentence on into the second's budget.
    # Zero-initialised, so adding it to a trained model changes nothing until it is trained.
    # 0 = none (the sampler then passes no room).
    room_buckets: int = 0
    # Virtual spaces: a hole that starts a line or a JSON string value is written with a
    # leading space the document does not have (" Joshua", one token, where the document's
    # own line-start "Joshua" is "Jos", "hua"), and the space is stripped. A tokenization
    # rule the model is trained with, so it lives here; see tokenizer.opens_line_or_value.
    virtual_spaces: bool = False
    # Spaced lines: every line start and JSON string value has such a virtual space, in
    # locked text too (tokenizer.spaced_text), so a name at a line's start is the same tokens
    # as inside a line and a hole can copy it. Implies virtual_spaces.
    spaced_lines: bool = False
    # AR-FIM hole masks: the prompt shows the hole being filled as its budget of mask tokens
    # at the start of the suffix, and every later hole of the canvas as its own budget of
    # masks (``<pre> prefix <suf> <mask>*n suffix <mid> middle``). Without them a hole's
    # size is not in the prompt, and the first of a run of holes (sentences in a row) has an
    # empty suffix, so the model writes whatever span most often follows the prefix (a
    # buyer's name where an invoice's payment sentence belongs). See gpu_worker.engine.ar.fim_prompt.
    fim_hole_masks: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # free-form provenance (corpus, seed)

    @property
    def causal(self) -> bool:
        return self.kind == "ar_fim"

    def to_json(self) -> dict[str, Any]:
        return {"format": CONFIG_FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelConfig:
        data = dict(data)
        fmt = data.pop("format", CONFIG_FORMAT)
        if fmt != CONFIG_FORMAT:
            raise ValueError(f"config format {fmt!r} is not {CONFIG_FORMAT!r}")
        return cls(**data)


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


class StencilTransformer(nn.Module):
    """``logits = model(ids, attention_mask)``: the model-backend protocol of ARCHITECTURE.md.
    A model with a room embedding also takes ``room`` (see ``ModelConfig.room_buckets``); the
    sampler passes it only to a model whose config asks for it."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"d_model={cfg.d_model} is not divisible by n_heads={cfg.n_heads}")
        if cfg.copy_twins and not cfg.copy_dim:
            raise ValueError("copy_twins needs a copy head (copy_dim > 0)")
        if cfg.copy_lower and not cfg.copy_twins:
            raise ValueError("copy_lower needs copy_twins")
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.copy_dim:
            self.copy = CopyHead(cfg)
        if cfg.room_buckets:
            self.room = nn.Embedding(cfg.room_buckets + 1, cfg.d_model)
        cos, sin = rope_tables(cfg.max_len, cfg.d_model // cfg.n_heads, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init_weights)
        if cfg.room_buckets:
            nn.init.zeros_(self.room.weight)
        if cfg.copy_twins:  # checked above: it comes with a copy head
            self.copy.init_twin_gate()
        if cfg.copy_lower:
            self.copy.init_lower_gate()

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    # -- the backend protocol -------------------------------------------------------------
    @property
    def mask_id(self) -> int:
        return self.config.mask_id

    @property
    def pad_id(self) -> int:
        return self.config.pad_id

    @property
    def eos_id(self) -> int:
        return self.config.eos_id

    @property
    def max_len(self) -> int:
        return self.config.max_len

    def forward(
        self,
        ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        room: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits [B, L, V] for ids [B, L]; attention_mask [B, L] bool, True = real token;
        room [B, L] long, see ``ModelConfig.room_buckets`` (ignored without a room embedding)."""
        logits, _ = self.forward_window(ids, attention_mask=attention_mask, room=room)
        return logits

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # -- cached forwards --------------------------------------------------------------------
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
        room: torch.Tensor | None = None,  # [B, W] long, the window's room (see ModelConfig)
    ) -> tuple[torch.Tensor, KVCache | None]:
        """Logits [B, W, V] for the window of positions start..start+W, or ``positions``;
        with ``outputs``, logits [B, K, V] of just those window indices (the output head and
        the copy mixture, about half a full forward's time, then run on K positions only).

        With ``cache``, keys and values outside the window come from the cache (the window's
        own are recomputed, except where ``from_cache`` is True); without it the window is the
        whole sequence. With ``write_cache`` the returned cache holds the spliced keys and
        values of every layer; with per-row ``positions`` it is ``cache`` itself, updated in
        place (the caller takes it back). See :class:`Window` for per-row ``positions``.
        """
        window = Window(start, positions, from_cache, overwrite=write_cache and cache is not None)
        h, attn_mask, keys, values = self._hidden(
            ids, window, cache, attention_mask, write_cache, room
        )
        picked = h if outputs is None else h.gather(1, outputs[..., None].expand(-1, -1, h.shape[-1]))
        logits = self.head(picked)
        copy_keys = ids_all = None
        if self.config.copy_dim:
            logits, copy_keys, ids_all = self.copy(
                h, logits, ids, window, cache, _rows(attn_mask, outputs), picked
            )
        return logits, (KVCache(keys, values, copy_keys, ids_all) if write_cache else None)

    def target_log_probs(
        self,
        ids: torch.Tensor,
        targets: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        room: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """log p(targets) [B, L] under a full forward of ids [B, L]: what the training loss
        reads, without building the copy head's [B, L, V] mixture."""
        h, attn_mask, _, _ = self._hidden(ids, Window(), None, attention_mask, False, room)
        logits = self.head(h).float()
        vocab = -F.cross_entropy(
            logits.flatten(0, 1), targets.flatten(), reduction="none"
        ).view_as(targets)
        if not self.config.copy_dim:
            return vocab
        return self.copy.target_log_probs(h, vocab, ids, targets, attn_mask)

    def _hidden(
        self,
        ids: torch.Tensor,
        window: Window,
        cache: KVCache | None,
        attention_mask: torch.Tensor | None,
        write_cache: bool,
        room: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor], list[torch.Tensor]]:
        """Final normed hidden states [B, W, C] of the window, its attention mask and, with
        ``write_cache``, every layer's spliced keys and values."""
        b, w = ids.shape
        total = max(window.last(w), cache.length if cache is not None else 0)
        if total > self.config.max_len:
            raise ValueError(
                f"sequence length {total} exceeds the model's max_len={self.config.max_len}"
            )
        if cache is None and (window.positions is not None or window.start != 0):
            raise ValueError(f"start={window.start} or positions need a cache")
        if window.positions is not None and (
            cache is None or window.last(w) > cache.length or int(window.positions.min()) < 0
        ):
            raise ValueError("per-row positions must lie inside the cache")
        positions = window.absolute(w, ids.device)  # [B or 1, W]
        rotation = torch.complex(
            self.rope_cos[positions],  # type: ignore[index]  # a registered buffer
            self.rope_sin[positions],  # type: ignore[index]
        )[:, None]  # [B or 1, 1, W, D/2]: one table row per query position
        attn_mask = self._attention_mask(b, total, positions, attention_mask, ids.device)
        x = self.embed(ids)
        if room is not None and self.config.room_buckets:
            if room.shape != ids.shape:
                raise ValueError(f"room has shape {tuple(room.shape)}, expected {tuple(ids.shape)}")
            x = x + self.room(room.clamp(0, self.config.room_buckets))
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        for i, block in enumerate(self.blocks):
            past = (cache.keys[i], cache.values[i]) if cache is not None else None
            x, k, v = block(x, rotation, attn_mask, past, window)
            if write_cache:
                keys.append(k)
                values.append(v)
        return self.norm(x), attn_mask, keys, values

    def _attention_mask(
        self,
        b: int,
        total: int,
        positions: torch.Tensor,  # [B or 1, W] the queries' absolute positions
        attention_mask: torch.Tensor | None,
        device: torch.device,
    ) -> torch.Tensor | None:
        """Bool [B, 1, W, total]: True where a query may attend to a key; None when every
        query may attend to every key (no mask is the cheaper attention path, same result)."""
        allowed: torch.Tensor | None = None
        q_pos = positions[:, :, None]  # [B or 1, W, 1]
        k_pos = torch.arange(total, device=device)[None, None, :]  # [1, 1, total]
        if self.config.causal:
            allowed = (k_pos <= q_pos)[:, None]  # [B or 1, 1, W, total]
        if attention_mask is not None:
            if attention_mask.shape != (b, total):
                raise ValueError(
                    f"attention_mask has shape {tuple(attention_mask.shape)}, expected {(b, total)}"
                )
            if allowed is None and bool(attention_mask.all()):
                return None
            keys_ok = attention_mask.bool()[:, None, None, :]  # [B, 1, 1, total]
            allowed = keys_ok if allowed is None else allowed & keys_ok
            # A padded query row with no allowed key would give NaN: let it see itself.
            allowed = allowed | (k_pos == q_pos)[:, None]
        return allowed


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


def _rows(attn_mask: torch.Tensor | None, outputs: torch.Tensor | None) -> torch.Tensor | None:
    """The attention mask [B, 1, W, Lk]'s query rows at ``outputs`` [B, K]: [B, 1, K, Lk]."""
    if attn_mask is None or outputs is None:
        return attn_mask
    b, k = outputs.shape
    rows = attn_mask.expand(b, -1, -1, -1)
    return rows.gather(2, outputs[:, None, :, None].expand(b, 1, k, rows.shape[-1]))


def hole_room(length: int, budgets: Iterable[tuple[int, int]]) -> torch.Tensor:
    """[length] long: each position's room (``ModelConfig.room_buckets``), the positions left
    in its hole's budget counting itself, for ``budgets`` (start, end) half-open ranges;
    0 outside them. Clipping to the embedding's size is the model's business."""
    room = torch.zeros(length, dtype=torch.long)
    for start, end in budgets:
        end = min(end, length)
        if end > start:
            room[start:end] = torch.arange(end - start, 0, -1)
    return room


def fit_fim_context(prefix: list[int], suffix: list[int], room: int) -> tuple[list[int], list[int]]:
    """A FIM prompt's prefix and suffix cut to ``room`` tokens together: the prefix's far end
    first, then the suffix's. The AR route (``gpu_worker.engine.ar.fim_prompt``) and training's
    hole-mask rows (``research.train.fim_example``) cut alike, so a long row reads as the
    route's prompt would."""
    excess = len(prefix) + len(suffix) - room
    if excess <= 0:
        return prefix, suffix
    cut = min(excess, len(prefix))
    return prefix[cut:], suffix[: len(suffix) - (excess - cut)]


def save_model(model: StencilTransformer, directory: Path, *, dtype: torch.dtype) -> Path:
    """Write ``model.safetensors`` (in ``dtype``) and ``config.json`` into ``directory``."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    state = {  # integer tables (the copy head's twins) keep their type
        k: (v.detach().to(dtype) if v.is_floating_point() else v.detach()).contiguous()
        for k, v in model.state_dict().items()
    }
    weights = directory / "model.safetensors"
    save_file(state, str(weights))
    (directory / "config.json").write_text(
        json.dumps(model.config.to_json(), indent=2, sort_keys=True) + "\n"
    )
    return weights


def load_weights(directory: Path) -> dict[str, torch.Tensor]:
    """The state dict of a model directory's ``model.safetensors``, floating tensors as
    float32 (integer tables as saved)."""
    from safetensors.torch import load_file

    state = load_file(str(directory / "model.safetensors"))
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


def load_model(directory: Path, *, device: str | torch.device = "cpu") -> StencilTransformer:
    """Load a Stencil model directory written by :func:`save_model` (weights as float32)."""
    cfg = ModelConfig.from_json(json.loads((directory / "config.json").read_text()))
    model = StencilTransformer(cfg)
    model.load_state_dict(load_weights(directory))
    return model.to(device).eval()


def count_flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Approximate training FLOPs per token (6N plus attention), for the model card."""
    n_params = cfg.n_layers * (4 * cfg.d_model**2 + 3 * cfg.d_model * cfg.ffn_hidden)
    attention = cfg.n_layers * 2 * seq_len * cfg.d_model
    return 6 * n_params + 6 * attention + 6 * cfg.d_model * cfg.vocab_size


__all__ = [
    "KVCache",
    "ModelConfig",
    "StencilTransformer",
    "count_flops_per_token",
    "hole_room",
    "load_model",
    "load_weights",
    "save_model",
]
