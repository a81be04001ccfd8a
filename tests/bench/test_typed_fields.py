"""The typed-fields study: what it counts as copied, out of time and exact."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from bench.typed_fields_study import FIELDS, dates_in, main, score
from gpu_worker.engine.tokenizer import StencilTokenizer
from research.corpus import long_date
from research.evaluate import Case, first_of_kind, sample_case
from tests.gpu_worker.conftest import shipped_tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> StencilTokenizer:
    return shipped_tokenizer()


@pytest.mark.parametrize("kind", sorted(FIELDS))
def test_the_originals_copy_every_field_and_keep_time(kind: str, tokenizer: StencilTokenizer) -> None:
    naming = 0
    for doc in first_of_kind("val", kind, 10):
        case = sample_case(doc, tokenizer.encode)
        counts = score(case, _originals(case))
        assert counts["copied"] == counts["naming"]
        assert counts["out_of_time"] == 0 and counts["exact"] == counts["holes"] == len(case.holes)
        assert counts["untyped_date"] == counts["untyped_amount"] == 0  # every field is typed
        naming += counts["naming"]
    assert naming >= 3  # not every invoice's payment sentences name the due date


def _originals(case: Case) -> dict[str, str]:
    return {h.name: h.target for h in case.holes}


def test_a_date_years_after_the_document_is_out_of_time(tokenizer: StencilTokenizer) -> None:
    doc = next(first_of_kind("val", "invoice", 1))
    case = sample_case(doc, tokenizer.encode)
    holes = _originals(case)
    issued = dates_in(next(doc.span_text(s) for s in doc.spans if s.name == "issued"))[0]
    first = next(iter(holes))
    later = issued + timedelta(days=4 * 365)
    late = {**holes, first: f"Please pay by {long_date(later)}."}
    assert score(case, late)["out_of_time"] == 1 and score(case, holes)["out_of_time"] == 0
    assert score(case, late)["untyped_date"] == 1 and score(case, holes)["untyped_date"] == 0


def _offer_naming(field: str, tokenizer: StencilTokenizer) -> tuple[Case, dict[str, str], str]:
    """The first val job offer as a drafting request, its original fills, and the hole whose
    original names the typed ``field``."""
    doc = next(first_of_kind("val", "job_offer", 1))
    case = sample_case(doc, tokenizer.encode)
    holes = _originals(case)
    value = next(doc.span_text(s) for s in doc.spans if s.name == field)
    return case, holes, next(name for name, text in holes.items() if value in text)


def test_a_fill_that_drops_the_field_or_goes_back_in_time_is_counted(tokenizer: StencilTokenizer) -> None:
    case, holes, naming = _offer_naming("role", tokenizer)
    wrong = {**holes, naming: "We offer you the role of Engineer, from January 1, 2020."}
    counts, right = score(case, wrong), score(case, holes)
    assert counts["copied"] == right["copied"] - 1
    assert counts["out_of_time"] == 1 and counts["exact"] == counts["holes"] - 1
    assert counts["untyped_date"] == right["untyped_date"] + 1


def test_a_made_up_or_garbled_salary_is_an_amount_not_typed(tokenizer: StencilTokenizer) -> None:
    case, holes, naming = _offer_naming("salary", tokenizer)
    right = score(case, holes)
    assert right["priced"] >= 1 and right["untyped_amount"] == 0
    for written in ("Your gross pay will be $ $,000.00 per annum.", "The starting salary is $12,500.00 per year."):
        counts = score(case, {**holes, naming: written})
        assert counts["priced"] == right["priced"] and counts["untyped_amount"] == 1
        assert counts["copied"] == right["copied"] - 1


def test_dates_in_reads_long_dates_and_skips_impossible_ones() -> None:
    assert [d.isoformat() for d in dates_in("on May 27, 2021 and February 30, 2021")] == ["2021-05-27"]


def test_the_study_runs_a_pair_and_writes_its_report(tmp_path: Path) -> None:
    main(["--docs", "1", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "typed_fields_val.json").read_text())
    rows = results["pairs"]["shipped"]["rows"]
    assert set(rows) == {f"{m}, {k}" for m in ("denoiser", "AR-FIM") for k in FIELDS}
    assert all(0 <= r["copied"] <= r["naming"] and r["exact"] <= r["holes"] for r in rows.values())
    assert "| shipped | denoiser, job_offer |" in (tmp_path / "TYPED_FIELDS_VAL.md").read_text()
