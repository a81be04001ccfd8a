"""The margin between a choices hole's best and second-best candidate, against the chosen
candidate's share (what the worker keeps), as confidence signals.

    python bench/confidence/choice_probe.py

Fills the generated val and test choice cases on both routes (as the confidence bench does)
while recording every candidate's whole-candidate log-likelihood at the commit (the
sampler's ``Choices.commit``, the AR route's ``score_candidates``), and prints each route's
AUROC against exactness for: the chosen share ``p1``, the share margin ``p1 - p2``, the
log-likelihood ratio of the best two, and the best candidate's log-likelihood.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.confidence.confidence_bench import MODELS, auroc  # noqa: E402


def main() -> int:
    import torch

    import gpu_worker.engine.ar as ar
    import gpu_worker.engine.sampler.writers as writers
    from gpu_worker.engine.backends import load_backend
    from gpu_worker.engine.run import run
    from research.evaluate import build_cases, exact

    seen: dict[str, list[float]] = {}
    score_candidates, commit = ar.score_candidates, writers.Choices.commit

    def scored(*args: Any, **kw: Any) -> list[float]:
        seen["totals"] = list(score_candidates(*args, **kw))
        return seen["totals"]

    def committed(self: Any, draft: Any, hole_index: int, logits: Any, generator: Any) -> Any:
        hole = draft.plan.canvas.holes[hole_index]
        log_probs = torch.log_softmax(logits.values[logits.where[hole.start : hole.end]], dim=-1)
        pad = draft.plan.pad_id
        cands = torch.tensor([list(c) + [pad] * (hole.max_len - len(c)) for c in hole.constraint.candidates],
                             dtype=torch.long, device=log_probs.device)  # fmt: skip
        positions = torch.arange(hole.max_len, device=log_probs.device)
        seen["totals"] = log_probs[positions[None, :], cands].sum(-1).tolist()
        return commit(self, draft, hole_index, logits, generator)

    ar.score_candidates = scored
    writers.Choices.commit = committed  # type: ignore[method-assign]
    loaded = {route: load_backend(d) for route, d in MODELS.items()}
    encode = loaded["diffusion"].tokenizer.encode
    for split in ("val", "test"):
        rows: dict[str, list[tuple[bool, list[float]]]] = {route: [] for route in loaded}
        for case in build_cases("choice", 28, encode, split=split):
            target = next(h for h in case.holes if h.name == "target")
            for route, model in loaded.items():
                seen.clear()
                outcome = run(route, model, case.request())
                rows[route].append(
                    (exact(outcome.holes.get("target", ""), target.target), seen["totals"])
                )
        for route, got in rows.items():
            ys = [y for y, _ in got]
            tops = [sorted(t, reverse=True)[:2] for _, t in got]
            shares = [
                sorted(torch.softmax(torch.tensor(t), 0).tolist(), reverse=True)[:2] for _, t in got
            ]
            print(f"{split} {route}: n={len(got)} right {sum(ys) / len(ys):.2f}  p1 {auroc([s[0] for s in shares], ys):.3f}"
                  f"  p1-p2 {auroc([s[0] - s[1] for s in shares], ys):.3f}"
                  f"  log-ratio {auroc([t[0] - t[1] for t in tops], ys):.3f}"
                  f"  best log-lik {auroc([t[0] for t in tops], ys):.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
