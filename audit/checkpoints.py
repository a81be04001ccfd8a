"""Signed checkpoints of the Merkle log, appended to a JSON-lines file outside the database.

A line: ``{"size", "root", "timestamp", "key_id", "signature", "first", "leaves", "frontier"}``.
The Ed25519 signature covers the canonical JSON of (size, root, timestamp, key_id); ``leaves``
(the leaf hashes added since the previous line) and ``frontier`` (the perfect-subtree roots)
are bound to the signed root because a verifier recomputes the root from them.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from audit.canonical import canonical_json
from audit.keys import public_key_id


@dataclass
class Checkpoint:
    size: int
    root: str  # hex
    timestamp: str  # ISO 8601, UTC
    key_id: str
    signature: str  # base64
    first: int  # index of leaves[0]
    leaves: list[str] = field(default_factory=list)  # hex leaf hashes first..size-1
    frontier: list[str] = field(default_factory=list)  # hex

    def signed_message(self) -> bytes:
        return signed_message(
            size=self.size, root=self.root, timestamp=self.timestamp, key_id=self.key_id
        )

    def to_line(self) -> str:
        return canonical_json(self.__dict__) + "\n"


def signed_message(*, size: int, root: str, timestamp: str, key_id: str) -> bytes:
    return canonical_json(
        {"size": size, "root": root, "timestamp": timestamp, "key_id": key_id}
    ).encode("utf-8")


def checkpoint_sign(
    *,
    key: Ed25519PrivateKey,
    size: int,
    root: str,
    timestamp: str,
    first: int,
    leaves: list[str],
    frontier: list[str],
) -> Checkpoint:
    key_id = public_key_id(key.public_key())
    message = signed_message(size=size, root=root, timestamp=timestamp, key_id=key_id)
    signature = base64.b64encode(key.sign(message)).decode()
    return Checkpoint(size, root, timestamp, key_id, signature, first, leaves, frontier)


def signature_valid(checkpoint: Checkpoint, public: Ed25519PublicKey) -> bool:
    try:
        public.verify(base64.b64decode(checkpoint.signature), checkpoint.signed_message())
    except (InvalidSignature, ValueError):
        return False
    return True


def parse_line(line: str) -> Checkpoint:
    data: dict[str, Any] = json.loads(line)
    return Checkpoint(
        size=int(data["size"]),
        root=str(data["root"]),
        timestamp=str(data["timestamp"]),
        key_id=str(data["key_id"]),
        signature=str(data["signature"]),
        first=int(data["first"]),
        leaves=[str(x) for x in data["leaves"]],
        frontier=[str(x) for x in data["frontier"]],
    )


@contextlib.contextmanager
def locked(path: Path) -> Iterator[IO[str]]:
    """The checkpoint file opened for append and read, under an exclusive advisory lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+", encoding="utf-8") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield fh
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def last_line(fh: IO[str]) -> str | None:
    fh.seek(0)
    last = None
    for line in fh:
        if line.strip():
            last = line
    return last
