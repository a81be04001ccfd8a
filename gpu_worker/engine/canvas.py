"""The Canvas: what the sampler denoises, built from Canvas JSON (see ARCHITECTURE.md).

A canvas is a row of token ids where locked text is protected and holes start as the mask
token. Building it is mostly about tokenization at segment boundaries: people write locked text
that ends in a space ("Thank you for seeing " + hole). Tokenized alone, that text ends in a lone
space token and the hole would have to start with a space-less word: a split that byte-level BPE
never makes, so the model never saw it. Instead the trailing space is taken out of the locked
tokens and becomes a *forced prefix* of the hole's first token (" Dr", " Smith"...), so the tokens
around the boundary look like training text. The space still belongs to the locked text: the
document is assembled from the locked strings and the holes' texts with the prefix stripped, so
locked text comes back byte-identical whatever the hole holds (even an empty hole).

A model trained with virtual spaces (``ModelConfig.virtual_spaces``) also gives a hole that
starts a line or a JSON string value a forced prefix " " that is in no locked text: the word
is written as it is inside a line (" Joshua") and the space is stripped like a moved one. A
model trained with spaced lines (``ModelConfig.spaced_lines``) has such a space at every line
start and JSON string value, locked text too (see ``tokenizer.spaced_text``), the document's
first line included, so a name reads the same tokens wherever it stands.

A JSON Schema hole becomes a skeleton: its keys and punctuation are locked tokens owned by the
hole, its values are typed sub-holes named ``<hole>.<path>``.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any

import torch

from gpu_worker.engine.constraints import (
    ChoiceConstraint,
    PatternConstraint,
    SkeletonText,
    TokenTable,
    build_choices,
    pattern_constraint,
    schema_skeleton,
    token_table,
)
from gpu_worker.engine.outcome import MAX_SEED
from gpu_worker.engine.tokenizer import StencilTokenizer, encode_before_word

HoleConstraint = PatternConstraint | ChoiceConstraint
FORCED_PREFIX = " "  # a locked text's trailing space moves into the next hole's first token
_TOP_LEVEL_FIELDS = {"segments", "seed", "sampler", "purpose"}
_TEXT_FIELDS = {"text"}
_HOLE_FIELDS = {"hole", "max_tokens", "constraint", "hint"}
_CONSTRAINT_KINDS = ("pattern", "choices", "schema")


@dataclass(frozen=True)
class Hole:
    """A span of maskable positions; its unused tail becomes pad and is stripped."""

    name: str  # unique: the request's hole name, or "<hole>.<path>" for a schema value
    group: str  # the request's hole this span belongs to (== name unless a schema value)
    start: int  # first canvas position
    max_len: int  # positions reserved for the hole
    constraint: HoleConstraint | None  # enforced while decoding; None = free text
    prefix: str = ""  # text the first token must start with (a moved locked space or a
    # virtual one, see StencilTokenizer.virtual_prefix), or ""

    @property
    def end(self) -> int:
        return self.start + self.max_len


@dataclass(frozen=True)
class Piece:
    """One piece of the document, in order: locked text, or a hole (by index)."""

    text: str | None  # the locked text (None for a hole)
    hole: int | None  # index into Canvas.holes (None for text)
    group: str | None  # the request hole owning this piece (schema skeleton text), or None

    def render(self, spans: list[str]) -> str:
        """Its locked text, or its hole span's text taken from ``spans``."""
        return spans[self.hole] if self.hole is not None else (self.text or "")


