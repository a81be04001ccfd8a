"""Hole constraints, enforced while decoding rather than checked afterwards.

* ``choices``: the hole is one of a list of strings, scored as whole candidates under the model
  (the sampler commits one candidate's tokens at once, never a mix of two).
* ``pattern``: a regular expression (a supported subset, anchored full match) compiled by hand
  to an automaton over characters, lifted to tokens: at each position of the hole, decoded left
  to right, only tokens that keep the text completable within the positions left are allowed.
* ``schema``: a JSON Schema turned into a skeleton whose keys and punctuation are locked text
  and whose values are typed holes (string / integer / number via patterns, boolean / enum via
  choices).

The regex subset: literals, ``.``, classes ``[a-z0-9]`` and ``[^...]``, ``\\d \\w \\s`` (and
``\\D \\W \\S``, ASCII meanings as ``re.ASCII``), ``\\xhh``, ``? * + {m} {m,} {m,n}``, ``|``,
groups ``(...)`` / ``(?:...)``, ``^`` at the start and ``$`` at the end. Anything else
(backreferences, lookaround, word boundaries, lazy or possessive quantifiers, inline flags)
raises ``ValueError`` naming the feature.
"""

from __future__ import annotations

import functools
import json
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gpu_worker.engine.tokenizer import StencilTokenizer

MAX_REPEAT = 256  # the largest {m,n} bound accepted (each bound copies the sub-automaton)
MAX_TOKEN_STATES = 4096  # the most automaton states a pattern may reach through tokens
_ASCII_SPACE = " \t\n\r\f\v"
_WORD_RANGES = ((ord("a"), ord("z")), (ord("A"), ord("Z")), (ord("0"), ord("9")), (95, 95))


# -- character sets -------------------------------------------------------------------------
@dataclass(frozen=True)
class CharSet:
    """A union of (ranges, negated) items, itself optionally negated (``[^...]``)."""

    items: tuple[tuple[tuple[tuple[int, int], ...], bool], ...]
    negated: bool = False

    def __contains__(self, ch: str) -> bool:
        code = ord(ch)
        hit = any(any(lo <= code <= hi for lo, hi in ranges) != neg for ranges, neg in self.items)
        return hit != self.negated

    @staticmethod
    def of(ranges: Iterable[tuple[int, int]], negated: bool = False) -> CharSet:
        return CharSet(((tuple(ranges), negated),))


def _literal(ch: str) -> CharSet:
    return CharSet.of([(ord(ch), ord(ch))])


def _single_char(cs: CharSet) -> int | None:
    """The code point of a one-character set (a literal), else None."""
    if len(cs.items) == 1 and not cs.negated:
        ranges, neg = cs.items[0]
        if not neg and len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
            return ranges[0][0]
    return None


_DOT = CharSet.of([(ord("\n"), ord("\n"))], negated=True)
_CLASS_ESCAPES: dict[str, tuple[tuple[tuple[int, int], ...], bool]] = {
    "d": (((ord("0"), ord("9")),), False),
    "D": (((ord("0"), ord("9")),), True),
    "w": (_WORD_RANGES, False),
    "W": (_WORD_RANGES, True),
    "s": (tuple((ord(c), ord(c)) for c in _ASCII_SPACE), False),
    "S": (tuple((ord(c), ord(c)) for c in _ASCII_SPACE), True),
}
_CHAR_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}
_UNSUPPORTED_ESCAPES = {
    "b": "word boundary \\b",
    "B": "word boundary \\B",
    "A": "anchor \\A",
    "Z": "anchor \\Z",
    "z": "anchor \\z",
    "G": "anchor \\G",
    "p": "unicode property \\p",
    "P": "unicode property \\P",
    "u": "unicode escape \\u",
    "U": "unicode escape \\U",
    "N": "named character \\N",
}


# -- the regex AST ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Chars:
    chars: CharSet


@dataclass(frozen=True)
class Concat:
    parts: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True)
class Repeat:
    node: Node
    low: int
    high: int | None  # None = unbounded


Node = Chars | Concat | Alt | Repeat


def literal_node(text: str) -> Node:
    return Concat(tuple(Chars(_literal(c)) for c in text))


