"""The Stencil tokenizer: byte-level BPE (Hugging Face ``tokenizers``) with our special tokens.

Special tokens are looked up by name from the trained ``tokenizer.json``; no id is a literal.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

PAD = "<|pad|>"
EOS = "<|eos|>"
MASK = "<|mask|>"
FIM_PREFIX = "<|fim_prefix|>"
FIM_SUFFIX = "<|fim_suffix|>"
FIM_MIDDLE = "<|fim_middle|>"
UNK = "<|unk|>"
SPECIAL_TOKENS = [PAD, EOS, MASK, FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE, UNK]


@dataclass(frozen=True)
class SpecialIds:
    pad: int
    eos: int
    mask: int
    fim_prefix: int
    fim_suffix: int
    fim_middle: int


class StencilTokenizer:
    """Thin wrapper: encode / decode without special-token handling surprises."""

    def __init__(
        self, tokenizer: Tokenizer, *, virtual_spaces: bool = False, spaced_lines: bool = False
    ) -> None:
        # Text that spells a special token ("<|mask|>" typed into a field) is encoded as
        # ordinary text, never as the special id: only the canvas places special tokens.
        tokenizer.encode_special_tokens = True
        self.tok = tokenizer
        found = {name: tokenizer.token_to_id(name) for name in SPECIAL_TOKENS}
        missing = [name for name, i in found.items() if i is None and name != UNK]
        if missing:
            raise ValueError(f"tokenizer lacks special tokens {missing}")
        ids: dict[str, int] = {name: i for name, i in found.items() if i is not None}
        self.special = SpecialIds(
            pad=ids[PAD], eos=ids[EOS], mask=ids[MASK], fim_prefix=ids[FIM_PREFIX],
            fim_suffix=ids[FIM_SUFFIX], fim_middle=ids[FIM_MIDDLE],
        )  # fmt: skip
        self._special_set = {i for i in ids.values() if i is not None}
        # Whether a hole that starts a line or a JSON string value begins with a virtual
        # space (see virtual_prefix): how the model was trained, so it comes from the model's
        # config (ModelConfig.virtual_spaces), not from tokenizer.json.
        self.virtual_spaces = virtual_spaces or spaced_lines
        # Whether all text, locked text too, is encoded with a virtual space at every line
        # start and JSON string value (see spaced_text); implies virtual_spaces. From the
        # model's config too (ModelConfig.spaced_lines).
        self.spaced_lines = spaced_lines

    @classmethod
    def from_file(
        cls, path: Path, *, virtual_spaces: bool = False, spaced_lines: bool = False
    ) -> StencilTokenizer:
        return cls(
            Tokenizer.from_file(str(path)), virtual_spaces=virtual_spaces, spaced_lines=spaced_lines
        )

    def virtual_prefix(self, locked: str, *, at_document_start: bool = False) -> str:
        """" " where this tokenizer gives a hole a virtual leading space, else "".

        ``locked`` is the locked text between the previous hole (or the document's start)
        and the hole. See :func:`opens_line_or_value`.
        """
        if self.virtual_spaces and (at_document_start or opens_line_or_value(locked)):
            return " "
        return ""

    def document_prefix(self, text: str) -> str:
        """" " where spaced lines give ``text``, at the document's start, a virtual space (the
        document's first line starts with one as every other line does), else ""."""
        return document_lead(text, spaced=self.spaced_lines)

    def encode_document(self, text: str) -> list[int]:
        """Token ids of a whole document (its first line spaced like the others)."""
        return encode_document(self.encode, text, spaced=self.spaced_lines)

    @classmethod
    def train(cls, texts: Iterable[str], *, vocab_size: int) -> StencilTokenizer:
        tok = Tokenizer(models.BPE(unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    def save(self, path: Path) -> None:
        self.tok.save(str(path))

    @property
    def vocab_size(self) -> int:
        return int(self.tok.get_vocab_size())

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_set

    def encode(self, text: str) -> list[int]:
        if self.spaced_lines:
            text = spaced_text(text)
        return list(self.tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int], *, raw: bool = False) -> str:
        """Text of ids with special tokens dropped; with spaced lines, the virtual spaces
        taken out (``raw``: left in, the tokens' own text)."""
        text = str(self.tok.decode([i for i in ids if i not in self._special_set]))
        return unspaced_text(text) if self.spaced_lines and not raw else text

    def space_twins(self) -> tuple[list[int], list[int]]:
        """Per id, its spaced twin and its bare twin: the token spelling the same text with
        one leading space, and without it (" East" and "East"). An id is its own twin on the
        side it already is, and on a side whose spelling is not in the vocabulary; special
        tokens have none. See ``ModelConfig.copy_twins``."""
        vocab = self.tok.get_vocab()  # raw byte-level spellings: "Ġ" stands for the space
        spaced, bare = list(range(self.vocab_size)), list(range(self.vocab_size))
        for text, i in vocab.items():
            if i in self._special_set or not text.startswith("Ġ") or len(text) == 1:
                continue
            twin = vocab.get(text[1:])
            if twin is not None and twin not in self._special_set:
                spaced[twin], bare[i] = i, twin
        return spaced, bare

    def case_twins(self) -> tuple[list[int], list[int]]:
        """Per id, its lower-case twins: the token spelling the same text in lower case with
        one leading space, and without it (" Adam" -> " adam" and "adam"), the id itself
        where that spelling is not in the vocabulary or the text has no ASCII upper case. An
        e-mail address spells a name so ("adam.diaz@..."). See ``ModelConfig.copy_lower``."""
        vocab = self.tok.get_vocab(with_added_tokens=False)  # the BPE's own tokens, "Ġ" for the space
        spaced, bare = list(range(self.vocab_size)), list(range(self.vocab_size))
        for text, i in vocab.items():
            core = text[1:] if text.startswith("Ġ") else text
            if i in self._special_set or core.lower() == core or not core.isascii():
                continue  # (other bytes spell pieces of characters: theirs is no case)
            spaced[i] = vocab.get("Ġ" + core.lower(), i)
            bare[i] = vocab.get(core.lower(), i)
        return spaced, bare

    def with_words(self, words: Iterable[str]) -> tuple[StencilTokenizer, int]:
        """This vocabulary with each of ``words`` spelled by one token, and how many tokens
        that added. Each word gets the merges that join its current pieces left to right,
        appended after every learned merge, so a merge only joins pieces that no learned
        merge joins (other text tokenizes as before except where those same pieces meet:
        3 words in 3,000 train documents for the e-mail names). New tokens take the next
        ids, so every earlier id keeps its meaning. A word whose pieces another new merge
        claims first may stay split."""
        data = json.loads(self.tok.to_str())
        vocab: dict[str, int] = data["model"]["vocab"]
        merges = [tuple(m) for m in data["model"]["merges"]]
        known = set(merges)
        spell = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        before = len(vocab)
        for word in words:
            byte_text = "".join(piece for piece, _ in spell.pre_tokenize_str(word))
            pieces = [t.value for t in self.tok.model.tokenize(byte_text)]
            joined = pieces[0]
            for piece in pieces[1:]:
                if (joined, piece) not in known:
                    merges.append((joined, piece))
                    known.add((joined, piece))
                joined += piece
                vocab.setdefault(joined, len(vocab))
        data["model"]["merges"] = [list(m) for m in merges]
        tok = Tokenizer.from_str(json.dumps(data))
        return (
            StencilTokenizer(tok, virtual_spaces=self.virtual_spaces, spaced_lines=self.spaced_lines),
            len(vocab) - before,
        )

    def token_text(self, token_id: int) -> str:
        """The decoded text of one token ('' for a special token), as it is spelled."""
        return self.decode([token_id], raw=True)


# Byte-level BPE learns words with their leading space (" Joshua", one token) and splits the
# same word without it ("Jos", "hua") when it starts a line or a JSON string: text the model
# can hardly copy into a hole there. With virtual spaces a hole at such a place is written with
# a leading space that is not in the document (its forced prefix, see gpu_worker.engine.canvas):
# the model writes " Joshua" and the document reads "Joshua".
_OPENS = re.compile(r'(?:\n|:[ \t]*")\Z')


def opens_line_or_value(locked: str) -> bool:
    """Whether a hole right after ``locked`` starts a line or a JSON string value (locked
    text ending in a newline, or in a colon and an opening quote)."""
    return _OPENS.search(locked) is not None


# Spaced lines (ModelConfig.spaced_lines) go one step further: every line and every JSON
# string value starts with a virtual space, in locked text too, so a name at a line's start
# is " Joshua" wherever it stands and a hole can copy it token for token. The rule is a
# bijection on strings: a space is inserted after each newline that something other than a
# newline follows, and after each colon and opening quote that something other than a quote
# follows; decoding takes out one space at each such place. Text at the start of a string is
# left alone: encode() also reads pieces of a document. The document's start is a line start
# too, and the code that knows it is there adds that space (document_lead; a hole's prefix).
_SPACE_AFTER = re.compile(r'\n(?=[^\n])|:[ \t]*"(?=[^"])')
_VIRTUAL_SPACE = re.compile(r'(\n|:[ \t]*") ')


def spaced_text(text: str) -> str:
    """``text`` as a tokenizer with spaced lines encodes it: a virtual space at every line
    start and JSON string value inside it."""
    return _SPACE_AFTER.sub(lambda m: m.group(0) + " ", text)


def unspaced_text(text: str) -> str:
    """The inverse of :func:`spaced_text`: ``unspaced_text(spaced_text(s)) == s``."""
    return _VIRTUAL_SPACE.sub(r"\1", text)


def document_lead(text: str, *, spaced: bool) -> str:
    """" " before ``text`` at a document's start under spaced lines (as after a newline:
    unless it is empty or starts with a newline), else ""."""
    return " " if spaced and text[:1] not in ("", "\n") else ""


def encode_document(encode: Callable[[str], list[int]], text: str, *, spaced: bool) -> list[int]:
    """Token ids of ``text`` as a whole document, or its start: under spaced lines
    (``encode`` then follows them) with the virtual space of its first line."""
    return encode(document_lead(text, spaced=spaced) + text)


WORD_PROBE = "a"  # stands for the word that follows text tokenized by encode_before_word


def encode_before_word(
    encode: Callable[[str], list[int]], text: str, *, spaced: bool = False
) -> list[int]:
    """Token ids of ``text`` as it tokenizes when a word follows it (locked text before a hole).

    Byte-level BPE splits trailing whitespace by what comes next: "\n\n" at the end of a
    string is one token, before a word it is "\n", "\n", and documents only ever show the
    second. Where the probe word would merge into the text (it ends mid-word), the text's own
    tokens. ``spaced``: ``encode`` follows spaced lines (:func:`spaced_text`), so the word
    after a line start or a JSON value's quote is spaced (" a"), as a hole there is.
    """
    if text:
        probed = encode(text + WORD_PROBE)
        word = " " + WORD_PROBE if spaced and opens_line_or_value(text) else WORD_PROBE
        if probed[-1:] == encode(word):
            return probed[:-1]
    return encode(text)
