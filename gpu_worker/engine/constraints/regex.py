"""Regular expressions for ``pattern`` holes: a supported subset, parsed and compiled by hand.

The pattern becomes a Thompson NFA and a lazily built DFA over characters
(:class:`CharAutomaton`); anything outside the subset raises ``ValueError`` naming the feature.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field

MAX_REPEAT = 256  # the largest {m,n} bound accepted (each bound copies the sub-automaton)
MAX_TOKEN_STATES = 4096  # the most automaton states a pattern may reach through tokens
MAX_PATTERN_POSITIONS = 4096  # the most character positions a pattern may expand to
MAX_PATTERN_LENGTH = 1000  # the longest pattern source accepted
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
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise ValueError(f"pattern is {len(pattern)} characters long; at most {MAX_PATTERN_LENGTH}")
    node = _Parser(pattern).parse()
    size = _positions(node)
    if size > MAX_PATTERN_POSITIONS:
        raise ValueError(f"pattern {pattern[:60]!r} expands to {size:,} character positions "
                         f"(nested repeats multiply); at most {MAX_PATTERN_POSITIONS:,}")  # fmt: skip
    return node


def _positions(node: Node) -> int:
    """How many character positions the automaton of ``node`` holds: each bounded repeat
    copies its body once per bound, so nested repeats multiply."""
    if isinstance(node, Chars):
        return 1
    if isinstance(node, Concat | Alt):
        parts = node.parts if isinstance(node, Concat) else node.options
        return sum(_positions(p) for p in parts)
    copies = max(node.low, node.high or 0, 1)
    return _positions(node.node) * copies


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


