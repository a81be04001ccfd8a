"""Run records written by an earlier release replay bit-exact and keep their hashes.

``fixtures/legacy_runs.json`` holds run records (body, request, hashed trace) that Stencil
0.1.0 wrote with the shipped models: every preset, a request's own sampler block, fields
that only v1 configs set, sampling, the AR route and a batch of two. Whatever the engine's
layout and the config's schema become, these replay identically.

They were recorded on ATen's AVX2 CPU kernels, and AVX-512 kernels round float sums
differently in the last bits: ``scripts/test`` pins ``ATEN_CPU_CAPABILITY=avx2``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from audit.canonical import sha256_hex
from audit.replay import replay_record
from audit.trace import trace_chain_valid

REPO = Path(__file__).resolve().parents[2]
RUNS: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent / "fixtures" / "legacy_runs.json").read_text(encoding="utf-8")
)["runs"]
# A record from another code revision replays on this one; nothing else may differ.
ALLOWED_REASONS = ("git_revision differs", "stencil differs")


@pytest.mark.slow
@pytest.mark.parametrize("run", RUNS, ids=[r["run_id"] for r in RUNS])
def test_legacy_record_replays_identically(run: dict[str, Any], monkeypatch: Any) -> None:
    monkeypatch.chdir(REPO)  # the records name the shipped models by relative directory
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # they ran on one CPU thread: float sums depend on the split
    try:
        _replay_matches(run)
    finally:
        torch.set_num_threads(threads)


def _replay_matches(run: dict[str, Any]) -> None:
    assert sha256_hex(run["body"]) == run["body_sha256"]
    assert trace_chain_valid(json.loads(run["trace"])) is None
    report = replay_record(
        run_id=run["run_id"], body=run["body"], request=run["request"], trace=run["trace"],
        batch_requests=run["batch_requests"],
    )  # fmt: skip
    kernels = torch.backends.cpu.get_cpu_capability()
    assert report.divergence is None, f"{report.summary} (CPU kernels {kernels}; recorded on AVX2)"
    assert report.notes == [], report.summary
    assert report.identical
    assert all(r.startswith(ALLOWED_REASONS) for r in report.approximate_reasons), report.summary
    assert report.steps_replayed == len(json.loads(run["trace"])) > 0


def test_a_record_made_on_other_cpu_kernels_replays_as_approximate(monkeypatch: Any) -> None:
    monkeypatch.chdir(REPO)
    run = RUNS[0]
    body = json.loads(run["body"])
    body["stencil.runtime"]["cpu_kernels"] = "NEON"
    report = replay_record(run_id=run["run_id"], body=json.dumps(body), request=run["request"],
                           trace=run["trace"], batch_requests=run["batch_requests"])  # fmt: skip
    now = torch.backends.cpu.get_cpu_capability()
    assert f"cpu_kernels differs: recorded NEON, now {now}" in report.approximate_reasons
