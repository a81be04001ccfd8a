"""Base against tuned, paired: on a corpus's held-out documents and on the original test split.

The held-out cases are cut as :mod:`research.evaluate` cuts them (the same candidate rules,
budgets and second sentence hole) into the held-out windows: ``entity_right`` (the first
mention of a repeated entity), ``entity_left`` (a later one), ``number_date`` (with its format
as a pattern) and ``sentence``. The regression check reads the original test split's cases
(``evaluate.build_cases``). Both models fill the same cases with the same seeds through the
diffusion route, and their negative ELBOs are drawn with the same mask draws, so each case
gives a paired difference; the intervals are 95% percentile intervals of a seeded bootstrap
over cases.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from gpu_worker.engine.backends import load_backend
from gpu_worker.engine.infill import infill_request
from gpu_worker.engine.loaded import LoadedModel
from research.corpus import Document
from research.evaluate import (
    CASE_SEED,
    HOLE_KINDS,
    Case,
    _candidates,
    _hole,
    _second_hole,
    build_cases,
    denoiser_nelbo,
    run_route,
)

HELD_OUT_KINDS = ("entity_right", "entity_left", "number_date", "sentence")
REGRESSION_KINDS = tuple(k for k in HOLE_KINDS if not k.endswith("_single"))
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 20260101
CANVAS_MARGIN = 8  # positions a case leaves free of the model's max_len


def corpus_cases(documents: list[Document], kind: str, count: int, loaded: LoadedModel) -> list[Case]:
    """Up to ``count`` cases of ``kind`` from ``documents`` (deterministic), each one that fits
    the model whole."""
    encode = loaded.tokenizer.encode
    limit = int(getattr(loaded.network, "max_len", 0)) - CANVAS_MARGIN
    cases: list[Case] = []
    for index, doc in enumerate(documents):
        if len(cases) >= count:
            break
        options = _candidates(doc, kind)
        if not options:
            continue
        rng = random.Random(f"{CASE_SEED}:{kind}:{index}")
        target = rng.choice(options)
        holes = [_hole("target", kind, doc, target, encode)]
        second = _second_hole(doc, target, rng)
        if second is not None:
            holes.append(_hole("other", "sentence_extra", doc, second, encode))
        size = len(loaded.tokenizer.encode_document(doc.text)) + sum(h.max_tokens for h in holes)
        if size <= limit:
            cases.append(Case(kind, doc, tuple(holes)))
    return cases


def bootstrap(diffs: list[float], *, samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED
              ) -> tuple[float, float]:  # fmt: skip
    """95% percentile interval of the mean of ``diffs`` (paired per case)."""
    if not diffs:
        return float("nan"), float("nan")
    rng = random.Random(seed)
    n = len(diffs)
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(samples))
    return means[int(0.025 * samples)], means[int(0.975 * samples) - 1]


def paired_row(base: list[dict[str, Any]], tuned: list[dict[str, Any]]) -> dict[str, Any]:
    """n, exact match and NLL of each model, and the paired differences with intervals."""
    n = len(base)
    if n == 0:
        return {"n": 0}
    exact = [t["exact"] - b["exact"] for b, t in zip(base, tuned, strict=True)]
    nll = [t["nll"] - b["nll"] for b, t in zip(base, tuned, strict=True)]
    exact_low, exact_high = bootstrap(exact)
    nll_low, nll_high = bootstrap(nll)
    return {
        "n": n,
        "base_exact": sum(b["exact"] for b in base) / n, "tuned_exact": sum(t["exact"] for t in tuned) / n,
        "exact_diff": sum(exact) / n, "exact_low": exact_low, "exact_high": exact_high,
        "base_nll": sum(b["nll"] for b in base) / n, "tuned_nll": sum(t["nll"] for t in tuned) / n,
        "nll_diff": sum(nll) / n, "nll_low": nll_low, "nll_high": nll_high,
    }  # fmt: skip


def _score(loaded: LoadedModel, name: str, kind_index: int, cases: list[Case],
           tick: Callable[[], None]) -> list[dict[str, Any]]:  # fmt: skip
    """One model on ``cases``: each case's record with its NLL (mask draws seeded per kind,
    the same for both models)."""
    gen = torch.Generator().manual_seed(CASE_SEED + kind_index)
    nelbo = partial(denoiser_nelbo, loaded, generator=gen)
    records: list[dict[str, Any]] = []

    def route(request: dict[str, Any]) -> Any:
        tick()
        return infill_request(loaded, request)

    score = run_route(name, route, loaded, cases, nelbo, records)
    for record, nll in zip(records, score.nll, strict=True):
        record["nll"] = nll
    return records


def evaluate_pair(base: LoadedModel, tuned: LoadedModel, cases_by_kind: dict[str, list[Case]],
                  tick: Callable[[], None]) -> dict[str, Any]:  # fmt: skip
    per_kind: dict[str, Any] = {}
    every_base: list[dict[str, Any]] = []
    every_tuned: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    for index, (kind, cases) in enumerate(cases_by_kind.items()):
        b = _score(base, "base", index, cases, tick)
        t = _score(tuned, "tuned", index, cases, tick)
        per_kind[kind] = paired_row(b, t)
        every_base += b
        every_tuned += t
        samples += [{"kind": kind, "target": x["target"], "base": x["prediction"],
                     "tuned": y["prediction"]} for x, y in list(zip(b, t, strict=True))[:3]]  # fmt: skip
    return {"per_kind": per_kind, "all": paired_row(every_base, every_tuned), "samples": samples}


def evaluate_run(base_dir: Path, tuned_dir: Path, held_out: list[Document], *, cases_per_kind: int,
                 regression_cases: int, on_case: Callable[[int, int], None] | None = None
                 ) -> dict[str, Any]:  # fmt: skip
    """The run's evaluation: held-out and regression tables, a summary, a few samples.
    ``on_case(done, total)`` is called before each fill (progress, and a cancellation point
    when it raises)."""
    base, tuned = load_backend(base_dir), load_backend(tuned_dir)
    held = {k: corpus_cases(held_out, k, cases_per_kind, base) for k in HELD_OUT_KINDS}
    held = {k: v for k, v in held.items() if v}
    regression = {k: build_cases(k, regression_cases, base.tokenizer.encode, split="test")
                  for k in REGRESSION_KINDS} if regression_cases > 0 else {}  # fmt: skip
    total = 2 * (sum(map(len, held.values())) + sum(map(len, regression.values())))
    done = [0]

    def tick() -> None:
        if on_case is not None:
            on_case(done[0], total)
        done[0] += 1

    held_result = evaluate_pair(base, tuned, held, tick)
    regression_result = evaluate_pair(base, tuned, regression, tick) if regression else {}
    summary = {f"{side}_{metric}": held_result["all"].get(f"{side}_{metric}")
               for side in ("base", "tuned") for metric in ("exact", "nll")}  # fmt: skip
    summary["held_out_cases"] = held_result["all"].get("n", 0)
    if regression_result:
        summary["regression_exact_diff"] = regression_result["all"]["exact_diff"]
        summary["regression_exact_low"] = regression_result["all"]["exact_low"]
        summary["regression_exact_high"] = regression_result["all"]["exact_high"]
    return {"held_out": held_result, "regression": regression_result, "summary": summary,
            "samples": held_result["samples"][:9],
            "models": {"base": base.identity(), "tuned": tuned.identity()}}  # fmt: skip
