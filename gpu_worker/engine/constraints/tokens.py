"""Token-level constraints: a pattern automaton lifted to the tokenizer's vocabulary, and choices.

At each position of a pattern hole, decoded left to right, only tokens that keep the text
completable within the positions left are allowed; a choices hole is one of its candidates.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gpu_worker.engine.constraints.regex import (
    MAX_TOKEN_STATES,
    CharAutomaton,
    Concat,
    literal_node,
    parse_pattern,
)
from gpu_worker.engine.tokenizer import StencilTokenizer


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


