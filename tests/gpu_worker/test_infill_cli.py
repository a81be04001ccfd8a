"""The engine's one entry point (run, run_batch) on the diffusion route, and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpu_worker.engine.backends import load_backend
from gpu_worker.engine.config import PRESETS, SamplerConfig
from gpu_worker.engine.loaded import LoadedModel
from gpu_worker.engine.outcome import Hooks, Outcome
from gpu_worker.engine.run import run, run_batch
from gpu_worker.engine.trace import trace_chain
from gpu_worker.infill import main

REPO = Path(__file__).resolve().parents[2]
REQUEST: dict[str, Any] = {
    "segments": [
        {"text": "Dear "},
        {"hole": "name", "max_tokens": 4},
        {"text": ", thank you for seeing me at "},
        {"hole": "room", "max_tokens": 6, "constraint": {"pattern": "Room \\d{1,2}"}},
        {"text": "."},
    ],
    "seed": 7,
    "sampler": {"preset": "fast", "temperature": 0.8},
}


@pytest.fixture(scope="module")
def loaded(model_dir: Path) -> LoadedModel:
    return load_backend(model_dir)


def infill_request(loaded: LoadedModel, request: dict[str, Any], **kwargs: Any) -> Outcome:
    return run("diffusion", loaded, request, **kwargs)


def test_run_fills_validates_and_hashes(loaded: LoadedModel) -> None:
    outcome = infill_request(loaded, REQUEST)
    assert isinstance(outcome, Outcome)
    assert outcome.route == "diffusion" and not outcome.cancelled
    assert outcome.violations == []
    assert outcome.document.startswith("Dear ") and outcome.document.endswith(".")
    assert outcome.holes["room"].startswith("Room ")
    assert outcome.forward_passes == outcome.steps == len(outcome.trace)
    assert set(outcome.timings) == {"encode", "denoise", "validate", "total"}
    assert outcome.config == PRESETS["fast"].replace(temperature=0.8).to_dict()
    assert outcome.config_sha256 == SamplerConfig.from_json(outcome.config).sha256
    assert outcome.trace_sha256 == trace_chain(outcome.trace)
    assert {"committed", "committed_sha256", "canvas_sha256", "confidence", "step_ms"} <= set(
        outcome.trace[0]
    )
    assert json.loads(json.dumps(outcome.to_json()))["trace_sha256"] == outcome.trace_sha256


def test_an_unknown_route_is_refused_by_name(loaded: LoadedModel) -> None:
    with pytest.raises(ValueError, match="'beam'"):
        run("beam", loaded, REQUEST)
    with pytest.raises(ValueError, match="'beam'"):
        run_batch("beam", loaded, [REQUEST])


def test_the_ar_route_refuses_a_denoiser(loaded: LoadedModel) -> None:
    with pytest.raises(ValueError, match="ar_fim"):
        run("ar", loaded, REQUEST)


def test_the_same_request_gives_the_same_trace_hash(loaded: LoadedModel) -> None:
    first, second = infill_request(loaded, REQUEST), infill_request(loaded, REQUEST)
    assert first.trace_sha256 == second.trace_sha256
    assert first.document == second.document
    other = infill_request(loaded, {**REQUEST, "seed": 8})
    assert other.seed == 8


def test_an_explicit_config_wins_over_the_request(loaded: LoadedModel) -> None:
    config = SamplerConfig(commit_rule="even", steps_per_block=2, block_length=4)
    outcome = infill_request(loaded, REQUEST, config=config)
    assert outcome.config_sha256 == config.sha256


def test_should_stop_cancels_and_on_step_sees_each_entry(loaded: LoadedModel) -> None:
    seen: list[dict[str, Any]] = []
    outcome = infill_request(
        loaded,
        REQUEST,
        config=SamplerConfig(commit_rule="even", steps_per_block=10, block_length=10),
        hooks=Hooks(on_step=seen.append, should_stop=lambda: len(seen) >= 2),
    )
    assert outcome.cancelled and outcome.steps == 2 and outcome.trace == seen


def test_on_snapshot_gets_provisional_hole_texts_and_stable_prefixes(loaded: LoadedModel) -> None:
    snapshots: list[tuple[int, dict[str, str], dict[str, str]]] = []
    outcome = infill_request(
        loaded, REQUEST,
        hooks=Hooks(on_snapshot=lambda step, texts, stable: snapshots.append((step, texts, stable))),
    )  # fmt: skip
    assert [step for step, _, _ in snapshots] == list(range(outcome.steps))
    assert snapshots[-1][1] == outcome.holes
    assert snapshots[-1][2] == outcome.holes  # nothing is masked at the end: all stable
    assert all(set(texts) == {"name", "room"} for _, texts, _ in snapshots)
    for _, texts, stable in snapshots:  # the stable text starts the provisional text
        assert all(texts[name].startswith(prefix) for name, prefix in stable.items())


def test_run_batch_returns_bad_requests_as_errors_in_place(loaded: LoadedModel) -> None:
    config = SamplerConfig(cache="none", temperature=0.8, commit_rule="threshold", threshold=0.5)
    bad = {"segments": [{"hole": "x"}]}
    other = {**REQUEST, "seed": 3}
    rows: list[int] = []

    def seen_by(row: int) -> Hooks:
        return Hooks(on_step=lambda _entry: rows.append(row))

    hooks = [seen_by(row) for row in range(3)]
    outcomes = run_batch("diffusion", loaded, [REQUEST, bad, other], config, hooks)
    assert isinstance(outcomes[1], ValueError) and "max_tokens" in str(outcomes[1])
    assert set(rows) == {0, 2}
    for index in (0, 2):
        batched = outcomes[index]
        assert isinstance(batched, Outcome)
        alone = infill_request(loaded, [REQUEST, bad, other][index], config=config)
        assert batched.trace_sha256 == alone.trace_sha256
        assert batched.document == alone.document


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_prints_holes_document_passes_timings_and_trace_hash(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "canvas.json"
    path.write_text(json.dumps(REQUEST))
    code, out, _ = run_cli(capsys, str(path), "--model", str(model_dir))
    assert code == 0
    report = json.loads(out)
    assert {"holes", "document", "forward_passes", "timings", "trace_sha256"} <= set(report)
    assert report["route"] == "diffusion"


def test_cli_runs_an_ar_fim_model_on_its_own_route(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "canvas.json"
    path.write_text(json.dumps({**REQUEST, "sampler": {}}))
    code, out, err = run_cli(capsys, str(path), "--model", str(REPO / "models" / "stencil-ar-fim"))
    assert code == 0, err
    report = json.loads(out)
    assert report["route"] == "ar" and report["document"].startswith("Dear ")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{oops", "not valid JSON"),
        ('{"segments": [{"text": "a"}], "extra": 1}', "unknown canvas field"),
        ('{"segments": [{"hole": "a", "max_tokens": 400}]}', "max_len"),
    ],
)
def test_cli_bad_input_is_one_clear_line_and_a_non_zero_exit(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    path = tmp_path / "canvas.json"
    path.write_text(content)
    code, out, err = run_cli(capsys, str(path), "--model", str(model_dir))
    assert code != 0 and out == ""
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_cli_missing_model_or_file_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "canvas.json"
    path.write_text(json.dumps(REQUEST))
    code, _, err = run_cli(capsys, str(path), "--model", str(tmp_path / "nowhere"))
    assert code != 0 and "cannot load model" in err
    code, _, err = run_cli(capsys, str(tmp_path / "missing.json"))
    assert code != 0 and "cannot read" in err


def test_cli_as_a_process_never_prints_a_traceback(tmp_path: Path, model_dir: Path) -> None:
    path = tmp_path / "canvas.json"
    path.write_text(
        '{"segments": [{"hole": "a", "max_tokens": 2, "constraint": {"pattern": "(?=x)"}}]}'
    )
    done = subprocess.run(
        [sys.executable, "-m", "gpu_worker.infill", str(path), "--model", str(model_dir)],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "lookahead" in done.stderr and "Traceback" not in done.stderr
