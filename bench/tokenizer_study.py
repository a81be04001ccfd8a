"""How candidate vocabularies cut the words a model must invent or copy.

The models read text with spaced lines (``ModelConfig.spaced_lines``) through "spaced, 8,192"
with every e-mail name word of the corpus added as one token (``python -m research.train
--kind tokenizer --extend``); their first vocabulary was learned from unspaced text (4,096
tokens). A model that invents a value it has never seen next to
it (a job title in an offer letter, a company in an NDA) must spell it token by token. This
study learns candidate vocabularies from the train split (``research.train.train_tokenizer``)
and measures, on test documents encoded as a spaced-lines model reads them:

- tokens per document, per word of each value category, and the share of its words that are
  one token (a word spelled in pieces is a word a small model can misspell);
- the vocabulary's parameters in a model of the shipped width (input embedding and output
  head, which are not tied).

    python bench/tokenizer_study.py [--docs 2000]

Writes bench/tokenizer/tokenizer_study.json and REPORT.md.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_worker.engine.tokenizer import StencilTokenizer  # noqa: E402
from research.corpus import document_at  # noqa: E402
from research.train import TOKENIZER_DOCS, VOCAB_SIZE, TrainConfig, train_tokenizer  # noqa: E402

# (label, vocabulary size, train documents the merges are learned from, spaced). The first is
# the models' first vocabulary (the same sha256 as the file their first training run read);
# the shipped vocabulary is "spaced, 8,192" with the e-mail name words added.
CANDIDATES: tuple[tuple[str, int, int, bool], ...] = (
    ("unspaced, 4,096 (the models' first)", VOCAB_SIZE, TOKENIZER_DOCS, False),
    ("spaced, 4,096", VOCAB_SIZE, TOKENIZER_DOCS, True),
    ("spaced, 8,192", 8192, TOKENIZER_DOCS, True),
    ("spaced, 8,192, 96k docs", 8192, 4 * TOKENIZER_DOCS, True),
    ("spaced, 16,384, 96k docs", 16384, 4 * TOKENIZER_DOCS, True),
)
# value categories: (span kind, span names)
CATEGORIES: dict[str, tuple[str, frozenset[str]]] = {
    "job titles": ("entity", frozenset({"role"})),
    "person names": ("entity", frozenset({
        "patient", "doctor", "consultant", "reporter", "witness", "candidate", "first",
        "manager", "chair", "member", "secretary", "signer_a", "signer_b", "sender",
        "contact", "person"})),
    "organisations": ("entity", frozenset({
        "company", "seller", "buyer", "disclosing", "receiving", "org", "site", "clinic",
        "hospital"})),
    "JSON emails and addresses": ("json_value", frozenset({"email", "ship_to"})),
    "sentences": ("sentence", frozenset()),
}
WORD = re.compile(r"\S+")


def measure(tok: StencilTokenizer, docs: int) -> dict[str, Any]:
    """Tokens per document and, per category, tokens per word and the share of one-token
    words, over the first ``docs`` test documents."""
    doc_tokens = 0
    tokens: dict[str, int] = defaultdict(int)
    words: dict[str, int] = defaultdict(int)
    single: dict[str, int] = defaultdict(int)
    for i in range(docs):
        doc = document_at("test", i)
        doc_tokens += len(tok.encode_document(doc.text))
        for span in doc.spans:
            for label, (kind, names) in CATEGORIES.items():
                if span.kind != kind or (names and span.name not in names):
                    continue
                for word in WORD.findall(doc.span_text(span)):
                    n = len(tok.encode(" " + word))  # as it stands mid-line, or spaced
                    tokens[label] += n
                    words[label] += 1
                    single[label] += n == 1
    return {"tokens_per_document": doc_tokens / docs,
            "categories": {label: {"words": words[label],
                                   "tokens_per_word": tokens[label] / max(words[label], 1),
                                   "one_token_words": single[label] / max(words[label], 1)}
                           for label in CATEGORIES}}  # fmt: skip


def study(docs: int) -> dict[str, Any]:
    width = TrainConfig.d_model
    rows: dict[str, Any] = {}
    for label, size, train_docs, spaced in CANDIDATES:
        with tempfile.TemporaryDirectory() as scratch:  # the numbers are the result
            path = Path(scratch) / "tokenizer.json"
            started = time.perf_counter()
            train_tokenizer(path, docs=train_docs, vocab_size=size, spaced=spaced)
            seconds = time.perf_counter() - started
            tok = StencilTokenizer.from_file(path, spaced_lines=True)
        rows[label] = {"vocab_size": tok.vocab_size, "train_documents": train_docs,
                       "train_seconds": round(seconds, 1), **measure(tok, docs)}  # fmt: skip
    for row in rows.values():
        row["vocabulary_parameters"] = 2 * row["vocab_size"] * width
    return {"test_documents": docs, "d_model": width, "vocabularies": rows}


def markdown(results: dict[str, Any], command: str) -> str:
    rows = results["vocabularies"]
    labels = list(CATEGORIES)
    lines = ["# Candidate vocabularies", "",
             f"Command: `{command}`. {results['test_documents']} test documents, encoded as a "
             "spaced-lines model reads them. Per category: tokens per word, and (in brackets) "
             "the share of its words that are one token. Vocabulary parameters: input "
             f"embedding and output head at width {results['d_model']}.", "",
             "| vocabulary | tokens / document | " + " | ".join(labels)
             + " | vocabulary parameters |",
             "|---|---|" + "---|" * len(labels) + "---|"]  # fmt: skip
    for name, row in rows.items():
        cells = [f"{row['categories'][c]['tokens_per_word']:.2f} "
                 f"({row['categories'][c]['one_token_words']:.0%})" for c in labels]  # fmt: skip
        lines.append(f"| {name} | {row['tokens_per_document']:.1f} | " + " | ".join(cells)
                     + f" | {row['vocabulary_parameters']:,} |")  # fmt: skip
    words = ", ".join(f"{c} {rows[next(iter(rows))]['categories'][c]['words']:,}" for c in labels)
    lines += ["", f"Words per category: {words}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=2000, help="test documents measured")
    parser.add_argument("--out", type=Path, default=Path("bench/tokenizer"))
    args = parser.parse_args(argv)
    results = study(args.docs)
    command = "python bench/tokenizer_study.py" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    results["command"] = command
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tokenizer_study.json").write_text(json.dumps(results, indent=1) + "\n")
    text = markdown(results, command)
    (args.out / "REPORT.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
