"""Canonical JSON (sorted keys, compact, UTF-8) and the sha256 helpers every record uses."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """The one serialisation that is hashed: sorted keys, no spaces, non-ASCII kept as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def json_sha256(value: Any) -> str:
    return sha256_hex(canonical_json(value))
