"""scripts/gpu-check at toy shapes on the CPU: the code a GPU machine runs at the real LLaDA-8B,
Dream-7B and SDAR-8B shapes writes its report and JSON (the numbers are not checked: CPU
timings)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_tiny_writes_a_report_for_every_native_family(tmp_path: Path) -> None:
    out = tmp_path / "gpu"
    done = subprocess.run(
        [str(ROOT / "scripts" / "gpu-check"), "--tiny", "--device", "cpu", "--out", str(out),
         "--work", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["tiny"] is True
    results = {r["family"]: r for r in data["results"]}
    assert sorted(results) == ["dream", "llada", "sdar"]
    for r in results.values():
        assert r["precision"] == "bf16"
        assert r["load_s"] >= 0 and r["forward_ms_32"] > 0 and r["forward_ms_64"] > 0
        assert r["denoise_balanced"]["steps"] == r["denoise_no_cache"]["steps"] > 0
        assert r["cache_speedup"] > 0
        assert sorted(r["jobs_per_s"]) == ["1", "4", "8"]
    report = (out / "REPORT.md").read_text()
    assert "| llada |" in report and "| dream |" in report and "| sdar |" in report
    assert not list((tmp_path / "work").iterdir())  # the random checkpoints are removed


def test_gpu_check_without_a_gpu_says_so(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(ROOT / "scripts" / "gpu-check"), "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "no CUDA device" in done.stderr
