"""Per-process model cache and device choice for workers (Django-free).

A worker process loads each model once. Two kinds of entry:

- a configured directory (``STENCIL_MODEL_DIR``, ``STENCIL_AR_MODEL_DIR``: asked for without a
  weights hash) is loaded once and kept for the life of the process;
- a model version (asked for with the weights hash its row names) is kept in a small LRU keyed
  by (directory, weights hash, device): the version in force and the one before it, so a
  rollback or two templates on two versions do not reload on every job. The least recently
  used is evicted and its memory freed. A version is checked on load: a directory that is gone
  or whose weights hash differs raises :class:`ModelVersionUnavailable`.

The caller (the job pipeline) decides which directory and hash a job runs with; this module
never asks the database. The device is CUDA when present unless configured.
"""

from __future__ import annotations

import gc
import threading
from collections import OrderedDict
from pathlib import Path

import torch

from gpu_worker.engine.backends import load_backend
from gpu_worker.engine.loaded import LoadedModel
from gpu_worker.engine.model_files import archived_version

VERSIONS_HELD = 2  # model versions kept loaded at once (the LRU's bound)

_lock = threading.Lock()
_configured: dict[tuple[str, str], LoadedModel] = {}
_versions: OrderedDict[tuple[str, str, str], LoadedModel] = OrderedDict()


class ModelVersionUnavailable(RuntimeError):
    """A model version's weights cannot be served: its directory is gone or was altered."""


def choose_device(preference: str = "auto") -> torch.device:
    """``auto`` picks CUDA when a GPU is visible, else the CPU; anything else is taken as is."""
    if preference == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(preference)


def device_name(device: torch.device) -> str:
    """The device's label in run records: "cpu", or "cuda:<GPU name>" (e.g. "cuda:NVIDIA H200")."""
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return device.type


def model_get(directory: Path, *, device: torch.device,
              weights_sha256: str | None = None) -> LoadedModel:  # fmt: skip
    """The model in ``directory`` on ``device``, loaded once per process.

    With ``weights_sha256`` (a model version) the weights must hash to it, else
    :class:`ModelVersionUnavailable`; versions are held in the LRU of :data:`VERSIONS_HELD`.
    """
    resolved = str(Path(directory).resolve())
    if weights_sha256 is None:
        key = (resolved, str(device))
        with _lock:
            loaded = _configured.get(key)
            if loaded is None:
                loaded = load_backend(Path(directory), device=device)
                _configured[key] = loaded
            return loaded
    version_key = (resolved, weights_sha256, str(device))
    with _lock:
        held = _versions.get(version_key)
        if held is not None:
            _versions.move_to_end(version_key)
            return held
        loaded = _load_version(Path(directory), device=device, weights_sha256=weights_sha256)
        _versions[version_key] = loaded
        while len(_versions) > VERSIONS_HELD:
            _versions.popitem(last=False)
            _free(device)
        return loaded


def _load_version(directory: Path, *, device: torch.device, weights_sha256: str) -> LoadedModel:
    if not (directory / "model.safetensors").is_file():
        raise ModelVersionUnavailable(f"its weights are gone: {directory / 'model.safetensors'} "
                                      "is not on this machine")  # fmt: skip
    try:
        loaded = load_backend(directory, device=device)
    except (OSError, ValueError) as exc:
        raise ModelVersionUnavailable(f"its directory {directory} cannot be loaded: {exc}") from exc
    if loaded.weights_sha256 != weights_sha256:
        kept = archived_version(directory, weights_sha256)  # a shipped model retrained since
        if kept is not None:
            return _load_version(kept, device=device, weights_sha256=weights_sha256)
        raise ModelVersionUnavailable(
            f"its weights in {directory} were altered: sha256 {loaded.weights_sha256[:12]}, "
            f"registered {weights_sha256[:12]}"
        )
    return loaded


def _free(device: torch.device) -> None:
    """Give an evicted model's memory back (the caller dropped the last reference)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def models_held() -> list[tuple[str, str]]:
    """The (directory, weights sha256) of each model version held, least recently used first."""
    with _lock:
        return [(directory, sha) for directory, sha, _device in _versions]


def model_cache_clear() -> None:
    with _lock:
        _configured.clear()
        _versions.clear()
