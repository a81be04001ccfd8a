"""E-mail addresses: does a model spell the record's name into the address?

An employee record (``research.corpus``, JSON records) names its employee ("Adam Diaz") and
gives an address that spells the name in lower case ("adam.diaz@young.biz"); the domain is
drawn at random, so only the part before the "@" can be known. For the first N employee
records of a split, each model pair fills the address twice:

* alone: only the address is a hole (its schema pattern as the constraint), all else locked;
* in the whole record, holed as a drafting request (``research.evaluate.sample_case``): the
  name stays visible only in the heading line.

Counted: the address exact, its part before the "@" exact, and valid under the pattern.

    python bench/email_study.py [--split val] [--records 40] [--pair NAME=DENOISER,AR ...]

Pairs run side by side in one run (default: the shipped pair). Writes
bench/email/email_study_SPLIT.json and REPORT_SPLIT.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.threshold_study import write_study  # noqa: E402
from gpu_worker.engine.ar import infill_request_ar  # noqa: E402
from gpu_worker.engine.backends import load_backend  # noqa: E402
from gpu_worker.engine.infill import infill_request  # noqa: E402
from research.corpus import Document, Split  # noqa: E402
from research.evaluate import (  # noqa: E402
    Case,
    _hole,
    first_of_kind,
    is_valid,
    sample_case,
)

SHIPPED = "shipped=models/stencil-denoiser,models/stencil-ar-fim"


def employee_records(split: Split, count: int) -> list[Document]:
    """The first ``count`` JSON records of ``split`` that have an e-mail address."""
    found: list[Document] = []
    for doc in first_of_kind(split, "json_record", 8 * count):
        if any(s.name == "email" for s in doc.spans):
            found.append(doc)
        if len(found) == count:
            break
    return found


def _score(written: str, target: str, case: Case, name: str) -> dict[str, float]:
    hole = next(h for h in case.holes if h.name == name)
    return {"exact": float(written == target),
            "local_part": float(written.split("@")[0] == target.split("@")[0]),
            "valid": float(is_valid(hole, written))}  # fmt: skip


def study(pairs: dict[str, tuple[Path, Path]], split: Split, records: int) -> dict[str, Any]:
    docs = employee_records(split, records)
    results: dict[str, Any] = {"split": split, "records": len(docs), "pairs": {}}
    for label, (den_dir, ar_dir) in pairs.items():
        den, ar = load_backend(den_dir), load_backend(ar_dir)
        totals: dict[str, dict[str, float]] = {}
        examples: list[dict[str, str]] = []
        for doc in docs:
            span = next(s for s in doc.spans if s.name == "email")
            target = doc.span_text(span)
            alone = Case("json_value", doc, (_hole("target", "json_value", doc, span, den.tokenizer.encode),))
            whole = sample_case(doc, den.tokenizer.encode)
            email_hole = next(h.name for h in whole.holes if h.span == span)
            fills = {
                "denoiser, alone": (infill_request(den, alone.request()).holes["target"], alone, "target"),
                "AR-FIM, alone": (infill_request_ar(ar, alone.request()).holes["target"], alone, "target"),
                "denoiser, whole record": (infill_request(den, whole.request()).holes[email_hole], whole, email_hole),
                "AR-FIM, whole record": (infill_request_ar(ar, whole.request()).holes[email_hole], whole, email_hole),
            }  # fmt: skip
            for row, (written, case, name) in fills.items():
                score = _score(written, target, case, name)
                cell = totals.setdefault(row, dict.fromkeys(score, 0.0))
                for key, value in score.items():
                    cell[key] += value / len(docs)
            if len(examples) < 6:
                examples.append({"target": target, **{row: fill[0] for row, fill in fills.items()}})
        results["pairs"][label] = {"denoiser": str(den_dir), "ar": str(ar_dir),
                                   "rows": totals, "examples": examples}  # fmt: skip
    return results


def pair_table(
    results: dict[str, Any], columns: list[str], cells: Callable[[dict[str, Any]], list[str]]
) -> list[str]:
    """A Markdown table of every pair's rows: the pair, the row's name, then ``cells(row)``."""
    lines = ["| " + " | ".join(["pair", *columns]) + " |", "|---" * (len(columns) + 1) + "|"]
    for label, pair in results["pairs"].items():
        for row, cell in pair["rows"].items():
            lines.append("| " + " | ".join([label, row, *cells(cell)]) + " |")
    return lines


def markdown(results: dict[str, Any]) -> str:
    lines = [f"# E-mail addresses ({results['split']}, {results['records']} employee records)", "",
             f"Command: `{results.get('command', '')}`. The address alone as a hole, or in the "
             "whole record holed as a drafting request; share exact, with the part before the "
             "\"@\" exact (the domain is random), and valid under the schema's pattern.", ""]  # fmt: skip
    lines += pair_table(results, ["fill", "exact", "before the @ exact", "valid"],
                        lambda c: [f"{c['exact']:.3f}", f"{c['local_part']:.3f}", f"{c['valid']:.3f}"])
    for label, pair in results["pairs"].items():
        lines += ["", f"## {label}: the first records", "",
                  "| address | " + " | ".join(k for k in pair["examples"][0] if k != "target") + " |",
                  "|---" * len(pair["examples"][0]) + "|"]  # fmt: skip
        for example in pair["examples"]:
            lines.append("| " + " | ".join(f"`{v}`" for v in example.values()) + " |")
    lines.append("")
    return "\n".join(lines)


def parse_pairs(parser: argparse.ArgumentParser, specs: list[str] | None) -> dict[str, tuple[Path, Path]]:
    """``--pair NAME=DENOISER,AR`` values (the shipped pair when none) as {name: (denoiser, ar)}."""
    pairs: dict[str, tuple[Path, Path]] = {}
    for spec in specs or [SHIPPED]:
        label, _, dirs = spec.partition("=")
        den, _, ar = dirs.partition(",")
        if not (label and den and ar):
            parser.error(f"--pair {spec!r} is not NAME=DENOISER,AR")
        pairs[label] = (Path(den), Path(ar))
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=["test", "val"], default="val")
    parser.add_argument("--records", type=int, default=40)
    parser.add_argument("--pair", action="append", metavar="NAME=DENOISER,AR",
                        help=f"a model pair (repeatable; default {SHIPPED})")
    parser.add_argument("--out", type=Path, default=Path("bench/email"))
    args = parser.parse_args(argv)
    results = study(parse_pairs(parser, args.pair), args.split, args.records)
    write_study(results, "bench/email_study.py", argv, args.out / f"email_study_{args.split}.json",
                args.out / f"REPORT_{args.split.upper()}.md", markdown, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
