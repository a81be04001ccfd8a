"""Settings come from the environment with embedded defaults."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from stencil.env import database_from_url

REPO = Path(__file__).resolve().parent.parent


def test_postgres_url_becomes_a_postgresql_database() -> None:
    db = database_from_url("postgres://app:s%40cret@db.local:6543/stencil", base_dir=REPO)
    assert db["ENGINE"] == "django.db.backends.postgresql"
    assert (db["NAME"], db["USER"], db["PASSWORD"], db["HOST"], db["PORT"]) == (
        "stencil", "app", "s@cret", "db.local", "6543"
    )


def test_sqlite_urls_accept_relative_and_absolute_paths() -> None:
    assert database_from_url("sqlite:///var/x.db", base_dir=REPO)["NAME"] == str(REPO / "var/x.db")
    assert database_from_url("sqlite:////tmp/x.db", base_dir=REPO)["NAME"] == "/tmp/x.db"


def test_unknown_database_scheme_is_refused_with_its_name() -> None:
    with pytest.raises(ValueError, match="mysql"):
        database_from_url("mysql://x/y", base_dir=REPO)


def _manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_production_settings_pass_check_deploy_without_warnings() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"}
    env.update({"DEBUG": "False", "SECRET_KEY": secrets.token_urlsafe(50),
                "ALLOWED_HOSTS": "stencil.example.org"})  # fmt: skip
    done = _manage("check", "--deploy", "--fail-level", "WARNING", env=env)
    assert done.returncode == 0, done.stderr + done.stdout


def test_production_refuses_to_start_without_a_secret_key() -> None:
    env = {k: v for k, v in os.environ.items() if k != "SECRET_KEY"}
    done = _manage("check", env={**env, "DEBUG": "False"})
    assert done.returncode != 0
    assert "SECRET_KEY must be set" in done.stderr


def test_debug_is_off_unless_asked_for() -> None:
    """A process started with neither DEBUG nor SECRET_KEY runs production settings: it refuses
    to start rather than fall back to the development secret key."""
    env = {k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "DEBUG"}}
    done = _manage("check", env=env)
    assert done.returncode != 0
    assert "SECRET_KEY must be set when DEBUG is off" in done.stderr
    asked = _manage("shell", "-c", "from django.conf import settings; print(settings.DEBUG)",
                    env={**env, "DEBUG": "True"})  # fmt: skip
    assert asked.stdout.strip().splitlines()[-1] == "True", asked.stderr
