"""Per-process model cache and device choice for workers (Django-free).

A worker process loads each model once; the device is CUDA when present unless configured.
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from gpu_worker.engine.backends import load_backend
from gpu_worker.engine.loaded import LoadedModel

_lock = threading.Lock()
_cache: dict[tuple[str, str], LoadedModel] = {}


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


def model_get(directory: Path, *, device: torch.device) -> LoadedModel:
    """The model in ``directory`` on ``device``, loaded once per process."""
    key = (str(Path(directory).resolve()), str(device))
    with _lock:
        loaded = _cache.get(key)
        if loaded is None:
            loaded = load_backend(Path(directory), device=device)
            _cache[key] = loaded
        return loaded


def model_cache_clear() -> None:
    with _lock:
        _cache.clear()
