"""The byte-level BPE tokenizer: special tokens, lossless round trips, deterministic training."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_worker.engine.tokenizer import (
    SPECIAL_TOKENS,
    StencilTokenizer,
    document_lead,
    spaced_text,
    unspaced_text,
)
from research.corpus import email_name_words, iter_split
from research.train import extends, tokenizer_pieces, train_tokenizer
from tests.gpu_worker.conftest import shipped_tokenizer


def test_every_special_token_is_one_token_with_a_distinct_id(tokenizer: StencilTokenizer) -> None:
    s = tokenizer.special
    ids = [s.pad, s.eos, s.mask, s.fim_prefix, s.fim_suffix, s.fim_middle]
    assert len(set(ids)) == len(ids)
    for name in SPECIAL_TOKENS[:6]:
        assert tokenizer.tok.token_to_id(name) in ids


@given(text=st.text(max_size=200))
@settings(max_examples=80, deadline=None)
def test_any_text_survives_encode_then_decode(tokenizer: StencilTokenizer, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text)) == text


@given(text=st.text(alphabet=st.sampled_from(list('\n: "\tab{}')), max_size=40))
@settings(max_examples=300, deadline=None)
def test_spaced_lines_are_a_bijection_and_encode_then_decode_is_lossless(text: str) -> None:
    """Spaced lines insert a virtual space after a newline (a colon and quote) that anything
    but a newline (a quote) follows, and decoding takes out exactly those: any text comes back, and every line start and JSON
    string value that holds something starts with a space in the model's view."""
    spaced = spaced_text(text)
    assert unspaced_text(spaced) == text
    assert spaced.replace(" ", "") == text.replace(" ", "")  # only spaces are added
    for i, char in enumerate(spaced):
        opens_value = char == '"' and spaced[:i].rstrip(" \t").endswith(":")
        if char == "\n" or opens_value:  # what follows is a space, the end, or nothing held
            assert spaced[i + 1 : i + 2] in ("", " ", "\n" if char == "\n" else '"')
    tokenizer = StencilTokenizer(shipped_tokenizer().tok, spaced_lines=True)
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_with_spaced_lines_a_name_has_the_same_tokens_at_a_line_start_as_inside_a_line() -> None:
    plain = shipped_tokenizer()
    spaced = StencilTokenizer(plain.tok, spaced_lines=True)
    assert spaced.virtual_spaces  # holes at a line start get their space as a prefix
    joshua = spaced.encode(" Joshua")
    assert len(joshua) == 1
    text = 'Kind regards,\nJoshua\n{"name": "Joshua", "n": ""}'
    ids = spaced.encode(text)
    assert ids.count(joshua[0]) == 2 and plain.encode(text).count(joshua[0]) == 0
    assert spaced.decode(ids) == text
    assert spaced.decode(ids, raw=True) == 'Kind regards,\n Joshua\n {"name": " Joshua", "n": ""}'
    newline_space = plain.encode("\n ")  # one token: its own spelling, not the decoded text
    assert len(newline_space) == 1 and spaced.token_text(newline_space[0]) == "\n "


def test_text_spelling_a_special_token_is_encoded_as_ordinary_text(tokenizer: StencilTokenizer) -> None:
    for name in SPECIAL_TOKENS[:6]:
        ids = tokenizer.encode(f"a {name} b")
        assert not any(tokenizer.is_special(i) for i in ids)
        assert tokenizer.decode(ids) == f"a {name} b"


def test_decode_drops_special_tokens(tokenizer: StencilTokenizer) -> None:
    ids = [tokenizer.special.mask, *tokenizer.encode("Dear Alice"), tokenizer.special.pad]
    assert tokenizer.decode(ids) == "Dear Alice"


def test_training_is_deterministic_and_save_load_keeps_ids(tmp_path: Path) -> None:
    texts = [d.text for d in iter_split("train", 120)]
    a = StencilTokenizer.train(texts, vocab_size=500)
    b = StencilTokenizer.train(texts, vocab_size=500)
    assert a.tok.get_vocab() == b.tok.get_vocab()
    a.save(tmp_path / "tokenizer.json")
    loaded = StencilTokenizer.from_file(tmp_path / "tokenizer.json")
    assert loaded.encode(texts[0]) == a.encode(texts[0])
    assert loaded.special == a.special


def test_corpus_trained_bpe_compresses_documents(tmp_path: Path) -> None:
    texts = [d.text for d in iter_split("train", 200)]
    tok = StencilTokenizer.train(texts, vocab_size=800)
    held = next(iter(iter_split("test", 1))).text
    assert len(tok.encode(held)) < len(held.encode()) / 1.5


def test_spaced_pieces_join_to_the_spaced_document() -> None:
    for doc in iter_split("train", 300):
        plain = tokenizer_pieces(doc)
        assert "".join(plain) == doc.text
        assert "".join(tokenizer_pieces(doc, spaced=True)) == (
            document_lead(doc.text, spaced=True) + spaced_text(doc.text)
        )


