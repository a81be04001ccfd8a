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

    def identity(self) -> dict[str, Any]:
        """What names this model in an outcome and an audit record."""
        return {"name": self.name, "kind": self.kind, "weights_sha256": self.weights_sha256,
                "tokenizer_sha256": self.tokenizer_sha256, "placeholder": self.placeholder}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
