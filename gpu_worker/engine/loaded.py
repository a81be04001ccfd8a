"""What a loaded model is: the network protocol the sampler talks to and the loaded pair.

``logits = model(ids [B, L], attention_mask [B, L]) -> [B, L, V]`` plus the ids of mask / pad /
eos and the longest sequence the model takes. A loaded model pairs the network with its
tokenizer and the hashes the audit record needs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from gpu_worker.engine.config import SamplerConfig
from gpu_worker.engine.tokenizer import StencilTokenizer


@runtime_checkable
class DenoiserModel(Protocol):
    """What a network must offer the sampler."""

    mask_id: int
    pad_id: int
    eos_id: int
    max_len: int

    def __call__(
        self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor: ...


@dataclass
class LoadedModel:
    """A network, its tokenizer and what identifies them in an audit record."""

    name: str
    directory: Path
    network: torch.nn.Module  # a DenoiserModel
    tokenizer: StencilTokenizer
    weights_sha256: str
    tokenizer_sha256: str
    kind: str  # "denoiser" | "ar_fim" | "external"
    placeholder: bool  # True when the weights are untrained (say so in the UI)
    # The dtype the network's weights are held in, so the one its forward runs in whatever
    # the sampler's precision says: "fp32" | "bf16" (a bf16 network is not run in fp32).
    precision: str = "fp32"
    # Which code runs the network: "stencil" (the shipped models), a native family ("llada",
    # "dream", see gpu_worker.engine.native) or "transformers" (a transformers masked LM).
    family: str = "stencil"
    # An instruction model's chat turn before the document (the directory's
    # stencil-preamble.json, gpu_worker.engine.preamble.Preamble), or None.
    preamble: Any = None

    def identity(self) -> dict[str, Any]:
        """What names this model in an outcome and an audit record."""
        return {"name": self.name, "kind": self.kind, "weights_sha256": self.weights_sha256,
                "tokenizer_sha256": self.tokenizer_sha256, "placeholder": self.placeholder,
                "precision": self.precision, "family": self.family}

    @property
    def has_window_forward(self) -> bool:
        """Whether the network offers ``forward_window`` (the dual and delayed caches)."""
        return hasattr(self.network, "forward_window")

    def fit_config(self, config: SamplerConfig) -> SamplerConfig:
        """``config`` as this model can run it: a network without a window forward runs a
        cached preset without its cache (``cache="none"``, exact); a block-diffusion network
        (``attention_block``) decodes its own attention blocks (``block_scope="attention"``)
        and runs any cached mode as its block KV cache (``cache="block"``); any other network
        runs ``cache="block"`` as ``"none"`` (both exact). Resolve a request's config with it
        before freezing it, so the frozen config says what ran."""
        block = int(getattr(self.network, "attention_block", 0))
        no_window = config.cache != "none" and not self.has_window_forward
        if no_window or (config.cache == "block" and not block):
            config = config.replace(cache="none")
        if block:
            cache = "none" if config.cache == "none" else "block"
            config = config.replace(block_scope="attention", block_length=block, cache=cache)
        return config


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
