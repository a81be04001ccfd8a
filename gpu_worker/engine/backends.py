"""Model backends: load a model directory into a :class:`~gpu_worker.engine.loaded.LoadedModel`.

- a shipped Stencil model (config.json + model.safetensors + tokenizer.json);
- a Hugging Face checkpoint of a family Stencil runs natively, LLaDA or Dream
  (:mod:`gpu_worker.engine.native`: Stencil's own forward, no checkpoint code);
- a Hugging Face masked LM that ``transformers`` knows, BERT, RoBERTa or ModernBERT
  (:mod:`gpu_worker.engine.external`).

Anything else is refused with one line naming the file and the fix (a block-diffusion
checkpoint with the reason). A ``stencil-preamble.json`` beside the weights is an instruction
model's chat turn, placed before every document (:mod:`gpu_worker.engine.preamble`). The dtype
the weights are held in is the operator's ``STENCIL_MODEL_DTYPE`` (``auto``: bf16 on a GPU, fp32 on the CPU); the shipped models are
always fp32.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from gpu_worker.engine.loaded import LoadedModel, file_sha256
from gpu_worker.engine.tokenizer import StencilTokenizer

DTYPE_ENV = "STENCIL_MODEL_DTYPE"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
AUTO = "auto"


def model_dtype(device: torch.device, setting: str | None = None) -> torch.dtype:
    """The dtype a checkpoint's weights are loaded in: ``setting`` (default: the
    ``STENCIL_MODEL_DTYPE`` environment variable), "auto" = bf16 on CUDA, else fp32."""
    value = (os.environ.get(DTYPE_ENV, AUTO) if setting is None else setting).strip().lower() or AUTO
    if value == AUTO:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if value not in DTYPES:
        raise ValueError(f"{DTYPE_ENV}={value!r} is not one of {[AUTO, *DTYPES]}")
    return DTYPES[value]


def load_backend(
    directory: Path,
    *,
    device: str | torch.device = "cpu",
    trust_remote_code: bool | None = None,
    dtype: str | None = None,
) -> LoadedModel:
    """Load a model directory (see the module docstring). ``trust_remote_code=None`` reads the
    operator setting (``STENCIL_TRUST_REMOTE_CODE``), ``dtype=None`` reads
    ``STENCIL_MODEL_DTYPE``. Raises :class:`~gpu_worker.engine.checkpoint.CheckpointError` (a
    ValueError, one line) for a directory that cannot be run as it is."""
    from gpu_worker.engine.checkpoint import is_hf_directory, read_hf_config
    from gpu_worker.engine.external import load_external
    from gpu_worker.engine.native import family_of, load_native, refuse_block_diffusion
    from gpu_worker.engine.preamble import check_preamble, load_preamble

    directory = Path(directory)
    device = torch.device(device)
    preamble = load_preamble(directory)  # checked first: a bad file stops the load at once
    if not is_hf_directory(directory):
        loaded = _load_stencil(directory, device=device)
    else:
        config = read_hf_config(directory)
        refuse_block_diffusion(config, directory / "config.json")
        weights_dtype = model_dtype(device, dtype)
        family = family_of(config)
        if family is not None:
            loaded = load_native(directory, config, family, device=device, dtype=weights_dtype)
        else:
            loaded = load_external(directory, device=device, trust_remote_code=trust_remote_code,
                                   dtype=weights_dtype)  # fmt: skip
    if preamble is not None:
        check_preamble(preamble, loaded.tokenizer, directory)
    loaded.preamble = preamble
    return loaded


def _load_stencil(directory: Path, *, device: torch.device) -> LoadedModel:
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
