"""bench/compare_eval.py: two evaluation runs matched case by case."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.compare_eval import compare, main, paired, routes


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


@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.sampled_from(["sentence", "choice"]),
                          st.sampled_from(["left", "right", "none"])), min_size=1, max_size=30))  # fmt: skip
def test_routes_put_the_denoiser_against_ar_fim_on_the_same_cases_split_by_copy(
    rows: list[tuple[bool, bool, str, str]],
) -> None:
    cases = []
    for i, (d, a, kind, copy) in enumerate(rows):
        cases += [{**_case(m, i, e, kind=kind), "copy": copy} for m, e in (("denoiser", d), ("ar_fim", a))]
    twice = [{**c, "kind": "sentence_single"} for c in cases if c["kind"] == "sentence"]  # the same targets
    result = routes({"split": "test", "per_kind": {"sentence": {}, "choice": {}, "sentence_single": {}},
                     "cases": cases + twice})["rows"]  # fmt: skip
    assert result.get("sentence_single") == result.get("sentence")
    assert result["all"]["cases"] == len(rows)  # each target once: the _single repeats stay out
    assert result["all"]["difference"] == pytest.approx(sum(d - a for d, a, _, _ in rows) / len(rows))
    assert result["all"]["better"] == sum(d and not a for d, a, _, _ in rows)
    assert {"sentence", "choice"} & set(result) == {kind for _, _, kind, _ in rows}  # a kind with no case: no row
    for name in ("all", *{kind for _, _, kind, _ in rows}):
        mine = [r for r in rows if name in ("all", r[2])]
        copies = {r[3] for r in mine}
        assert {n for n in result if n.startswith(f"{name}, ")} == {f"{name}, copy {c}" for c in copies}
        assert sum(result[f"{name}, copy {c}"]["cases"] for c in copies) == len(mine)
        for c in copies:
            split = [(d, a) for d, a, _, copy in mine if copy == c]
            assert result[f"{name}, copy {c}"]["before"] == pytest.approx(sum(a for _, a in split) / len(split))
            assert result[f"{name}, copy {c}"]["after"] == pytest.approx(sum(d for d, _ in split) / len(split))


def test_routes_read_one_run_and_a_run_from_before_the_phrase_field_has_no_split(tmp_path: Path) -> None:
    run = _run({"denoiser": [True, True, False], "ar_fim": [True, False, False]}, split="test")
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    main(["--routes", str(path), "--out", str(tmp_path / "out.json")])
    rows = json.loads((tmp_path / "out.json").read_text())["rows"]
    assert set(rows) == {"all", "sentence"}
    assert rows["all"]["difference"] == pytest.approx(1 / 3) and rows["all"]["better"] == 1
    with pytest.raises(SystemExit):
        main([str(path)])  # two runs, or one with --routes
