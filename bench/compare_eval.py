"""Two runs of ``python -m research.evaluate`` on the same cases, compared case by case.

Each run's ``results.json`` holds every case with its document seed, hole kind and target, so
the same case can be matched in both runs (for each model) even when the two pairs of models
read it through different vocabularies. For each model and hole kind: the exact match of
each run, and the paired difference with a 95% bootstrap interval (2,000 resamples of the
matched cases, seeded), which says whether a change is more than the noise of the sample.
With ``--doc-kind KIND`` two more rows per model split the cases into that document kind's
and every other kind's (after a corpus edition that changed one kind, say).

``--routes RUN/results.json`` compares the two models of one run instead: AR-FIM's exact
match against the denoiser's on the same cases, over all cases and per hole kind, each also
split, where the run records them, by where the target's text also stands
(``evaluate.copy_side``: left, only right, nowhere) and by the phrase that wrote it
(``evaluate.phrase_class``: a variant training reads, one held out for the test split, or
layout).

    python bench/compare_eval.py BEFORE/results.json AFTER/results.json [--doc-kind KIND] [--out FILE.json]
    python bench/compare_eval.py --routes RUN/results.json [--out FILE.json]
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


Keep = Callable[[dict[str, Any]], bool]


def _select(run: dict[str, Any], model: str, keep: Keep) -> list[dict[str, Any]]:
    return [c for c in run["cases"] if c["model"] == model and keep(c)]


def _where(before: dict[str, Any], after: dict[str, Any], model: str, keep: Keep) -> dict[str, Any]:
    """:func:`paired` over the model's cases that ``keep`` selects, in both runs."""
    return paired(_select(before, model, keep), _select(after, model, keep))


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


SPLITS = ("copy", "phrase")  # case fields a --routes comparison splits by, where a run has them


def routes(run: dict[str, Any]) -> dict[str, Any]:
    """AR-FIM ("before") against the denoiser ("after") on the same cases of one run: all
    cases and each hole kind, then each split by the fields of SPLITS ("all, copy right":
    every hole whose text stands only on its right, whatever its kind). "all" leaves out
    the kinds that end in "_single": they repeat another kind's targets (``entity_right``'s,
    as the only hole), and a target counted twice would narrow the interval."""

    def row(keep: Keep) -> dict[str, Any]:
        return paired(_select(run, "ar_fim", keep), _select(run, "denoiser", keep))

    rows: dict[str, Any] = {}
    for kind in ["all", *(k for k in run["per_kind"] if any(c["kind"] == k for c in run["cases"]))]:
        def mine(c: dict[str, Any], kind: str = kind) -> bool:
            return c["kind"] == kind or (kind == "all" and not c["kind"].endswith("_single"))

        rows[kind] = row(mine)
        for split in SPLITS:
            for value in sorted({c[split] for c in run["cases"] if mine(c) and split in c}):
                rows[f"{kind}, {split} {value}"] = row(
                    lambda c, mine=mine, split=split, value=value: mine(c) and c.get(split) == value
                )
    return {"split": run.get("split"), "rows": rows}


def routes_markdown(result: dict[str, Any]) -> str:
    lines = ["| cases | n | AR-FIM | denoiser | D - AR (95% interval) | D better / worse |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for name, r in result["rows"].items():
        low, high = r["interval_95"]
        lines.append(f"| {name} | {r['cases']} | {r['before']:.3f} | {r['after']:.3f} | "
                     f"{r['difference']:+.3f} ({low:+.3f} to {high:+.3f}) | {r['better']} / {r['worse']} |")  # fmt: skip
    return "\n".join(lines)


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
    parser.add_argument("runs", type=Path, nargs="+", help="BEFORE AFTER, or RUN with --routes")
    parser.add_argument("--routes", action="store_true", help="the denoiser against AR-FIM in one run")
    parser.add_argument("--doc-kind", help="also split the cases into this document kind's and the rest")
    parser.add_argument("--out", type=Path, help="write the comparison as JSON here")
    args = parser.parse_args(argv)
    runs = [json.loads(path.read_text()) for path in args.runs]
    if len(runs) != (1 if args.routes else 2):
        parser.error("give two results.json files (BEFORE AFTER), or one with --routes")
    result = routes(runs[0]) if args.routes else compare(runs[0], runs[1], args.doc_kind)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(routes_markdown(result) if args.routes else markdown(result))


if __name__ == "__main__":
    main()
