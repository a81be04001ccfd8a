"""Continue a denoiser on an organisation's documents, mixed with its original corpus.

The loop is :func:`research.train.train`'s, on other data: the same corruption recipe
(``denoiser_example``, read from the base model's ``training.json``), loss (``batch_loss``),
learning-rate schedule (``lr_at``, a shorter warm-up), wall-clock budget (``_budget_steps``) and
checkpoint format (``_save_checkpoint``: model, optimiser, state, run record), so a killed run
resumes from its last checkpoint or stays failed with it. Row ``r`` of step ``s`` reads, with
probability ``original_share``, the original corpus's train document after the ones the base
model saw (``TrainConfig.data_offset``), else the next window of a seeded per-epoch shuffle of
the corpus's training windows: a run is a pure function of its seed, documents and step count.

The weights are written whole into ``<out>.partial`` and renamed to ``out`` only once complete,
so nothing reads half-written weights; registering them as a model version is the caller's
(``research.finetune_job``), after the evaluation.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from gpu_worker.engine.backends import load_backend
from gpu_worker.engine.loaded import file_sha256
from gpu_worker.engine.model import StencilTransformer
from gpu_worker.engine.model import save_model as save_model_dir
from research.corpus import CORPUS_EDITION, Document, document_at
from research.train import (
    TrainConfig,
    TrainState,
    _budget_steps,
    _check_same_run,
    _previous_training,
    _save_checkpoint,
    batch_loss,
    collate,
    denoiser_example,
    lr_at,
    recorded,
    set_copy_tables,
    training_phases,
    training_summary,
)

WINDOW_MARGIN = 80  # positions a window leaves free of a model's max_len, for hole pad budgets
RECALIBRATE_EVERY = 10  # the step budget is re-estimated every this many steps (train: 50)


@dataclass(frozen=True)
class FinetuneConfig:
    """What decides a fine-tuning run (the person's knobs, corpora.training.KNOBS, and the
    rest); saved in the checkpoint, in training.json and on the model version."""

    minutes: float | None = 30.0
    steps: int | None = None  # exact step count, overrides minutes
    seed: int = 0
    original_share: float = 0.25  # rows from the base model's own corpus
    held_out_share: float = 0.1
    lr: float = 3e-4
    eval_cases: int = 60  # held-out cases per hole kind
    regression_cases: int = 25  # original test-split cases per hole kind
    threads: int = 2
    batch_size: int = 8
    warmup_steps: int = 20
    checkpoint_every: int = 25
    bf16: bool = False  # autocast; on a CPU float32 is as fast and steadier

    @classmethod
    def from_knobs(cls, knobs: dict[str, Any]) -> FinetuneConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in knobs.items() if k in names and v is not None}) if knobs else cls()


@dataclass
class Progress:
    step: int
    total_steps: int
    loss: float
    tokens: int
    seconds: float
    eta_seconds: float | None
    phase: str = "training"


@dataclass
class FinetuneResult:
    directory: Path | None  # None: cancelled before the end (the checkpoint holds the state)
    state: TrainState
    summary: dict[str, Any]
    cancelled: bool


def base_recipe(base_dir: Path, max_len: int) -> TrainConfig:
    """The corruption recipe the base model was trained with (its training.json's last
    phase), else the defaults with the model's tokenization rules."""
    config = json.loads((base_dir / "config.json").read_text())
    summary_path = base_dir / "training.json"
    known = {f.name for f in fields(TrainConfig)}
    saved: dict[str, Any] = {}
    if summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        summary.pop("log", None)
        saved = dict(training_phases(summary)[-1]["config"])
        saved.setdefault("corpus_edition", recorded(saved, "corpus_edition"))
    recipe = {k: v for k, v in saved.items() if k in known}
    recipe.update(kind="denoiser", virtual_spaces=bool(config.get("virtual_spaces", False)),
                  spaced_lines=bool(config.get("spaced_lines", False)), max_len=max_len - 1)  # fmt: skip
    return TrainConfig(**recipe)


def seen_documents(base_dir: Path) -> int:
    """Original-corpus train documents the base model's chain has read (a continuation reads
    the ones after them)."""
    summary_path = base_dir / "training.json"
    if not summary_path.is_file():
        return 0
    summary = json.loads(summary_path.read_text())
    return max((p["config"].get("data_offset", 0) + p["steps"]) * p["config"]["batch_size"]
               * p["config"].get("docs_per_row", 1) for p in training_phases(summary))  # fmt: skip


def corpus_digest(documents: list[Document]) -> str:
    return hashlib.sha256("\n".join(hashlib.sha256(d.text.encode()).hexdigest()
                                    for d in documents).encode()).hexdigest()  # fmt: skip


class Rows:
    """The documents of a run's rows: a pure function of (seed, step, row)."""

    def __init__(self, documents: list[Document], cfg: FinetuneConfig, *, original_offset: int,
                 edition: int) -> None:  # fmt: skip
        if not documents:
            raise ValueError("no training documents")
        self.documents, self.cfg = documents, cfg
        self.original_offset, self.edition = original_offset, edition
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(len(self.documents)))
            random.Random(f"{self.cfg.seed}:epoch:{epoch}").shuffle(order)
            self._orders = {epoch: order}  # one epoch at a time
        return self._orders[epoch]

    def document(self, step: int, row: int, rng: random.Random) -> Document:
        index = step * self.cfg.batch_size + row
        if rng.random() < self.cfg.original_share:
            return document_at("train", self.original_offset + index, edition=self.edition)
        epoch, at = divmod(index, len(self.documents))
        return self.documents[self._order(epoch)[at]]


