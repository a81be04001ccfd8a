"""Compare two sampler-bench runs of the same cases: two code revisions, side by side.

Not a test: it reads two ``results.json`` written by ``bench/sampler_bench.py`` and writes
``comparison.json`` and ``COMPARISON.md``: per config and case set, whether exact match,
validity, forward passes, tokens per forward and every document's sha256 are identical, and
the wall-time ratio (second run / first).

    python bench/sampler_compare.py BASE/results.json NEW/results.json --out bench/sampler/refactor
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

SAME = ("exact_match", "validity", "forward_passes", "tokens_per_forward", "padded_per_forward",
        "document_sha256")  # fmt: skip


def compare_routes(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Per route: the fields that must match, whether they do, and the wall ratio."""
    out = {}
    for name, b in base.items():
        n = new[name]
        differ = [key for key in SAME if key in b and b[key] != n.get(key)]
        out[name] = {
            "identical": not differ,
            "differs": differ,
            "exact_match": [b["exact_match"], n["exact_match"]],
            "forward_passes": [b["forward_passes"], n["forward_passes"]],
            "seconds_per_case": [b["seconds_per_case"], n["seconds_per_case"]],
            "wall_ratio": n["seconds_per_case"] / b["seconds_per_case"],
        }
    return out


def compare(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    sets = {"batch 1": compare_routes(base["batch1"], new["batch1"])}
    for key in ("documents", "drafting_documents"):
        if key in base:
            sets[key] = compare_routes(base[key]["routes"], new[key]["routes"])
    batched = []
    for b, n in zip(base["batched"], new["batched"], strict=True):
        same = all(b[k] == n[k] for k in ("config", "batch", "exact_match", "forward_passes"))
        batched.append({"config": b["config"], "batch": b["batch"], "identical": same,
                        "wall_ratio": n["seconds_per_case"] / b["seconds_per_case"]})  # fmt: skip
    ratios = [r["wall_ratio"] for routes in sets.values() for r in routes.values()]
    return {
        "sets": sets,
        "batched": batched,
        "precision_identical": base["precision"] == new["precision"],
        "every_route_identical": all(r["identical"] for routes in sets.values() for r in routes.values())
        and all(b["identical"] for b in batched),
        "wall_ratio_median": statistics.median(ratios),
        "wall_ratio_range": [min(ratios), max(ratios)],
        "cases": base["cases"],
        "threads": [base.get("threads"), new.get("threads")],
    }


def markdown(result: dict[str, Any], command: str) -> str:
    lines = ["# Sampler refactor: the bench before and after, side by side", "",
             f"Command: `{command}`. Both runs measured the same {result['cases']} cases and the "
             "same documents at the same time on the same machine (one thread each). A route is "
             "identical when its exact match, validity, forward passes, tokens and pads per "
             "forward and every document's sha256 are equal; the wall ratio is after / before.", "",
             f"Every route identical: **{result['every_route_identical']}**; precision study "
             f"identical: **{result['precision_identical']}**; wall ratio median "
             f"{result['wall_ratio_median']:.3f} (range {result['wall_ratio_range'][0]:.2f} to "
             f"{result['wall_ratio_range'][1]:.2f}).", ""]  # fmt: skip
    for label, routes in result["sets"].items():
        lines += [f"## {label}", "", "| config | identical | EM before / after | fwd passes before / after | wall ratio |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for name, r in routes.items():
            em, fwd = r["exact_match"], r["forward_passes"]
            lines.append(f"| {name} | {'yes' if r['identical'] else 'NO: ' + ', '.join(r['differs'])} | "
                         f"{em[0]:.3f} / {em[1]:.3f} | {fwd[0]:.1f} / {fwd[1]:.1f} | {r['wall_ratio']:.2f} |")  # fmt: skip
        lines.append("")
    lines += ["## batched", "", "| config | batch | identical | wall ratio |", "|---|---|---|---|"]
    lines += [f"| {b['config']} | {b['batch']} | {'yes' if b['identical'] else 'NO'} | {b['wall_ratio']:.2f} |"
              for b in result["batched"]]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, help="results.json of the first revision")
    parser.add_argument("new", type=Path, help="results.json of the second revision")
    parser.add_argument("--out", type=Path, default=Path("bench/sampler/refactor"))
    parser.add_argument("--command", default="", help="the commands that produced both runs")
    args = parser.parse_args(argv)
    result = compare(json.loads(args.base.read_text()), json.loads(args.new.read_text()))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "comparison.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result, args.command)
    (args.out / "COMPARISON.md").write_text(text)
    print(text)
    return 0 if result["every_route_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
