"""The stored trace: the engine's per-step entries reduced to counts, hashes and summaries.

No raw text survives: lists become a count and a sha256 (numbers also min / max / mean),
strings become a sha256 unless they are hex digests or known labels. Each stored step keeps
the link of the engine's one hash chain (:mod:`gpu_worker.engine.trace`): ``step_sha256``
hashes the step's full content minus its timings, ``chain = sha256(prev || step_sha256)``,
so a stored trace verifies on its own, its last ``chain`` is ``Outcome.trace_sha256``, and
replay compares steps exactly while timings may differ. Every schema version stores this form.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_worker.engine.trace import GENESIS, chain_link, json_sha256, sha256_hex, split_timings

_HEX_DIGEST = re.compile(r"^[0-9a-f]{16,128}$")
# keys whose string values are labels from config or templates, never generated text
_LABEL_KEYS = frozenset({"hole", "holes", "rule", "policy", "phase", "event", "kind", "name"})


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


def trace_hash(raw_trace: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The stored form of an outcome's ``trace``: summaries plus the chain's links."""
    prev = GENESIS
    out: list[dict[str, Any]] = []
    for i, raw_step in enumerate(raw_trace):
        content, timing = split_timings(raw_step)
        step_sha = json_sha256(content)
        chain = chain_link(prev, step_sha)
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
        if step.get("prev") != prev or step.get("chain") != chain_link(
            prev, str(step.get("step_sha256"))
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
