"""Two runs of ``python -m gpu_worker.evaluate`` on the same cases, compared case by case.

Each run's ``results.json`` holds every case with its document seed, hole kind and target, so
the same case can be matched in both runs (for each model) even when the two pairs of models
read it through different vocabularies. For each model and hole kind: the exact match of
each run, and the paired difference with a 95% bootstrap interval (2,000 resamples of the
matched cases, seeded), which says whether a change is more than the noise of the sample.
With ``--doc-kind KIND`` two more rows per model split the cases into that document kind's
and every other kind's (after a corpus edition that changed one kind, say).

    python bench/compare_eval.py BEFORE/results.json AFTER/results.json [--doc-kind KIND] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESAMPLES = 2000


def _key(case: dict[str, Any]) -> tuple[str, str, int, str]:
    return case["kind"], case["doc_kind"], case["seed"], case["target"]


def paired(before: list[dict[str, Any]], after: list[dict[str, Any]], seed: int = 0) -> dict[str, Any]:
    """Exact match before and after on the cases both runs hold, and the difference's interval."""
    old = {_key(c): bool(c["exact"]) for c in before}
    new = {_key(c): bool(c["exact"]) for c in after}
    common = sorted(k for k in old if k in new)
    if not common:
        raise ValueError("the two runs share no case (another split or other documents?)")
    diffs = [int(new[k]) - int(old[k]) for k in common]
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(diffs) for _ in diffs) / len(diffs) for _ in range(RESAMPLES))
    return {
        "cases": len(common),
        "before": sum(old[k] for k in common) / len(common),
        "after": sum(new[k] for k in common) / len(common),
        "difference": sum(diffs) / len(diffs),
        "interval_95": [means[int(0.025 * RESAMPLES)], means[int(0.975 * RESAMPLES) - 1]],
        "better": diffs.count(1),
        "worse": diffs.count(-1),
    }


def _where(before: dict[str, Any], after: dict[str, Any], model: str,
           keep: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:  # fmt: skip
    """:func:`paired` over the model's cases that ``keep`` selects, in both runs."""
    return paired([c for c in before["cases"] if c["model"] == model and keep(c)],
                  [c for c in after["cases"] if c["model"] == model and keep(c)])  # fmt: skip


def compare(before: dict[str, Any], after: dict[str, Any], doc_kind: str | None = None) -> dict[str, Any]:
    if before.get("split") != after.get("split"):
        raise ValueError(f"one run is on {before.get('split')}, the other on {after.get('split')}")
    out: dict[str, Any] = {"split": after.get("split"), "models": {}}
    for model in ("denoiser", "ar_fim"):
        rows = {"all": _where(before, after, model, lambda c: True)}
        if doc_kind is not None:
            rows[f"{doc_kind} documents"] = _where(before, after, model, lambda c: c["doc_kind"] == doc_kind)
            rows["other documents"] = _where(before, after, model, lambda c: c["doc_kind"] != doc_kind)
        for kind in after["per_kind"]:
            rows[kind] = _where(before, after, model, lambda c, kind=kind: c["kind"] == kind)
        out["models"][model] = rows
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = ["| model | hole kind | n | before | after | difference (95% interval) | better / worse |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for model, rows in result["models"].items():
        for kind, r in rows.items():
            low, high = r["interval_95"]
            lines.append(f"| {model} | {kind} | {r['cases']} | {r['before']:.3f} | {r['after']:.3f} | "
                         f"{r['difference']:+.3f} ({low:+.3f} to {high:+.3f}) | "
                         f"{r['better']} / {r['worse']} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--doc-kind", help="also split the cases into this document kind's and the rest")
    parser.add_argument("--out", type=Path, help="write the comparison as JSON here")
    args = parser.parse_args(argv)
    result = compare(json.loads(args.before.read_text()), json.loads(args.after.read_text()), args.doc_kind)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))


if __name__ == "__main__":
    main()
