"""Fine-tuning: a whole model directory or none, a checkpoint that resumes exactly, cancelling."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpu_worker.engine.loaded import file_sha256
from research.corpus_text import annotate
from research.finetune import FinetuneConfig, finetune
from tests.workers import PLACEHOLDER_MODEL

LETTERS = [annotate(f"Dear Ms Ode,\n\nYour tenancy at {n} Elm Row renews on 2027-05-0{n % 9 + 1}. "
                    f"The rent is ${n},100.00 a month.\n\nYours sincerely,\nJo Brown")
           for n in range(1, 7)]  # fmt: skip
CFG = FinetuneConfig(minutes=None, steps=4, batch_size=2, warmup_steps=1, checkpoint_every=2,
                     original_share=0.5)  # fmt: skip


def test_finetune_writes_a_whole_model_directory(tmp_path: Path) -> None:
    result = finetune(PLACEHOLDER_MODEL, LETTERS, tmp_path / "out", CFG, checkpoint=tmp_path / "ck.pt")
    assert result.directory == tmp_path / "out" and not result.cancelled
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "training.json"} <= names
    assert not (tmp_path / "out.partial").exists()
    assert file_sha256(tmp_path / "out" / "model.safetensors") != file_sha256(
        PLACEHOLDER_MODEL / "model.safetensors")
    assert result.summary["steps"] == 4 and result.summary["corpus_documents"] == len(LETTERS)


def test_a_resumed_run_ends_with_the_same_weights(tmp_path: Path) -> None:
    whole = finetune(PLACEHOLDER_MODEL, LETTERS, tmp_path / "a", CFG, checkpoint=tmp_path / "a.pt")
    part = finetune(PLACEHOLDER_MODEL, LETTERS, tmp_path / "b", CFG, checkpoint=tmp_path / "b.pt",
                    max_new_steps=2)  # fmt: skip
    assert part.directory is None and part.state.step == 2 and not (tmp_path / "b").exists()
    rest = finetune(PLACEHOLDER_MODEL, LETTERS, tmp_path / "b", CFG, checkpoint=tmp_path / "b.pt")
    assert rest.state.step == 4
    assert whole.directory is not None and rest.directory is not None
    assert file_sha256(whole.directory / "model.safetensors") == file_sha256(
        rest.directory / "model.safetensors")


def test_cancel_stops_at_the_next_step_and_keeps_the_checkpoint(tmp_path: Path) -> None:
    seen: list[int] = []

    def progress(p: object) -> bool:
        seen.append(p.step)  # type: ignore[attr-defined]
        return p.step == 3  # type: ignore[attr-defined]

    result = finetune(PLACEHOLDER_MODEL, LETTERS, tmp_path / "out",
                      FinetuneConfig(minutes=None, steps=10, batch_size=2, checkpoint_every=5),
                      checkpoint=tmp_path / "ck.pt", on_progress=progress)  # fmt: skip
    assert result.cancelled and result.directory is None and seen == [1, 2, 3]
    assert not (tmp_path / "out").exists()
    assert torch.load(tmp_path / "ck.pt", weights_only=False)["state"]["step"] == 3


def test_a_checkpoint_resumes_only_its_own_run(tmp_path: Path) -> None:
    finetune(PLACEHOLDER_MODEL, LETTERS, tmp_path / "out", CFG, checkpoint=tmp_path / "ck.pt",
             max_new_steps=1)  # fmt: skip
    other = FinetuneConfig(minutes=None, steps=4, batch_size=2, seed=9)
    with pytest.raises(ValueError, match="holds another training run"):
        finetune(PLACEHOLDER_MODEL, LETTERS, tmp_path / "out", other, checkpoint=tmp_path / "ck.pt")
