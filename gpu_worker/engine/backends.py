"""Model backends: load a model directory into a :class:`~gpu_worker.engine.loaded.LoadedModel`.

A shipped Stencil model (config.json + model.safetensors + tokenizer.json) or a Hugging Face
masked-diffusion checkpoint (:mod:`gpu_worker.engine.external`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from gpu_worker.engine.loaded import LoadedModel, file_sha256
from gpu_worker.engine.tokenizer import StencilTokenizer


def load_backend(
    directory: Path,
    *,
    device: str | torch.device = "cpu",
    trust_remote_code: bool | None = None,
) -> LoadedModel:
    """Load a model directory: a shipped Stencil model (config.json + model.safetensors +
    tokenizer.json), or a Hugging Face masked-diffusion checkpoint (see
    :mod:`gpu_worker.engine.external`; ``trust_remote_code=None`` reads the operator setting)."""
    directory = Path(directory)
    from gpu_worker.engine.external import is_hf_directory, load_external

    if is_hf_directory(directory):
        return load_external(directory, device=device, trust_remote_code=trust_remote_code)
    return _load_stencil(directory, device=device)


def _load_stencil(directory: Path, *, device: str | torch.device) -> LoadedModel:
    import json

    from gpu_worker.engine.model import load_model

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
