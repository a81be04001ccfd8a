"""Audit keys: AES-256-GCM keys for diagnostics and the Ed25519 key that signs checkpoints.

Keys come from settings (the environment). In development (AUDIT_DEV_KEYS, on when DEBUG is) a missing key is
generated once into ``VAR_DIR/audit/`` with mode 0600, and a log line says so; with DEBUG off a
missing key is a configuration error.
"""

from __future__ import annotations

import base64
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from audit.canonical import sha256_hex

logger = logging.getLogger(__name__)

AES_KEY_BYTES = 32  # AES-256
KEY_ID_HEX = 16  # a key id is the first 16 hex digits of the key's sha256
ENCRYPTION_KEY_FILE = "encryption.keys"  # one base64 key a line, newest first
SIGNING_KEY_FILE = "signing.key"


@dataclass(frozen=True)
class EncryptionKey:
    key_id: str
    secret: bytes


def key_id_of(secret: bytes) -> str:
    return sha256_hex(secret)[:KEY_ID_HEX]


def _dev_dir() -> Path:
    return Path(settings.VAR_DIR) / "audit"


def _write_secret_file(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o600)


def _decode_aes_key(text: str) -> bytes:
    secret = base64.b64decode(text.strip(), validate=True)
    if len(secret) != AES_KEY_BYTES:
        raise ImproperlyConfigured(
            f"AUDIT_ENCRYPTION_KEYS holds a key of {len(secret)} bytes, expected {AES_KEY_BYTES}"
        )
    return secret


def _require_debug(name: str) -> None:
    if not settings.AUDIT_DEV_KEYS:
        raise ImproperlyConfigured(f"{name} must be set in the environment when DEBUG is off")


def encryption_keys() -> list[EncryptionKey]:
    """All configured AES keys, newest (the one new ciphertexts use) first."""
    configured = [str(k) for k in settings.AUDIT_ENCRYPTION_KEYS if str(k).strip()]
    if not configured:
        _require_debug("AUDIT_ENCRYPTION_KEYS")
        path = _dev_dir() / ENCRYPTION_KEY_FILE
        if not path.exists():
            encryption_key_generate_dev()
        configured = [line for line in path.read_text().splitlines() if line.strip()]
    secrets = [_decode_aes_key(text) for text in configured]
    return [EncryptionKey(key_id=key_id_of(s), secret=s) for s in secrets]


def encryption_key_generate_dev() -> EncryptionKey:
    """Prepend a fresh key to the development key file (development only)."""
    _require_debug("AUDIT_ENCRYPTION_KEYS")
    path = _dev_dir() / ENCRYPTION_KEY_FILE
    secret = AESGCM.generate_key(bit_length=AES_KEY_BYTES * 8)
    old = path.read_text() if path.exists() else ""
    _write_secret_file(path, base64.b64encode(secret).decode() + "\n" + old)
    logger.warning(
        "audit: generated a development AES-256 key %s into %s (set AUDIT_ENCRYPTION_KEYS in "
        "production)",
        key_id_of(secret),
        path,
    )
    return EncryptionKey(key_id=key_id_of(secret), secret=secret)


def signing_key() -> Ed25519PrivateKey:
    """The Ed25519 key that signs log checkpoints."""
    text = str(settings.AUDIT_SIGNING_KEY or "").strip()
    if not text:
        _require_debug("AUDIT_SIGNING_KEY")
        path = _dev_dir() / SIGNING_KEY_FILE
        if not path.exists():
            raw = Ed25519PrivateKey.generate().private_bytes(
                serialization.Encoding.Raw,
                serialization.PrivateFormat.Raw,
                serialization.NoEncryption(),
            )
            _write_secret_file(path, base64.b64encode(raw).decode() + "\n")
            logger.warning(
                "audit: generated a development Ed25519 signing key into %s (set "
                "AUDIT_SIGNING_KEY in production)",
                path,
            )
        text = path.read_text().strip()
    raw = base64.b64decode(text, validate=True)
    return Ed25519PrivateKey.from_private_bytes(raw)


def public_key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return sha256_hex(raw)[:KEY_ID_HEX]
