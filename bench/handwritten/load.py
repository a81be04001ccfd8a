"""Read the hand-written evaluation set (``val.txt``, ``test.txt`` beside this file).

Each document starts with a header line ``### id | kind | ood|in``; the lines after it, up to
the next header, are its text. A hole is written ``[[name]]`` (free, the default budget),
``[[name:N]]`` (free, ``N`` tokens at most) or ``[[name=answer]]`` (one right answer: an
entity copied from the context, a number, a date). ``ood`` documents are kinds the training
corpus never has; ``in`` documents are its kinds in phrasing its generator never uses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_BUDGET = 24  # tokens of a free hole written without a budget
ANSWER_SLACK = 4  # tokens a hole with one answer gets beyond the answer's own
_HOLE = re.compile(r"\[\[([a-z0-9_]+)(?::(\d+))?(?:=([^\]]+))?\]\]")


@dataclass(frozen=True)
class HandHole:
    name: str
    max_tokens: int | None  # None: sized from the answer by the caller's tokenizer
    answer: str | None  # the one right answer, or None for free text


@dataclass(frozen=True)
class HandDoc:
    id: str
    kind: str  # the document kind (a corpus kind for "in" documents)
    domain: str  # "ood" | "in"
    segments: list[dict[str, Any]]  # Canvas JSON segments; holes carry no max_tokens yet
    holes: list[HandHole]

    def locked_text(self) -> str:
        return "".join(s.get("text", "") for s in self.segments)

    def request(self, encode: Any, seed: int = 0) -> dict[str, Any]:
        """Canvas JSON, each hole's budget its own or its answer's tokens plus slack."""
        budgets = {h.name: h.max_tokens or len(encode(" " + str(h.answer))) + ANSWER_SLACK
                   for h in self.holes}  # fmt: skip
        segments = [dict(s) if "text" in s else {"hole": s["hole"], "max_tokens": budgets[s["hole"]]}
                    for s in self.segments]  # fmt: skip
        return {"segments": segments, "seed": seed}


def parse(text: str) -> list[HandDoc]:
    docs: list[HandDoc] = []
    for block in re.split(r"^### ", text, flags=re.M)[1:]:
        header, _, body = block.partition("\n")
        doc_id, kind, domain = (part.strip() for part in header.split("|"))
        if domain not in ("ood", "in"):
            raise ValueError(f"{doc_id}: domain {domain!r} is not ood or in")
        body = body.rstrip("\n") + "\n"
        segments: list[dict[str, Any]] = []
        holes: list[HandHole] = []
        cursor = 0
        for m in _HOLE.finditer(body):
            if m.start() > cursor:
                segments.append({"text": body[cursor : m.start()]})
            budget = int(m.group(2)) if m.group(2) else (None if m.group(3) else DEFAULT_BUDGET)
            holes.append(HandHole(m.group(1), budget, m.group(3)))
            segments.append({"hole": m.group(1)})
            cursor = m.end()
        segments.append({"text": body[cursor:]})
        docs.append(HandDoc(doc_id, kind, domain, segments, holes))
    return docs


def load(split: str) -> list[HandDoc]:
    """The documents of ``split`` ("val" or "test")."""
    if split not in ("val", "test"):
        raise ValueError(f"split={split!r} is not val or test")
    return parse((HERE / f"{split}.txt").read_text(encoding="utf-8"))
