"""The domain score: the shipped profile flags a foreign text and not a corpus document."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from gpu_worker.engine.domain import DomainProfile, load_profile
from research.corpus import KINDS, generate

DENOISER = Path(__file__).resolve().parents[2] / "models" / "stencil-denoiser"
FOREIGN = (
    "Steps to reproduce: open the settings screen on Android 14, toggle dark mode twice and "
    "rotate the phone. Expected: the chart axis labels stay readable. Actual: the app crashes "
    "with a null pointer exception in the rendering thread."
)


def test_the_profile_flags_a_foreign_text_and_not_corpus_documents() -> None:
    profile = load_profile(DENOISER)
    assert profile is not None
    assert profile.assess(FOREIGN)["unfamiliar"] is True
    for i, kind in enumerate(KINDS):  # val seeds: documents the profile never read
        doc = generate(kind, 50_000_000 + 7 * i, "val")
        assert profile.assess(doc.text)["unfamiliar"] is False, (kind, profile.score(doc.text))


def test_a_directory_without_a_profile_gives_no_score(tmp_path: Path) -> None:
    assert load_profile(tmp_path) is None


@given(st.lists(st.text(max_size=80), max_size=5))
def test_the_score_lies_in_zero_one(texts: list[str]) -> None:
    profile = DomainProfile.build(["the patient was seen in clinic today"], threshold=0.5)
    assert 0.0 <= profile.score(texts) <= 1.0


def test_word_pairs_never_span_two_pieces() -> None:
    profile = DomainProfile.build(["dear doctor smith thank you for seeing her"], threshold=0.5)
    assert profile.score(["dear doctor smith thank", "you for seeing her"]) == 0.0
    assert profile.score("dear doctor smith thank zebra you for seeing her") > 0.0
