"""Imported text as documents: spans found, windows that fit, held-out documents chosen first."""

from __future__ import annotations

import hashlib

from research.corpus_text import TextDocument, annotate, split_held_out, windows

NOTICE = """# Rent review for 4 Elm Row

Dear Ms Patel,

Your rent at 4 Elm Row rises to $1,450.00 a month from 2027-05-01. Ms Patel may appeal within 28 days.
The review follows clause 4.2 of the tenancy agreement.

Yours sincerely,
Jo Brown"""


def _kinds(text: str) -> dict[str, list[str]]:
    doc = annotate(text)
    out: dict[str, list[str]] = {}
    for span in doc.spans:
        out.setdefault(span.kind, []).append(doc.span_text(span))
    return out


def test_annotate_finds_dates_numbers_sentences_and_repeated_names() -> None:
    found = _kinds(NOTICE)
    assert "2027-05-01" in found["date"]
    assert {"$1,450.00", "28", "4.2"} <= set(found["number"])
    assert "Your rent at 4 Elm Row rises to $1,450.00 a month from 2027-05-01." in found["sentence"]
    assert "Rent review for 4 Elm Row" in found["sentence"]  # a heading's text
    assert found["entity"].count("Ms Patel") == 2 and found["entity"].count("Elm Row") == 2


def test_a_name_and_its_repeat_share_a_group() -> None:
    doc = annotate(NOTICE)
    groups = {s.group for s in doc.spans if s.kind == "entity" and doc.span_text(s) == "Ms Patel"}
    assert len(groups) == 1


def test_windows_fit_and_keep_every_paragraph() -> None:
    text = "\n\n".join(f"Paragraph {i} says something about clause {i}." for i in range(40))
    count = len  # characters as tokens
    pieces = windows(text, count, 120)
    assert all(len(p) <= 120 for p in pieces)
    assert "\n\n".join(pieces) == text


def test_a_long_line_is_cut_at_words() -> None:
    text = " ".join(["word"] * 100)
    pieces = windows(text, len, 50)
    assert all(len(p) <= 50 for p in pieces) and " ".join(pieces) == text


def _docs(n: int) -> list[TextDocument]:
    return [TextDocument(hashlib.sha256(str(i).encode()).hexdigest(), f"d{i}", f"text {i}")
            for i in range(n)]  # fmt: skip


def test_held_out_split_is_the_same_whatever_the_order() -> None:
    docs = _docs(50)
    train, held = split_held_out(docs, share=0.1, seed=3)
    train2, held2 = split_held_out(list(reversed(docs)), share=0.1, seed=3)
    assert len(held) == 5 and {d.sha256 for d in held} == {d.sha256 for d in held2}
    assert not {d.sha256 for d in held} & {d.sha256 for d in train}
    assert {d.sha256 for d in split_held_out(docs, share=0.1, seed=4)[1]} != {d.sha256 for d in held}


def test_two_documents_hold_one_out_and_train_on_one() -> None:
    train, held = split_held_out(_docs(2), share=0.5, seed=0)
    assert len(train) == 1 and len(held) == 1
