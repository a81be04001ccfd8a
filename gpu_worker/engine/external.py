"""The ``transformers`` path: a local Hugging Face masked LM that transformers knows (BERT,
RoBERTa, ModernBERT), read through :mod:`gpu_worker.engine.checkpoint`.

A masked LM's ``model(ids).logits`` predicts every position, with a mask token id in
``config.json`` (or ``tokenizer_config.json``'s mask token). This module adapts such a directory
(``config.json`` + weights + ``tokenizer.json``) to the model-backend protocol of
:mod:`gpu_worker.engine.backends`. It has no window forward, so a cached preset runs it without
its cache (``LoadedModel.fit_config``). LLaDA and Dream do not come here: Stencil runs them
natively (:mod:`gpu_worker.engine.native`).

Remote code is off by default. A checkpoint whose architecture neither Stencil nor
``transformers`` knows (it ships ``modeling_*.py`` through ``auto_map``) is refused with a clear
error unless the operator turns ``trust_remote_code`` on (argument, or the environment variable
``STENCIL_TRUST_REMOTE_CODE=1``). Nothing is ever downloaded: ``local_files_only`` always.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gpu_worker.engine.checkpoint import (
    INDEX_FILE,
    SINGLE_FILE,
    CheckpointError,
    CheckpointTokenizer,
    check_tokenizer,
    is_hf_directory,
    precision_name,
    special_ids,
    weight_files,
    weights_sha256,
)
from gpu_worker.engine.loaded import LoadedModel, file_sha256

TRUST_REMOTE_CODE_ENV = "STENCIL_TRUST_REMOTE_CODE"
EXTERNAL_KIND = "external"
MAX_LEN_KEYS = ("max_position_embeddings", "max_sequence_length", "n_positions", "model_max_length")
DEFAULT_MAX_LEN = 2048  # when the config names no context length
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


class RemoteCodeRefused(CheckpointError):
    """The checkpoint needs its own Python code and the operator has not allowed it."""


def trust_remote_code_from_env() -> bool:
    return os.environ.get(TRUST_REMOTE_CODE_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


class ExternalDenoiser(nn.Module):
    """``logits = model(ids [B, L], attention_mask [B, L]) -> [B, L, V]`` over a HF model."""

    def __init__(self, model: nn.Module, *, mask_id: int, pad_id: int, eos_id: int, max_len: int) -> None:
        super().__init__()
        self.model = model
        self.mask_id = mask_id
        self.pad_id = pad_id
        self.eos_id = eos_id
        self.max_len = max_len

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        kwargs: dict[str, Any] = {"input_ids": ids}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask.long()
        out = self.model(**kwargs)
        logits = out.logits if hasattr(out, "logits") else out[0]
        return logits  # [B, L, V]


def needs_remote_code(config: dict[str, Any]) -> bool:
    """True when ``transformers`` has no built-in class for the checkpoint's model_type."""
    from transformers import CONFIG_MAPPING

    model_type = config.get("model_type")
    return not isinstance(model_type, str) or model_type not in CONFIG_MAPPING


