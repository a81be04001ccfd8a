"""Hugging Face checkpoints from a local directory: their tokenizer and special ids, and the
``transformers`` path for masked LMs it knows (BERT, RoBERTa, ModernBERT).

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

from gpu_worker.engine.loaded import LoadedModel, file_sha256
from gpu_worker.engine.native.weights import CheckpointError
from gpu_worker.engine.tokenizer import SpecialIds, StencilTokenizer

TRUST_REMOTE_CODE_ENV = "STENCIL_TRUST_REMOTE_CODE"
EXTERNAL_KIND = "external"
MASK_ID_KEYS = ("mask_token_id", "mask_id", "mask_index")  # LLaDA / Dream / MDLM spellings
MAX_LEN_KEYS = ("max_position_embeddings", "max_sequence_length", "n_positions", "model_max_length")
DEFAULT_MAX_LEN = 2048  # when the config names no context length
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
NO_ID = -1  # a special token the checkpoint does not have (the FIM sentinels)
PROBE_WORD = "a"  # a word every vocabulary spells with one token (see ExternalTokenizer.token_text)


class RemoteCodeRefused(CheckpointError):
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
        self.tok.encode_special_tokens = True  # typed text never becomes a special id
        added = self.tok.get_added_tokens_decoder()  # id -> AddedToken
        self._special_set = {i for i in (special.pad, special.eos, special.mask) if i != NO_ID}
        self._special_set |= {int(i) for i, token in added.items() if token.special}
        # A one-letter word, which token_text writes each token after, and its own text.
        self._probe = list(self.tok.encode(PROBE_WORD, add_special_tokens=False).ids)
        self._probe_text = str(self.tok.decode(self._probe, skip_special_tokens=False))

    def token_text(self, token_id: int) -> str:
        """The text a token adds after a word, as the tokenizer decodes it: a token's own text
        for byte-level BPE; with a leading space for a WordPiece or SentencePiece word start
        (" smith", where "##ing" adds "ing"). A hole after a locked space ("seeing " + hole)
        starts with a word-start token in every vocabulary, so this is what its first
        position may take (see gpu_worker.engine.canvas's forced prefix)."""
        if token_id in self._special_set or not self._probe:
            return ""
        both = str(self.tok.decode([*self._probe, token_id], skip_special_tokens=False))
        before = self._probe_text
        return both[len(before) :] if both.startswith(before) else both


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
        raise CheckpointError(
            f"{directory / 'config.json'}: no mask token id (none of {list(MASK_ID_KEYS)}, and "
            "tokenizer_config.json names no mask_token): set mask_token_id to the id of the "
            f"tokenizer's mask token{_mask_hint(tokenizer_path)}; a model without one is not a "
            "masked-diffusion model"
        )
    eos = _first_id(config.get("eos_token_id"))
    eos = eos if eos is not None else _token_id(tokenizer_path, directory, "eos")
    pad = _first_id(config.get("pad_token_id"))
    pad = pad if pad is not None else _token_id(tokenizer_path, directory, "pad")
    eos = eos if eos is not None else (pad if pad is not None else NO_ID)
    pad = pad if pad is not None else eos
    return SpecialIds(pad=pad, eos=eos, mask=mask, fim_prefix=NO_ID, fim_suffix=NO_ID, fim_middle=NO_ID)


def _mask_candidates(tokenizer_path: Path) -> list[tuple[str, int]]:
    """The tokenizer's added tokens whose text says "mask", with their ids."""
    if not tokenizer_path.is_file():
        return []
    from tokenizers import Tokenizer

    added = Tokenizer.from_file(str(tokenizer_path)).get_added_tokens_decoder()
    return sorted((t.content, int(i)) for i, t in added.items() if "mask" in t.content.lower())


def _mask_hint(tokenizer_path: Path) -> str:
    found = _mask_candidates(tokenizer_path)
    return f" ({', '.join(f'{text} is {i}' for text, i in found)})" if found else ""


def check_tokenizer(directory: Path, tokenizer: ExternalTokenizer, rows: int) -> None:
    """Refuse a tokenizer that does not belong to the network (more tokens than embedding
    rows) and a mask id that is not a mask token: one line each, naming the file and the fix.
    A tokenizer smaller than the embedding is normal (rows are padded to a round number)."""
    size, mask = tokenizer.vocab_size, tokenizer.special.mask
    path = directory / "tokenizer.json"
    if size > rows:
        raise CheckpointError(
            f"{path} has {size} tokens but the network's embedding has {rows} rows: the "
            "tokenizer belongs to another model; put the checkpoint's own tokenizer.json there"
        )
    if not 0 <= mask < size:
        raise CheckpointError(
            f"{directory / 'config.json'}: mask_token_id {mask} is not one of the tokenizer's "
            f"{size} ids: set it to the id of the tokenizer's mask token{_mask_hint(path)}"
        )
    if mask not in tokenizer.tok.get_added_tokens_decoder():
        raise CheckpointError(
            f"{directory / 'config.json'}: mask_token_id {mask} is the ordinary token "
            f"{tokenizer.tok.id_to_token(mask)!r} of tokenizer.json, not a mask token: set it to "
            f"the id of the tokenizer's mask token{_mask_hint(path)}"
        )


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
    from gpu_worker.engine.native.identity import weights_sha256
    from gpu_worker.engine.native.weights import INDEX_FILE, weight_files

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
    files = weight_files(directory) if weights.name in (INDEX_FILE, "model.safetensors") else [weights]
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
    tokenizer = ExternalTokenizer(directory / "tokenizer.json", special)
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
        precision={torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype],
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
    "check_tokenizer",
    "TRUST_REMOTE_CODE_ENV",
    "ExternalDenoiser",
    "ExternalTokenizer",
    "RemoteCodeRefused",
    "is_hf_directory",
    "load_external",
    "needs_remote_code",
    "special_ids",
]
