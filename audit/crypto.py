"""AES-256-GCM for diagnostics: the run id is the associated data, the key id travels along."""

from __future__ import annotations

import os
from dataclasses import dataclass

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from audit.keys import EncryptionKey

NONCE_BYTES = 12  # the GCM standard nonce


class DecryptionError(Exception):
    """The ciphertext, its nonce or its associated data was altered, or the key is unknown."""


@dataclass(frozen=True)
class Sealed:
    key_id: str
    nonce: bytes
    ciphertext: bytes  # includes the 16-byte GCM tag


def seal(*, plaintext: bytes, associated_data: bytes, key: EncryptionKey) -> Sealed:
    nonce = os.urandom(NONCE_BYTES)
    ciphertext = AESGCM(key.secret).encrypt(nonce, plaintext, associated_data)
    return Sealed(key_id=key.key_id, nonce=nonce, ciphertext=ciphertext)


def unseal(*, sealed: Sealed, associated_data: bytes, keys: list[EncryptionKey]) -> bytes:
    by_id = {k.key_id: k for k in keys}
    key = by_id.get(sealed.key_id)
    if key is None:
        raise DecryptionError(f"key {sealed.key_id} is not among the configured audit keys")
    try:
        return AESGCM(key.secret).decrypt(sealed.nonce, sealed.ciphertext, associated_data)
    except Exception as exc:  # cryptography raises InvalidTag
        raise DecryptionError("ciphertext failed authentication (altered or misplaced)") from exc
