"""Model versions for tests: a model directory copied with weights of its own (a new hash)."""

from __future__ import annotations

import shutil
from pathlib import Path

from gpu_worker.engine.loaded import file_sha256


def version_directory(source: Path, target: Path, *, nudge: float) -> str:
    """Copy the model directory ``source`` to ``target`` with every floating weight moved by
    ``nudge`` (so its weights hash differs and its outputs may); returns the weights sha256."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target)
    weights = target / "model.safetensors"
    state = load_file(str(weights))
    moved = {name: (t + nudge if t.is_floating_point() else t).contiguous()
             for name, t in state.items()}  # fmt: skip
    save_file(moved, str(weights))
    return file_sha256(weights)
