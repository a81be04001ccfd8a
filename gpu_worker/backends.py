"""Model backends: the one small protocol the sampler and the AR route talk to.

``logits = model(ids [B, L], attention_mask [B, L]) -> [B, L, V]`` plus the ids of mask / pad /
eos and the longest sequence the model takes. A loaded backend pairs the network with its
tokenizer and the hashes the audit record needs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from gpu_worker.tokenizer import StencilTokenizer


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


def load_backend(
    directory: Path,
    *,
    device: str | torch.device = "cpu",
    trust_remote_code: bool | None = None,
) -> LoadedModel:
    """Load a model directory: a shipped Stencil model (config.json + model.safetensors +
    tokenizer.json), or a Hugging Face masked-diffusion checkpoint (see
    :mod:`gpu_worker.external`; ``trust_remote_code=None`` reads the operator setting)."""
    directory = Path(directory)
    from gpu_worker.external import is_hf_directory, load_external

    if is_hf_directory(directory):
        return load_external(directory, device=device, trust_remote_code=trust_remote_code)
    return _load_stencil(directory, device=device)


def _load_stencil(directory: Path, *, device: str | torch.device) -> LoadedModel:
    import json

    from gpu_worker.model import load_model

    for required in ("config.json", "model.safetensors", "tokenizer.json"):
        if not (directory / required).is_file():
            raise FileNotFoundError(f"model directory {directory} lacks {required}")
    network = load_model(directory, device=device)
    config = json.loads((directory / "config.json").read_text())
    return LoadedModel(
        name=directory.name,
        directory=directory,
        network=network,
        tokenizer=StencilTokenizer.from_file(
            directory / "tokenizer.json", virtual_spaces=bool(config.get("virtual_spaces", False)),
            spaced_lines=bool(config.get("spaced_lines", False))
        ),
        weights_sha256=file_sha256(directory / "model.safetensors"),
        tokenizer_sha256=file_sha256(directory / "tokenizer.json"),
        kind=str(config["kind"]),
        placeholder=bool(config.get("extra", {}).get("placeholder", False)),
    )
