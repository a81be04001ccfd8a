"""The report of one corpus training run: its evaluation tables, three filled documents before
and after, and a plot.

    python bench/finetune_report.py --run RUN_ID [--out bench/finetune] [--source TEXT]
                                    [--command TEXT] [--samples 3]

Reads the run, its model version and its corpus from the database (DATABASE_URL), fills
``--samples`` held-out windows holed as a drafting template (``research.evaluate.sample_case``)
with the base and the tuned model, and writes OUT/REPORT.md, OUT/results.json and
OUT/exact_match.png.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FENCE = "~~~~"  # the documents hold ``` fences of their own


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def table(part: dict[str, Any], title: str) -> list[str]:
    lines = [f"| {title} | n | exact, base | exact, tuned | difference (95%) | NLL, base | "
             "NLL, tuned | difference (95%) |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    rows = list(part.get("per_kind", {}).items()) + [("**all**", part.get("all", {}))]
    for kind, m in rows:
        if not m.get("n"):
            continue
        lines.append(
            f"| {kind} | {m['n']} | {_pct(m['base_exact'])} | {_pct(m['tuned_exact'])} | "
            f"{m['exact_diff']:+.3f} ({m['exact_low']:+.3f} … {m['exact_high']:+.3f}) | "
            f"{m['base_nll']:.3f} | {m['tuned_nll']:.3f} | "
            f"{m['nll_diff']:+.3f} ({m['nll_low']:+.3f} … {m['nll_high']:+.3f}) |"
        )
    return lines


def samples(run: Any, count: int) -> list[str]:
    """Three held-out windows holed as a template, filled by base and tuned (seed 0)."""
    from corpora.selectors import corpus_texts
    from gpu_worker.engine.backends import load_backend
    from gpu_worker.engine.infill import infill_request
    from research.corpus_text import TextDocument, document_windows
    from research.evaluate import _marked, exact, sample_case
    from research.finetune import WINDOW_MARGIN

    base = load_backend(Path(run.base_version.directory))
    tuned = load_backend(Path(run.model_version.directory))
    held = [TextDocument(*row) for row in corpus_texts(corpus=run.corpus) if row[0] in set(run.held_out)]
    limit = int(getattr(base.network, "max_len", 0)) - WINDOW_MARGIN

    def tokens(text: str) -> int:
        return len(base.tokenizer.encode_document(text))

    out: list[str] = []
    shown = 0
    for doc in document_windows(held, tokens, limit):
        if shown >= count:
            break
        case = sample_case(doc, base.tokenizer.encode)
        size = tokens(doc.text) + sum(h.max_tokens for h in case.holes)
        if not 2 <= len(case.holes) <= 8 or size > limit + WINDOW_MARGIN - 8:
            continue
        fills = {name: infill_request(m, case.request(0)).holes for name, m in (("base", base), ("tuned", tuned))}
        right = {k: sum(exact(v.get(h.name, ""), h.target) for h in case.holes) for k, v in fills.items()}
        shown += 1
        out += [f"### {doc.split}", "",
                f"{len(case.holes)} holes; written exactly as the original: base {right['base']}, "
                f"tuned {right['tuned']}. Text a model wrote is between ⟦ and ⟧.", "",
                "Base:", "", FENCE + "text", _marked(doc, case, fills["base"]), FENCE, "",
                "Tuned:", "", FENCE + "text", _marked(doc, case, fills["tuned"]), FENCE, "",
                "<details><summary>original</summary>", "", FENCE + "text", doc.text, FENCE, "",
                "</details>", ""]  # fmt: skip
    return out


def plot(evaluation: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(f"held-out {k}", m) for k, m in evaluation["held_out"]["per_kind"].items()]
    rows += [(f"test {k}", m) for k, m in (evaluation.get("regression") or {}).get("per_kind", {}).items()]
    fig, ax = plt.subplots(figsize=(10, 4))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [m["base_exact"] for _, m in rows], width=0.4, label="base")
    ax.bar([i + 0.2 for i in x], [m["tuned_exact"] for _, m in rows], width=0.4, label="tuned")
    ax.set_xticks(list(x), [name for name, _ in rows], rotation=30, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel("exact match")
    ax.set_title("Base against tuned: held-out documents and the original test split")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True)
    parser.add_argument("--out", type=Path, default=Path("bench/finetune"))
    parser.add_argument("--source", default="", help="where the corpus came from (a sentence)")
    parser.add_argument("--command", action="append", default=[], help="a command that made it")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--note", action="append", default=[],
                        help="a paragraph for the report's notes (what ran, what it shows)")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stencil.settings")
    os.environ.setdefault("DEBUG", "True")  # a development tool: development settings
    import django

    django.setup()
    from corpora.models import TrainingRun

    run = TrainingRun.objects.select_related("corpus", "base_version", "model_version").get(pk=args.run)
    if run.model_version is None or not run.evaluation:
        raise SystemExit(f"run {run.id} is {run.state}: no evaluated model version to report")
    ev, training = run.evaluation, run.model_version.training_config
    args.out.mkdir(parents=True, exist_ok=True)
    plot(ev, args.out / "exact_match.png")
    s = ev["summary"]
    lines = [
        f"# Teaching Stencil a corpus: {run.corpus.name}", "",
        args.source, "",
        f"Corpus: {run.corpus.documents} documents, {run.corpus.tokens:,} tokens; "
        f"{len(run.held_out)} documents held out before training "
        f"({ev.get('windows', {}).get('held_out', '?')} windows), "
        f"{ev.get('windows', {}).get('train', '?')} training windows.", "",
        f"Base: `{run.base_version.name}` (weights {run.base_version.weights_sha256[:12]}). "
        f"Tuned: `{run.model_version.name}` (weights {run.model_version.weights_sha256[:12]}).", "",
        f"Training: {training['steps']} steps × {training['config']['batch_size']} rows, "
        f"{training['tokens']:,} tokens, {training['train_seconds'] / 60:.1f} minutes of wall "
        f"time and {training.get('cpu_seconds', 0) / 60:.1f} CPU minutes on {training['threads']} "
        f"thread(s) ({training['precision']}); {run.config.get('original_share', 0):.0%} of rows "
        f"from the original corpus; peak learning rate {run.config.get('lr')}. Settings: "
        f"`{json.dumps(run.config)}`.", "",
        *[f"Command: `{c}`" for c in args.command], "",
        "## Held-out documents", "",
        "Paired (the same holes and seeds for both models, the diffusion route's default "
        "preset). Exact match: the hole's text equals the original's (spaces at the ends "
        "aside). NLL: the denoiser's per-token negative ELBO of the original text, nats (lower "
        "is better). 95% intervals from a paired bootstrap over cases (2,000 resamples).", "",
        *table(ev["held_out"], "hole kind"), "",
        "## Original test split (regression check)", "",
        *table(ev.get("regression") or {}, "hole kind"), "",
        f"Summary: held-out exact match {s['base_exact']:.3f} → {s['tuned_exact']:.3f}, NLL "
        f"{s['base_nll']:.3f} → {s['tuned_nll']:.3f}; original test split exact match "
        f"{s.get('regression_exact_diff', float('nan')):+.3f} "
        f"({s.get('regression_exact_low', float('nan')):+.3f} … "
        f"{s.get('regression_exact_high', float('nan')):+.3f}).", "",
        "![exact match](exact_match.png)", "",
        *(["## Notes", ""] + [line for note in args.note for line in (note, "")] if args.note else []),
        "## Three held-out documents, holed as a template, before and after", "",
        *samples(run, args.samples),
    ]  # fmt: skip
    (args.out / "REPORT.md").write_text("\n".join(lines) + "\n")
    (args.out / "results.json").write_text(json.dumps(
        {"run": str(run.id), "config": run.config, "evaluation": ev,
         "training": {k: v for k, v in training.items() if k != "init_from"}}, indent=1) + "\n")  # fmt: skip
    print(args.out / "REPORT.md")


if __name__ == "__main__":
    main()