def finetune(
    base_dir: Path, documents: list[Document], out: Path, cfg: FinetuneConfig, *,
    checkpoint: Path, on_progress: Callable[[Progress], bool] | None = None,
    device: str = "cpu", max_new_steps: int | None = None,
) -> FinetuneResult:  # fmt: skip
    """Train ``base_dir``'s denoiser on ``documents`` (windows that fit it) and write the
    result to ``out``. ``on_progress`` is called after every step and returns True to stop
    (cancel): the checkpoint is saved and ``directory`` is None. ``max_new_steps``: stop after
    so many steps in this call, checkpoint saved (a later call resumes)."""
    if cfg.steps is None and cfg.minutes is None:
        raise ValueError("give steps or minutes")
    loaded = load_backend(base_dir)
    model = loaded.network
    if not isinstance(model, StencilTransformer) or model.config.kind != "denoiser":
        raise ValueError(f"{base_dir} is not a Stencil denoiser: only those can be fine-tuned here")
    tok, mc = loaded.tokenizer, model.config
    tcfg = replace(base_recipe(base_dir, mc.max_len), seed=cfg.seed, lr=cfg.lr,
                   batch_size=cfg.batch_size, warmup_steps=cfg.warmup_steps,
                   checkpoint_every=cfg.checkpoint_every)  # fmt: skip
    set_copy_tables(model, tok)
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95),
                            weight_decay=tcfg.weight_decay)  # fmt: skip
    digest = corpus_digest(documents)
    run: dict[str, Any] = {"config": {**asdict(cfg), "recipe": asdict(tcfg), "corpus": digest},
                           "init_from_sha256": loaded.weights_sha256}  # fmt: skip
    state = TrainState(total_steps=cfg.steps or 0)
    if checkpoint.is_file():  # a run resumes only itself (_check_same_run)
        saved = torch.load(checkpoint, weights_only=False, map_location=device)
        _check_same_run(checkpoint, saved, run)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        state = TrainState(**saved["state"])
    rows = Rows(documents, cfg, original_offset=seen_documents(base_dir),
                edition=tcfg.corpus_edition or CORPUS_EDITION)  # fmt: skip
    first_step = state.step
    cpu_start = time.process_time()
    stopped = False
    while state.total_steps == 0 or state.step < state.total_steps:
        if max_new_steps is not None and state.step - first_step >= max_new_steps:
            break
        t0 = time.time()
        examples = []
        for r in range(cfg.batch_size):
            rng = random.Random(f"{cfg.seed}:finetune:{state.step}:{r}")
            doc = rows.document(state.step, r, rng)
            examples.append(denoiser_example(doc, tok.encode, rng, tcfg, mc,
                                             stratum=(r, cfg.batch_size)))  # fmt: skip
        batch = collate(examples, mc.pad_id)
        for group in opt.param_groups:
            group["lr"] = lr_at(state.step, max(state.total_steps, 1), tcfg)
        loss = batch_loss(model, batch, bf16=cfg.bf16)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.grad_clip)
        opt.step()
        state.step += 1
        state.tokens += batch.tokens
        state.seconds += time.time() - t0
        state.log.append({"step": state.step, "tokens": state.tokens, "loss": loss.item(),
                          "seconds": state.seconds})  # fmt: skip
        if cfg.steps is None and cfg.minutes is not None:
            recalibrate = state.step >= 3 and state.step % RECALIBRATE_EVERY == 3
            state.total_steps = _budget_steps(state, cfg.minutes, recalibrate=recalibrate)
        done = state.total_steps and state.step >= state.total_steps
        if state.step % cfg.checkpoint_every == 0 or done:
            _save_checkpoint(checkpoint, model, opt, state, run)
        if on_progress is not None and on_progress(_progress(state)):
            stopped = True
            break
    _save_checkpoint(checkpoint, model, opt, state, run)
    model.cpu().eval()
    summary = {**training_summary(tcfg, model, state), "finetune": asdict(cfg),
               "corpus_documents": len(documents), "corpus_sha256": digest,
               "init_from": _previous_training(base_dir), "precision": "bf16 autocast" if cfg.bf16 else "fp32",
               "threads": cfg.threads,
               "cpu_seconds": round(time.process_time() - cpu_start, 1)}  # fmt: skip
    if stopped or (state.total_steps and state.step < state.total_steps):
        return FinetuneResult(None, state, summary, cancelled=stopped)
    return FinetuneResult(write_model(model, base_dir, out, summary, state), state, summary, False)


def _progress(state: TrainState) -> Progress:
    recent = state.log[-20:]
    per_step = (recent[-1]["seconds"] - recent[0]["seconds"]) / max(1, len(recent) - 1)
    eta = (state.total_steps - state.step) * per_step if state.total_steps else None
    tail = [e["loss"] for e in state.log[-10:]]
    return Progress(state.step, state.total_steps, sum(tail) / len(tail), state.tokens,
                    round(state.seconds, 1), round(eta, 1) if eta is not None else None)  # fmt: skip


def write_model(model: StencilTransformer, base_dir: Path, out: Path, summary: dict[str, Any],
                state: TrainState) -> Path:  # fmt: skip
    """Weights (bf16, as shipped), config, tokenizer and training.json into ``out``: written
    in ``out.partial``, then renamed, so ``out`` is either whole or absent."""
    partial = out.with_name(out.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    save_model_dir(model, partial, dtype=torch.bfloat16)
    shutil.copyfile(base_dir / "tokenizer.json", partial / "tokenizer.json")
    (partial / "training.json").write_text(json.dumps({**summary, "log": state.log}, indent=1) + "\n")
    if out.exists():
        shutil.rmtree(out)
    partial.rename(out)
    summary["weights_sha256"] = file_sha256(out / "model.safetensors")
    return out
