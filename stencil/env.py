"""Small helpers that read settings from the environment (in the style of healthchecks)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse


def envbool(name: str, default: str) -> bool:
    return os.getenv(name, default).strip().lower() in {"1", "true", "yes", "on"}


def envint(name: str, default: str) -> int:
    return int(os.getenv(name, default))


def envfloat(name: str, default: str) -> float:
    return float(os.getenv(name, default))


def envlist(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.getenv(name, default).split(",") if item.strip()]


def database_from_url(url: str, *, base_dir: Path) -> dict[str, Any]:
    """A Django DATABASES entry from ``postgres://user:pw@host:port/name`` or ``sqlite:///path``."""
    parsed = urlparse(url)
    if parsed.scheme in {"postgres", "postgresql", "pgsql"}:
        options = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parsed.path.lstrip("/")) or "stencil",
            "USER": unquote(parsed.username or ""),
            "PASSWORD": unquote(parsed.password or ""),
            "HOST": parsed.hostname or "",
            "PORT": str(parsed.port or ""),
            "CONN_MAX_AGE": 60,
            # a connection the server dropped (restart, failover) is replaced before it is used
            "CONN_HEALTH_CHECKS": True,
            "OPTIONS": options,
            "TEST": {"NAME": os.getenv("DATABASE_TEST_NAME") or None},
        }
    if parsed.scheme == "sqlite":
        raw = unquote(parsed.path)
        # sqlite:///relative/path and sqlite:////absolute/path, as dj-database-url reads them
        path = Path(raw[1:]) if raw.startswith("//") else Path(raw.lstrip("/"))
        name = path if path.is_absolute() else base_dir / path
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(name),
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
        }
    raise ValueError(f"DATABASE_URL scheme {parsed.scheme!r} is not postgres:// or sqlite://")