def load_external(
    directory: Path,
    *,
    device: str | torch.device = "cpu",
    trust_remote_code: bool | None = None,
    dtype: torch.dtype = torch.float32,
) -> LoadedModel:
    """Load a local Hugging Face masked LM through ``transformers`` as a :class:`LoadedModel`.

    ``trust_remote_code=None`` reads the operator setting (``STENCIL_TRUST_REMOTE_CODE``).
    Raises :class:`RemoteCodeRefused` for a custom-code checkpoint while it is off, and
    :class:`CheckpointError` (one line: the file and the fix) for an incomplete or
    unsuitable directory.
    """
    directory = Path(directory)
    allow = trust_remote_code_from_env() if trust_remote_code is None else trust_remote_code
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"model directory {directory} lacks config.json")
    if not (directory / "tokenizer.json").is_file():
        raise CheckpointError(
            f"model directory {directory} lacks tokenizer.json: copy the checkpoint's own "
            "tokenizer.json there"
        )
    weights = next((directory / w for w in WEIGHT_FILES if (directory / w).is_file()), None)
    if weights is None:
        raise CheckpointError(f"model directory {directory} has no weights ({', '.join(WEIGHT_FILES)})")
    files = weight_files(directory) if weights.name in (INDEX_FILE, SINGLE_FILE) else [weights]
    config = json.loads(config_path.read_text())
    if needs_remote_code(config):
        if "auto_map" not in config:
            raise CheckpointError(
                f"{config_path}: model_type {config.get('model_type')!r} (architectures "
                f"{config.get('architectures')}) is neither a family Stencil runs natively "
                "(LLaDA, Dream) nor a transformers model, and ships no code: use a LLaDA, Dream "
                "or transformers masked-LM (BERT, RoBERTa, ModernBERT) checkpoint"
            )
        if not allow:
            raise RemoteCodeRefused(
                f"{directory}: model_type {config.get('model_type')!r} needs the checkpoint's own "
                f"Python code ({', '.join(sorted(config['auto_map']))}); loading remote code is "
                f"off. An operator can allow it with {TRUST_REMOTE_CODE_ENV}=1 "
                "(or trust_remote_code=True) after reviewing that code"
            )
    special = special_ids(directory, config)
    tokenizer = CheckpointTokenizer(directory / "tokenizer.json", special)
    model = _load_hf_model(directory, config, allow, dtype)
    embedding: Any = model.get_input_embeddings()  # type: ignore[operator]  # a PreTrainedModel
    check_tokenizer(directory, tokenizer, int(embedding.num_embeddings))
    max_len = next((int(config[k]) for k in MAX_LEN_KEYS if isinstance(config.get(k), int)), DEFAULT_MAX_LEN)
    network = ExternalDenoiser(model, mask_id=special.mask, pad_id=special.pad, eos_id=special.eos, max_len=max_len)
    return LoadedModel(
        name=directory.name,
        directory=directory,
        network=network.to(device).eval(),
        tokenizer=tokenizer,
        weights_sha256=weights_sha256(files),
        tokenizer_sha256=file_sha256(directory / "tokenizer.json"),
        kind=EXTERNAL_KIND,
        placeholder=False,
        precision=precision_name(dtype),
        family="transformers",
    )


def _load_hf_model(directory: Path, config: dict[str, Any], allow: bool, dtype: torch.dtype) -> nn.Module:
    """A masked-LM head model if transformers has one for the architecture, else AutoModel;
    whatever transformers raises becomes one line naming the directory."""
    try:
        return _from_pretrained(directory, config, allow, dtype)
    except (CheckpointError, MemoryError):
        raise
    except Exception as exc:  # transformers' errors are many and unlisted
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CheckpointError(
            f"{directory}: transformers could not load this checkpoint ({type(exc).__name__}: "
            f"{reason[:300]}): check that config.json and the weights belong together"
        ) from exc


def _from_pretrained(directory: Path, config: dict[str, Any], allow: bool, dtype: torch.dtype) -> nn.Module:
    from transformers import AutoModel, AutoModelForMaskedLM

    common: dict[str, Any] = {"local_files_only": True, "trust_remote_code": allow, "dtype": dtype}
    auto_map = config.get("auto_map", {})
    if not needs_remote_code(config) or "AutoModelForMaskedLM" in auto_map:
        try:
            return AutoModelForMaskedLM.from_pretrained(str(directory), **common)
        except ValueError:  # no masked-LM class for this architecture: the base model
            pass
    return AutoModel.from_pretrained(str(directory), **common)


__all__ = [
    "EXTERNAL_KIND",
    "TRUST_REMOTE_CODE_ENV",
    "ExternalDenoiser",
    "RemoteCodeRefused",
    "is_hf_directory",
    "load_external",
    "needs_remote_code",
]
