"""The small JSON files a model directory may ship beside its weights (the confidence
calibration, the domain profile): parsed once per file version, None when absent."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def model_file(directory: Path, name: str, parse: Callable[[dict[str, Any]], T]) -> T | None:
    """``parse`` of the JSON file ``name`` in ``directory``; None when there is no such file.
    A file rewritten in place (a new modification time) is read again."""
    path = Path(directory) / name
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        return None
    return _parsed(str(path), stamp, parse)


@functools.lru_cache(maxsize=16)
def _parsed(path: str, _stamp: int, parse: Callable[[dict[str, Any]], Any]) -> Any:
    return parse(json.loads(Path(path).read_text(encoding="utf-8")))


ARCHIVE = "archive"  # beside the shipped model directories: their earlier weights


def archived_version(directory: Path, weights_sha256: str) -> Path | None:
    """The directory that keeps ``directory``'s model as it was when its weights hashed to
    ``weights_sha256``, if it is kept: ``<models>/archive/<name>-<first 12 hex digits>/``,
    a whole model directory (config, tokenizer, weights, calibration). A shipped model whose
    weights are retrained keeps its earlier ones there, so runs recorded with them still replay
    and versions registered on them still load. None when there is no such directory."""
    directory = Path(directory)
    kept = directory.parent / ARCHIVE / f"{directory.name}-{weights_sha256[:12]}"
    return kept if (kept / "model.safetensors").is_file() else None
