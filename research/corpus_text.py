"""An organisation's documents as training and evaluation documents (Django-free).

Imported text carries no annotation, so :func:`annotate` finds its spans the way
:mod:`research.corpus` records them for generated documents: sentences (prose lines, headings,
list items), dates and numbers with their format as a pattern, and entity mentions (proper
names, identifiers, quoted and code values) grouped by their text, every whole-word occurrence
of a candidate a mention, so a name in a heading and again in the body is a copy the model can
learn. A document longer than the model reads is cut at paragraph (else line) boundaries into
windows (:func:`windows`), each a document of its own. The held-out documents are chosen
before any of this, by a hash of the seed and each document's sha256 (:func:`split_held_out`),
so they are the same whatever order the corpus was imported in.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from research.corpus import DATE_ISO_PATTERN, DATE_LONG_PATTERN, MONEY_PATTERN, Document, Span

# Formats of the number and date spans: the regex that finds one and the pattern a hole cut
# there is constrained by (the same text, as ``research.corpus`` does for its own values).
VERSION_PATTERN = r"[0-9]+(\.[0-9]+)+"
INTEGER_PATTERN = r"[0-9]{1,7}"
DATE_DMY_PATTERN = r"[1-9][0-9]? (January|February|March|April|May|June|July|August|September|October|November|December) [0-9]{4}"
DATE_SLASH_PATTERN = r"[0-9]{1,2}/[0-9]{1,2}/[0-9]{2,4}"
VALUE_FORMATS: tuple[tuple[str, str], ...] = (  # (span kind, pattern), first match wins
    ("date", DATE_ISO_PATTERN), ("date", DATE_LONG_PATTERN), ("date", DATE_DMY_PATTERN),
    ("date", DATE_SLASH_PATTERN), ("number", MONEY_PATTERN), ("number", VERSION_PATTERN),
    ("number", INTEGER_PATTERN),
)  # fmt: skip
# Entity candidates: proper names (capitalised words, a run of them), identifiers that mix
# letters with digits or joiners (RUSTSEC-2021-0074, tokio-util, serde_json), quoted values and
# code (`ammonia`). Every whole-word occurrence of a candidate's text is a mention.
PROPER = re.compile(r"\b[A-Z][a-z]+(?: (?:[A-Z][a-z]+|[A-Z]\.))*")
IDENTIFIER = re.compile(r"\b[A-Za-z][A-Za-z0-9]*(?:[-_.:/][A-Za-z0-9]+)+\b|\b[A-Za-z]+[0-9][A-Za-z0-9]*\b")
QUOTED = re.compile(r"\"([^\"\n]{2,60})\"|`([^`\n]{2,60})`")
ENTITY_MIN, ENTITY_MAX = 2, 60  # characters
COMMON = frozenset(
    ["The", "A", "An", "This", "That", "These", "Those", "It", "Its", "In", "On", "At", "For", "To", "Of", "And", "Or", "But", "If", "When", "While", "With", "By", "From", "As", "Is", "Are", "Was", "Were", "Be", "Been", "Has", "Have", "Had", "Do", "Does", "Did", "Not", "No", "Yes", "We", "You", "Your", "Our", "They", "Their", "He", "She", "His", "Her", "I", "My", "Me", "Please", "Thanks", "Thank", "Dear", "Hi", "Hello", "Regards", "Sincerely", "Yours", "Best", "Also", "There", "Here", "Any", "All", "Some", "Each", "Every", "Other", "Such", "Than", "Then", "So", "However", "Note", "See", "Affected", "Versions", "Version", "Description", "Impact", "Workaround", "Patched"]
)  # capitalised because they start a sentence, not names
SENTENCE = re.compile(r"[^\s].*?(?:[.!?](?=\s|$)|$)")
MIN_SENTENCE_CHARS, MIN_SENTENCE_WORDS = 12, 3
LINE_MARKER = re.compile(r"^(#{1,6} |[*+-] |[0-9]{1,3}[.)] |> )")


@dataclass(frozen=True)
class TextDocument:
    """One imported document: its sha256 (the corpus row's), name and text."""

    sha256: str
    name: str
    text: str


def _sentences(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each sentence: prose split at . ! ? inside each line, a heading's or
    list item's text after its marker; code fences and their contents are skipped."""
    offset = 0
    fenced = False
    for line in text.split("\n"):
        start = offset
        offset += len(line) + 1
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or not line.strip():
            continue
        marker = LINE_MARKER.match(line)
        body = start + (marker.end() if marker else 0)
        for m in SENTENCE.finditer(text, body, start + len(line)):
            piece = m.group().rstrip()
            if len(piece) >= MIN_SENTENCE_CHARS and len(piece.split()) >= MIN_SENTENCE_WORDS:
                yield m.start(), m.start() + len(piece)


def _values(text: str) -> list[Span]:
    """Dates and numbers, each with its format's pattern; none overlaps another."""
    taken: list[tuple[int, int]] = []
    spans: list[Span] = []
    for kind, pattern in VALUE_FORMATS:
        for m in re.finditer(rf"(?<![\w.$/-])(?:{pattern})(?![\w/-]|\.[0-9])", text):
            a, b = m.span()
            if any(a < d and c < b for c, d in taken):
                continue
            taken.append((a, b))
            spans.append(Span(a, b, kind, f"{kind}_{len(spans)}", pattern=pattern))  # type: ignore[arg-type]
    return spans


def _entity_texts(text: str) -> set[str]:
    found: set[str] = set()
    for m in PROPER.finditer(text):
        words = m.group().split(" ")
        while words and words[0] in COMMON:
            words = words[1:]
        if words:
            found.add(" ".join(words))
    found.update(m.group() for m in IDENTIFIER.finditer(text))
    found.update(m.group(1) or m.group(2) for m in QUOTED.finditer(text))
    return {t.strip() for t in found if ENTITY_MIN <= len(t.strip()) <= ENTITY_MAX
            and not re.fullmatch(r"[0-9.,:/-]+", t.strip())}  # fmt: skip


def _mentions(text: str, entity: str) -> Iterator[tuple[int, int]]:
    for m in re.finditer(rf"(?<![\w]){re.escape(entity)}(?![\w])", text):
        yield m.span()


def annotate(text: str, *, name: str = "", seed: int = 0, kind: str = "imported") -> Document:
    """``text`` as a :class:`research.corpus.Document` with its spans found (see the module's
    docstring); no phrase patterns (the report's "written by" column reads "layout")."""
    spans: list[Span] = [Span(a, b, "sentence", f"sentence_{i}")
                         for i, (a, b) in enumerate(_sentences(text))]  # fmt: skip
    values = _values(text)
    spans += values
    value_ranges = [(s.start, s.end) for s in values]
    for n, entity in enumerate(sorted(_entity_texts(text), key=lambda e: (-len(e), e))):
        group = f"e{n}"
        for a, b in _mentions(text, entity):
            if any(a < d and c < b for c, d in value_ranges):
                continue  # a date or number already
            spans.append(Span(a, b, "entity", group, group=group))
    spans.sort(key=lambda s: (s.start, -s.end))
    return Document(kind=kind, seed=seed, split=name, text=text, spans=tuple(spans),
                    patterns=(), pattern_spans=())  # fmt: skip


def windows(text: str, count: Callable[[str], int], max_tokens: int) -> list[str]:
    """``text`` cut into pieces of at most ``max_tokens`` (by ``count``): whole paragraphs
    where they fit, else whole lines, else a line cut at its words."""
    if count(text) <= max_tokens:
        return [text]
    pieces: list[str] = []
    for unit, joiner in ((p, "\n\n") for p in text.split("\n\n")):
        parts = [unit] if count(unit) <= max_tokens else _split_lines(unit, count, max_tokens)
        for part in parts:
            if pieces and count(pieces[-1] + joiner + part) <= max_tokens:
                pieces[-1] = pieces[-1] + joiner + part
            else:
                pieces.append(part)
    return [p for p in pieces if p.strip()]


def _split_lines(paragraph: str, count: Callable[[str], int], max_tokens: int) -> list[str]:
    out: list[str] = []
    for line in paragraph.split("\n"):
        parts = [line] if count(line) <= max_tokens else _split_words(line, count, max_tokens)
        for part in parts:
            if out and count(out[-1] + "\n" + part) <= max_tokens:
                out[-1] = out[-1] + "\n" + part
            else:
                out.append(part)
    return out


def _split_words(line: str, count: Callable[[str], int], max_tokens: int) -> list[str]:
    out: list[str] = []
    for word in line.split(" "):
        if out and count(out[-1] + " " + word) <= max_tokens:
            out[-1] = out[-1] + " " + word
        else:
            out.append(word[: max_tokens * 2])  # one "word" over the limit: its start only
    return out


def split_held_out(documents: list[TextDocument], *, share: float, seed: int
                   ) -> tuple[list[TextDocument], list[TextDocument]]:  # fmt: skip
    """(train, held out): the held-out ``share`` of the documents (at least one, and at least
    one left to train on), by the rank of sha256(seed, document sha256)."""
    if len(documents) < 2:
        raise ValueError(f"a corpus of {len(documents)} document(s) cannot be split")
    want = min(len(documents) - 1, max(1, math.ceil(share * len(documents))))

    def rank(doc: TextDocument) -> str:
        return hashlib.sha256(f"{seed}:{doc.sha256}".encode()).hexdigest()

    held = set(d.sha256 for d in sorted(documents, key=rank)[:want])
    return ([d for d in documents if d.sha256 not in held],
            [d for d in documents if d.sha256 in held])  # fmt: skip


def document_windows(documents: list[TextDocument], count: Callable[[str], int],
                     max_tokens: int) -> list[Document]:  # fmt: skip
    """Every window of every document, annotated; a window is named ``name#k``."""
    out: list[Document] = []
    for doc in documents:
        for k, piece in enumerate(windows(doc.text, count, max_tokens)):
            out.append(annotate(piece, name=f"{doc.name}#{k}", seed=len(out)))
    return out
