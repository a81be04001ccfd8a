"""The byte-level BPE tokenizer: special tokens, lossless round trips, deterministic training."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_worker.corpus import iter_split
from gpu_worker.tokenizer import (
    SPECIAL_TOKENS,
    StencilTokenizer,
    document_lead,
    spaced_text,
    unspaced_text,
)
from gpu_worker.train import tokenizer_pieces, train_tokenizer
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
