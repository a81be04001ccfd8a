"""Long canvases read whole against the windowed path, on the test split.

    python bench/long_context/long_context_bench.py              # run, write results.json and REPORT.md
    python bench/long_context/long_context_bench.py --report     # the report from results.json

Cases (:func:`research.evaluate.build_long_cases`): consecutive test documents joined, two
blank lines apart, into canvases of up to ``--tokens`` tokens (with the holes' budgets, within
the model's 1,025); the target hole and a second hole (a sentence) cut in one of them, of every
hole kind of ``research.evaluate``. The same cases go through:

- ``whole``: the shipped denoiser reading the whole canvas in one window;
- ``windowed``: the same model filling hole by hole from windows of 321 tokens of nearest
  context (:func:`gpu_worker.engine.window.infill_windowed`), the path a canvas longer than the
  model takes;
- ``base windowed``: the archived denoiser that read 321 tokens (``--base``), windowed as the
  worker runs it;
- the AR-FIM route: the shipped model reading the whole canvas, and the archived one (``--base-ar``),
  which refuses a canvas longer than it reads.

Exact match of the target (spaces at the ends aside), locked text kept, forward passes and
seconds per case; paired differences with 95% bootstrap intervals.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gpu_worker.engine.backends import load_backend  # noqa: E402
from gpu_worker.engine.infill import infill_batch  # noqa: E402
from gpu_worker.engine.outcome import AR, DIFFUSION  # noqa: E402
from gpu_worker.engine.run import run_batch  # noqa: E402
from gpu_worker.engine.sampler import model_int  # noqa: E402
from gpu_worker.engine.window import infill_windowed  # noqa: E402
from research.corpus_eval import bootstrap  # noqa: E402
from research.evaluate import build_long_cases, exact, locked_preserved  # noqa: E402

HERE = Path(__file__).resolve().parent
KINDS = ("entity_right", "entity_left", "sentence", "number_date", "choice", "json_value")
WINDOW = 321  # the windowed path's context: what the archived models read
ROUTES = ("whole", "windowed", "base windowed", "ar whole", "ar base")


def run(args: argparse.Namespace) -> dict[str, Any]:
    long, base = load_backend(args.model), load_backend(args.base)
    long_ar, base_ar = load_backend(args.ar), load_backend(args.base_ar)
    fills: dict[str, Any] = {
        "whole": lambda r: run_batch(DIFFUSION, long, [r])[0],
        "windowed": lambda r: infill_windowed(infill_batch, long, r, context=WINDOW),
        "base windowed": lambda r: run_batch(DIFFUSION, base, [r])[0],
        "ar whole": lambda r: run_batch(AR, long_ar, [r])[0],
        "ar base": lambda r: run_batch(AR, base_ar, [r])[0],
    }
    rows: list[dict[str, Any]] = []
    for kind in KINDS:
        cases = build_long_cases(kind, args.per_kind, long.tokenizer.encode, tokens=args.tokens)
        for n, case in enumerate(cases):
            request = case.request()
            size = len(long.tokenizer.encode(case.doc.text))
            for route in ROUTES:
                started = time.perf_counter()
                outcome = fills[route](request)
                seconds = time.perf_counter() - started
                row = {"kind": kind, "case": n, "route": route, "doc_tokens": size,
                       "documents": case.doc.kind.count("+") + 1, "seconds": seconds}  # fmt: skip
                if isinstance(outcome, ValueError):
                    row.update(refused=str(outcome), exact=0.0, locked=None, passes=0)
                else:
                    pred = outcome.holes.get("target", "")
                    row.update(refused=None, prediction=pred, target=case.holes[0].target,
                               exact=float(exact(pred, case.holes[0].target)),
                               locked=locked_preserved(case, outcome.document, outcome.holes),
                               passes=outcome.forward_passes)  # fmt: skip
                rows.append(row)
            print(f"{kind} {n + 1}/{len(cases)}", file=sys.stderr, flush=True)
    meta = {"models": {name: {"dir": str(m.directory), "weights_sha256": m.weights_sha256,
                              "max_len": model_int(m.network, "max_len")}
                       for name, m in (("model", long), ("base", base), ("ar", long_ar),
                                       ("base_ar", base_ar))},
            "tokens": args.tokens, "per_kind": args.per_kind, "window": WINDOW}  # fmt: skip
    return {"meta": meta, "rows": rows}


def _by(rows: list[dict[str, Any]], route: str, kind: str | None = None) -> list[dict[str, Any]]:
    return [r for r in rows if r["route"] == route and (kind is None or r["kind"] == kind)]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def summary(results: dict[str, Any]) -> dict[str, Any]:
    rows = results["rows"]
    table: dict[str, Any] = {}
    for kind in (*KINDS, None):
        cells: dict[str, Any] = {}
        for route in ROUTES:
            mine = _by(rows, route, kind)
            ran = [r for r in mine if r["refused"] is None]
            cells[route] = {"n": len(mine), "exact": _mean([r["exact"] for r in mine]),
                            "refused": len(mine) - len(ran),
                            "locked": _mean([float(r["locked"]) for r in ran]),
                            "passes": _mean([r["passes"] for r in ran]),
                            "seconds": _mean([r["seconds"] for r in ran])}  # fmt: skip
        for a, b in (("whole", "windowed"), ("whole", "base windowed")):
            diffs = [x["exact"] - y["exact"] for x, y in
                     zip(_by(rows, a, kind), _by(rows, b, kind), strict=True)]  # fmt: skip
            low, high = bootstrap(diffs)
            cells[f"{a} - {b}"] = {"diff": _mean(diffs), "low": low, "high": high}
        table[kind or "all"] = cells
    return table


def _shown(directory: str) -> str:
    path = Path(directory)
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else directory


def report(results: dict[str, Any]) -> str:
    meta, table = results["meta"], summary(results)
    sizes = [r["doc_tokens"] for r in results["rows"] if r["route"] == "whole"]
    docs = [r["documents"] for r in results["rows"] if r["route"] == "whole"]
    lines = [
        "# Long canvases: read whole or window by window (test split)",
        "",
        "`python bench/long_context/long_context_bench.py`",
        "",
        f"{len(sizes)} canvases of {min(sizes)} to {max(sizes)} tokens of locked text (mean "
        f"{_mean(sizes):.0f}), each {min(docs)} to {max(docs)} test documents joined; the "
        f"target hole and a second hole in one of them. Models: "
        + ", ".join(f"{k} `{_shown(v['dir'])}` (weights {v['weights_sha256'][:12]}, reads {v['max_len']:,})"
                    for k, v in meta["models"].items()) + ".",
        "",
        "| hole kind | n | exact, whole | exact, windowed (321) | whole - windowed (95%) | "
        "exact, base windowed | whole - base (95%) | AR whole | AR base |",
        "|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for kind, c in table.items():
        d1, d2 = c["whole - windowed"], c["whole - base windowed"]
        ar_base = (f"refused {c['ar base']['refused']}" if c["ar base"]["refused"] == c["ar base"]["n"]
                   else f"{c['ar base']['exact']:.3f}")  # fmt: skip
        name = f"**{kind}**" if kind == "all" else kind
        lines.append(
            f"| {name} | {c['whole']['n']} | {c['whole']['exact']:.3f} | {c['windowed']['exact']:.3f} | "
            f"{d1['diff']:+.3f} ({d1['low']:+.3f} … {d1['high']:+.3f}) | "
            f"{c['base windowed']['exact']:.3f} | {d2['diff']:+.3f} ({d2['low']:+.3f} … {d2['high']:+.3f}) | "
            f"{c['ar whole']['exact']:.3f} | {ar_base} |"
        )  # fmt: skip
    every = table["all"]
    lines += [
        "",
        "| route | locked text kept | forward passes per case | seconds per case |",
        "|---|---|---|---|",
    ]
    for route in ROUTES:
        c = every[route]
        if c["refused"] == c["n"]:
            lines.append(f"| {route} | refused every canvas | | |")
            continue
        lines.append(f"| {route} | {c['locked']:.3f} | {c['passes']:.1f} | {c['seconds']:.2f} |")
    return "\n".join(lines) + "\n" + short_split_section()


def short_split_section() -> str:
    """The shipped models against the archived ones on the ordinary test split (one document
    per canvas): what reading 1,025 tokens cost where 321 were enough."""
    before, after = HERE / "short_split_base.json", ROOT / "bench/eval/results.json"
    if not (before.is_file() and after.is_file()):
        return ""
    from bench.compare_eval import compare, markdown

    result = compare(json.loads(before.read_text()), json.loads(after.read_text()))
    return "\n".join([
        "",
        "## The ordinary test split, before and after",
        "",
        "`python -m research.evaluate` (400 cases per kind, one document per canvas) on the archived "
        "models (`short_split_base.json`) and on the shipped ones (`bench/eval/results.json`), paired "
        "case by case: `python bench/compare_eval.py bench/long_context/short_split_base.json "
        "bench/eval/results.json`.",
        "",
        markdown(result),
    ]) + "\n"  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models/stencil-denoiser")
    parser.add_argument("--ar", type=Path, default=ROOT / "models/stencil-ar-fim")
    parser.add_argument("--base", type=Path,
                        default=ROOT / "models/archive/stencil-denoiser-fc76d9458dd3")
    parser.add_argument("--base-ar", type=Path,
                        default=ROOT / "models/archive/stencil-ar-fim-627da29a0315")
    parser.add_argument("--per-kind", type=int, default=25)
    parser.add_argument("--tokens", type=int, default=940,
                        help="the most tokens of locked text a canvas holds")
    parser.add_argument("--report", action="store_true", help="only rewrite REPORT.md")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    out = HERE / "results.json"
    if args.report:
        results = json.loads(out.read_text())
    else:
        results = run(args)
        out.write_text(json.dumps(results, indent=1) + "\n")
    (HERE / "REPORT.md").write_text(report(results))
    print(report(results))


if __name__ == "__main__":
    main()