class _Parser:
    """Recursive descent over the supported subset; errors name the unsupported feature."""

    def __init__(self, pattern: str) -> None:
        self.src = pattern
        self.pos = 0

    def fail(self, what: str) -> ValueError:
        return ValueError(f"pattern {self.src!r}: {what} (at offset {self.pos}) is not supported")

    def peek(self) -> str | None:
        return self.src[self.pos] if self.pos < len(self.src) else None

    def take(self) -> str:
        ch = self.src[self.pos]
        self.pos += 1
        return ch

    def parse(self) -> Node:
        node = self.alternation()
        if self.pos != len(self.src):
            raise ValueError(f"pattern {self.src!r}: unbalanced ')' at offset {self.pos}")
        return node

    def alternation(self) -> Node:
        options = [self.concatenation()]
        while self.peek() == "|":
            self.take()
            options.append(self.concatenation())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def concatenation(self) -> Node:
        parts: list[Node] = []
        while self.peek() not in (None, "|", ")"):
            part = self.repetition()
            if part is not None:
                parts.append(part)
        return parts[0] if len(parts) == 1 else Concat(tuple(parts))

    def repetition(self) -> Node | None:
        atom = self.atom()
        while self.peek() in ("*", "+", "?", "{"):
            if atom is None:
                raise self.fail("a quantifier after an anchor")
            low, high = self.quantifier()
            if self.peek() == "?":
                raise self.fail("lazy quantifier")
            if self.peek() == "+":
                raise self.fail("possessive quantifier")
            atom = Repeat(atom, low, high)
        return atom

    def quantifier(self) -> tuple[int, int | None]:
        ch = self.take()
        if ch == "*":
            return 0, None
        if ch == "+":
            return 1, None
        if ch == "?":
            return 0, 1
        end = self.src.find("}", self.pos)
        body = self.src[self.pos : end] if end >= 0 else ""
        low_s, comma, high_s = body.partition(",")
        if end < 0 or not low_s.isdigit() or (high_s and not high_s.isdigit()):
            raise self.fail("a '{' that is not a {m}, {m,} or {m,n} quantifier")
        self.pos = end + 1
        low = int(low_s)
        high = (int(high_s) if high_s else None) if comma else low
        if high is not None and high < low:
            raise ValueError(f"pattern {self.src!r}: quantifier {{{body}}} has max < min")
        if max(low, high or 0) > MAX_REPEAT:
            raise ValueError(f"pattern {self.src!r}: quantifier {{{body}}} exceeds {MAX_REPEAT}")
        return low, high

    def atom(self) -> Node | None:
        ch = self.take()
        if ch == "(":
            return self.group()
        if ch == "[":
            return Chars(self.char_class())
        if ch == ".":
            return Chars(_DOT)
        if ch == "\\":
            return Chars(self.escape())
        if ch == "^":
            if self.pos != 1:
                raise self.fail("anchor '^' inside the pattern")
            return None
        if ch == "$":
            if self.pos != len(self.src):
                raise self.fail("anchor '$' inside the pattern")
            return None
        if ch in "*+?{":
            self.pos -= 1
            raise self.fail(f"quantifier {ch!r} with nothing to repeat")
        return Chars(_literal(ch))

    def group(self) -> Node:
        if self.peek() == "?":
            rest = self.src[self.pos : self.pos + 3]
            if rest.startswith("?:"):
                self.pos += 2
            elif rest.startswith(("?=", "?!")):
                raise self.fail("lookahead")
            elif rest.startswith(("?<=", "?<!")):
                raise self.fail("lookbehind")
            elif rest.startswith(("?P", "?<")):
                raise self.fail("named group")
            else:
                raise self.fail("inline flag or group extension '(?'")
        node = self.alternation()
        if self.peek() != ")":
            raise ValueError(f"pattern {self.src!r}: missing ')'")
        self.take()
        return node

    def char_class(self) -> CharSet:
        negated = self.peek() == "^"
        if negated:
            self.take()
        items: list[tuple[tuple[tuple[int, int], ...], bool]] = []
        first = True
        while True:
            if self.peek() is None:
                raise ValueError(f"pattern {self.src!r}: missing ']'")
            ch = self.take()
            if ch == "]" and not first:
                break
            first = False
            if ch == "[" and self.peek() == ":":
                raise self.fail("POSIX class [:...:]")
            if ch == "\\":
                escaped = self.escape()
                single = _single_char(escaped)
                if single is None:  # \d \w \s and their negations
                    items.extend(escaped.items)
                    continue
                lo = single
            else:
                lo = ord(ch)
            hi = lo
            if self.peek() == "-" and self.src[self.pos + 1 : self.pos + 2] not in ("]", ""):
                self.take()
                end_ch = self.take()
                end_set = self.escape() if end_ch == "\\" else _literal(end_ch)
                end = _single_char(end_set)
                if end is None:
                    raise self.fail("a class escape as the end of a range")
                hi = end
                if hi < lo:
                    raise ValueError(f"pattern {self.src!r}: bad range {chr(lo)}-{chr(hi)}")
            items.append((((lo, hi),), False))
        if not items:
            raise ValueError(f"pattern {self.src!r}: empty character class")
        return CharSet(tuple(items), negated)

    def escape(self) -> CharSet:
        if self.peek() is None:
            raise ValueError(f"pattern {self.src!r}: trailing backslash")
        ch = self.take()
        if ch in _CLASS_ESCAPES:
            ranges, neg = _CLASS_ESCAPES[ch]
            return CharSet(((ranges, neg),))
        if ch in _CHAR_ESCAPES:
            return _literal(_CHAR_ESCAPES[ch])
        if ch == "x":
            digits = self.src[self.pos : self.pos + 2]
            if len(digits) != 2 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.fail("a \\x escape without two hex digits")
            self.pos += 2
            return _literal(chr(int(digits, 16)))
        if ch.isdigit():
            raise self.fail("backreference")
        if ch in _UNSUPPORTED_ESCAPES:
            raise self.fail(_UNSUPPORTED_ESCAPES[ch])
        if ch.isalnum():
            raise self.fail(f"escape \\{ch}")
        return _literal(ch)


