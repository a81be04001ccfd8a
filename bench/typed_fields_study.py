"""Typed fields: does a model carry what a person typed into the sentences it writes?

In a job offer the person making the offer types the position, the start date, the salary
and the date to reply by, in meeting minutes the secretary types the date of the next
meeting, and on an invoice the person invoicing types its due date (corpus edition 2 shows
the position, the start date and the next meeting in a header, edition 3 the due date,
edition 4 the salary and the reply-by date; before, they stood only inside sentences, so a
template that holed the sentences asked the model to invent them). For the first N
documents of each kind in a split, holed as a drafting request
(``research.evaluate.sample_case``: every sentence a hole, typed fields locked), each
model pair fills the holes, and counted are:

* copied: of the holes whose original sentence names a typed field, the share whose fill
  names it exactly (the position, the start date, the salary, the reply-by date, the next
  meeting's date, the due date);
* dates out of time: the share of holes whose fill holds a date before the document's own
  (the offer letter's date, the meeting's date, the invoice's date) or more than a year
  after it: no original sentence does (a start date, a reply, the next meeting and a due
  date all fall within 60 days of it);
* dates not typed: of the holes whose fill holds a date, the share holding one that the
  document's locked text does not (a date the model made up);
* amounts not typed: of the holes whose fill holds a dollar amount, the share holding one
  that the locked text does not (a salary or a sum made up, or garbled as "$ $,000.00");
* holes exact: the share of all holes written exactly as the original.

    python bench/typed_fields_study.py [--split val] [--docs 40] [--pair NAME=DENOISER,AR ...]

Pairs run side by side in one run (default: the shipped pair). Writes
bench/typed_fields/typed_fields[_SPLIT].json and TYPED_FIELDS[_SPLIT].md.
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import date, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.email_study import pair_table, parse_pairs  # noqa: E402
from bench.threshold_study import save_study  # noqa: E402
from gpu_worker.engine.ar import infill_request_ar  # noqa: E402
from gpu_worker.engine.backends import load_backend  # noqa: E402
from gpu_worker.engine.infill import infill_request  # noqa: E402
from research.corpus import DATE_LONG_PATTERN, Document, Split  # noqa: E402
from research.evaluate import Case, first_of_kind, sample_case  # noqa: E402

# kind -> (the typed fields a sentence may name, the span holding the document's own date)
FIELDS: dict[str, tuple[tuple[str, ...], str]] = {
    "job_offer": (("role", "start", "salary", "reply"), "offer_day"),
    "meeting_minutes": (("next",), "date"),
    "invoice": (("due",), "issued"),
}
HORIZON_DAYS = 365  # a date further after the document's own than this is out of time
AMOUNT = re.compile(r"\$[ $0-9,.]*[0-9]")  # a dollar amount, a garbled one ("$ $,000.00") too


def dates_in(text: str) -> list[date]:
    """The long-form dates ("May 27, 2021") written in ``text``."""
    found = []
    for match in re.finditer(DATE_LONG_PATTERN, text):
        try:
            found.append(datetime.strptime(match.group(0), "%B %d, %Y").date())
        except ValueError:  # "February 30, 2021": a date in form only
            continue
    return found


def _value(doc: Document, name: str) -> str:
    return next(doc.span_text(s) for s in doc.spans if s.name == name)


def locked_text(case: Case) -> str:
    """The text of ``case``'s request outside its holes: what the person typed or kept."""
    return "".join(s["text"] for s in case.request()["segments"] if "text" in s)


def score(case: Case, fills: dict[str, str]) -> dict[str, int]:
    """Counts for one document holed as ``case``; ``fills`` maps each hole to what a model wrote."""
    doc = case.doc
    fields, own = FIELDS[doc.kind]
    own_date = dates_in(_value(doc, own))[0]
    locked = locked_text(case)
    typed_dates, typed_amounts = set(dates_in(locked)), set(AMOUNT.findall(locked))
    counts = {"naming": 0, "copied": 0, "holes": len(case.holes), "out_of_time": 0, "exact": 0,
              "dated": 0, "untyped_date": 0, "priced": 0, "untyped_amount": 0}  # fmt: skip
    for hole in case.holes:
        written, original = fills[hole.name], hole.target
        for value in (_value(doc, f) for f in fields):
            if value in original:
                counts["naming"] += 1
                counts["copied"] += value in written
        dates = dates_in(written)
        counts["out_of_time"] += any(not 0 <= (d - own_date).days <= HORIZON_DAYS for d in dates)
        counts["dated"] += bool(dates)
        counts["untyped_date"] += any(d not in typed_dates for d in dates)
        amounts = AMOUNT.findall(written)
        counts["priced"] += bool(amounts)
        counts["untyped_amount"] += any(a not in typed_amounts for a in amounts)
        counts["exact"] += written.strip() == original.strip()
    return counts


