"""Compare two sampler-bench runs of the same cases: two code revisions, side by side.

Not a test: it reads two ``results.json`` written by ``bench/sampler_bench.py`` and writes
``comparison.json`` and ``COMPARISON.md``: per config and case set, whether exact match,
validity, forward passes, tokens per forward and every document's sha256 are identical, and
the wall-time ratio (second run / first).

    python bench/sampler_compare.py BASE/results.json NEW/results.json --out bench/sampler/refactor

With ``--alternate BASE_TREE NEW_TREE`` it also times a few of the bench's batch-1 routes in
each checkout, one process at a time, alternating the order (ABBA) for ``--rounds`` rounds,
so load that drifts on a shared machine falls on both; it writes ``alternating.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
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
    totals = {label: sum(r["seconds_per_case"][1] for r in routes.values())
              / sum(r["seconds_per_case"][0] for r in routes.values())
              for label, routes in sets.items()}  # fmt: skip
    reference = None  # the AR-FIM route: code neither revision changed, so its ratio is noise
    if base.get("ar_fim") and new.get("ar_fim"):
        reference = new["ar_fim"]["seconds_per_case"] / base["ar_fim"]["seconds_per_case"]
    return {
        "sets": sets,
        "wall_ratio_of_totals": totals,
        "wall_ratio_ar_fim": reference,
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
             f"{result['wall_ratio_range'][1]:.2f}). Summed over each set's routes: "
             + ", ".join(f"{k} {v:.3f}" for k, v in result["wall_ratio_of_totals"].items())
             + (f"; the AR-FIM route, which neither revision changed: "
                f"{result['wall_ratio_ar_fim']:.3f} (the noise)." if result["wall_ratio_ar_fim"] else "."),
             ""]  # fmt: skip
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


ALTERNATE_ROUTES = ("even-1/step", "threshold-0.9", "threshold-0.9+cache",
                    "threshold-0.1/anchored-0.7+delayed/once", "threshold-0.3+delayed",
                    "even-1/step+delayed")  # fmt: skip
# Run inside a checkout: its own bench grid, cases and engine; prints {route: [seconds, passes]}
TIMING = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, ".")
from bench.sampler_bench import eval_cases, sampler_grid
from gpu_worker.engine.backends import load_backend
from gpu_worker.engine.infill import infill_request
loaded = load_backend(Path("models/stencil-denoiser"))
cases, grid = eval_cases(loaded, 1), sampler_grid()
for case in cases:
    infill_request(loaded, case.request, config=grid["threshold-0.9"])
out = {}
for name in sys.argv[1].split(","):
    started, passes = time.perf_counter(), 0
    for case in cases:
        passes += infill_request(loaded, case.request, config=grid[name]).forward_passes
    out[name] = [time.perf_counter() - started, passes]
print(json.dumps(out))
"""


def alternate(trees: list[Path], rounds: int) -> dict[str, Any]:
    """Wall time of ALTERNATE_ROUTES in each checkout, ABBA, one thread, one at a time."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs: list[dict[str, Any]] = []
    for i in range(rounds):
        for which in ((0, 1) if i % 2 == 0 else (1, 0)):
            tree = trees[which]
            done = subprocess.run([sys.executable, "-c", TIMING, ",".join(ALTERNATE_ROUTES)],
                                  cwd=tree, env={**env, "PYTHONPATH": str(tree)},
                                  capture_output=True, text=True, check=True)  # fmt: skip
            runs.append({"round": i, "tree": ["base", "new"][which], "times": json.loads(done.stdout)})
    summary = {}
    for name in (*ALTERNATE_ROUTES, "total"):
        base = {r["round"]: _seconds(r, name) for r in runs if r["tree"] == "base"}
        new = {r["round"]: _seconds(r, name) for r in runs if r["tree"] == "new"}
        ratios = [new[k] / base[k] for k in base]
        summary[name] = {"base_median_s": statistics.median(base.values()),
                         "new_median_s": statistics.median(new.values()),
                         "ratio_median": statistics.median(ratios),
                         "ratio_range": [min(ratios), max(ratios)]}  # fmt: skip
    passes_equal = all(r["times"][n][1] == runs[0]["times"][n][1] for r in runs for n in ALTERNATE_ROUTES)
    return {"rounds": rounds, "routes": summary, "forward_passes_equal": passes_equal, "runs": runs}


def _seconds(run: dict[str, Any], name: str) -> float:
    times = run["times"]
    return sum(float(t[0]) for t in times.values()) if name == "total" else float(times[name][0])


def alternate_markdown(result: dict[str, Any]) -> str:
    lines = ["", "## Alternating timing", "",
             f"{result['rounds']} rounds, one process at a time, ABBA order, one thread; forward "
             f"passes equal in every run: **{result['forward_passes_equal']}**.", "",
             "| routes (5 cases each) | before, median s | after, median s | ratio median | ratio range |",
             "|---|---|---|---|---|"]  # fmt: skip
    for name, r in result["routes"].items():
        lines.append(f"| {name} | {r['base_median_s']:.3f} | {r['new_median_s']:.3f} | "
                     f"{r['ratio_median']:.3f} | {r['ratio_range'][0]:.2f} to {r['ratio_range'][1]:.2f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, help="results.json of the first revision")
    parser.add_argument("new", type=Path, help="results.json of the second revision")
    parser.add_argument("--out", type=Path, default=Path("bench/sampler/refactor"))
    parser.add_argument("--command", default="", help="the commands that produced both runs")
    parser.add_argument("--alternate", nargs=2, type=Path, metavar=("BASE_TREE", "NEW_TREE"),
                        help="also time both checkouts one after the other (see above)")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args(argv)
    result = compare(json.loads(args.base.read_text()), json.loads(args.new.read_text()))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "comparison.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result, args.command)
    if args.alternate:
        timing = alternate([p.resolve() for p in args.alternate], args.rounds)
        (args.out / "alternating.json").write_text(json.dumps(timing, indent=2) + "\n")
        text += alternate_markdown(timing)
    (args.out / "COMPARISON.md").write_text(text)
    print(text)
    return 0 if result["every_route_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