def parse_pattern(pattern: str) -> Node:
    """The AST of ``pattern``; ``ValueError`` naming any unsupported feature."""
    if not isinstance(pattern, str):
        raise ValueError(f"pattern={pattern!r} must be a string")
    return _Parser(pattern).parse()


# -- NFA (Thompson) and a lazily built DFA ------------------------------------------------------
@dataclass
class _Nfa:
    eps: list[list[int]] = field(default_factory=list)
    edges: list[list[tuple[CharSet, int]]] = field(default_factory=list)

    def new(self) -> int:
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def build(self, node: Node) -> tuple[int, int]:
        """(entry, exit) states of a fragment for ``node``."""
        if isinstance(node, Chars):
            a, b = self.new(), self.new()
            self.edges[a].append((node.chars, b))
            return a, b
        if isinstance(node, Concat):
            entry = exit_ = self.new()
            for part in node.parts:
                a, b = self.build(part)
                self.eps[exit_].append(a)
                exit_ = b
            return entry, exit_
        if isinstance(node, Alt):
            entry, exit_ = self.new(), self.new()
            for option in node.options:
                a, b = self.build(option)
                self.eps[entry].append(a)
                self.eps[b].append(exit_)
            return entry, exit_
        return self._repeat(node)

    def _repeat(self, node: Repeat) -> tuple[int, int]:
        entry = exit_ = self.new()
        for _ in range(node.low):
            a, b = self.build(node.node)
            self.eps[exit_].append(a)
            exit_ = b
        if node.high is None:  # a star: loop back through the body
            a, b = self.build(node.node)
            self.eps[exit_].append(a)
            self.eps[b].append(a)
            done = self.new()
            self.eps[exit_].append(done)
            self.eps[b].append(done)
            return entry, done
        done = self.new()
        for _ in range(node.high - node.low):  # optional copies, each may end the repeat
            self.eps[exit_].append(done)
            a, b = self.build(node.node)
            self.eps[exit_].append(a)
            exit_ = b
        self.eps[exit_].append(done)
        return entry, done