@dataclass
class Canvas:
    """The unit the sampler works on. Shapes: L canvas length, V model vocabulary."""

    ids: torch.Tensor  # [L] long: locked tokens, and the mask id in every hole position
    protect: torch.Tensor  # [L] bool: True = locked, never changed at any step
    holes: list[Hole]
    pieces: list[Piece]
    allowed: dict[int, torch.Tensor]  # position -> [V] bool, static per-position sets
    free_vocab: torch.Tensor  # [V] bool: tokens an unconstrained hole position may take
    mask_id: int
    pad_id: int
    eos_id: int
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)  # hole name -> its JSON
    seed: int = 0
    sampler: dict[str, Any] = field(default_factory=dict)  # the request's sampler overrides
    tokenizer: StencilTokenizer | None = None  # decodes hole texts for the result
    # What the document is for (the template's purpose), for an instruction model's preamble
    # (gpu_worker.engine.preamble); each hole's "hint" is in ``groups``.
    purpose: str = ""
    # Locked positions before the document (an instruction model's preamble, its chat turn):
    # the model reads them, the document and the holes' texts never hold them.
    preamble_length: int = 0

    @property
    def length(self) -> int:
        return int(self.ids.shape[0])

    def hole_index(self) -> torch.Tensor:
        """[L] long: the index of the hole holding each position, -1 for locked positions."""
        index = torch.full((self.length,), -1, dtype=torch.long)
        for i, hole in enumerate(self.holes):
            index[hole.start : hole.end] = i
        return index

    def terminators(self) -> tuple[int, int]:
        return (self.eos_id, self.pad_id)

    def kept_tokens(self, ids: torch.Tensor, hole: Hole) -> list[int]:
        """The hole's tokens before its first EOS / pad (the tail is stripped)."""
        kept: list[int] = []
        for token in ids[hole.start : hole.end].tolist():
            if token in self.terminators():
                break
            kept.append(int(token))
        return kept

    def span_texts(self, ids: torch.Tensor, tokenizer: StencilTokenizer) -> list[str]:
        """Each hole span's text (forced prefix removed), in ``holes`` order."""
        texts = []
        for hole in self.holes:
            # A pattern's automaton reads the tokens' own text: it is the hole's text, virtual
            # spaces and all (see tokenizer.spaced_text), so what it accepted is what is kept.
            raw = isinstance(hole.constraint, PatternConstraint)
            kept = (t for t in self.kept_tokens(ids, hole) if t != self.mask_id)
            text = tokenizer.decode(kept, raw=raw)
            texts.append(text[len(hole.prefix) :] if text.startswith(hole.prefix) else text)
        return texts

    def hole_texts(self, ids: torch.Tensor, tokenizer: StencilTokenizer) -> dict[str, str]:
        """The text of each request hole (a schema hole: skeleton and values together)."""
        spans = self.span_texts(ids, tokenizer)
        out: dict[str, str] = {name: "" for name in self.groups}
        for piece in self.pieces:
            if piece.group is None:
                continue
            out[piece.group] += piece.render(spans)
        return out

    def document(self, ids: torch.Tensor, tokenizer: StencilTokenizer) -> str:
        spans = self.span_texts(ids, tokenizer)
        return "".join(piece.render(spans) for piece in self.pieces)

    def filled_ids(self, fills: dict[str, str], tokenizer: StencilTokenizer) -> list[int]:
        """The canvas's token ids with each hole span holding ``fills[span name]`` (no masks).

        What the model sees once the holes are filled; for a natural split it equals the
        tokenization of the whole document.
        """
        out: list[int] = []
        cursor = 0
        for hole in self.holes:
            out.extend(int(t) for t in self.ids[cursor : hole.start].tolist())
            out.extend(tokenizer.encode(hole.prefix + fills[hole.name]))
            cursor = hole.end
        out.extend(int(t) for t in self.ids[cursor:].tolist())
        return out


