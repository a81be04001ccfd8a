"""Readers of run records written under run-record schema_version 1 (Stencil 0.1.0).

The rule: a run record is read by the rules of the schema_version in its body, and only the
newest version is written. What a version-1 record holds that later ones do not:

- ``stencil.outcome.trace_sha256`` is the head of a second chain the engine kept then,
  separate from the stored trace's: genesis ``sha256(b"stencil-trace/1")``, each link
  ``sha256(prev || ascii_canonical_json(entry without its _ms keys))`` (the entry's JSON
  itself, not its hash, escaped to ASCII). :func:`engine_trace_sha256_v1` recomputes it, so
  replay checks a version-1 record's own head against the replayed trace.
- ``stencil.outcome.trace_chain_head`` repeats the stored chain's head (the ``trace_sha256``
  column), which is the one chain of :mod:`gpu_worker.engine.trace`.

The stored trace (``RunRecord.trace``) and every other hash are the same in all versions, so
``audit.trace`` and ``audit.verify`` read them without asking the version.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

SCHEMA_VERSION = 1  # the run-record schema version these readers serve
_ENGINE_GENESIS = hashlib.sha256(b"stencil-trace/1").hexdigest()


def engine_trace_sha256_v1(entries: Sequence[Mapping[str, Any]]) -> str:
    """The version-1 body's ``trace_sha256`` for a trace of raw entries."""
    head = _ENGINE_GENESIS
    for entry in entries:
        content = {k: v for k, v in entry.items() if not k.endswith("_ms")}
        text = json.dumps(content, sort_keys=True, separators=(",", ":"))
        head = hashlib.sha256((head + text).encode()).hexdigest()
    return head


__all__ = ["SCHEMA_VERSION", "engine_trace_sha256_v1"]
