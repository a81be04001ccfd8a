"""The confidence bench's fit: a hole class with a signal of its own has its curve fitted on
that signal, so the calibrated confidence still ranks that class's spans."""

from __future__ import annotations

import random
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.confidence.confidence_bench import _fit_route, _p, auroc  # noqa: E402
from gpu_worker.engine.confidence import span_signal  # noqa: E402


def _rows(seed: int, n: int) -> tuple[list[dict], list[bool]]:
    rng = random.Random(seed)
    rows, labels = [], []
    for _ in range(n):
        right = rng.random() < 0.5
        level = rng.uniform(0.6, 0.99) if right else rng.uniform(0.05, 0.7)
        probs = [min(1.0, max(1e-4, level + rng.uniform(-0.05, 0.05))) for _ in range(rng.randint(1, 8))]
        rows.append({"probs": probs, "class": "free", "set": "generated", "domain_score": 0.1,
                     "rescored": None})  # fmt: skip
        labels.append(right)
    return rows, labels


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 10_000))
def test_a_class_with_its_own_signal_is_calibrated_on_it(seed: int) -> None:
    rows, labels = _rows(seed, 80)
    route = _fit_route(rows, labels, "mean_logp", 0.0, {"free": "mean_p"})
    assert route.signal_for("free") == "mean_p"
    curve = route.curve("free")
    signals = [span_signal("mean_p", r["probs"]) for r in rows]
    assert min(curve.x) >= min(signals) - 1e-9 and max(curve.x) <= max(signals) + 1e-9
    ps = [_p(r, route) for r in rows]
    assert auroc(ps, labels) > 0.8  # not one flat value
