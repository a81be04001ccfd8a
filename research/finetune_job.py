"""A training run from its row to a registered model version: what the ``train`` task runs.

claim (a conditional update: a second delivery finds nothing to do) → the corpus's documents,
decrypted → held-out documents split off → windows → :func:`research.finetune.finetune`
(progress and heartbeat on the row every step, cancellable) → :func:`research.corpus_eval.
evaluate_run` → ``corpora.services.model_version_register``, which makes the version and ends
the run in one transaction. A run that fails or is cancelled keeps its checkpoint and registers
nothing; a worker killed mid-run leaves the row running until its heartbeat goes stale, when the
run is failed (``corpora.services.training_run_fail_stale``, asked by the run's page and API and
by a later delivery of its id).

``python -m research.finetune_job RUN_ID`` runs a queued run in this process, with a progress
bar (the same code the task runs); ``--corpus ID`` queues one first, without a broker.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)
PROGRESS_EVERY_S = 2.0  # at most one progress write per this many seconds (and every checkpoint)


class Cancelled(Exception):
    """A person asked the run to stop."""


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def run_paths(run: Any) -> tuple[Path, Path]:
    """(checkpoint, output directory) of a run: under STENCIL_TRAIN_DIR and
    STENCIL_MODEL_VERSIONS_DIR."""
    from django.conf import settings

    name = f"corpus{run.corpus_id}-{str(run.id)[:8]}"
    return (Path(settings.STENCIL_TRAIN_DIR) / str(run.id) / "ckpt.pt",
            Path(settings.STENCIL_MODEL_VERSIONS_DIR) / name)  # fmt: skip


def finetune_run(run_id: str, *, progress_bar: bool = False) -> str:
    """Run the queued run ``run_id`` to its end; returns its final state."""
    import torch

    from corpora import selectors, services
    from corpora.models import TrainingRun
    from research.corpus_eval import evaluate_run
    from research.corpus_text import TextDocument, document_windows, split_held_out
    from research.finetune import WINDOW_MARGIN, FinetuneConfig, Progress, finetune

    run = services.training_run_claim(run_id=run_id, worker=worker_name())
    if run is None:  # not queued: finished, cancelled, or running elsewhere (maybe dead)
        existing = TrainingRun.objects.filter(pk=run_id).first()
        if existing is not None:
            services.training_run_fail_stale(run=existing)
            return existing.state
        return "missing"
    cfg = FinetuneConfig.from_knobs(run.config)
    torch.set_num_threads(cfg.threads)
    checkpoint, out = run_paths(run)
    last = [0.0]
    bar = _bar(progress_bar)

    def report(p: Progress) -> bool:
        if bar is not None:
            bar.total = p.total_steps or None
            bar.n = p.step
            bar.set_postfix(loss=f"{p.loss:.3f}", tok=p.tokens, refresh=True)
        now = time.monotonic()
        saved = checkpoint.is_file() and p.step % cfg.checkpoint_every == 0
        if now - last[0] < PROGRESS_EVERY_S and not saved and p.step != p.total_steps:
            return False
        last[0] = now
        return services.training_run_progress(run=run, progress=vars(p),
                                              checkpoint=str(checkpoint) if saved else None)  # fmt: skip

    def on_case(done: int, total: int) -> None:
        if done % 5 and done != total - 1:
            return
        progress = {**(run.progress or {}), **vars(state_progress), "phase": "evaluating",
                    "cases_done": done, "cases_total": total}  # fmt: skip
        if services.training_run_progress(run=run, progress=progress):
            raise Cancelled

    try:
        texts = [TextDocument(*row) for row in selectors.corpus_texts(corpus=run.corpus)]
        train_docs, held_docs = split_held_out(texts, share=cfg.held_out_share, seed=cfg.seed)
        services.training_run_held_out(run=run, held_out=[d.sha256 for d in held_docs])
        base_dir = Path(run.base_version.directory)
        from gpu_worker.engine.backends import load_backend

        base = load_backend(base_dir)
        limit = int(getattr(base.network, "max_len", 0)) - WINDOW_MARGIN
        tokenizer = base.tokenizer
        del base  # the training loads its own copy

        def count(text: str) -> int:
            return len(tokenizer.encode_document(text))

        train_windows = document_windows(train_docs, count, limit)
        held_windows = document_windows(held_docs, count, limit)
        device = "cuda" if torch.cuda.is_available() else "cpu"  # a GPU when the worker has one
        result = finetune(base_dir, train_windows, out, cfg, checkpoint=checkpoint,
                          on_progress=report, device=device)  # fmt: skip
        services.training_run_progress(run=run, progress=vars(_final(result.state)),
                                       checkpoint=str(checkpoint))  # fmt: skip
        if result.cancelled or result.directory is None:
            services.training_run_finish(run=run, state=TrainingRun.State.CANCELLED,
                                         error="cancelled; the last checkpoint is kept")  # fmt: skip
            return TrainingRun.State.CANCELLED
        state_progress = _final(result.state)
        services.training_run_progress(run=run, state=TrainingRun.State.EVALUATING,
                                       progress={**vars(state_progress), "phase": "evaluating"})  # fmt: skip
        evaluation = evaluate_run(base_dir, result.directory, held_windows,
                                  cases_per_kind=cfg.eval_cases,
                                  regression_cases=cfg.regression_cases, on_case=on_case)  # fmt: skip
        evaluation["windows"] = {"train": len(train_windows), "held_out": len(held_windows)}
        services.model_version_register(run=run, directory=result.directory, evaluation=evaluation,
                                        training=result.summary)  # fmt: skip
        return TrainingRun.State.SUCCEEDED
    except Cancelled:
        services.training_run_finish(run=run, state=TrainingRun.State.CANCELLED,
                                     error="cancelled during the evaluation; nothing registered")  # fmt: skip
        return TrainingRun.State.CANCELLED
    except Exception as exc:  # the run row says why; the worker goes on to the next run
        logger.exception("training run %s failed", run_id)
        services.training_run_finish(run=run, state=TrainingRun.State.FAILED,
                                     error=f"{type(exc).__name__}: {exc}")  # fmt: skip
        return TrainingRun.State.FAILED
    finally:
        if bar is not None:
            bar.close()


def _final(state: Any) -> Any:
    from research.finetune import _progress

    return _progress(state)


def _bar(enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(desc="fine-tune", unit="step")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run a corpus training run in this process.")
    parser.add_argument("run", nargs="?", help="a queued training run's id")
    parser.add_argument("--corpus", type=int, help="queue a run on this corpus first")
    parser.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE",
                        help="a training setting (corpora.training.KNOBS), e.g. minutes=20")
    args = parser.parse_args(argv)
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stencil.settings")
    django.setup()
    from corpora.models import Corpus, TrainingRun
    from corpora.selectors import model_version_default
    from corpora.services import model_version_for_directory
    from corpora.training import TrainingForm

    run_id = args.run
    if args.corpus is not None:
        from django.conf import settings

        corpus = Corpus.objects.get(pk=args.corpus)
        knobs = TrainingForm.parse(dict(kv.split("=", 1) for kv in args.set))
        base = model_version_default() or model_version_for_directory(
            directory=Path(settings.STENCIL_MODEL_DIR))  # fmt: skip
        run_id = str(TrainingRun.objects.create(corpus=corpus, base_version=base, config=knobs).id)
        print(f"queued run {run_id} on corpus {corpus.id} ({corpus.name}) from {base.name}")
    if run_id is None:
        parser.error("give a run id or --corpus")
    state = finetune_run(run_id, progress_bar=True)
    run = TrainingRun.objects.get(pk=run_id)
    print(f"run {run_id}: {state}" + (f" ({run.error})" if run.error else ""))
    if run.model_version is not None:
        print(f"model version {run.model_version.id}: {run.model_version.directory}")


if __name__ == "__main__":
    main()
