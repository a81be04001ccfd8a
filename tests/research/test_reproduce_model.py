"""scripts/reproduce-model: a model card's one Reproduce line rebuilds the weights it describes."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpu_worker.engine.loaded import file_sha256
from research import train as research_train
from research.train import main, reproduce_commands, train_tokenizer

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = [d for d in sorted((ROOT / "models").iterdir()) if (d / "training.json").is_file()]


def _dry_run(directory: Path, *, script: Path = ROOT / "scripts" / "reproduce-model") -> list[str]:
    run = subprocess.run([str(script), str(directory), "--dry-run"], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHON": sys.executable})  # fmt: skip
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()


@pytest.mark.parametrize("model", SHIPPED, ids=lambda d: d.name)
def test_a_shipped_card_reproduces_with_one_short_line(model: Path) -> None:
    summary = json.loads((model / "training.json").read_text())
    lines = [line for line in (model / "MODEL_CARD.md").read_text().splitlines()
             if line.startswith("Reproduce:")]  # fmt: skip
    assert len(lines) == 1 and len(lines[0]) < 200
    assert lines[0].startswith(f"Reproduce: `scripts/reproduce-model models/{model.name}` (")
    assert _dry_run(model) == reproduce_commands(model, summary)


@pytest.mark.parametrize("model", SHIPPED, ids=lambda d: d.name)
def test_every_command_that_rebuilds_a_shipped_model_is_one_the_cli_accepts(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each training command parses (argparse exits on an unknown flag); the run stops right
    after parsing, where the CLI sets its thread count."""

    class Parsed(Exception):
        pass

    def stop(threads: int) -> None:
        raise Parsed

    monkeypatch.setattr(research_train.torch, "set_num_threads", stop)
    commands = reproduce_commands(model, json.loads((model / "training.json").read_text()))
    trains = [shlex.split(c) for c in commands if c.startswith("python ")]
    assert len(trains) == len(commands) - sum("sha256sum --check" in c for c in commands)
    for argv in trains:
        assert argv[:3] == ["python", "-m", "research.train"], argv
        with pytest.raises(Parsed):
            main(argv[3:])


@pytest.mark.slow
def test_the_script_rebuilds_a_tiny_chain_bit_for_bit(tmp_path: Path) -> None:
    """A two-run chain (a continuation adds copy twins), trained on the default vocabulary, then
    rebuilt from nothing by the script in a copy of the repository's layout: the vocabulary
    and the weights come out byte for byte the same."""
    for package in ("research", "gpu_worker"):
        (tmp_path / package).symlink_to(ROOT / package)
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "reproduce-model"
    shutil.copy2(ROOT / "scripts" / "reproduce-model", script)
    vocabulary = tmp_path / "var" / "tokenizer" / "tokenizer.json"
    train_tokenizer(vocabulary)  # what the chain's first command learns
    out = tmp_path / "models" / "tiny"
    tiny = ["--kind", "denoiser", "--out", str(out), "--tokenizer", str(vocabulary), "--d-model",
            "32", "--layers", "2", "--heads", "2", "--ffn", "64", "--batch-size", "2", "--no-bf16"]  # fmt: skip
    threads = torch.get_num_threads()
    main([*tiny, "--steps", "3", "--checkpoint", str(tmp_path / "a.pt")])
    main([*tiny, "--copy-twins", "--steps", "2", "--init-from", str(out),
          "--checkpoint", str(tmp_path / "b.pt")])  # fmt: skip
    torch.set_num_threads(threads)
    built = {p: file_sha256(p) for p in (vocabulary, out / "model.safetensors", out / "config.json")}
    assert len(_dry_run(out, script=script)) == 3  # the vocabulary and the two runs
    vocabulary.unlink()
    run = subprocess.run([str(script), str(out)], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHON": sys.executable})  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert run.stdout.count("+ python -m research.train") == 3
    assert {p: file_sha256(p) for p in built} == built
