"""The Stencil transformer: one model file for the denoiser and the AR-FIM baseline.

Both models share this architecture (RoPE, RMSNorm, SwiGLU, pre-norm residual blocks; see
:mod:`gpu_worker.engine.model_layers`); the denoiser attends bidirectionally, the AR-FIM
baseline causally. The config (:mod:`gpu_worker.engine.model_config`) is saved beside the
weights (``config.json``) so a checkpoint describes itself. The sampler's cached forward
passes are :mod:`gpu_worker.engine.model_cache`.

Shapes: B batch, L sequence length, W window length, H heads, D head dim, V vocabulary.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from gpu_worker.engine import model_cache
from gpu_worker.engine.model_config import CONFIG_FORMAT, ModelConfig, ModelKind
from gpu_worker.engine.model_layers import (
    Block,
    CopyHead,
    KVCache,
    RMSNorm,
    Window,
    output_rows,
    rope_tables,
)


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

    def forward_cache(self, mode: str) -> model_cache.ExactForward | model_cache.DualCache:
        """The sampler's forward passes over this model for one batch of canvases: exact
        (``mode`` "none"), with the dual cache ("dual") or delayed caching ("delayed"); each
        implements the sampler's ForwardCache protocol (see :mod:`gpu_worker.engine.model_cache`)."""
        return model_cache.for_mode(self, mode)

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
                h, logits, ids, window, cache, output_rows(attn_mask, outputs), picked
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
    "CONFIG_FORMAT",
    "KVCache",
    "ModelConfig",
    "ModelKind",
    "StencilTransformer",
    "count_flops_per_token",
    "fit_fim_context",
    "hole_room",
    "load_model",
    "load_weights",
    "save_model",
]
