"""Words a model spells from pieces, under each sampler preset.

Whole documents holed as drafting requests that name nothing (``research.evaluate.sample_case``
with ``invent``: every sentence, choice and JSON value and every later mention of a repeated
entity, also where nothing outside the holes shows the name), filled by the denoiser under each
preset and by AR-FIM. A written word (a run of letters) that neither the train corpus nor the
document's locked text spells is one the model put together from pieces ("Sngineer" for a
job title): ``research.evaluate.HoleCounts``. If a preset's decoding order made them, another
preset (the careful one writes one token per step) would not.

    python bench/spelling_study.py [--split val] [--per-kind 5] [--denoiser DIR]

Writes bench/spelling/spelling_study[_val].json and REPORT[_VAL].md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.threshold_study import write_study  # noqa: E402
from gpu_worker.engine.ar import infill_request_ar  # noqa: E402
from gpu_worker.engine.backends import load_backend  # noqa: E402
from gpu_worker.engine.config import PRESETS, config_from_request  # noqa: E402
from gpu_worker.engine.infill import infill_request  # noqa: E402
from research.corpus import KINDS, Split  # noqa: E402
from research.evaluate import (  # noqa: E402
    HoleCounts,
    first_of_kind,
    sample_case,
    train_lexicon,
)

WATCHED = ("job_offer", "json_record")  # the kinds whose values are most often misspelled


def study(denoiser_dir: Path, ar_dir: Path, split: Split, per_kind: int) -> dict[str, Any]:
    denoiser, ar = load_backend(denoiser_dir), load_backend(ar_dir)
    lexicon = train_lexicon()
    default = config_from_request({})
    counts = {(p, k): HoleCounts() for p in PRESETS for k in KINDS}
    seconds = dict.fromkeys(PRESETS, 0.0)
    for kind in KINDS:
        for doc in first_of_kind(split, kind, per_kind):
            case = sample_case(doc, denoiser.tokenizer.encode, invent=True)
            theirs = infill_request_ar(ar, case.request(0), config=default).holes
            for preset in PRESETS:  # AR-FIM's column is the same run for every preset
                started = time.perf_counter()
                mine = infill_request(denoiser, case.request(0),
                                      config=config_from_request({"preset": preset})).holes  # fmt: skip
                seconds[preset] += time.perf_counter() - started
                counts[preset, kind].add(case, mine, theirs, lexicon)
    rows: dict[str, Any] = {}
    for preset in PRESETS:
        total = HoleCounts()
        for kind in KINDS:
            total.merge(counts[preset, kind])
        rows[preset] = {
            "holes": total.holes, "exact": total.holes_d / total.holes,
            "exact_ar": total.holes_ar / total.holes,
            "unseen_share": total.unseen_d / max(total.words_d, 1),
            "unseen_share_ar": total.unseen_ar / max(total.words_ar, 1),
            "unseen_share_original": total.unseen / max(total.words, 1),
            "by_kind": {k: counts[preset, k].unseen_d / max(counts[preset, k].words_d, 1)
                        for k in WATCHED},
            "unseen_words": dict(total.unseen_words_d.most_common(16)),
            "seconds": seconds[preset],
        }  # fmt: skip
    return {"denoiser": denoiser.name, "denoiser_dir": str(denoiser_dir), "split": split,
            "documents": per_kind * len(KINDS), "presets": rows}  # fmt: skip


def markdown(results: dict[str, Any]) -> str:
    rows = results["presets"]
    first = next(iter(rows.values()))
    lines = [f"# Words spelled from pieces ({results['split']})", "",
             f"Denoiser `{results['denoiser']}` (`{results['denoiser_dir']}`). Command: "
             f"`{results.get('command', '')}`. {results['documents']} documents holed as in "
             "SAMPLES.md, except that an entity named only inside holes is holed everywhere "
             "(the model invents it). Share of the written words that neither the train corpus nor the "
             "document's locked text spells.", "",
             "| fills | holes exact | words not in the corpus | job offers | JSON records | "
             "seconds |", "|---|---|---|---|---|---|",
             f"| the originals | 1.000 | {first['unseen_share_original']:.1%} | | | |",
             f"| AR-FIM | {first['exact_ar']:.3f} | {first['unseen_share_ar']:.1%} | | | |"]  # fmt: skip
    for preset, row in rows.items():
        kinds = " | ".join(f"{row['by_kind'][k]:.1%}" for k in WATCHED)
        lines.append(f"| denoiser, {preset} | {row['exact']:.3f} | {row['unseen_share']:.1%} | "
                     f"{kinds} | {row['seconds']:.1f} |")  # fmt: skip
    lines.append("")
    for preset, row in rows.items():
        words = ", ".join(f"{w} ({n})" if n > 1 else w for w, n in row["unseen_words"].items())
        lines.append(f"- {preset}: {words or 'none'}")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--denoiser", type=Path, default=Path("models/stencil-denoiser"))
    parser.add_argument("--ar", type=Path, default=Path("models/stencil-ar-fim"))
    parser.add_argument("--split", choices=["test", "val"], default="val")
    parser.add_argument("--per-kind", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench/spelling"))
    args = parser.parse_args(argv)
    results = study(args.denoiser, args.ar, args.split, args.per_kind)
    suffix = "_val" if args.split == "val" else ""
    write_study(results, "bench/spelling_study.py", argv, args.out / f"spelling_study{suffix}.json",
                args.out / f"REPORT{suffix.upper()}.md", markdown, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
