"""A few-pass ELBO signal for the denoiser's spans, measured against the token-probability one.

    python bench/confidence/elbo_probe.py --passes 4

For every diffusion-route span in ``runs_{val,test}.json`` it rebuilds the filled document
(the request's locked text and the route's hole texts), re-masks the span's tokens in
``--passes`` stratified random subsets (one batched forward pass), and averages the denoiser's
log-probability of the committed tokens at the masked positions (``elbo``; ``elbo_min``: the
mean over passes of the least likely masked token). It prints each hole kind's AUROC against
"right" (as the confidence bench labels it) beside ``mean_logp``, and the seconds per span.
The probe reads the document as the bench's tokenizer does, not the worker's canvas (no
preamble, the span alone as a hole); the worker's own is ``gpu_worker.engine.rescore``, and
what it ships is measured by ``confidence_bench.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.confidence.confidence_bench import (  # noqa: E402
    HERE,
    KINDS,
    MODELS,
    auroc,
    fit,
    hole_ranges,
    label,
)

SHOWN = ("sentence", "choice", "json_value", "number_date", "entity_right", "answer")


def requests(split: str, per_kind: int, encode: Any) -> dict[str, dict[str, Any]]:
    from bench.handwritten.load import load
    from research.evaluate import build_cases

    out = {f"{kind}-{i}": case.request() for kind in KINDS
           for i, case in enumerate(build_cases(kind, per_kind, encode, split=split))}  # type: ignore[arg-type]  # fmt: skip
    out.update({d.id: d.request(encode) for d in load(split)})
    return out


def few_pass(
    loaded: Any, text: str, start: int, end: int, passes: int, seed: int = 0
) -> tuple[float, float]:
    import torch

    from gpu_worker.engine.model import hole_room
    from research.corpus import Document, Span, tokenize_with_holes

    net, tok = loaded.network, loaded.tokenizer
    cfg = net.config
    span = Span(start, end, "sentence", "target")
    doc = Document("probed", 0, "test", text, (span,), (), ())
    ids, ranges = tokenize_with_holes(doc, [span], tok.encode, virtual_spaces=tok.virtual_spaces,
                                      spaced_lines=tok.spaced_lines)  # fmt: skip
    a, b = ranges[0]
    truth = torch.tensor(ids[: cfg.max_len])
    pos = torch.tensor([p for p in range(a, b) if p < cfg.max_len], dtype=torch.long)
    n = len(pos)
    if n == 0:
        return float("nan"), float("nan")
    g = torch.Generator().manual_seed(seed)
    t = (torch.arange(passes) + torch.rand(passes, generator=g)) / passes  # stratified ratios
    count = (t * n).round().clamp(1, n)
    draws = torch.rand(passes, n, generator=g).argsort(-1).argsort(-1) < count[:, None]
    inputs = truth.repeat(passes, 1)
    masked = torch.zeros_like(inputs, dtype=torch.bool)
    masked[:, pos] = draws
    inputs[masked] = cfg.mask_id
    with torch.no_grad():
        logits = net(inputs, room=hole_room(len(truth), [(a, b)]).repeat(passes, 1)).float()
    lp = torch.log_softmax(logits, -1).gather(-1, truth.repeat(passes, 1)[..., None])[..., 0]
    mean = ((lp * masked).sum(1) / masked.sum(1)).mean()
    least = torch.where(masked, lp, torch.zeros_like(lp)).min(1).values.mean()
    return float(mean), float(least)


def main() -> int:
    from gpu_worker.engine.backends import load_backend
    from gpu_worker.engine.confidence import span_signal

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passes", type=int, default=4)
    parser.add_argument("--per-kind", type=int, default=28)
    args = parser.parse_args()
    loaded = load_backend(MODELS["diffusion"])
    val = json.loads((HERE / "runs_val.json").read_text())
    judge_bar = fit(val)["judge_bar"]
    for split in ("val", "test"):
        records = val if split == "val" else json.loads((HERE / "runs_test.json").read_text())
        reqs = requests(split, args.per_kind, loaded.tokenizer.encode)
        rows = [r for r in records if r["route"] == "diffusion" and r["probs"]]
        texts: dict[str, dict[str, str]] = {}
        for r in rows:
            texts.setdefault(r["id"], {})[r["hole"]] = r["text"]
        started = time.perf_counter()
        probed = {}
        for r in rows:
            req, holes = reqs[r["id"]], texts[r["id"]]
            doc = "".join(
                s["text"] if "text" in s else holes.get(s["hole"], "") for s in req["segments"]
            )
            probed[(r["id"], r["hole"])] = few_pass(
                loaded, doc, *hole_ranges(req, holes)[r["hole"]], args.passes
            )
        per_span = (time.perf_counter() - started) / max(1, len(rows))
        print(f"{split}: {len(rows)} spans, {args.passes} passes, {per_span:.3f} s/span (this CPU)")
        for kind in (*SHOWN, "generated"):
            rr = [
                r
                for r in rows
                if (
                    r["set"] == "generated"
                    if kind == "generated"
                    else r["kind"] == kind and not r["ood"]
                )
            ]
            ys = [label(r, judge_bar) for r in rr]
            base = [span_signal("mean_logp", r["probs"]) for r in rr]
            got = [
                [-99.0 if math.isnan(v) else v for v in probed[(r["id"], r["hole"])]] for r in rr
            ]
            print(f"  {kind:12s} n={len(rr):3d} mean_logp {auroc(base, ys):.3f}  elbo {auroc([g[0] for g in got], ys):.3f}"
                  f"  elbo_min {auroc([g[1] for g in got], ys):.3f}  mean_logp+elbo {auroc([b + g[0] for b, g in zip(base, got, strict=True)], ys):.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
