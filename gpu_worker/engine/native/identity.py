"""What names a checkpoint's weights in a run record: a sha256 over every weight file.

A single ``model.safetensors`` is named by its own sha256 (as a shipped Stencil model is). A
sharded checkpoint is named by the sha256 of one line per shard, in the index's order:
``<file name> <sha256 of the file>``; the index itself only maps tensor names to files, so two
different models with the same layout would share its hash.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from gpu_worker.engine.loaded import file_sha256


def weights_sha256(files: list[Path]) -> str:
    """sha256 of a checkpoint's weight files (see the module docstring)."""
    if len(files) == 1:
        return file_sha256(files[0])
    lines = "".join(f"{path.name} {file_sha256(path)}\n" for path in files)
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


__all__ = ["weights_sha256"]
