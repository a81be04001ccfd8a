"""How far a text is from what a model was trained on: a domain score, pure Python.

A model directory may ship ``domain_profile.json``: the words of its training corpus (lower
case, letters only) and the word pairs that follow each other in it, with the threshold
chosen on the validation split. The score of a text is the share of its word pairs the corpus
never has, each pair weighted as one; a pair of two words the corpus never has at all counts
as unseen too. 0 reads like the corpus; 1 shares no pair with it. It needs no model and no
torch, so the web process scores a template when it is saved.

A directory without a profile gives no score (``None``); callers then say nothing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_worker.engine.model_files import model_file

PROFILE_FILE = "domain_profile.json"
PROFILE_FORMAT = "stencil-domain-profile/1"
MIN_PAIRS = 4  # a text with fewer word pairs than this is too short to judge: score 0
_WORD = re.compile(r"[a-z]+")


def words_of(text: str) -> list[str]:
    """The text's words as the profile counts them: lower case runs of letters, in order."""
    return _WORD.findall(text.lower())


def pairs_of(words: list[str]) -> list[str]:
    """Adjacent word pairs as ``"a b"`` strings, in order."""
    return [f"{a} {b}" for a, b in zip(words, words[1:], strict=False)]


@dataclass(frozen=True)
class DomainProfile:
    """The training corpus's words and word pairs, and the threshold above which a text is
    unfamiliar."""

    words: frozenset[str]
    pairs: frozenset[str]
    threshold: float  # scores above this are unfamiliar (chosen on the validation split)
    source: str = ""  # what the profile was built from (for the model card)

    def score(self, texts: str | Sequence[str]) -> float:
        """Share of the word pairs that the corpus never has, in [0, 1]. ``texts`` may be
        several pieces (a template's locked segments): pairs never span two pieces."""
        pieces = [texts] if isinstance(texts, str) else list(texts)
        pairs = [p for piece in pieces for p in pairs_of(words_of(piece))]
        if len(pairs) < MIN_PAIRS:
            return 0.0
        unseen = sum(1 for p in pairs if p not in self.pairs)
        return unseen / len(pairs)

    def assess(self, texts: str | Sequence[str]) -> dict[str, Any]:
        """``{"score", "unfamiliar", "threshold"}`` of ``texts`` (the job result's ``domain``)."""
        score = self.score(texts)
        return {"score": round(score, 4), "unfamiliar": score > self.threshold,
                "threshold": self.threshold}  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {"format": PROFILE_FORMAT, "threshold": self.threshold, "source": self.source,
                "words": sorted(self.words), "pairs": sorted(self.pairs)}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DomainProfile:
        if data.get("format") != PROFILE_FORMAT:
            raise ValueError(
                f"domain profile format {data.get('format')!r} is not {PROFILE_FORMAT}"
            )
        threshold = float(data["threshold"])
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"domain profile threshold={threshold} is outside [0, 1]")
        return cls(frozenset(data["words"]), frozenset(data["pairs"]), threshold,
                   str(data.get("source", "")))  # fmt: skip

    @classmethod
    def build(cls, texts: list[str], *, threshold: float, source: str = "") -> DomainProfile:
        words: set[str] = set()
        pairs: set[str] = set()
        for text in texts:
            found = words_of(text)
            words.update(found)
            pairs.update(pairs_of(found))
        return cls(frozenset(words), frozenset(pairs), threshold, source)


def load_profile(directory: Path) -> DomainProfile | None:
    """The model directory's profile, or None when it ships none (read once per file)."""
    return model_file(directory, PROFILE_FILE, DomainProfile.from_json)


def assess_text(directory: Path, texts: str | Sequence[str]) -> dict[str, Any] | None:
    """``{"score", "unfamiliar", "threshold"}`` of ``texts`` against the model in
    ``directory``, or None when the model ships no profile."""
    profile = load_profile(directory)
    return profile.assess(texts) if profile is not None else None


__all__ = ["PROFILE_FILE", "DomainProfile", "assess_text", "load_profile", "pairs_of", "words_of"]