def study(pairs: dict[str, tuple[Path, Path]], split: Split, docs: int) -> dict[str, Any]:
    results: dict[str, Any] = {"split": split, "docs_per_kind": docs, "pairs": {}}
    for label, (den_dir, ar_dir) in pairs.items():
        den, ar = load_backend(den_dir), load_backend(ar_dir)
        rows: dict[str, dict[str, int]] = {}
        examples: list[dict[str, str]] = []
        for kind in FIELDS:
            for doc in first_of_kind(split, kind, docs):
                case = sample_case(doc, den.tokenizer.encode)
                request = case.request()
                fills = {"denoiser": infill_request(den, request).holes,
                         "AR-FIM": infill_request_ar(ar, request).holes}  # fmt: skip
                for model, filled in fills.items():
                    cell = rows.setdefault(f"{model}, {kind}", {})
                    for key, n in score(case, filled).items():
                        cell[key] = cell.get(key, 0) + n
                first = next((h for h in case.holes if _value(doc, FIELDS[kind][0][0]) in h.target), None)
                if first is not None and len([e for e in examples if e["kind"] == kind]) < 3:
                    examples.append({"kind": kind, "original": first.target,
                                     **{m: f[first.name] for m, f in fills.items()}})  # fmt: skip
        results["pairs"][label] = {"denoiser": str(den_dir), "ar": str(ar_dir), "rows": rows,
                                   "examples": examples}  # fmt: skip
    return results


def _share(n: int, of: int) -> str:
    return f"{n / of:.3f} ({n}/{of})" if of else "-"


def markdown(results: dict[str, Any]) -> str:
    lines = [f"# Typed fields ({results['split']}, {results['docs_per_kind']} documents per kind)",
             "", f"Command: `{results.get('command', '')}`. Whole documents holed as drafting "
             "requests (`sample_case`); copied: of the holes whose original names a typed field "
             "(an offer's position, start date, salary and reply-by date, the next meeting's date, "
             "an invoice's due date), the share whose fill names it exactly; out of time: the "
             "share of holes whose fill holds a date before the document's own or more than a "
             "year after it; dates (amounts) not typed: of the holes whose fill holds a date (a "
             "dollar amount), the share holding one the document's locked text does not; exact: "
             "holes written as the original.", ""]  # fmt: skip
    lines += pair_table(results, ["model, kind", "copied", "out of time", "dates not typed", "amounts not typed",
                                  "holes exact"],
                        lambda c: [_share(c["copied"], c["naming"]), _share(c["out_of_time"], c["holes"]),
                                   _share(c["untyped_date"], c["dated"]),
                                   _share(c["untyped_amount"], c["priced"]),
                                   _share(c["exact"], c["holes"])])  # fmt: skip
    for label, pair in results["pairs"].items():
        lines += ["", f"## {label}: the first sentences naming a typed field", "",
                  "| kind | original | denoiser | AR-FIM |", "|---|---|---|---|"]  # fmt: skip
        for e in pair["examples"]:
            lines.append(f"| {e['kind']} | {e['original']} | {e['denoiser']} | {e['AR-FIM']} |")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=["test", "val"], default="val")
    parser.add_argument("--docs", type=int, default=40, help="documents per kind")
    parser.add_argument("--pair", action="append", metavar="NAME=DENOISER,AR",
                        help="a model pair (repeatable; default the shipped pair)")
    parser.add_argument("--out", type=Path, default=Path("bench/typed_fields"))
    args = parser.parse_args(argv)
    results = study(parse_pairs(parser, args.pair), args.split, args.docs)
    save_study(results, "bench/typed_fields_study.py", argv, args.out, "typed_fields", markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
