"""The one canonical JSON, its sha256 helpers, and the one hash chain over a run's trace.

Canonical JSON is what every hash in Stencil is taken over: sorted keys, no spaces, non-ASCII
kept as UTF-8 (``ensure_ascii=False``). The audit's run records, log leaves and checkpoints
use the same functions (``audit.canonical`` names them for the audit).

A trace is the list of per-step entries a route appends (diffusion: one per sampler step, see
``gpu_worker.engine.infill.trace_entry``; AR: one per decoded token or choice). Keys ending in
``_ms`` are timings: they vary run to run, so they are never hashed. The chain over a trace:

    step_sha256 = sha256(canonical_json(entry without its timings))
    chain_0     = GENESIS (64 zeros)
    chain_k+1   = sha256(chain_k || step_sha256_k)      (hex digests, concatenated as text)

and its head (the last link, GENESIS for an empty trace) is ``Outcome.trace_sha256``. The
audit stores every link (``audit.trace``), so a stored trace verifies without the raw entries,
and replay compares runs step by step. Run records of schema_version 1 also carry a head from
an older, separate chain; only ``audit.legacy`` reads it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

GENESIS = "0" * 64  # the link before the first step
TIMING_SUFFIX = "_ms"  # entry keys ending so are timings, left out of every hash


def canonical_json(value: Any) -> str:
    """The one serialisation that is hashed: sorted keys, no spaces, non-ASCII kept as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(data: bytes | str) -> str:
    """sha256 hex digest of bytes, or of a string's UTF-8 encoding."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def json_sha256(value: Any) -> str:
    """sha256 of ``value``'s canonical JSON."""
    return sha256_hex(canonical_json(value))


def is_timing_key(key: str) -> bool:
    return key.endswith(TIMING_SUFFIX)


def plain(value: Any) -> Any:
    """JSON-ready form of a trace value: tensors and tuples become lists, sets sorted lists."""
    if hasattr(value, "tolist") and callable(value.tolist):
        return value.tolist()
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = [plain(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, set | frozenset) else items
    return value


def split_timings(entry: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(content, timings)`` of one entry, both in plain JSON form."""
    content: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    for key, value in plain(entry).items():
        (timings if is_timing_key(key) else content)[key] = value
    return content, timings


def step_sha256(entry: Mapping[str, Any]) -> str:
    """The hash of one entry's content (its timings left out)."""
    return json_sha256(split_timings(entry)[0])


def chain_link(prev: str, step_digest: str) -> str:
    """The link after ``prev`` for a step whose content hashes to ``step_digest``."""
    return sha256_hex(prev + step_digest)


def trace_chain(entries: Sequence[Mapping[str, Any]]) -> str:
    """The chain's head over ``entries``: equal runs give equal heads, whatever their timings."""
    head = GENESIS
    for entry in entries:
        head = chain_link(head, step_sha256(entry))
    return head


__all__ = [
    "GENESIS",
    "TIMING_SUFFIX",
    "canonical_json",
    "chain_link",
    "is_timing_key",
    "json_sha256",
    "plain",
    "sha256_hex",
    "split_timings",
    "step_sha256",
    "trace_chain",
]
