"""Audit fixtures: fixed keys and a per-test checkpoint file, outcomes, and a sampler runner.

Runs are produced by ``gpu_worker.engine.infill.infill_request`` when it exists, else by the same
pipeline assembled here (parse_canvas + sampler.denoise) with InfillOutcome's shape.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

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


@dataclass
class FakeOutcome:
    """InfillOutcome's shape (gpu_worker/infill.py)."""

    holes: dict[str, str] = field(default_factory=lambda: {"name": "Alice"})
    document: str = "Dear Alice, thanks."
    forward_passes: int = 3
    steps: int = 3
    timings: dict[str, float] = field(default_factory=lambda: {"denoise": 0.01, "total": 0.02})
    trace: list[dict[str, Any]] = field(default_factory=list)
    trace_sha256: str = "ab" * 32
    config: dict[str, Any] = field(default_factory=lambda: {"temperature": 0.0, "top_p": 1.0})
    config_sha256: str = "cd" * 32
    seed: int = 7
    route: str = "diffusion"
    cancelled: bool = False
    violations: list[dict[str, Any]] = field(default_factory=list)


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


@pytest.fixture
def record_fake(audit_settings: Any, db: Any) -> Callable[..., Any]:
    """Create a run record from a fake outcome; keyword overrides go to run_record_create."""
    from audit.services import run_record_create

    def make(**overrides: Any) -> Any:
        outcome = overrides.pop("outcome", None) or FakeOutcome(trace=fake_trace())
        kwargs: dict[str, Any] = {
            "job_id": "job-1",
            "attempt": 0,
            "route": "diffusion",
            "model_dir": str(PLACEHOLDER_MODEL),
            "weights_sha256": "11" * 32,
            "tokenizer_sha256": "22" * 32,
            "request": REQUEST,
            "outcome": outcome,
            "batch_job_ids": ["job-1"],
            "device": "cpu",
            "router_decision": {"route": "diffusion", "why": "default"},
            "correlation_id": "corr-1",
            "template_version": "letter@1",
            "snapshots": [f"{SNAPSHOT_MARKER} step {i}" for i in range(3)],
        }
        kwargs.update(overrides)
        return run_record_create(**kwargs)

    return make


# -- a real sampler run ------------------------------------------------------------------------
@dataclass
class Outcome:
    holes: dict[str, str]
    document: str
    forward_passes: int
    steps: int
    timings: dict[str, float]
    trace: list[dict[str, Any]]
    trace_sha256: str
    config: dict[str, Any]
    config_sha256: str
    seed: int
    route: str
    cancelled: bool
    violations: list[dict[str, Any]]


def pipeline_infill_request(
    loaded: Any,
    request: dict[str, Any],
    *,
    config: Any = None,
    on_step: Any = None,
    should_stop: Any = None,
    device: Any = None,
) -> Outcome:
    """parse_canvas + denoise, shaped like gpu_worker.engine.infill.infill_request."""
    from gpu_worker.engine.canvas import parse_canvas
    from gpu_worker.engine.config import SamplerConfig
    from gpu_worker.engine.sampler import denoise

    canvas = parse_canvas(
        request, loaded.tokenizer, max_len=loaded.network.max_len,
        vocab_size=loaded.network.config.vocab_size,
    )  # fmt: skip
    cfg = config if config is not None else SamplerConfig.from_json(canvas.sampler)
    generator = torch.Generator(device="cpu").manual_seed(canvas.seed)
    result = denoise(loaded.network, canvas, cfg, generator)
    trace = [dataclasses.asdict(s) for s in result.trace]
    untimed = [{k: v for k, v in s.items() if not k.endswith("_ms")} for s in trace]
    return Outcome(
        holes=result.hole_texts, document=result.document,
        forward_passes=result.forward_passes, steps=result.steps, timings={"total": 0.0},
        trace=trace, trace_sha256=hashlib.sha256(json.dumps(untimed).encode()).hexdigest(),
        config=cfg.to_dict(), config_sha256=cfg.sha256, seed=canvas.seed, route="diffusion",
        cancelled=result.cancelled, violations=[],
    )  # fmt: skip


def real_runner() -> Callable[..., Any]:
    try:
        from gpu_worker.engine.infill import infill_request
    except ImportError:
        return pipeline_infill_request
    return infill_request


@pytest.fixture
def use_runner(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """Point audit replay's diffusion route at the runner the tests record with."""
    from audit import replay

    runner = real_runner()
    if runner is pipeline_infill_request:
        monkeypatch.setitem(replay.RUNNERS, "diffusion", f"{__name__}:pipeline_infill_request")
    return runner
