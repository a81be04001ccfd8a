"""The presets with and without ``pattern_runs``, on single holes, drafts and value spans.

``pattern_runs`` lets a step write a pattern hole's next positions from the same forward pass
(see ``SamplerConfig.pattern_runs``); without it a pattern hole costs a pass per token. Each
threshold preset is run both ways, side by side (routes interleaved case by case, as the
sampler bench times them), on three sets: single holes (``eval_cases``), whole documents
holed as drafts (``drafting_cases``) and whole documents with every value span holed
(``document_cases``, where dates, amounts and references are pattern holes). Choose on val,
by the rules ``bench/preset_study.py`` chose the presets' other settings by: the balanced
preset (chosen for quality) turns it on if its exact match is the same or higher on every
set; the fast preset if it is faster and its exact match within half a point on every set.
Then report test.

    python bench/pattern_runs_study.py --split val [--cases 48] [--docs 80]

Writes bench/sampler/pattern_runs_study[_val].json and PATTERN_RUNS_STUDY[_VAL].md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.sampler_bench import (  # noqa: E402
    document_cases,
    drafting_cases,
    eval_cases,
)
from bench.threshold_study import run_sets, save_study, study_arguments  # noqa: E402
from gpu_worker.engine.backends import load_backend  # noqa: E402
from gpu_worker.engine.config import PRESETS, SamplerConfig  # noqa: E402
from research.corpus import Split  # noqa: E402

STUDIED = ("fast", "balanced")  # the threshold presets (careful's even rule ignores the field)
SETS = ("single holes", "drafts", "value spans")


def candidates() -> dict[str, SamplerConfig]:
    """Each studied preset without and with pattern runs (the rest of its fields as now)."""
    out = {}
    for preset in STUDIED:
        base = PRESETS[preset]
        out[f"{preset}, pattern runs off"] = base.replace(pattern_runs=False)
        out[f"{preset}, pattern runs on"] = base.replace(pattern_runs=True)
    return out


def study(model: Path, split: Split, cases: int, docs: int) -> dict[str, Any]:
    loaded = load_backend(model)
    configs = candidates()
    sets = {"single holes": eval_cases(loaded, cases, split=split),
            "drafts": drafting_cases(loaded, docs, split=split),
            "value spans": document_cases(loaded, docs, split=split)}  # fmt: skip
    out: dict[str, Any] = {"model": loaded.name, "split": split, "configs": {
        name: json.loads(config.to_json()) for name, config in configs.items()}}  # fmt: skip
    return {**out, **run_sets(loaded, configs, sets, list(configs.values()))}


def markdown(results: dict[str, Any]) -> str:
    lines = [f"# Pattern runs in the presets ({results['split']})", "",
             f"Model `{results['model']}`. Command: `{results.get('command', '')}`. Each preset "
             "without and with `pattern_runs`, side by side; the wall ratio is with / without, "
             "per preset. **Bold**: the preset as it is now.", ""]  # fmt: skip
    now = {json.dumps(json.loads(PRESETS[p].to_json()), sort_keys=True) for p in STUDIED}
    for label in SETS:
        block = results[label]
        routes = block["routes"]
        lines += [f"{label.capitalize()} ({block['cases']} cases):", "",
                  "| config | EM | valid | fwd passes | tok/fwd | s/case | × without |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for name, r in routes.items():
            off = routes[name.replace("runs on", "runs off")]["seconds_per_case"]
            config = json.dumps(results["configs"][name], sort_keys=True)
            shown = f"**{name}**" if config in now else name
            lines.append(f"| {shown} | {r['exact_match']:.3f} | {r['validity']:.2f} | "
                         f"{r['forward_passes']:.1f} | {r['tokens_per_forward']:.2f} | "
                         f"{r['seconds_per_case']:.3f} | {r['seconds_per_case'] / off:.2f} |")  # fmt: skip
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    study_arguments(parser, docs=80)
    args = parser.parse_args(argv)
    results = study(args.model, args.split, args.cases, args.docs)
    save_study(results, "bench/pattern_runs_study.py", argv, args.out, "pattern_runs_study",
               markdown)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