class CharAutomaton:
    """A DFA over characters, built lazily from the NFA; state 0 is the dead state."""

    DEAD = 0

    def __init__(self, node: Node) -> None:
        self.nfa = _Nfa()
        start, self.final = self.nfa.build(node)
        self._ids: dict[frozenset[int], int] = {frozenset(): self.DEAD}
        self._sets: list[frozenset[int]] = [frozenset()]
        self._step: dict[tuple[int, str], int] = {}
        self.start = self._intern(self._closure({start}))

    def _closure(self, states: Iterable[int]) -> frozenset[int]:
        seen = set(states)
        stack = list(seen)
        while stack:
            for nxt in self.nfa.eps[stack.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return frozenset(seen)

    def _intern(self, states: frozenset[int]) -> int:
        if states not in self._ids:
            self._ids[states] = len(self._sets)
            self._sets.append(states)
        return self._ids[states]

    def step(self, state: int, ch: str) -> int:
        key = (state, ch)
        if key not in self._step:
            moved = {t for s in self._sets[state] for cs, t in self.nfa.edges[s] if ch in cs}
            self._step[key] = self._intern(self._closure(moved)) if moved else self.DEAD
        return self._step[key]

    def run(self, text: str, state: int | None = None) -> int:
        state = self.start if state is None else state
        for ch in text:
            state = self.step(state, ch)
            if state == self.DEAD:
                break
        return state

    def accepting(self, state: int) -> bool:
        return self.final in self._sets[state]

    def fullmatch(self, text: str) -> bool:
        return self.accepting(self.run(text))


def check_pattern(pattern: str) -> None:
    """Raise ``ValueError`` naming the first feature of ``pattern`` the sampler cannot enforce."""
    parse_pattern(pattern)


def pattern_fullmatch(pattern: str, text: str) -> bool:
    """Whether ``text`` matches ``pattern`` entirely, by our own automaton."""
    return _compiled(pattern).fullmatch(text)


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> CharAutomaton:
    return CharAutomaton(parse_pattern(pattern))


# -- the tokenizer's vocabulary as text ------------------------------------------------------------
@dataclass(eq=False)  # hashed by identity: one table per tokenizer, a cache key
class TokenTable:
    """Each token's decoded text, a trie over the texts, and the single-character tokens."""

    texts: list[str]  # '' for special tokens and for partial UTF-8 byte tokens
    trie: dict[str, Any]  # char -> child; key "" holds the ids of tokens ending here
    single_chars: frozenset[str]
    terminators: tuple[int, ...]  # eos and pad: end a hole
    free: torch.Tensor  # [V] bool: real tokens plus eos / pad; never mask, FIM or unknown ids
    words: frozenset[int]  # tokens whose text holds a letter (a word or a piece of one)

    @property
    def vocab_size(self) -> int:
        return len(self.texts)


@functools.lru_cache(maxsize=8)
def token_table(tokenizer: StencilTokenizer, vocab_size: int) -> TokenTable:
    """Built once per tokenizer; ``vocab_size`` is the model's (it may exceed the tokenizer's)."""
    texts: list[str] = []
    for token_id in range(vocab_size):
        if token_id >= tokenizer.vocab_size or tokenizer.is_special(token_id):
            texts.append("")
            continue
        text = tokenizer.token_text(token_id)
        texts.append("" if "\ufffd" in text else text)
    trie: dict[str, Any] = {}
    for token_id, text in enumerate(texts):
        if not text:
            continue
        node = trie
        for ch in text:
            node = node.setdefault(ch, {})
        node.setdefault("", []).append(token_id)
    single = frozenset(t for t in texts if len(t) == 1)
    terminators = (tokenizer.special.eos, tokenizer.special.pad)
    free = torch.zeros(vocab_size, dtype=torch.bool)
    for token_id in range(min(tokenizer.vocab_size, vocab_size)):
        free[token_id] = not tokenizer.is_special(token_id)  # partial UTF-8 bytes included
    free[list(terminators)] = True
    words = frozenset(i for i, text in enumerate(texts) if any(ch.isalpha() for ch in text))
    return TokenTable(texts, trie, single, terminators, free, words)


# -- token-level constraints ------------------------------------------------------------------------
class PatternConstraint:
    """``prefix + text`` must fully match the pattern; decoded left to right over tokens.

    The token-level automaton: every DFA state reachable from the start through token texts,
    and for each the fewest tokens that finish a match. ``allowed(state, remaining)`` is the
    set of tokens after which the match can still finish within the positions left, so
    decoding never reaches a dead end; EOS / pad are allowed only in an accepting state.
    """

    def __init__(self, pattern: str, table: TokenTable, *, prefix: str = "") -> None:
        self.pattern = pattern
        self.prefix = prefix
        self.table = table
        node = parse_pattern(pattern)
        self.dfa = CharAutomaton(Concat((literal_node(prefix), node)) if prefix else node)
        self._moves: dict[int, list[tuple[int, int]]] = {}
        self._move_arrays: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._allowed: dict[tuple[int, int], torch.Tensor] = {}
        self._dist = self._token_distances()

    @property
    def start(self) -> int:
        return self.dfa.start

    def _token_distances(self) -> dict[int, float]:
        """Fewest tokens from each reachable state to an accepting one (inf if none)."""
        reverse: dict[int, set[int]] = {self.start: set()}
        queue: deque[int] = deque([self.start])
        while queue:  # explore the states reachable through whole tokens
            state = queue.popleft()
            for _, nxt in self.moves(state):
                if nxt not in reverse:
                    if len(reverse) >= MAX_TOKEN_STATES:
                        raise ValueError(
                            f"pattern {self.pattern!r} is too complex: more than "
                            f"{MAX_TOKEN_STATES} automaton states"
                        )
                    reverse[nxt] = set()
                    queue.append(nxt)
                reverse[nxt].add(state)
        dist: dict[int, float] = {s: float("inf") for s in reverse}
        frontier = [s for s in reverse if self.dfa.accepting(s)]
        for s in frontier:
            dist[s] = 0
        queue = deque(frontier)
        while queue:  # breadth-first, backwards from the accepting states
            state = queue.popleft()
            for prev in reverse[state]:
                if dist[prev] == float("inf"):
                    dist[prev] = dist[state] + 1
                    queue.append(prev)
        return dist

    def min_tokens(self, state: int | None = None) -> float:
        """Fewest tokens that finish the match from ``state`` (inf if none can)."""
        return self._dist.get(self.dfa.start if state is None else state, float("inf"))

    def moves(self, state: int) -> list[tuple[int, int]]:
        """(token id, next state) for every token that does not kill the match."""
        if state not in self._moves:
            out: list[tuple[int, int]] = []
            stack: list[tuple[dict[str, Any], int]] = [(self.table.trie, state)]
            while stack:  # walk the token trie, pruned where the automaton dies
                node, st = stack.pop()
                for key, child in node.items():
                    if key == "":
                        out.extend((token_id, st) for token_id in child)
                        continue
                    nxt = self.dfa.step(st, key)
                    if nxt != CharAutomaton.DEAD:
                        stack.append((child, nxt))
            self._moves[state] = out
        return self._moves[state]

    def advance(self, state: int, token_id: int) -> int:
        """The state after ``token_id``'s text (DEAD if it kills the match)."""
        text = self.table.texts[token_id] if token_id < self.table.vocab_size else ""
        return self.dfa.run(text, state) if text else CharAutomaton.DEAD

    def allowed(self, state: int, remaining: int) -> torch.Tensor:
        """Bool [V]: tokens allowed at the next position with ``remaining`` positions left."""
        key = (state, remaining)
        if key not in self._allowed:
            if state not in self._move_arrays:  # each move's token and its finishing distance
                moves = self.moves(state)
                self._move_arrays[state] = (
                    torch.tensor([t for t, _ in moves], dtype=torch.long),
                    torch.tensor([self.min_tokens(nxt) for _, nxt in moves], dtype=torch.float64),
                )
            ids, distance = self._move_arrays[state]
            mask = torch.zeros(self.table.vocab_size, dtype=torch.bool)
            mask[ids[distance <= remaining - 1]] = True
            if self.dfa.accepting(state):
                mask[list(self.table.terminators)] = True
            self._allowed[key] = mask
        return self._allowed[key]


@functools.lru_cache(maxsize=256)
def pattern_constraint(pattern: str, table: TokenTable, prefix: str = "") -> PatternConstraint:
    """A shared PatternConstraint: its automaton and token masks are built once per process."""
    return PatternConstraint(pattern, table, prefix=prefix)


@dataclass(frozen=True)
class ChoiceConstraint:
    """The hole is exactly one of ``choices``; candidates are their token ids (prefix included)."""

    choices: tuple[str, ...]
    candidates: tuple[tuple[int, ...], ...]


def build_choices(
    choices: Sequence[Any], tokenizer: StencilTokenizer, *, prefix: str, hole: str
) -> ChoiceConstraint:
    if not isinstance(choices, list | tuple) or not choices:
        raise ValueError(f"hole {hole!r}: choices={choices!r} must be a non-empty list")
    if not all(isinstance(c, str) for c in choices):
        raise ValueError(f"hole {hole!r}: every choice must be a string, got {choices!r}")
    if len(set(choices)) != len(choices):
        raise ValueError(f"hole {hole!r}: choices={list(choices)!r} has duplicates")
    candidates = tuple(tuple(tokenizer.encode(prefix + c)) for c in choices)
    return ChoiceConstraint(tuple(choices), candidates)


# -- JSON Schema skeletons ------------------------------------------------------------------------
JSON_STRING_BODY = '[^"\\\\\\x00-\\x1f]'  # one character a JSON string may hold unescaped
JSON_INTEGER = "-?(0|[1-9][0-9]*)"
JSON_NUMBER = "-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?"
DEFAULT_VALUE_TOKENS = {"string": 16, "integer": 6, "number": 10}
_INTEGER_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_ANNOTATIONS = {"title", "description", "$schema", "$id", "examples", "default", "$comment"}
_SUPPORTED_KEYS = {
    "object": {"type", "properties", "required", "additionalProperties"},
    "string": {"type", "minLength", "maxLength", "enum", "const"},
    "integer": {"type", "enum", "const", *_INTEGER_BOUNDS},
    "number": {"type", "enum", "const"},
    "boolean": {"type", "enum", "const"},
    "null": {"type"},
}


@dataclass(frozen=True)
class SkeletonText:
    text: str


@dataclass(frozen=True)
class SkeletonValue:
    path: str  # e.g. "address.city": the sub-hole is named "<hole>.<path>"
    constraint: dict[str, Any]  # {"pattern": ...} or {"choices": [...]}
    max_tokens: int


SkeletonPiece = SkeletonText | SkeletonValue


def schema_skeleton(
    schema: Any, *, hole: str, max_tokens: int | None = None
) -> list[SkeletonPiece]:
    """Locked keys and punctuation plus typed value holes for a JSON Schema.

    The hole's text is one JSON value. An object writes every property (in the schema's
    order), compactly: ``{"a":1,"b":"x"}``; a scalar schema is a single typed value.
    ``max_tokens`` caps each value hole (defaults per type otherwise).
    """
    import jsonschema

    if not isinstance(schema, dict):
        raise ValueError(f"hole {hole!r}: schema must be a JSON object, got {schema!r}")
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"hole {hole!r}: invalid JSON Schema: {exc.message}") from None
    pieces: list[SkeletonPiece] = []
    _skeleton(schema, "", hole, max_tokens, pieces)
    merged: list[SkeletonPiece] = []
    for piece in pieces:  # join adjacent locked texts
        if merged and isinstance(piece, SkeletonText) and isinstance(merged[-1], SkeletonText):
            merged[-1] = SkeletonText(merged[-1].text + piece.text)
        else:
            merged.append(piece)
    return merged


