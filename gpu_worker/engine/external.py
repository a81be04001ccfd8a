"""External masked-diffusion checkpoints in Hugging Face format, from a local directory.

LLaDA, Dream and MDLM style models are bidirectional networks whose ``model(ids).logits``
predicts every position, with a mask token id in ``config.json``. This module adapts such a
directory (``config.json`` + weights + ``tokenizer.json``) to the model-backend protocol of
:mod:`gpu_worker.engine.backends`, so the sampler can drive it like the shipped denoiser (without the
dual KV cache: use ``cache="none"``).

Remote code is off by default. A checkpoint whose architecture ``transformers`` does not know
(it ships ``modeling_*.py`` through ``auto_map``, as LLaDA and Dream do) is refused with a clear
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

from gpu_worker.engine.loaded import LoadedModel, file_sha256
from gpu_worker.engine.tokenizer import SpecialIds, StencilTokenizer

TRUST_REMOTE_CODE_ENV = "STENCIL_TRUST_REMOTE_CODE"
EXTERNAL_KIND = "external"
MASK_ID_KEYS = ("mask_token_id", "mask_id", "mask_index")  # LLaDA / Dream / MDLM spellings
MAX_LEN_KEYS = ("max_position_embeddings", "max_sequence_length", "n_positions", "model_max_length")
DEFAULT_MAX_LEN = 2048  # when the config names no context length
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
NO_ID = -1  # a special token the checkpoint does not have (the FIM sentinels)


class RemoteCodeRefused(ValueError):
    """The checkpoint needs its own Python code and the operator has not allowed it."""


def is_hf_directory(directory: Path) -> bool:
    """Whether ``directory`` looks like a Hugging Face checkpoint (not a Stencil one)."""
    config = directory / "config.json"
    if not config.is_file():
        return False
    data = json.loads(config.read_text())
    return "format" not in data and ("model_type" in data or "architectures" in data)


def trust_remote_code_from_env() -> bool:
    return os.environ.get(TRUST_REMOTE_CODE_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


class ExternalTokenizer(StencilTokenizer):
    """A checkpoint's own ``tokenizer.json`` with special ids taken from its config."""

    def __init__(self, path: Path, special: SpecialIds) -> None:
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(path))
        self.special = special
        self.virtual_spaces = False  # a checkpoint's tokenizer: text is tokenized as is
        self.spaced_lines = False
        added = self.tok.get_added_tokens_decoder()  # id -> AddedToken
        self._special_set = {i for i in (special.pad, special.eos, special.mask) if i != NO_ID}
        self._special_set |= {int(i) for i, token in added.items() if token.special}


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


def _first_id(value: Any) -> int | None:
    if isinstance(value, list):
        value = value[0] if value else None
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _token_id(tokenizer_path: Path, directory: Path, role: str) -> int | None:
    """The id of the tokenizer's ``<role>_token`` (from tokenizer_config.json), if any."""
    config = directory / "tokenizer_config.json"
    if not config.is_file():
        return None
    token = json.loads(config.read_text()).get(f"{role}_token")
    if isinstance(token, dict):
        token = token.get("content")
    if not isinstance(token, str):
        return None
    from tokenizers import Tokenizer

    found = Tokenizer.from_file(str(tokenizer_path)).token_to_id(token)
    return int(found) if found is not None else None


def special_ids(directory: Path, config: dict[str, Any]) -> SpecialIds:
    """mask / pad / eos ids from config.json, else from tokenizer_config.json's tokens."""
    tokenizer_path = directory / "tokenizer.json"
    mask = next((_first_id(config.get(k)) for k in MASK_ID_KEYS if _first_id(config.get(k)) is not None), None)
    if mask is None:
        mask = _token_id(tokenizer_path, directory, "mask")
    if mask is None:
        raise ValueError(
            f"{directory}: no mask token id: config.json has none of {list(MASK_ID_KEYS)} and "
            "tokenizer_config.json names no mask_token; this is not a masked-diffusion checkpoint"
        )
    eos = _first_id(config.get("eos_token_id"))
    eos = eos if eos is not None else _token_id(tokenizer_path, directory, "eos")
    pad = _first_id(config.get("pad_token_id"))
    pad = pad if pad is not None else _token_id(tokenizer_path, directory, "pad")
    eos = eos if eos is not None else (pad if pad is not None else NO_ID)
    pad = pad if pad is not None else eos
    return SpecialIds(pad=pad, eos=eos, mask=mask, fim_prefix=NO_ID, fim_suffix=NO_ID, fim_middle=NO_ID)


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
) -> LoadedModel:
    """Load a local Hugging Face masked-diffusion checkpoint as a :class:`LoadedModel`.

    ``trust_remote_code=None`` reads the operator setting (``STENCIL_TRUST_REMOTE_CODE``).
    Raises :class:`RemoteCodeRefused` for a custom-code checkpoint while it is off, and
    ``FileNotFoundError`` / ``ValueError`` for an incomplete or unsuitable directory.
    """
    directory = Path(directory)
    allow = trust_remote_code_from_env() if trust_remote_code is None else trust_remote_code
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"model directory {directory} lacks config.json")
    if not (directory / "tokenizer.json").is_file():
        raise FileNotFoundError(f"model directory {directory} lacks tokenizer.json")
    weights = next((directory / w for w in WEIGHT_FILES if (directory / w).is_file()), None)
    if weights is None:
        raise FileNotFoundError(f"model directory {directory} has no weights ({', '.join(WEIGHT_FILES)})")
    config = json.loads(config_path.read_text())
    if needs_remote_code(config):
        if "auto_map" not in config:
            raise ValueError(
                f"{directory}: model_type {config.get('model_type')!r} is unknown to transformers "
                "and the checkpoint ships no code (auto_map)"
            )
        if not allow:
            raise RemoteCodeRefused(
                f"{directory}: model_type {config.get('model_type')!r} needs the checkpoint's own "
                f"Python code ({', '.join(sorted(config['auto_map']))}); loading remote code is "
                f"off. An operator can allow it with {TRUST_REMOTE_CODE_ENV}=1 "
                "(or trust_remote_code=True) after reviewing that code"
            )
    special = special_ids(directory, config)
    model = _load_hf_model(directory, config, allow)
    max_len = next((int(config[k]) for k in MAX_LEN_KEYS if isinstance(config.get(k), int)), DEFAULT_MAX_LEN)
    network = ExternalDenoiser(model, mask_id=special.mask, pad_id=special.pad, eos_id=special.eos, max_len=max_len)
    return LoadedModel(
        name=directory.name,
        directory=directory,
        network=network.to(device).eval(),
        tokenizer=ExternalTokenizer(directory / "tokenizer.json", special),
        weights_sha256=file_sha256(weights),
        tokenizer_sha256=file_sha256(directory / "tokenizer.json"),
        kind=EXTERNAL_KIND,
        placeholder=False,
    )


def _load_hf_model(directory: Path, config: dict[str, Any], allow: bool) -> nn.Module:
    """A masked-LM head model if transformers has one for the architecture, else AutoModel."""
    from transformers import AutoModel, AutoModelForMaskedLM

    common: dict[str, Any] = {"local_files_only": True, "trust_remote_code": allow}
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
    "ExternalTokenizer",
    "RemoteCodeRefused",
    "is_hf_directory",
    "load_external",
    "needs_remote_code",
    "special_ids",
]
