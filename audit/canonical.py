"""Canonical JSON (sorted keys, compact, UTF-8) and the sha256 helpers every audit record uses.

They are the engine's (:mod:`gpu_worker.engine.trace`): a run record's hashes and the engine's
trace hashes are taken over one serialisation.
"""

from __future__ import annotations

from gpu_worker.engine.trace import canonical_json, json_sha256, sha256_hex

__all__ = ["canonical_json", "json_sha256", "sha256_hex"]