def _skeleton(
    schema: dict[str, Any], path: str, hole: str, cap: int | None, out: list[SkeletonPiece]
) -> None:
    where = f"hole {hole!r}, schema at {path or '<root>'!r}"
    kind = schema.get("type")
    if "enum" in schema or "const" in schema:
        values = schema["enum"] if "enum" in schema else [schema["const"]]
        texts = [json.dumps(v, separators=(",", ":")) for v in values]
        if len(texts) == 1:
            out.append(SkeletonText(texts[0]))
        else:
            out.append(SkeletonValue(path, {"choices": texts}, 0))
        return
    if not isinstance(kind, str) or kind not in _SUPPORTED_KEYS:
        raise ValueError(f"{where}: type {kind!r} is not supported (object, string, integer, "
                         "number, boolean, null, enum)")  # fmt: skip
    unsupported = sorted(set(schema) - _SUPPORTED_KEYS[kind] - _ANNOTATIONS)
    if unsupported:
        raise ValueError(f"{where}: keyword(s) {unsupported} are not supported for {kind}")
    if kind == "object":
        properties = schema.get("properties", {})
        if not properties:
            raise ValueError(f"{where}: an object needs at least one property")
        out.append(SkeletonText("{"))
        for i, (key, sub) in enumerate(properties.items()):
            out.append(SkeletonText(("," if i else "") + json.dumps(key) + ":"))
            _skeleton(sub, f"{path}.{key}" if path else key, hole, cap, out)
        out.append(SkeletonText("}"))
    elif kind == "boolean":
        out.append(SkeletonValue(path, {"choices": ["true", "false"]}, 0))
    elif kind == "null":
        out.append(SkeletonText("null"))
    elif kind == "string":
        low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
        bounds = f"{{{low},{int(high)}}}" if high is not None else f"{{{low},}}"
        tokens = cap or DEFAULT_VALUE_TOKENS["string"]
        out.append(SkeletonText('"'))
        out.append(SkeletonValue(path, {"pattern": JSON_STRING_BODY + bounds}, tokens))
        out.append(SkeletonText('"'))
    else:
        pattern = integer_schema_pattern(schema) if kind == "integer" else JSON_NUMBER
        limits = [schema[k] for k in _INTEGER_BOUNDS if k in schema]
        widest = max((len(str(abs(int(v)))) + 1 for v in limits), default=0)  # sign + digits
        tokens = cap or max(DEFAULT_VALUE_TOKENS[kind], widest)
        out.append(SkeletonValue(path, {"pattern": pattern}, tokens))