def test_a_vocabulary_learned_from_spaced_text_has_line_starting_words_whole(tmp_path: Path) -> None:
    """" Dear" only ever starts a line: learned from spaced text it is one token, as a
    spaced-lines model reads it; learned from plain text it is not."""
    plain = train_tokenizer(tmp_path / "plain.json", docs=300, vocab_size=1200)
    spaced = train_tokenizer(tmp_path / "spaced.json", docs=300, vocab_size=1200, spaced=True)
    assert spaced.vocab_size == plain.vocab_size == 1200
    letter = "Clinic\n\nDear Dr. Smith,\n"
    read = {name: StencilTokenizer.from_file(tmp_path / f"{name}.json", spaced_lines=True)
            for name in ("plain", "spaced")}  # fmt: skip
    assert " Dear" in [read["spaced"].token_text(t) for t in read["spaced"].encode(letter)]
    assert " Dear" not in [read["plain"].token_text(t) for t in read["plain"].encode(letter)]
    held = [d.text for d in iter_split("test", 20)]
    assert sum(len(read["spaced"].encode_document(t)) for t in held) < sum(
        len(read["plain"].encode_document(t)) for t in held
    )


@pytest.fixture(scope="module")
def name_vocabularies(tmp_path_factory: pytest.TempPathFactory) -> tuple[StencilTokenizer, StencilTokenizer, int]:
    """A spaced-lines vocabulary learned from 3,000 train documents, and it extended with the
    corpus's e-mail name words (with the number of tokens that added)."""
    path = tmp_path_factory.mktemp("names") / "base.json"
    train_tokenizer(path, docs=3000, vocab_size=8192, spaced=True)
    base = StencilTokenizer.from_file(path, spaced_lines=True)
    extended, added = base.with_words(email_name_words())
    return base, extended, added


def test_a_vocabulary_extended_with_the_email_names_spells_each_whole_and_keeps_every_id(
    name_vocabularies: tuple[StencilTokenizer, StencilTokenizer, int],
) -> None:
    base, extended, added = name_vocabularies
    assert extended.vocab_size == base.vocab_size + added and added > 1000
    assert extends(extended, base) and not extends(base, extended)
    base_vocab = base.tok.get_vocab()
    assert all(extended.tok.token_to_id(text) == i for text, i in base_vocab.items())
    words = email_name_words()
    whole = [w for w in words if len(extended.tok.encode(w).ids) == 1]
    assert len(whole) >= 0.99 * len(words)
    assert len(extended.tok.encode(" adam").ids) == 1 and len(base.tok.encode(" adam").ids) > 1
    assert extended.with_words(words)[1] == 0  # nothing left to add
    # Other text tokenizes as before, except where a new merge joins the same pieces.
    lexicon, changed = set(words), 0
    for doc in iter_split("val", 300):
        before = Counter(base.token_text(i) for i in base.encode_document(doc.text))
        after = Counter(extended.token_text(i) for i in extended.encode_document(doc.text))
        changed += any(text not in lexicon for text in after - before)
    assert changed <= 15


@given(text=st.text(max_size=120) | st.sampled_from(["Dear adam.diaz@young.biz", ' "adam"', "xadamx"]))
@settings(max_examples=60, deadline=None)
def test_an_extended_vocabulary_decodes_any_text_it_encodes(
    name_vocabularies: tuple[StencilTokenizer, StencilTokenizer, int], text: str
) -> None:
    _, extended, _ = name_vocabularies
    assert extended.decode(extended.encode(text)) == text


def test_an_email_spells_the_record_names_lower_case_twins(
    name_vocabularies: tuple[StencilTokenizer, StencilTokenizer, int],
) -> None:
    """In an employee record, "adam.diaz@..." is the lower-case twins of " Adam" and " Diaz"
    (case_twins): tokens the copy head can copy from the name (ModelConfig.copy_lower). The
    shipped vocabulary spells every corpus name whole; this smaller one most."""
    _, tok, _ = name_vocabularies
    spaced_lower, bare_lower = tok.case_twins()
    records = 0
    for doc in iter_split("val", 400):
        emails = [s for s in doc.spans if s.name == "email"]
        if not emails:
            continue
        email = emails[0]
        first, last = doc.span_text(next(s for s in doc.spans if s.name == "name")).split(" ", 1)
        name_ids = tok.encode(f" {first}") + tok.encode(f" {last}")
        if len(name_ids) != 2:  # a name this small vocabulary splits has no one-token twin
            continue
        written = tok.encode(f" {doc.span_text(email)}")  # as the JSON value reads, spaced
        assert written[:3] == [spaced_lower[name_ids[0]], tok.encode(".")[0], bare_lower[name_ids[1]]]
        records += 1
    assert records >= 10
    for i in range(tok.vocab_size):
        text = tok.token_text(i)
        if tok.is_special(i) or text.lower() == text:
            assert spaced_lower[i] == bare_lower[i] == i
        else:
            core = text.removeprefix(" ").lower()
            assert tok.token_text(spaced_lower[i]) in (text, " " + core)
            assert tok.token_text(bare_lower[i]) in (text, core)


def test_the_shipped_vocabulary_spells_every_corpus_email_name_whole() -> None:
    """What the shipped models' lower-case twins copy into an address (bench/email/)."""
    tok, words = shipped_tokenizer(), email_name_words()
    assert sum(len(tok.tok.encode(w).ids) == 1 for w in words) >= 0.99 * len(words)
