"""The AR-FIM route's spans re-read in the finished document, as a confidence signal.

    python bench/confidence/reread_probe.py

The AR route writes a canvas's holes left to right, each seeing the later holes as masks. Once
every hole is filled, the AR-FIM model can read each span again between the whole filled
prefix and suffix (its fill-in-the-middle NLL, the bench's ``judge_nll`` with the AR model as
its own reader). For every generated free-sentence span of the AR route in
``runs_{val,test}.json`` it rebuilds the filled document and prints the AUROC against
"right" (as the confidence bench labels it: the denoiser judges AR text, so this is not the
label) of the committed probabilities (``mean_logp``, ``mean_p``), of the re-read
(``reread``, minus the per-token NLL) and of their sum, with the seconds per span. It reads the
document as the bench's tokenizer does; the worker's own re-read is
``gpu_worker.engine.rescore.span_reread``, measured by ``confidence_bench.py``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.confidence.confidence_bench import (  # noqa: E402
    HERE,
    MODELS,
    auroc,
    fit,
    hole_ranges,
    judge_nll,
    label,
)
from bench.confidence.elbo_probe import requests  # noqa: E402


def main() -> int:
    from gpu_worker.engine.backends import load_backend
    from gpu_worker.engine.confidence import span_signal

    ar = load_backend(MODELS["ar"])
    val = json.loads((HERE / "runs_val.json").read_text())
    judge_bar = fit(val)["judge_bar"]
    for split in ("val", "test"):
        records = val if split == "val" else json.loads((HERE / "runs_test.json").read_text())
        per_kind = sum(r["id"].startswith("sentence-") and r["route"] == "ar" and r["hole"] == "target"
                       for r in records)  # fmt: skip
        reqs = requests(split, per_kind, ar.tokenizer.encode)
        rows = [r for r in records if r["route"] == "ar" and r["probs"] and r["set"] == "generated"
                and r["kind"] == "sentence"]  # fmt: skip
        texts: dict[str, dict[str, str]] = {}
        for r in [r for r in records if r["route"] == "ar"]:
            texts.setdefault(r["id"], {})[r["hole"]] = r["text"]
        started = time.perf_counter()
        reread = []
        for r in rows:
            req, holes = reqs[r["id"]], texts[r["id"]]
            doc = "".join(s["text"] if "text" in s else holes.get(s["hole"], "") for s in req["segments"])
            reread.append(-judge_nll(ar, doc, *hole_ranges(req, holes)[r["hole"]]))
        per_span = (time.perf_counter() - started) / max(1, len(rows))
        ys = [label(r, judge_bar) for r in rows]
        logp = [span_signal("mean_logp", r["probs"]) for r in rows]
        mean_p = [span_signal("mean_p", r["probs"]) for r in rows]
        both = [a + b for a, b in zip(logp, reread, strict=True)]
        print(f"{split}: {len(rows)} AR sentence spans, {per_span:.3f} s/span (this CPU): "
              f"mean_logp {auroc(logp, ys):.3f}  mean_p {auroc(mean_p, ys):.3f}  "
              f"reread {auroc(reread, ys):.3f}  mean_logp+reread {auroc(both, ys):.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
