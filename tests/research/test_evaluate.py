"""The evaluation harness: case construction, scoring rules, and an end-to-end tiny run."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_worker.engine.backends import load_backend
from gpu_worker.engine.model import ModelConfig, StencilTransformer, save_model
from gpu_worker.engine.tokenizer import StencilTokenizer
from research.corpus import (
    DOCUMENT_SEPARATOR,
    KINDS,
    Document,
    Span,
    Split,
    document_at,
    iter_split,
)
from research.evaluate import (
    COPIES,
    HOLE_KINDS,
    PHRASES,
    STARTS,
    Case,
    HoleCounts,
    HoleSpec,
    ar_nll,
    build_cases,
    build_long_cases,
    copy_side,
    evaluate,
    field_table,
    hole_start,
    is_valid,
    judged_nll,
    locked_preserved,
    locked_text,
    main,
    markdown_table,
    merge_results,
    phrase_class,
    sample_case,
    train_lexicon,
    write_report,
    write_samples,
)
from research.phrases import BANKS


@pytest.fixture(scope="module")
def corpus_tokenizer() -> StencilTokenizer:
    return StencilTokenizer.train((d.text for d in iter_split("train", 150)), vocab_size=900)


def _save(directory: Path, tok: StencilTokenizer, kind: str, *, fim_hole_masks: bool = False) -> Path:
    s = tok.special
    cfg = ModelConfig(
        kind=kind, vocab_size=tok.vocab_size, pad_id=s.pad, eos_id=s.eos, mask_id=s.mask,  # type: ignore[arg-type]
        fim_prefix_id=s.fim_prefix, fim_suffix_id=s.fim_suffix, fim_middle_id=s.fim_middle,
        d_model=16, n_layers=1, n_heads=2, ffn_hidden=32, max_len=512,
        fim_hole_masks=fim_hole_masks,
    )  # fmt: skip
    torch.manual_seed(0)
    save_model(StencilTransformer(cfg), directory, dtype=torch.float32)
    tok.save(directory / "tokenizer.json")
    return directory


@pytest.mark.parametrize("kind", HOLE_KINDS)
def test_cases_of_every_kind_rebuild_their_document(kind: str, corpus_tokenizer: StencilTokenizer) -> None:
    cases = build_cases(kind, 3, corpus_tokenizer.encode)
    assert len(cases) == 3
    for case in cases:
        holes = {h.name: h.target for h in case.holes}
        segments = case.request()["segments"]
        rebuilt = "".join(s["text"] if "text" in s else holes[s["hole"]] for s in segments)
        assert rebuilt == case.doc.text
        assert locked_preserved(case, rebuilt, holes)
        assert is_valid(case.holes[0], case.holes[0].target)


def test_right_context_cases_hide_the_first_mention_only(corpus_tokenizer: StencilTokenizer) -> None:
    for case in build_cases("entity_right", 10, corpus_tokenizer.encode):
        target = case.holes[0]
        rest = case.doc.text[target.span.end :]
        assert target.target in rest
        assert target.target not in case.doc.text[: target.span.start]
        other = [h for h in case.holes if h.name != "target"]
        assert all(target.target not in h.target for h in other)


def test_locked_preservation_catches_a_changed_locked_character(corpus_tokenizer: StencilTokenizer) -> None:
    case = build_cases("sentence", 1, corpus_tokenizer.encode)[0]
    holes = {h.name: h.target for h in case.holes}
    tampered = case.doc.text.replace(":", ";", 1)
    assert tampered != case.doc.text
    assert not locked_preserved(case, tampered, holes)


def test_invalid_fills_are_not_counted_valid(corpus_tokenizer: StencilTokenizer) -> None:
    number = build_cases("number_date", 1, corpus_tokenizer.encode)[0].holes[0]
    choice = build_cases("choice", 1, corpus_tokenizer.encode)[0].holes[0]
    assert not is_valid(number, "not a number")
    assert not is_valid(choice, "none of them")
    assert not is_valid(replace(choice, constraint=None), "   ")


def test_tiny_models_run_end_to_end_and_keep_locked_text(
    corpus_tokenizer: StencilTokenizer, tmp_path: Path
) -> None:
    denoiser = _save(tmp_path / "d", corpus_tokenizer, "denoiser")
    ar = _save(tmp_path / "a", corpus_tokenizer, "ar_fim")
    results = evaluate(denoiser, ar, per_kind=1, kinds=("entity_right", "choice"),
                       sampler={"max_steps": 8}, progress=False)  # fmt: skip
    for kind in ("entity_right", "choice"):
        for model in ("denoiser", "ar_fim"):
            m = results["per_kind"][kind][model]
            assert m["cases"] == 1 and m["locked_preserved"] == 1.0
    assert results["per_kind"]["choice"]["ar_fim"]["validity"] == 1.0
    for case in results["cases"]:  # exact match sets spaces at the ends aside; strict does not
        assert case["exact"] == (case["prediction"].strip() == case["target"].strip())
        assert case["exact_strict"] == (case["prediction"] == case["target"])
    alone = evaluate(denoiser, ar, per_kind=1, kinds=("choice",), sampler={"max_steps": 8}, progress=False)
    for model in ("denoiser", "ar_fim"):  # a kind scores the same in a run of other kinds
        assert alone["per_kind"]["choice"][model]["nll_per_token"] == results["per_kind"]["choice"][model]["nll_per_token"]
    first = evaluate(denoiser, ar, per_kind=1, kinds=("entity_right",), sampler={"max_steps": 8}, progress=False)
    merged = merge_results([alone, first])  # runs of other kinds make one run's results
    def scores(run: dict) -> dict:  # every measure but the wall time
        return {k: {m: {f: v for f, v in row.items() if f != "seconds_per_case"} for m, row in by.items()}
                for k, by in run["per_kind"].items()}  # fmt: skip

    assert scores(merged) == scores(results) and list(merged["per_kind"]) == ["entity_right", "choice"]
    assert [c["prediction"] for c in merged["cases"]] == [c["prediction"] for c in results["cases"]]
    with pytest.raises(ValueError, match="share a hole kind"):
        merge_results([alone, alone])
    write_report(results, tmp_path / "eval")
    assert (tmp_path / "eval" / "exact_match.png").is_file()
    assert "| entity_right | 1 |" in markdown_table(results)
    assert "exact, spaces counted (D / AR)" in markdown_table(results)
    assert all(case["starts"] in STARTS for case in results["cases"])
    assert {case["copy"] for case in results["cases"] if case["kind"] == "entity_right"} == {"right"}
    assert all(case["phrase"] in PHRASES for case in results["cases"])
    report = (tmp_path / "eval" / "REPORT.md").read_text()
    assert "## Exact match by where the hole starts" in report
    right = [c["exact"] for c in results["cases"] if c["copy"] == "right" and c["model"] == "denoiser"]
    assert f"| only on its right | {len(right)} | {sum(right) / len(right):.2f} / " in report


def test_ar_nll_with_hole_masks_reads_the_budgets_of_the_holes_after_the_target(
    corpus_tokenizer: StencilTokenizer, tmp_path: Path
) -> None:
    plain = load_backend(_save(tmp_path / "a", corpus_tokenizer, "ar_fim"))
    masks = load_backend(_save(tmp_path / "m", corpus_tokenizer, "ar_fim", fim_hole_masks=True))
    cases = build_cases("entity_right", 8, corpus_tokenizer.encode) + build_cases("sentence", 8, corpus_tokenizer.encode)
    case = next(c for c in cases if any(h.span.start > c.holes[0].span.start for h in c.holes))
    wider = replace(case, holes=tuple(h if h.name == "target" else replace(h, max_tokens=h.max_tokens + 3)
                                      for h in case.holes))  # fmt: skip
    assert ar_nll(masks, case) != ar_nll(masks, wider)  # the later holes' masks are in its prompt
    assert ar_nll(plain, case) == ar_nll(plain, wider)  # its suffix stops at the next hole


def test_a_hole_knows_the_phrase_variant_that_wrote_it() -> None:
    splits: tuple[Split, ...] = ("train", "val", "test")
    seen: dict[str, set[str]] = {split: set() for split in splits}
    for split in splits:
        for doc in iter_split(split, 60):
            ends = [0]
            for pattern, (start, end) in zip(doc.patterns, doc.pattern_spans, strict=True):
                assert ends[-1] <= start < end  # in order, never overlapping
                ends.append(end)
                slot, index = pattern.rsplit("#", 1)
                values = sorted((s for s in doc.spans if s.kind != "sentence" and start <= s.start and s.end <= end),
                                key=lambda s: s.start)  # fmt: skip
                text, cursor = "", start
                for v in values:  # the variant's wording with its placeholders back in
                    text += doc.text[cursor : v.start] + "{" + v.name + "}"
                    cursor = v.end
                assert text + doc.text[cursor:end] == BANKS[doc.kind][slot][int(index)]
            for span in doc.spans:
                where = phrase_class(doc, span)
                seen[split].add(where)
                if span.kind == "sentence":  # a sentence is one phrase: its slot's
                    owner = doc.pattern_at(span)
                    assert where != "layout" and owner is not None and owner.rsplit("#", 1)[0] == span.name
    assert seen["test"] == set(PHRASES)
    assert seen["train"] == seen["val"] == {"seen", "layout"}  # held-out variants are the test split's


def test_a_hole_knows_where_its_text_also_stands_outside_the_other_holes(corpus_tokenizer: StencilTokenizer) -> None:
    text = "Due May 2, 2024. Paid on May 2, 2024 by Ann. Ann Lee."
    doc = Document("invoice", 0, "test", text, (), (), ())

    def case(*spans: tuple[str, int]) -> Case:  # (text, which occurrence) per hole, target first
        holes = []
        for i, (word, nth) in enumerate(spans):
            start = [m.start() for m in re.finditer(re.escape(word), text)][nth]
            span = Span(start, start + len(word), "date", "d")
            holes.append(HoleSpec("target" if i == 0 else f"h{i}", "number_date", span, word, 9, None))
        return Case("number_date", doc, tuple(holes))

    assert copy_side(case(("May 2, 2024", 0))) == "right"
    assert copy_side(case(("May 2, 2024", 1))) == "left"
    assert copy_side(case(("May 2, 2024", 0), ("May 2, 2024", 1))) == "none"  # its copy is in a hole
    assert copy_side(case(("May 2, 2024", 0), ("Paid on May 2, 2024", 0))) == "none"
    assert copy_side(case(("May 2, 2024", 0), ("Ann", 1))) == "right"  # another hole on its right
    assert copy_side(case(("Ann", 0))) == "right"
    assert copy_side(case(("Ann", 1))) == "left"
    assert copy_side(case(("Le", 0))) == "none"  # whole words only: "Lee" is no copy of "Le"
    by_kind = {kind: {copy_side(c) for c in build_cases(kind, 30, corpus_tokenizer.encode)}
               for kind in ("entity_right", "entity_left", "sentence", "number_date")}  # fmt: skip
    assert by_kind["entity_right"] == {"right"} and by_kind["entity_left"] == {"left"}
    assert by_kind["sentence"] == {"none"} and by_kind["number_date"] == set(COPIES)


def test_holes_are_told_apart_by_where_they_start_and_tabled() -> None:
    seen: dict[str, str] = {}
    for index in range(40):
        doc = document_at("test", index)
        for span in doc.spans:
            before = doc.text[: span.start]
            where = hole_start(doc, span)
            seen.setdefault(where, before[-4:])
            assert (where == "line") == (before == "" or before.endswith("\n"))
            assert (where == "value") == before.endswith(': "')  # the corpus's JSON spelling
    assert set(seen) == set(STARTS)
    cases = [{"model": "denoiser", "exact": 1.0, "starts": "line"},
             {"model": "ar_fim", "exact": 0.0, "starts": "line"},
             {"model": "denoiser", "exact": 0.0, "starts": "value"},
             {"model": "denoiser", "exact": 1.0, "starts": "value"},
             {"model": "ar_fim", "exact": 1.0, "starts": "value"},
             {"model": "ar_fim", "exact": 1.0, "starts": "value"}]  # fmt: skip
    cases = [{**c, "kind": "choice"} for c in cases]
    repeats = [{**c, "kind": "entity_right_single", "starts": "inside"} for c in cases]  # counted once: left out
    table = field_table({"cases": cases + repeats}, "starts")
    assert "| a line (or the document) | 1 | 1.00 / 0.00 |" in table
    assert "| a JSON string value | 2 | 0.50 / 1.00 |" in table
    assert "inside a line" not in table  # no case starts there


def test_samples_show_every_kind_beside_ar_fim_with_the_judged_table(
    corpus_tokenizer: StencilTokenizer, tmp_path: Path
) -> None:
    denoiser = _save(tmp_path / "d", corpus_tokenizer, "denoiser")
    ar = _save(tmp_path / "a", corpus_tokenizer, "ar_fim")
    text = write_samples(denoiser, tmp_path / "eval", sampler={"max_steps": 4}, ar_dir=ar,
                         judge_per_kind=1)  # fmt: skip
    assert (tmp_path / "eval" / "SAMPLES.md").read_text() == text
    assert f"""Command: `python -m research.evaluate --samples --sampler '{{"max_steps": 4}}' --out {tmp_path / "eval"}`.""" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "|---" not in line]
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows] == [
        "kind", *KINDS, "**mean**"
    ]
    first_docs: dict[str, Document] = {}
    for index in range(200):
        doc = document_at("test", index)
        first_docs.setdefault(doc.kind, doc)
    for row in rows[1:]:
        cells = row.strip("| ").split(" | ")
        assert all(float(cell) > 0 for cell in cells[1:4])  # judged NLL of each text
        counts = [re.fullmatch(r"(\d+) / (\d+) of (\d+)", cell) for cell in cells[4:6]]
        assert re.fullmatch(r"\d+\.\d% / \d+\.\d% / \d+\.\d%", cells[6])  # words not in train
        assert all(m is not None and int(m[1]) <= int(m[3]) and int(m[2]) <= int(m[3])
                   for m in counts)  # fmt: skip
        if cells[0] in KINDS:  # one judged document per kind: its first one, holed as shown
            case = sample_case(first_docs[cells[0]], corpus_tokenizer.encode)
            assert counts[1] is not None and int(counts[1][3]) == len(case.holes)
            entities = sum(h.kind == "entity_left" for h in case.holes)
            assert counts[0] is not None and int(counts[0][3]) == entities
            assert f"{len(case.holes)} holes, {counts[1][1]} written exactly" in text
    for kind in KINDS:
        assert f"## {kind} (test seed" in text
    assert text.count("<details><summary>AR-FIM:") == len(KINDS)
    assert "The denoiser's words not in the train corpus, most frequent first: " in text


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(index=st.integers(0, 3000), invent=st.booleans())
def test_a_drafting_request_holes_every_sentence_whole_and_locks_the_typed_fields(
    corpus_tokenizer: StencilTokenizer, index: int, invent: bool
) -> None:
    doc = document_at("test", index)
    case = sample_case(doc, corpus_tokenizer.encode, invent=invent)
    spans = [h.span for h in case.holes]
    assert all(a.end <= b.start for a, b in zip(spans, spans[1:], strict=False))  # in order, apart
    holed = {(s.start, s.end) for s in spans}

    def hidden(s: Span, *, by: str | None = None) -> bool:  # inside a hole (of kind ``by``)
        return any(by in (None, h.kind) and h.start <= s.start and s.end <= h.end for h in spans)

    # every sentence is one hole, even one that opens with a repeated name
    assert all((s.start, s.end) in holed for s in doc.spans if s.kind == "sentence")
    # a typed value is only hidden inside a sentence
    assert all(not hidden(s) or hidden(s, by="sentence") for s in doc.spans if s.kind == "field")
    locked = locked_text(case)
    for hole in case.holes:
        if hole.kind == "entity_left" and not invent:  # a later mention: the name is shown
            assert hole.target in locked
    if not invent:  # each entity shown outside the sentences stays locked at least once
        outside = [s for s in doc.spans if s.kind == "entity" and not hidden(s, by="sentence")]
        assert all(doc.span_text(s) in locked for s in outside)


def test_an_nda_request_locks_the_parties_typed_in_its_signature_block_unless_invented(
    corpus_tokenizer: StencilTokenizer,
) -> None:
    doc = next(document_at("test", i) for i in range(100) if document_at("test", i).kind == "nda_clause")
    parties = [s for s in doc.spans if s.name in ("disclosing", "receiving")]
    signed = [s for s in parties if doc.text[: s.start].endswith("For ")]
    assert len(signed) == 2 and len(parties) > 2  # named in the clauses too
    typed = sample_case(doc, corpus_tokenizer.encode)
    for span in signed:
        assert not any(h.span.start <= span.start < h.span.end for h in typed.holes)
    inside = [s for s in parties if s not in signed]
    assert all(any(h.span.start <= s.start and s.end <= h.span.end for h in typed.holes) for s in inside)
    invented = sample_case(doc, corpus_tokenizer.encode, invent=True)
    names = {doc.span_text(s) for s in parties}
    assert not any(name in locked_text(invented) for name in names)  # the model must invent them
    assert len(invented.holes) == len(typed.holes) + 2  # the signature block's two parties


def test_hole_counts_count_the_words_no_train_document_spells(
    corpus_tokenizer: StencilTokenizer,
) -> None:
    lexicon = train_lexicon(300)
    offers = (document_at("test", i) for i in range(300) if document_at("test", i).kind == "job_offer")
    cases = (sample_case(doc, corpus_tokenizer.encode) for doc in offers)
    case, shown = next((case, w) for case in cases
                       for w in re.findall(r"[A-Za-z]+", locked_text(case)) if w not in lexicon)  # fmt: skip
    doc, locked = case.doc, locked_text(case)  # ``shown``: a locked word no train text spells (a name, say)
    originals = {h.name: h.target for h in case.holes}
    sentence = next(h for h in case.holes if h.kind == "sentence")
    assert len(locked) + sum(len(h.target) for h in case.holes) == len(doc.text)
    garbled = {**originals, sentence.name: f"{shown} would like you to join us as Sngineer, bor,al."}
    counts = HoleCounts()
    counts.add(case, garbled, originals, lexicon)
    assert counts.words_ar == counts.words and counts.unseen_ar == counts.unseen  # the originals
    assert counts.unseen_words_d["Sngineer"] == 1 and "join" not in counts.unseen_words_d
    assert shown not in counts.unseen_words_d  # copied from the locked text: no misspelling
    assert counts.unseen_d == sum(counts.unseen_words_d.values()) >= 1
    assert all(w not in lexicon for w in counts.unseen_words_d)
    merged = HoleCounts()
    merged.merge(counts)
    merged.merge(counts)
    assert merged.unseen_words_d["Sngineer"] == 2 and merged.words == 2 * counts.words


def test_the_shipped_ar_judge_finds_a_real_document_more_typical_than_its_words_shuffled() -> None:
    judge = load_backend(Path(__file__).resolve().parents[2] / "models" / "stencil-ar-fim")
    for index in range(3):
        text = document_at("test", index).text
        words = text.split(" ")
        shuffled = " ".join(words[1::2] + words[::2])
        assert judged_nll(judge, text) + 1.0 < judged_nll(judge, shuffled)


def test_the_validation_split_gives_other_documents_and_says_so(
    corpus_tokenizer: StencilTokenizer, tmp_path: Path
) -> None:
    test_docs = {c.doc.text for c in build_cases("entity_left", 4, corpus_tokenizer.encode)}
    val = build_cases("entity_left", 4, corpus_tokenizer.encode, split="val")
    assert len(val) == 4 and not test_docs & {c.doc.text for c in val}
    assert {c.doc.text for c in val} <= {document_at("val", i).text for i in range(100)}
    denoiser = _save(tmp_path / "d", corpus_tokenizer, "denoiser")
    ar = _save(tmp_path / "a", corpus_tokenizer, "ar_fim")
    main(["--denoiser", str(denoiser), "--ar", str(ar), "--per-kind", "1", "--kinds", "choice",
          "--sampler", '{"max_steps": 4}', "--split", "val", "--out", str(tmp_path / "v")])  # fmt: skip
    report = (tmp_path / "v" / "REPORT.md").read_text()
    assert "Validation split. Command: `python -m research.evaluate --split val`." in report
    assert json.loads((tmp_path / "v" / "results.json").read_text())["split"] == "val"



def test_threshold_study_pairs_each_config_with_even_on_the_same_cases(
    corpus_tokenizer: StencilTokenizer, tmp_path: Path
) -> None:
    from bench.sampler_bench import RULES, sampler_grid
    from bench.threshold_study import BASE, configs, markdown, sign_test, study

    grid = sampler_grid()
    assert all(grid[name] == config for name, config in configs((0.1, 0.5, 0.9)).items())
    assert configs((0.2,))["threshold-0.2"].threshold == 0.2
    with_bar = configs((0.2,), bars=(0.0,))
    assert list(with_bar) == [BASE, "threshold-0.2", "threshold-0.2 (neighbour bar 0.0)"]
    assert with_bar["threshold-0.2"].rules.neighbour_threshold == RULES["neighbour_threshold"] > 0
    assert with_bar["threshold-0.2 (neighbour bar 0.0)"] == with_bar["threshold-0.2"].replace(
        neighbour_threshold=0.0)  # fmt: skip

    assert sign_test(0, 0) == 1.0 and sign_test(3, 3) == 1.0
    assert sign_test(0, 6) == pytest.approx(2 / 64) and sign_test(6, 0) == sign_test(0, 6)
    results = study(_save(tmp_path / "d", corpus_tokenizer, "denoiser"), 2, ("choice", "entity_right"),
                    taus=(0.1, 0.2), split="val")  # fmt: skip
    assert results["cases"] == 4 and list(results["configs"]) == [BASE, "threshold-0.1", "threshold-0.2"]
    base = results["configs"][BASE]
    for name, r in results["configs"].items():
        if name == BASE:
            continue
        paired = r["paired"]
        difference = (paired["only_threshold"] - paired["only_even"]) / results["cases"]
        assert r["exact_match"] - base["exact_match"] == pytest.approx(difference)
        assert r["tokens_per_forward"] > 0
    assert "| threshold-0.2 |" in markdown(results) and "4 val cases" in markdown(results)


def test_the_bench_measures_the_fast_preset_and_the_preset_study_its_former_setting() -> None:
    from bench.preset_study import BASELINE, candidates, markdown
    from bench.sampler_bench import DOC_CONFIGS, FAST, sampler_grid
    from gpu_worker.engine.config import PRESETS

    assert sampler_grid()[FAST + "+delayed/once"] == PRESETS["fast"]
    assert FAST + "+delayed/once" in DOC_CONFIGS
    chosen = candidates()
    assert next(iter(chosen.values())) == BASELINE != PRESETS["fast"]
    assert BASELINE.threshold == 0.7 and not BASELINE.rules.anchored
    now = [name for name, config in chosen.items() if config == PRESETS["fast"]]
    assert len(now) == 1  # the study holds the preset now, and the table marks it
    run = {"exact_match": 0.5, "forward_passes": 2.0, "tokens_per_forward": 2.0,
           "seconds_per_case": 1.0}  # fmt: skip
    results = {"split": "val", "model": "m", "command": "c",
               "configs": {n: json.loads(c.to_json()) for n, c in chosen.items()},
               **{label: {"cases": 1, "routes": {n: run for n in chosen}}
                  for label in ("single holes", "drafts")}}  # fmt: skip
    assert markdown(results).count(f"| **{now[0]}** |") == 2
    balanced = candidates("balanced")  # --preset balanced: the default preset as it is
    first = next(iter(balanced))
    assert balanced[first] == PRESETS["balanced"] and len(balanced) > 1
    results.update(preset="balanced", configs={n: json.loads(c.to_json()) for n, c in balanced.items()},
                   **{label: {"cases": 1, "routes": {n: run for n in balanced}}
                      for label in ("single holes", "drafts")})  # fmt: skip
    assert markdown(results).count(f"| **{first}** |") == 2


def test_the_bench_holes_drafts_so_entities_can_be_copied_and_values_so_they_cannot(
    corpus_tokenizer: StencilTokenizer, tmp_path: Path
) -> None:
    from bench.sampler_bench import document_cases, drafting_cases

    loaded = load_backend(_save(tmp_path / "d", corpus_tokenizer, "denoiser"))
    drafts, values = drafting_cases(loaded, 4), document_cases(loaded, 4)
    assert len(drafts) == len(values) == 4
    copyable = 0
    for case in drafts:
        assert len(case.targets) >= 8
        locked = "".join(s.get("text", "") for s in case.request["segments"])
        copyable += sum(1 for t in case.targets.values() if len(t) > 3 and t in locked)
    assert copyable >= 4  # later mentions of entities whose first mention stays locked
    for case in values:
        locked = "".join(s.get("text", "") for s in case.request["segments"])
        assert len(case.targets) >= 8
        assert sum(1 for t in case.targets.values() if len(t) > 3 and t in locked) < copyable
    val_drafts = drafting_cases(loaded, 4, split="val")  # settings are chosen on val
    assert len(val_drafts) == 4
    assert {c.request["segments"][0].get("text") for c in val_drafts} != {
        c.request["segments"][0].get("text") for c in drafts
    }


def test_the_pattern_runs_study_marks_the_presets_and_gives_each_its_wall_ratio() -> None:
    from bench.pattern_runs_study import SETS, candidates, markdown
    from gpu_worker.engine.config import PRESETS

    chosen = candidates()
    assert {c.rules.pattern_runs for c in chosen.values()} == {True, False}
    now = [name for name, config in chosen.items() if config in PRESETS.values()]
    assert len(now) == 2  # both threshold presets, as they are now, are in the study
    routes = {name: {"exact_match": 0.5, "validity": 1.0, "forward_passes": 2.0,
                     "tokens_per_forward": 2.0,
                     "seconds_per_case": 1.0 if name.endswith("off") else 0.75}
              for name in chosen}  # fmt: skip
    results = {"split": "val", "model": "m", "command": "c",
               "configs": {n: json.loads(c.to_json()) for n, c in chosen.items()},
               **{label: {"cases": 1, "routes": routes} for label in SETS}}  # fmt: skip
    text = markdown(results)
    for name in now:
        assert text.count(f"| **{name}** |") == len(SETS)
    assert text.count("| 0.750 | 0.75 |") == 2 * len(SETS)  # on / off, per preset


@pytest.mark.parametrize("kind", HOLE_KINDS[:6])
def test_long_cases_join_documents_within_the_token_budget_and_hole_one_of_them(
    kind: str, corpus_tokenizer: StencilTokenizer
) -> None:
    cases = build_long_cases(kind, 3, corpus_tokenizer.encode, tokens=700)
    assert len(cases) == 3
    for case in cases:
        text = case.doc.text
        assert len(text.split(DOCUMENT_SEPARATOR)) > 1 and len(corpus_tokenizer.encode(text)) <= 700
        holes = {h.name: h.target for h in case.holes}
        rebuilt = "".join(s["text"] if "text" in s else holes[s["hole"]] for s in case.request()["segments"])
        assert rebuilt == text and is_valid(case.holes[0], case.holes[0].target)
        starts = [h.span.start for h in case.holes]
        documents = {text[:start].count(DOCUMENT_SEPARATOR) for start in starts}
        assert len(documents) == 1  # both holes in one of the joined documents
