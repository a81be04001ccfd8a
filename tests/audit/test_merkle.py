from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from audit.merkle import (
    EMPTY_ROOT,
    frontier_append,
    frontier_root,
    leaf_hash,
    merkle_root,
    node_hash,
)


def test_rfc6962_leaf_and_node_prefixes() -> None:
    assert leaf_hash(b"") == hashlib.sha256(b"\x00").digest()
    assert node_hash(b"a", b"b") == hashlib.sha256(b"\x01ab").digest()
    assert merkle_root([]) == EMPTY_ROOT == hashlib.sha256(b"").digest()


def test_three_leaf_tree_splits_at_the_largest_power_of_two() -> None:
    a, b, c = (leaf_hash(x) for x in (b"a", b"b", b"c"))
    assert merkle_root([a, b, c]) == node_hash(node_hash(a, b), c)


@given(st.lists(st.binary(max_size=8), max_size=70))
def test_incremental_frontier_root_equals_the_recursive_root(items: list[bytes]) -> None:
    leaves = [leaf_hash(x) for x in items]
    frontier: list[bytes] = []
    for size, leaf in enumerate(leaves):
        frontier = frontier_append(frontier, size, leaf)
        assert frontier_root(frontier) == merkle_root(leaves[: size + 1])
    assert frontier_root(frontier) == merkle_root(leaves)