# -- parsing Canvas JSON -----------------------------------------------------------------------
def parse_canvas(
    data: str | dict[str, Any],
    tokenizer: StencilTokenizer,
    *,
    max_len: int,
    vocab_size: int | None = None,
) -> Canvas:
    """A Canvas from Canvas JSON; ``ValueError`` with a clear message for any bad input.

    ``max_len`` is the model's context; ``vocab_size`` its vocabulary (default: the tokenizer's).
    """
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as exc:
            raise ValueError(f"canvas is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"canvas must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - _TOP_LEVEL_FIELDS)
    if unknown:
        raise ValueError(f"unknown canvas field(s) {unknown}; known: {sorted(_TOP_LEVEL_FIELDS)}")
    seed = data.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed={seed!r} must be an integer from 0 to {MAX_SEED}")
    sampler = data.get("sampler", {})
    if not isinstance(sampler, dict):
        raise ValueError(f"sampler={sampler!r} must be a JSON object of SamplerConfig fields")
    purpose = data.get("purpose", "")
    if not isinstance(purpose, str):
        raise ValueError(f"purpose={purpose!r} must be a string (what the document is for)")
    segments = data.get("segments")
    if not isinstance(segments, list) or not segments:
        raise ValueError("segments must be a non-empty list of {'text'} / {'hole'} objects")
    canvas = build_canvas(segments, tokenizer, max_len=max_len, vocab_size=vocab_size)
    _refuse_special_text("purpose", purpose, _special_spellings(tokenizer))
    canvas.seed = seed
    canvas.sampler = dict(sampler)
    canvas.purpose = purpose
    return canvas


@dataclass
class _Item:
    """A flattened segment: locked text, or a hole span waiting for positions."""

    text: str | None
    group: str | None
    name: str = ""
    max_len: int = 0
    spec: dict[str, Any] = field(default_factory=dict)  # {"pattern": ..} / {"choices": ..}


def build_canvas(
    segments: list[Any],
    tokenizer: StencilTokenizer,
    *,
    max_len: int,
    vocab_size: int | None = None,
) -> Canvas:
    """Tokenize segments into a Canvas (see the module docstring for the boundary rule)."""
    if not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len={max_len!r} must be a positive integer")
    table = token_table(tokenizer, vocab_size or tokenizer.vocab_size)
    groups: dict[str, dict[str, Any]] = {}
    items: list[_Item] = []
    for index, segment in enumerate(segments):
        items.extend(_flatten_segment(index, segment, groups))
    if not any(item.text is None for item in items):
        raise ValueError("the canvas has no hole to fill")
    specials = _special_spellings(tokenizer)
    for item in items:
        if item.text is not None:
            _refuse_special_text(f"{item.name or item.group}.text", item.text, specials)
    for name, hole in groups.items():
        _refuse_special_text(f"hole {name!r}'s hint", str(hole.get("hint", "")), specials)
    return _tokenize(items, groups, tokenizer, table, max_len)


def _special_spellings(tokenizer: StencilTokenizer) -> list[str]:
    """The text of each of the tokenizer's special tokens."""
    added = tokenizer.tok.get_added_tokens_decoder().values()
    return [token.content for token in added if token.special and token.content]


def _refuse_special_text(where: str, text: str, specials: list[str]) -> None:
    """ValueError for request text that spells one of the model's special tokens: they may
    stand only in the operator's preamble (gpu_worker.engine.preamble), never in a document."""
    for special in specials:
        if special in text:
            raise ValueError(
                f"{where} holds {special!r}, a special token of this model: special "
                "tokens may stand only in the model's preamble, not in the document"
            )


