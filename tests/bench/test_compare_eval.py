"""bench/compare_eval.py: two evaluation runs matched case by case."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.compare_eval import compare, main, paired


def _case(model: str, seed: int, exact: bool, kind: str = "sentence", doc_kind: str = "job_offer") -> dict[str, Any]:
    return {"model": model, "kind": kind, "doc_kind": doc_kind, "seed": seed,
            "target": f"t{seed}", "exact": exact}  # fmt: skip


def _run(flags: dict[str, list[bool]], split: str = "val") -> dict[str, Any]:
    cases = [_case(m, i, e) for m, row in flags.items() for i, e in enumerate(row)]
    return {"split": split, "per_kind": {"sentence": {}}, "cases": cases}


@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=40))
def test_the_paired_difference_is_after_minus_before_on_the_same_cases(pairs: list[tuple[bool, bool]]) -> None:
    before = [_case("denoiser", i, b) for i, (b, _) in enumerate(pairs)]
    after = [_case("denoiser", i, a) for i, (_, a) in enumerate(pairs)]
    r = paired(before, list(reversed(after)))  # matched by case, not by order
    n = len(pairs)
    assert r["cases"] == n
    assert r["difference"] == pytest.approx(sum(a for _, a in pairs) / n - sum(b for b, _ in pairs) / n)
    assert r["better"] == sum(a and not b for b, a in pairs)
    assert r["worse"] == sum(b and not a for b, a in pairs)
    low, high = r["interval_95"]
    assert -1 <= low <= high <= 1
    if all(a == b for b, a in pairs):  # nothing changed: no noise either
        assert low == high == 0


def test_cases_only_one_run_holds_are_left_out_and_a_foreign_run_is_refused(tmp_path: Path) -> None:
    before = _run({"denoiser": [True, False, False], "ar_fim": [False, False, False]})
    after = _run({"denoiser": [True, True], "ar_fim": [True, True]})
    result = compare(before, after)
    assert result["models"]["denoiser"]["all"]["cases"] == 2
    assert result["models"]["denoiser"]["all"]["difference"] == pytest.approx(0.5)
    assert result["models"]["ar_fim"]["sentence"]["better"] == 2
    with pytest.raises(ValueError, match="one run is on val, the other on test"):
        compare(before, _run({"denoiser": [True], "ar_fim": [True]}, split="test"))
    with pytest.raises(ValueError, match="share no case"):
        paired(before["cases"][:1], [_case("denoiser", 7, True)])
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, run in zip(paths, (before, after), strict=True):
        path.write_text(json.dumps(run))
    main([str(paths[0]), str(paths[1]), "--out", str(tmp_path / "out.json")])
    assert json.loads((tmp_path / "out.json").read_text()) == json.loads(json.dumps(result))


def test_a_document_kind_splits_the_cases_into_its_own_and_the_rest() -> None:
    def run(flags: list[bool]) -> dict[str, Any]:
        cases = [_case(m, i, e, doc_kind="invoice" if i % 3 == 0 else "job_offer")
                 for m in ("denoiser", "ar_fim") for i, e in enumerate(flags)]  # fmt: skip
        return {"split": "val", "per_kind": {"sentence": {}}, "cases": cases}

    before, after = run([False] * 6), run([True, False, False, True, True, False])
    rows = compare(before, after, "invoice")["models"]["denoiser"]
    assert rows["invoice documents"]["cases"] == 2 and rows["invoice documents"]["difference"] == 1.0
    assert rows["other documents"]["cases"] == 4 and rows["other documents"]["difference"] == pytest.approx(0.25)
    assert rows["all"]["better"] == rows["invoice documents"]["better"] + rows["other documents"]["better"]
    assert "invoice documents" not in compare(before, after)["models"]["denoiser"]
