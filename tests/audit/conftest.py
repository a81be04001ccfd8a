"""Audit fixtures: fixed keys and a per-test checkpoint file, and run records of made-up runs.

A made-up run is the engine's own :class:`~gpu_worker.engine.outcome.Outcome` with a fixed
trace; real runs come from ``gpu_worker.engine.run`` (tests/audit/test_replay.py).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.runbody import RunContext
from gpu_worker.engine.outcome import Outcome

REPO = Path(__file__).resolve().parents[2]
PLACEHOLDER_MODEL = REPO / "models" / "stencil-placeholder"
SNAPSHOT_MARKER = "ZZQX-intermediate-draft"  # text that must never appear outside ciphertext


def b64_key(seed: bytes) -> str:
    return base64.b64encode(hashlib.sha256(seed).digest()).decode()


def b64_signing_key(seed: bytes) -> str:
    key = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(seed).digest())
    raw = key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return base64.b64encode(raw).decode()


@pytest.fixture
def audit_settings(settings: Any, tmp_path: Path) -> Any:
    settings.AUDIT_ENCRYPTION_KEYS = [b64_key(b"key-one")]
    settings.AUDIT_SIGNING_KEY = b64_signing_key(b"signer")
    settings.AUDIT_CHECKPOINT_FILE = tmp_path / "checkpoints.jsonl"
    settings.AUDIT_DIAGNOSTIC_SHARE = 1.0
    settings.AUDIT_DIAGNOSTIC_RETENTION_DAYS = 30
    settings.VAR_DIR = tmp_path / "var"
    return settings


def fake_outcome(**fields: Any) -> Outcome:
    """A made-up diffusion outcome of three steps; keyword arguments replace its fields."""
    values: dict[str, Any] = {
        "holes": {"name": "Alice"}, "document": "Dear Alice, thanks.", "forward_passes": 3,
        "steps": 3, "timings": {"denoise": 0.01, "total": 0.02}, "trace": fake_trace(),
        "config": {"temperature": 0.0, "top_p": 1.0}, "config_sha256": "cd" * 32, "seed": 7,
        "route": "diffusion", "cancelled": False, "violations": [],
        "model": {"name": "stencil-placeholder", "kind": "denoiser", "weights_sha256": "11" * 32,
                  "tokenizer_sha256": "22" * 32, "placeholder": True},
        "device": "cpu",
    }  # fmt: skip
    values.update(fields)
    return Outcome(**values)


def fake_trace(n: int = 3) -> list[dict[str, Any]]:
    return [
        {
            "step": i,
            "block": 0,
            "committed": [10 + i, 20 + i],
            "padded": [],
            "remasked": [],
            "confidence": {"min": 0.5, "mean": 0.7, "max": 0.9, "n": 2},
            "canvas_sha256": hashlib.sha256(bytes([i])).hexdigest(),
            "masked_left": n - i - 1,
            "flush": False,
            "forward_ms": 1.5,
            "step_ms": 2.0,
        }
        for i in range(n)
    ]


REQUEST: dict[str, Any] = {
    "segments": [
        {"text": "Dear "},
        {"hole": "name", "max_tokens": 6},
        {"text": ", thank you for seeing me at "},
        {"hole": "place", "max_tokens": 6},
        {"text": "."},
    ],
    "seed": 7,
    "sampler": {},
}


def run_context(**fields: Any) -> RunContext:
    """The context of a made-up first attempt of job-1; keyword arguments replace its fields."""
    values: dict[str, Any] = {
        "job_id": "job-1", "attempt": 0, "route": "diffusion", "model_dir": str(PLACEHOLDER_MODEL),
        "request": REQUEST, "device": "cpu", "correlation_id": "corr-1",
        "batch_job_ids": ("job-1",), "router_decision": {"route": "diffusion", "why": "default"},
        "template_version": "letter@1",
    }  # fmt: skip
    values.update(fields)
    return RunContext(**values)


@pytest.fixture
def record_fake(audit_settings: Any, db: Any) -> Callable[..., Any]:
    """Create a run record of a made-up run.

    ``outcome=`` and ``snapshots=`` go to run_record_create; other keyword arguments replace
    fields of the run's context.
    """
    from audit.services import run_record_create

    def make(**overrides: Any) -> Any:
        outcome = overrides.pop("outcome", None) or fake_outcome()
        snapshots = overrides.pop("snapshots", [f"{SNAPSHOT_MARKER} step {i}" for i in range(3)])
        return run_record_create(context=run_context(**overrides), outcome=outcome,
                                 snapshots=snapshots)  # fmt: skip

    return make