def _flatten_segment(index: int, segment: Any, groups: dict[str, dict[str, Any]]) -> list[_Item]:
    where = f"segments[{index}]"
    if not isinstance(segment, dict):
        raise ValueError(f"{where} must be an object with 'text' or 'hole', got {segment!r}")
    if "text" in segment:
        unknown = sorted(set(segment) - _TEXT_FIELDS)
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {unknown} in a text segment")
        if not isinstance(segment["text"], str):
            raise ValueError(f"{where}.text must be a string, got {segment['text']!r}")
        return [_Item(segment["text"], None, name=where)]
    if "hole" not in segment:
        raise ValueError(f"{where} needs a 'text' or a 'hole' field, got {sorted(segment)}")
    unknown = sorted(set(segment) - _HOLE_FIELDS)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; known: {sorted(_HOLE_FIELDS)}")
    name = segment["hole"]
    if not isinstance(name, str) or not name or "." in name:
        raise ValueError(f"{where}.hole={name!r} must be a non-empty name without '.'")
    if name in groups:
        raise ValueError(f"duplicate hole name {name!r} at {where}")
    if not isinstance(segment.get("hint", ""), str):
        raise ValueError(f"{where}.hint={segment['hint']!r} must be a string (what the hole holds)")
    max_tokens = segment.get("max_tokens")
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise ValueError(f"{where}.max_tokens={max_tokens!r} must be a positive integer")
    constraint = _constraint_spec(where, name, segment.get("constraint"))
    groups[name] = dict(segment)
    if "schema" in constraint:
        return _schema_items(name, constraint["schema"], max_tokens)
    if max_tokens is None and "choices" not in constraint:
        raise ValueError(f"{where}: hole {name!r} needs max_tokens")
    return [_Item(None, name, name, max_tokens or 0, constraint)]


def _constraint_spec(where: str, name: str, spec: Any) -> dict[str, Any]:
    if spec is None:
        return {}
    if not isinstance(spec, dict):
        raise ValueError(f"{where}.constraint must be an object, got {spec!r}")
    unknown = sorted(set(spec) - set(_CONSTRAINT_KINDS))
    if unknown:
        raise ValueError(f"{where}.constraint: unknown field(s) {unknown}; "
                         f"known: {list(_CONSTRAINT_KINDS)}")  # fmt: skip
    if len(spec) != 1:
        raise ValueError(f"hole {name!r}: give exactly one of {list(_CONSTRAINT_KINDS)}")
    return dict(spec)


def _schema_items(name: str, schema: Any, max_tokens: int | None) -> list[_Item]:
    items: list[_Item] = []
    for piece in schema_skeleton(schema, hole=name, max_tokens=max_tokens):
        if isinstance(piece, SkeletonText):
            items.append(_Item(piece.text, name))
        else:
            sub = f"{name}.{piece.path}" if piece.path else name
            items.append(_Item(None, name, sub, piece.max_tokens, piece.constraint))
    return items


def _tokenize(
    items: list[_Item],
    groups: dict[str, dict[str, Any]],
    tokenizer: StencilTokenizer,
    table: TokenTable,
    max_len: int,
) -> Canvas:
    ids: list[int] = []
    protect: list[bool] = []
    holes: list[Hole] = []
    pieces: list[Piece] = []
    pending = ""  # locked text not tokenized yet: adjacent text pieces tokenize together
    for item in items:
        if item.text is not None:
            pieces.append(Piece(item.text, None, item.group))
            pending += item.text
            continue
        if pending.endswith(FORCED_PREFIX):  # the locked space moves into the hole
            prefix, locked = FORCED_PREFIX, pending[: -len(FORCED_PREFIX)]
        else:  # a virtual space where the tokenizer has them, else none
            prefix = tokenizer.virtual_prefix(pending, at_document_start=not ids and not pending)
            locked = pending
        _append_locked(locked, tokenizer, ids, protect, before_hole=True)
        pending = ""
        constraint, length = _hole_constraint(item, tokenizer, table, prefix)
        _check_fits(len(ids) + length, max_len)
        holes.append(Hole(item.name, item.group or item.name, len(ids), length, constraint, prefix))
        pieces.append(Piece(None, len(holes) - 1, item.group))
        ids.extend([tokenizer.special.mask] * length)
        protect.extend([False] * length)
    _append_locked(pending, tokenizer, ids, protect)
    _check_fits(len(ids), max_len)
    free = table.free  # shared, read-only
    return Canvas(
        ids=torch.tensor(ids, dtype=torch.long),
        protect=torch.tensor(protect, dtype=torch.bool),
        holes=holes,
        pieces=pieces,
        allowed=_prefix_sets(holes, table, free),
        free_vocab=free,
        mask_id=tokenizer.special.mask,
        pad_id=tokenizer.special.pad,
        eos_id=tokenizer.special.eos,
        groups=groups,
        tokenizer=tokenizer,
    )