def integer_schema_pattern(schema: dict[str, Any]) -> str:
    """The regular expression of the JSON integers an integer schema's minimum / maximum
    (and their exclusive forms) allow; JSON_INTEGER when it has no bound."""
    low = high = None
    if "minimum" in schema:
        low = math.ceil(schema["minimum"])
    if "exclusiveMinimum" in schema:
        bound = math.floor(schema["exclusiveMinimum"]) + 1
        low = bound if low is None else max(low, bound)
    if "maximum" in schema:
        high = math.floor(schema["maximum"])
    if "exclusiveMaximum" in schema:
        bound = math.ceil(schema["exclusiveMaximum"]) - 1
        high = bound if high is None else min(high, bound)
    if low is None and high is None:
        return JSON_INTEGER
    if low is not None and high is not None and low > high:
        raise ValueError(f"integer schema {schema!r} allows no value")
    return integer_range_pattern(low, high)


def integer_range_pattern(low: int | None, high: int | None) -> str:
    """A regular expression matching exactly the integers low..high written as JSON writes
    them (no leading zeros, "-" for negatives, never "-0"); a None bound is open."""
    parts: list[str] = []
    if low is None or low < 0:  # negatives: "-" then a magnitude
        smallest = 1 if high is None or high >= 0 else -high
        magnitudes = _magnitudes(smallest, None if low is None else -low)
        parts += ["-" + m for m in magnitudes]
    if high is None or high >= 0:
        parts += _magnitudes(max(0, low if low is not None else 0), high)
    return "(" + "|".join(parts) + ")"


