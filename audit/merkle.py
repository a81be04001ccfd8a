"""RFC 6962 Merkle tree hashing, and the compact "frontier" that lets a log grow in O(log n).

leaf = sha256(0x00 || data), node = sha256(0x01 || left || right); the tree of n leaves splits
at the largest power of two below n (RFC 6962 section 2.1).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"
EMPTY_ROOT = hashlib.sha256(b"").digest()


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(LEAF_PREFIX + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(NODE_PREFIX + left + right).digest()


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    """MTH(D[n]) of already-hashed leaves, by the recursive definition of RFC 6962."""
    n = len(leaves)
    if n == 0:
        return EMPTY_ROOT
    if n == 1:
        return leaves[0]
    k = 1 << ((n - 1).bit_length() - 1)  # largest power of two < n
    return node_hash(merkle_root(leaves[:k]), merkle_root(leaves[k:]))


def frontier_append(frontier: list[bytes], size: int, leaf: bytes) -> list[bytes]:
    """The frontier (roots of the perfect subtrees, largest first) after appending ``leaf``.

    The subtrees correspond to the set bits of ``size``; appending merges equal-sized ones,
    like a binary counter's carry.
    """
    new = list(frontier)
    node = leaf
    carry = size
    while carry & 1:
        node = node_hash(new.pop(), node)
        carry >>= 1
    new.append(node)
    return new


def frontier_root(frontier: Sequence[bytes]) -> bytes:
    """The RFC 6962 root of the tree whose perfect-subtree roots are ``frontier``."""
    if not frontier:
        return EMPTY_ROOT
    root = frontier[-1]
    for node in reversed(frontier[:-1]):
        root = node_hash(node, root)
    return root