def _check_fits(needed: int, max_len: int) -> None:
    if needed > max_len:
        raise ValueError(
            f"the canvas needs at least {needed} tokens (locked text plus every hole's "
            f"max_tokens) but the model's context is max_len={max_len}"
        )


def _append_locked(
    text: str,
    tokenizer: StencilTokenizer,
    ids: list[int],
    protect: list[bool],
    *,
    before_hole: bool = False,
) -> None:
    """Append locked text's tokens; before a hole, as the text tokenizes in a document where
    the hole's words follow it (see :func:`encode_before_word`). At the document's start
    (nothing appended yet) with the virtual space spaced lines give it there
    (``StencilTokenizer.document_prefix``), tokenized with the text."""
    lead = tokenizer.document_prefix(text) if not ids else ""
    if before_hole:
        tokens = encode_before_word(tokenizer.encode, lead + text, spaced=tokenizer.spaced_lines)
    else:
        tokens = tokenizer.encode(lead + text)
    if tokenizer.decode(tokens) != lead + text:
        raise ValueError(f"locked text {text!r} does not survive tokenization byte-identically")
    ids.extend(tokens)
    protect.extend([True] * len(tokens))


def _hole_constraint(
    item: _Item, tokenizer: StencilTokenizer, table: TokenTable, prefix: str
) -> tuple[HoleConstraint | None, int]:
    """The decoding-time constraint of a hole span and its number of positions."""
    spec = item.spec
    if "choices" in spec:
        # The choices fix the hole's length (their longest, in tokens); max_tokens, a guess
        # made without the tokenizer, neither cuts a choice nor adds pad positions.
        choice = build_choices(spec["choices"], tokenizer, prefix=prefix, hole=item.name)
        return choice, max(len(c) for c in choice.candidates)
    if "pattern" in spec:
        if not isinstance(spec["pattern"], str):
            raise ValueError(f"hole {item.name!r}: pattern={spec['pattern']!r} must be a string")
        try:
            pattern = pattern_constraint(spec["pattern"], table, prefix)
        except ValueError as exc:
            raise ValueError(f"hole {item.name!r}: {exc}") from None
        needed = pattern.min_tokens()
        if needed == float("inf"):
            raise ValueError(
                f"hole {item.name!r}: no sequence of the tokenizer's tokens matches "
                f"pattern {spec['pattern']!r}"
            )
        if needed > item.max_len:
            raise ValueError(
                f"hole {item.name!r}: pattern {spec['pattern']!r} needs at least {needed} "
                f"tokens but max_tokens={item.max_len}"
            )
        return pattern, item.max_len
    return None, item.max_len


def _prefix_sets(
    holes: list[Hole], table: TokenTable, free: torch.Tensor
) -> dict[int, torch.Tensor]:
    """First positions of unconstrained prefixed holes: tokens starting with the prefix."""
    allowed: dict[int, torch.Tensor] = {}
    for hole in holes:
        if hole.prefix and hole.constraint is None:
            allowed[hole.start] = _starting_with(hole.prefix, table) & free
    return allowed


@functools.lru_cache(maxsize=64)
def _starting_with(prefix: str, table: TokenTable) -> torch.Tensor:
    """Bool [V]: the tokens whose text starts with ``prefix``, and EOS / pad. Shared by every
    canvas (a scan of the whole vocabulary in Python, about 1 ms); never written to."""
    starts = torch.tensor([t.startswith(prefix) for t in table.texts])
    starts[list(table.terminators)] = True
    return starts


__all__ = ["FORCED_PREFIX", "Canvas", "Hole", "HoleConstraint", "Piece", "build_canvas",
           "parse_canvas"]  # fmt: skip
