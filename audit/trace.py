"""The hashed trace: the sampler's per-step entries reduced to counts, hashes and summaries.

No raw text survives: lists become a count and a sha256 (numbers also min / max / mean),
strings become a sha256 unless they are hex digests or known labels. Steps are hash-chained:
``chain = sha256(prev || step_sha256)``, where ``step_sha256`` hashes the step's full raw
content minus its timings, so replay compares steps exactly while timings may differ.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from audit.canonical import json_sha256, sha256_hex

GENESIS = "0" * 64
_HEX_DIGEST = re.compile(r"^[0-9a-f]{16,128}$")
# keys whose string values are labels from config or templates, never generated text
_LABEL_KEYS = frozenset({"hole", "holes", "rule", "policy", "phase", "event", "kind", "name"})
_TIMING_EXACT = frozenset({"time", "elapsed", "timing", "timings", "duration", "wall", "latency"})
_TIMING_SUFFIXES = ("_ms", "_s", "_sec", "_seconds", "_time", "_elapsed", "_duration")


def is_timing_key(key: str) -> bool:
    k = key.lower()
    return k in _TIMING_EXACT or k.endswith(_TIMING_SUFFIXES) or k.startswith(("time", "elapsed"))


def _plain(value: Any) -> Any:
    """JSON-able form of a step value (tensors and tuples become lists)."""
    if hasattr(value, "tolist") and callable(value.tolist):
        return value.tolist()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = [_plain(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, set | frozenset) else items
    return value


def _summarize(key: str, value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        if _HEX_DIGEST.match(value) or key in _LABEL_KEYS:
            return value
        return {"sha256": sha256_hex(value), "chars": len(value)}
    if isinstance(value, Mapping):
        return {str(k): _summarize(str(k), v) for k, v in value.items()}
    if isinstance(value, list):
        summary: dict[str, Any] = {"count": len(value), "sha256": json_sha256(value)}
        numbers = [v for v in value if isinstance(v, int | float) and not isinstance(v, bool)]
        if numbers and len(numbers) == len(value):
            summary.update(min=min(numbers), max=max(numbers), mean=sum(numbers) / len(numbers))
        return summary
    return {"sha256": sha256_hex(repr(value))}


def _split_timing(step: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    content: dict[str, Any] = {}
    timing: dict[str, Any] = {}
    for key, value in step.items():
        (timing if is_timing_key(str(key)) else content)[str(key)] = value
    return content, timing


def trace_hash(raw_trace: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The hashed, chained trace of a sampler's ``trace`` list."""
    prev = GENESIS
    out: list[dict[str, Any]] = []
    for i, raw_step in enumerate(raw_trace):
        content, timing = _split_timing(_plain(raw_step))
        step_sha = json_sha256(content)
        chain = sha256_hex(prev + step_sha)
        index = content.get("step", content.get("index", i))
        out.append(
            {
                "index": index if isinstance(index, int) else i,
                "data": {k: _summarize(k, v) for k, v in content.items()},
                "timing": {k: _summarize(k, v) for k, v in timing.items()},
                "step_sha256": step_sha,
                "prev": prev,
                "chain": chain,
            }
        )
        prev = chain
    return out


def trace_head(hashed: Sequence[Mapping[str, Any]]) -> str:
    return str(hashed[-1]["chain"]) if hashed else GENESIS


def trace_chain_valid(hashed: Sequence[Mapping[str, Any]]) -> int | None:
    """The position of the first broken link, or None when the chain holds."""
    prev = GENESIS
    for pos, step in enumerate(hashed):
        if step.get("prev") != prev or step.get("chain") != sha256_hex(
            prev + str(step.get("step_sha256"))
        ):
            return pos
        prev = str(step["chain"])
    return None


@dataclass(frozen=True)
class Divergence:
    step: int  # the step index (position in the trace when the sampler gives none)
    what: str


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _describe(recorded: Mapping[str, Any], replayed: Mapping[str, Any]) -> str:
    parts = []
    for key in sorted(set(recorded) | set(replayed)):
        a, b = recorded.get(key), replayed.get(key)
        if a != b:
            if isinstance(a, Mapping) and isinstance(b, Mapping) and "count" in a and "count" in b:
                parts.append(f"{key} count {a['count']} -> {b['count']}, hash differs")
            else:
                parts.append(f"{key} {_short(a)} -> {_short(b)}")
    return "; ".join(parts) or "step content hash differs"


def trace_compare(
    recorded: Sequence[Mapping[str, Any]], replayed: Sequence[Mapping[str, Any]]
) -> Divergence | None:
    """The first step where two hashed traces differ (timings ignored), or None."""
    for pos, (a, b) in enumerate(zip(recorded, replayed, strict=False)):
        if a["step_sha256"] != b["step_sha256"]:
            return Divergence(step=int(a.get("index", pos)), what=_describe(a["data"], b["data"]))
    if len(recorded) != len(replayed):
        return Divergence(
            step=min(len(recorded), len(replayed)),
            what=f"recorded {len(recorded)} steps, replay took {len(replayed)}",
        )
    return None
