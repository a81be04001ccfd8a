"""A Hugging Face model directory as Stencil reads it: its weight files and their identity,
its config.json, its tokenizer and special ids, and the one-line errors for a directory that
cannot be run as it is (:class:`CheckpointError`: the file and the fix).

Both checkpoint backends read directories through here: the native families
(:mod:`gpu_worker.engine.native`) and transformers' masked LMs (:mod:`gpu_worker.engine.external`).

A single ``model.safetensors`` is identified by its own sha256 (as a shipped Stencil model is).
A sharded checkpoint by the sha256 of one line per shard, in the index's order:
``<file name> <sha256 of the file>``; the index itself only maps tensor names to files, so two
different models with the same layout would share its hash.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from gpu_worker.engine.loaded import file_sha256
from gpu_worker.engine.tokenizer import SpecialIds, StencilTokenizer

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
PICKLE_FILE = "pytorch_model.bin"
MASK_ID_KEYS = ("mask_token_id", "mask_id", "mask_index")  # LLaDA / Dream / MDLM spellings
NO_ID = -1  # a special token the checkpoint does not have (the FIM sentinels)
PROBE_WORD = "a"  # a word every vocabulary spells with one token (see CheckpointTokenizer.token_text)


class CheckpointError(ValueError):
    """A model directory that cannot be run as it is: the message names the file and the fix."""


# -- files and identity ----------------------------------------------------------------------
def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a checkpoint: ``model.safetensors``, or every shard its index
    lists (in the index's order). A shard the index lists but the directory lacks is an error."""
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(
                f"{index}: not a safetensors index ({exc}); download the checkpoint's "
                f"{INDEX_FILE} again"
            ) from None
        shards = list(dict.fromkeys(str(name) for name in weight_map.values()))
        missing = [name for name in shards if not (directory / name).is_file()]
        if missing:
            raise CheckpointError(
                f"{index} lists {missing[0]}, which is not in {directory}"
                f"{f' ({len(missing)} shards missing)' if len(missing) > 1 else ''}: download "
                "every shard the index names"
            )
        return [directory / name for name in shards]
    if (directory / SINGLE_FILE).is_file():
        return [directory / SINGLE_FILE]
    if (directory / PICKLE_FILE).is_file():
        raise CheckpointError(
            f"{directory / PICKLE_FILE}: Stencil reads weights from safetensors only (a pickle "
            "can run code); download the checkpoint's model*.safetensors files instead"
        )
    raise CheckpointError(
        f"{directory} has no weights: put the checkpoint's {SINGLE_FILE} (or {INDEX_FILE} and "
        "its shards) there"
    )


def weights_sha256(files: list[Path]) -> str:
    """sha256 of a checkpoint's weight files (see the module docstring)."""
    if len(files) == 1:
        return file_sha256(files[0])
    lines = "".join(f"{path.name} {file_sha256(path)}\n" for path in files)
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


def is_hf_directory(directory: Path) -> bool:
    """Whether ``directory`` looks like a Hugging Face checkpoint (not a Stencil one)."""
    config = directory / "config.json"
    if not config.is_file():
        return False
    try:
        data = json.loads(config.read_text())
    except ValueError:
        return True  # unreadable: read_hf_config says so in one line
    return isinstance(data, dict) and "format" not in data and ("model_type" in data or "architectures" in data)


def read_hf_config(directory: Path) -> dict[str, Any]:
    """The directory's config.json as a dict (CheckpointError when it is not one)."""
    path = directory / "config.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not readable JSON ({exc}); download it again") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: not a JSON object; download it again")
    return data


def precision_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


# -- tokenizer and special ids ---------------------------------------------------------------
class CheckpointTokenizer(StencilTokenizer):
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


def check_tokenizer(directory: Path, tokenizer: CheckpointTokenizer, rows: int) -> None:
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


__all__ = [
    "INDEX_FILE",
    "NO_ID",
    "SINGLE_FILE",
    "CheckpointError",
    "CheckpointTokenizer",
    "check_tokenizer",
    "is_hf_directory",
    "precision_name",
    "read_hf_config",
    "special_ids",
    "weight_files",
    "weights_sha256",
]