def _magnitudes(low: int, high: int | None) -> list[str]:
    """Patterns of the naturals low..high (high None: no upper bound), no leading zeros."""
    if high is None:
        digits = len(str(low))
        return [*_natural_range(low, 10**digits - 1), f"[1-9][0-9]{{{digits},}}"]
    return _natural_range(low, high)


def _natural_range(low: int, high: int) -> list[str]:
    """Patterns, one per run of equal-length numbers, covering low..high (0 <= low)."""
    if low > high:
        return []
    a, b = str(low), str(high)
    if len(a) < len(b):
        return _natural_range(low, 10 ** len(a) - 1) + _natural_range(10 ** len(a), high)
    i = next((k for k in range(len(a)) if a[k] != b[k]), len(a))
    if i == len(a):
        return [a]
    rest = len(a) - i - 1
    prefix, tail = a[:i], "[0-9]" * rest
    if a[i + 1 :] == "0" * rest and b[i + 1 :] == "9" * rest:  # a whole digit class
        return [prefix + _digit_class(a[i], b[i]) + tail]
    parts = _natural_range(low, int(prefix + a[i] + "9" * rest))
    if int(b[i]) - int(a[i]) > 1:
        parts.append(prefix + _digit_class(str(int(a[i]) + 1), str(int(b[i]) - 1)) + tail)
    return parts + _natural_range(int(prefix + b[i] + "0" * rest), high)


def _digit_class(first: str, last: str) -> str:
    return first if first == last else f"[{first}-{last}]"


__all__ = [
    "CharAutomaton",
    "ChoiceConstraint",
    "PatternConstraint",
    "SkeletonText",
    "SkeletonValue",
    "TokenTable",
    "build_choices",
    "check_pattern",
    "integer_range_pattern",
    "integer_schema_pattern",
    "parse_pattern",
    "pattern_constraint",
    "pattern_fullmatch",
    "schema_skeleton",
    "token_table",
]
