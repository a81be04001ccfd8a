"""Training: corruption recipes, determinism from the seed, resume, artifacts. Tiny and fast."""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from gpu_worker.engine.backends import load_backend
from gpu_worker.engine.model import StencilTransformer, count_flops_per_token, load_model
from gpu_worker.engine.model import save_model as save_model_dir
from gpu_worker.engine.tokenizer import StencilTokenizer
from research.corpus import CORPUS_EDITION, document_at, iter_split
from research.train import (
    FLOPS_CALIBRATION_STEPS,
    TrainConfig,
    batch_stream,
    denoiser_example,
    extends,
    fim_example,
    load_initial_weights,
    main,
    make_batch,
    mask_hole_tails,
    model_config,
    pick_holes,
    repeated_spans,
    reproduce_commands,
    template_holes,
    train,
    training_phases,
    transplant_vocabulary,
)


def _recipe(out: Path) -> str:
    """The commands that rebuild ``out`` (its card names scripts/reproduce-model, which runs them)."""
    return "\n".join(reproduce_commands(out, json.loads((out / "training.json").read_text())))


TINY = {"d_model": 32, "n_layers": 2, "n_heads": 2, "ffn_hidden": 64, "batch_size": 4,
        "warmup_steps": 2, "eval_every": 10_000, "checkpoint_every": 5, "lr": 3e-3}  # fmt: skip


@pytest.fixture(scope="module")
def corpus_tokenizer() -> StencilTokenizer:
    return StencilTokenizer.train((d.text for d in iter_split("train", 150)), vocab_size=500)


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory, corpus_tokenizer: StencilTokenizer) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    corpus_tokenizer.save(path)
    return path


def _cfg(kind: str = "denoiser", **changes: object) -> TrainConfig:
    return replace(TrainConfig(kind=kind), **{**TINY, **changes})  # type: ignore[arg-type]


def _weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_hole_rows_mask_only_hole_positions_and_pad_the_budget(corpus_tokenizer: StencilTokenizer) -> None:
    cfg = _cfg(hole_fraction=1.0)
    mc = model_config(cfg, corpus_tokenizer)
    for index in range(20):
        ex = denoiser_example(document_at("train", index), corpus_tokenizer.encode,
                              random.Random(index), cfg, mc)  # fmt: skip
        masked = [i for i, x in enumerate(ex.inputs) if x == mc.mask_id]
        assert masked and all(ex.weights[i] > 0 for i in masked)
        assert all(ex.weights[i] == 0 for i in range(len(ex.inputs)) if i not in masked)
        # Unmasked positions show their own target; pad targets only inside holes.
        assert all(ex.inputs[i] == ex.targets[i] for i in range(len(ex.inputs)) if i not in masked)
        # The room counts each budget down to 1 at its last position; 0 outside the holes.
        room = ex.room
        assert room is not None and len(room) == len(ex.targets)
        assert all(room[i] > 0 for i in masked)
        assert all(room[i] > 0 for i, y in enumerate(ex.targets) if y == mc.pad_id)
        for i in range(len(room) - 1):
            if room[i] > 1:
                assert room[i + 1] == room[i] - 1


def test_uniform_rows_weight_masked_tokens_by_one_over_t(corpus_tokenizer: StencilTokenizer) -> None:
    cfg = _cfg(hole_fraction=0.0)
    mc = model_config(cfg, corpus_tokenizer)
    ex = denoiser_example(document_at("train", 3), corpus_tokenizer.encode, random.Random(0), cfg, mc,
                          stratum=(2, 4))  # fmt: skip
    masked = [w for w in ex.weights if w > 0]
    t = len(masked) / len(ex.inputs)
    assert 0.5 - 1 / len(ex.inputs) <= t <= 0.75 + 1 / len(ex.inputs)  # stratum 2 of 4
    assert masked[0] == pytest.approx(1 / (t * len(ex.inputs)))
    assert sum(ex.weights) == pytest.approx(1.0)


def test_copy_hole_leaves_another_mention_of_its_text_visible() -> None:
    cfg = _cfg(copy_hole_prob=1.0)
    for index in range(40):
        doc = document_at("train", index)
        if not repeated_spans(doc):
            continue
        holes = pick_holes(doc, random.Random(index), cfg)
        text = doc.span_text(holes[0])
        visible = [s for s in doc.spans if doc.span_text(s) == text
                   and not any(h.start <= s.start and s.end <= h.end for h in holes)]  # fmt: skip
        assert visible, f"doc {index}: every mention of {text!r} is hidden"


def test_template_rows_hole_the_body_and_keep_first_mentions_visible() -> None:
    cut = 0
    for index in range(40):
        doc = document_at("train", index)
        holes = template_holes(doc, random.Random(index))  # empty: the row falls back
        cut += len(holes) >= 3
        assert all(a.end <= b.start for a, b in zip(holes, holes[1:], strict=False))
        for hole in holes:
            assert hole.kind in ("sentence", "choice", "json_value", "entity")
            if hole.kind == "entity":  # a later mention: an earlier one is left visible
                earlier = [s for s in doc.spans if s.start < hole.start
                           and doc.span_text(s) == doc.span_text(hole)]  # fmt: skip
                assert any(not any(h.start <= s.start and s.end <= h.end for h in holes)
                           for s in earlier)  # fmt: skip
    assert cut >= 30  # most rows hole much of the document


def test_inventing_template_rows_also_hole_names_shown_only_inside_holes() -> None:
    invented = 0
    for index in range(40):
        doc = document_at("train", index)
        holes = template_holes(doc, random.Random(index), invent_prob=1.0)
        for hole in holes:
            if hole.kind != "entity":
                continue
            earlier = [s for s in doc.spans if s.start < hole.start
                       and doc.span_text(s) == doc.span_text(hole)]  # fmt: skip
            assert earlier  # still only later mentions
            invented += all(any(h.start <= s.start and s.end <= h.end for h in holes) for s in earlier)
        # invent_prob 0 draws nothing more: the rows of earlier phases are cut as they were
        assert template_holes(doc, random.Random(index), 0.0) == template_holes(doc, random.Random(index))
    assert invented >= 5  # a name nothing shows, to invent


def test_long_pad_tails_reach_past_the_short_budget(corpus_tokenizer: StencilTokenizer) -> None:
    """Half the holes may end in a pad tail as long as long_pad_budget (people leave room)."""
    cfg = _cfg(hole_fraction=1.0, template_prob=0.0)
    mc = model_config(cfg, corpus_tokenizer)
    tails = []
    for index in range(60):
        ex = denoiser_example(document_at("train", index), corpus_tokenizer.encode,
                              random.Random(index), cfg, mc)  # fmt: skip
        run = 0
        for target in ex.targets + [-1]:
            if target == mc.pad_id:
                run += 1
            elif run:
                tails.append(run)
                run = 0
    assert max(tails) > cfg.max_pad_budget
    assert max(tails) <= max(cfg.long_pad_budget, mc.max_len)


@given(st.lists(st.tuples(st.integers(1, 8), st.integers(0, 6)), min_size=1, max_size=4),
       st.integers(0, 1000))
def test_hole_tails_mask_a_suffix_of_each_budget_with_all_its_pad(
    holes: list[tuple[int, int]], seed: int
) -> None:
    budgets, start = [], 3
    for content, pad in holes:
        budgets.append((start, start + content, start + content + pad))
        start += content + pad + 2
    picked = mask_hole_tails(budgets, start, random.Random(seed))
    assert picked is not None
    masked, weight = picked
    assert weight == pytest.approx(1 / len(masked))
    for a, content_end, end in budgets:
        inside = sorted(p for p in masked if a <= p < end)
        assert inside, "every hole keeps something to predict"
        assert inside == list(range(inside[0], end))  # one suffix of the budget
        assert inside[0] <= content_end  # all of its pad is masked
    assert all(any(a <= p < end for a, _, end in budgets) for p in masked)


def test_ordered_hole_rows_mask_every_pad_after_a_written_start(
    corpus_tokenizer: StencilTokenizer,
) -> None:
    cfg = _cfg(hole_fraction=1.0, ordered_hole_prob=1.0)
    mc = model_config(cfg, corpus_tokenizer)
    written_starts = 0
    for index in range(30):
        ex = denoiser_example(document_at("train", index), corpus_tokenizer.encode,
                              random.Random(index), cfg, mc)  # fmt: skip
        masked = [x == mc.mask_id for x in ex.inputs]
        assert all(m for m, y in zip(masked, ex.targets, strict=True) if y == mc.pad_id)
        assert all(ex.inputs[i] == ex.targets[i] for i, m in enumerate(masked) if not m)
        # A masked run never stops inside a pad tail, and pad never sits visible after it.
        for i in range(len(masked) - 1):
            if masked[i] and not masked[i + 1]:
                assert ex.targets[i + 1] != mc.pad_id
        reference = denoiser_example(document_at("train", index), corpus_tokenizer.encode,
                                     random.Random(index), replace(cfg, ordered_hole_prob=0.0),
                                     mc)  # fmt: skip
        assert ex.targets == reference.targets  # only the masking changes
        written_starts += sum(ex.inputs) != sum(reference.inputs)
    assert written_starts > 20  # the recipe changes the rows (it is not a no-op)


def test_fim_rows_put_the_middle_after_prefix_and_suffix(corpus_tokenizer: StencilTokenizer) -> None:
    cfg = _cfg("ar_fim", fim_rate=1.0)
    mc = model_config(cfg, corpus_tokenizer)
    ex = fim_example(document_at("train", 1), corpus_tokenizer.encode, random.Random(0), cfg, mc)
    seq = [*ex.inputs, ex.targets[-1]]
    pre, suf, mid = (seq.index(i) for i in (mc.fim_prefix_id, mc.fim_suffix_id, mc.fim_middle_id))
    assert pre < suf < mid < len(seq) - 1
    assert seq[-1] == mc.eos_id
    assert ex.targets == seq[1:]


def _compact(text: str) -> str:
    return "".join(text.split())


@given(index=st.integers(0, 400), seed=st.integers(0, 1000))
@settings(max_examples=40, deadline=None)
def test_fim_rows_with_hole_masks_show_the_middle_and_every_later_hole_as_masks(
    corpus_tokenizer: StencilTokenizer, index: int, seed: int
) -> None:
    """With ModelConfig.fim_hole_masks a FIM row is what the AR route shows: the text before
    the middle (earlier holes written), then the middle's budget of masks, the text after it
    with every later hole as masks, and the middle to write."""
    cfg = _cfg("ar_fim", fim_rate=1.0, fim_hole_masks=True, suffix_cut_prob=0.0)
    mc = model_config(cfg, corpus_tokenizer)
    doc = document_at("train", index)
    ex = fim_example(doc, corpus_tokenizer.encode, random.Random(seed), cfg, mc)
    seq = [*ex.inputs, ex.targets[-1]]
    suf, mid = seq.index(mc.fim_suffix_id), seq.index(mc.fim_middle_id)
    prefix, suffix, middle = seq[1:suf], seq[suf + 1 : mid], seq[mid + 1 : -1]
    assert seq[-1] == mc.eos_id and middle and mc.mask_id not in prefix + middle
    run = next((i for i, t in enumerate(suffix) if t != mc.mask_id), len(suffix))
    assert run >= len(middle)  # the hole's budget: its text, then room to spare
    text, written = _compact(doc.text), _compact(corpus_tokenizer.decode(prefix + middle))
    assert written in text
    if len(seq) < cfg.max_len + 1:  # nothing was cut to fit: the prefix is the document's start
        assert text.startswith(written)
    at = text.index(written) + len(written)
    piece: list[int] = []  # the suffix's locked text, in order, between the later holes' masks
    for token in [*suffix[run:], mc.mask_id]:
        if token != mc.mask_id:
            piece.append(token)
        elif piece:
            found = text.find(_compact(corpus_tokenizer.decode(piece)), at)
            assert found >= at
            at, piece = found + len(_compact(corpus_tokenizer.decode(piece))), []
    plain = fim_example(doc, corpus_tokenizer.encode, random.Random(seed), replace(cfg, fim_hole_masks=False),
                        model_config(replace(cfg, fim_hole_masks=False), corpus_tokenizer))  # fmt: skip
    assert mc.mask_id not in plain.inputs


def test_rows_with_virtual_spaces_differ_only_by_a_space_opening_some_holes(
    corpus_tokenizer: StencilTokenizer,
) -> None:
    """Both kinds of hole rows follow TrainConfig.virtual_spaces (as the model's Canvases
    will): the same holes, the same text, and one more space where a hole opens a line."""
    differ = 0
    for kind, make in (("denoiser", denoiser_example), ("ar_fim", fim_example)):
        for index in range(12):
            doc = document_at("train", index)
            rows = []
            for virtual in (False, True):
                cfg = _cfg(kind, hole_fraction=1.0, fim_rate=1.0, virtual_spaces=virtual)
                mc = model_config(cfg, corpus_tokenizer)
                assert mc.virtual_spaces is virtual
                ex = make(doc, corpus_tokenizer.encode, random.Random(index), cfg, mc)
                rows.append(corpus_tokenizer.decode(ex.targets))
            plain, spaced = rows
            assert spaced.replace(" ", "") == plain.replace(" ", "")
            assert len(spaced) >= len(plain)
            differ += spaced != plain
    assert differ >= 4


def test_rows_with_spaced_lines_spell_the_same_text_with_every_line_start_spaced(
    corpus_tokenizer: StencilTokenizer,
) -> None:
    """With TrainConfig.spaced_lines both kinds of rows are made with a tokenizer that
    spaces every line start (as the model's Canvases will): the same characters, and no
    word right after a newline any more, where the virtual-space rows have many."""
    spaced_tok = StencilTokenizer(corpus_tokenizer.tok, spaced_lines=True)
    bare_starts = {False: 0, True: 0}
    for kind, make in (("denoiser", denoiser_example), ("ar_fim", fim_example)):
        for index in range(8):
            doc = document_at("train", index)
            rows = {}
            for spaced, tok in ((False, corpus_tokenizer), (True, spaced_tok)):
                cfg = _cfg(kind, hole_fraction=1.0, fim_rate=1.0, virtual_spaces=True,
                           spaced_lines=spaced, max_len=2048)  # whole documents  # fmt: skip
                mc = model_config(cfg, tok)
                assert mc.spaced_lines is spaced and mc.virtual_spaces
                ex = make(doc, tok.encode, random.Random(index), cfg, mc)
                rows[spaced] = corpus_tokenizer.decode(ex.targets)  # the tokens' own text
                bare_starts[spaced] += sum(
                    1 for a, b in itertools.pairwise(rows[spaced]) if a == "\n" and b.isalnum()
                )  # fmt: skip
            assert rows[True].replace(" ", "") == rows[False].replace(" ", "")
    assert bare_starts[True] == 0 and bare_starts[False] > 20


def test_training_refuses_a_tokenizer_that_does_not_follow_the_config(
    corpus_tokenizer: StencilTokenizer, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="spaced_lines"):
        train(_cfg(spaced_lines=True), corpus_tokenizer, checkpoint=tmp_path / "c.pt", steps=1,
              progress=False)  # fmt: skip
    assert not (tmp_path / "c.pt").exists()


def test_batches_are_a_pure_function_of_seed_and_step(corpus_tokenizer: StencilTokenizer) -> None:
    cfg = _cfg()
    mc = model_config(cfg, corpus_tokenizer)
    a, b = make_batch(3, cfg, mc, corpus_tokenizer), make_batch(3, cfg, mc, corpus_tokenizer)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.weights, b.weights)
    c = make_batch(3, replace(cfg, seed=1), mc, corpus_tokenizer)
    assert not torch.equal(a.inputs, c.inputs)


def test_batches_made_by_worker_processes_are_the_batches_of_their_steps(
    corpus_tokenizer: StencilTokenizer,
) -> None:
    cfg = _cfg()
    mc = model_config(cfg, corpus_tokenizer)
    made = list(itertools.islice(batch_stream(cfg, mc, corpus_tokenizer, start=7, workers=2), 5))
    for step, batch in enumerate(made, 7):
        alone = make_batch(step, cfg, mc, corpus_tokenizer)
        assert torch.equal(batch.inputs, alone.inputs) and torch.equal(batch.weights, alone.weights)
        assert torch.equal(batch.room, alone.room) and batch.tokens == alone.tokens
    assert not torch.equal(made[0].inputs, made[1].inputs)


def test_a_flops_target_fixes_the_step_count_from_the_first_steps_tokens(
    corpus_tokenizer: StencilTokenizer, tmp_path: Path
) -> None:
    cfg = _cfg()
    mc = model_config(cfg, corpus_tokenizer)
    per_token = count_flops_per_token(mc, cfg.max_len // 2)
    first = [make_batch(s, cfg, mc, corpus_tokenizer).tokens for s in range(FLOPS_CALIBRATION_STEPS)]
    per_step = sum(first) / len(first) * per_token
    prior = 1e9  # the phases before this one
    target = prior + per_step * (FLOPS_CALIBRATION_STEPS + 12.5)
    _, state = train(cfg, corpus_tokenizer, checkpoint=tmp_path / "f.pt", target_flops=target,
                     prior_flops=prior, progress=False, bf16=False)  # fmt: skip
    assert state.total_steps == state.step == FLOPS_CALIBRATION_STEPS + 13
    reached = prior + state.log[-1]["flops"]
    assert target <= reached < target + 2 * per_step


@pytest.mark.parametrize("kind", ["denoiser", "ar_fim"])
def test_tiny_training_lowers_the_loss(kind: str, corpus_tokenizer: StencilTokenizer, tmp_path: Path) -> None:
    _, state = train(_cfg(kind), corpus_tokenizer, checkpoint=tmp_path / "ckpt.pt", steps=40,
                     progress=False, bf16=False)  # fmt: skip
    first = sum(e["loss"] for e in state.log[:5]) / 5
    last = sum(e["loss"] for e in state.log[-5:]) / 5
    assert last < first * 0.9


def test_same_seed_gives_the_same_weights(corpus_tokenizer: StencilTokenizer, tmp_path: Path) -> None:
    a, _ = train(_cfg(), corpus_tokenizer, checkpoint=tmp_path / "a.pt", steps=6, progress=False, bf16=False)
    b, _ = train(_cfg(), corpus_tokenizer, checkpoint=tmp_path / "b.pt", steps=6, progress=False, bf16=False)
    for x, y in zip(_weights(a), _weights(b), strict=True):
        assert torch.equal(x, y)


def test_resume_from_a_checkpoint_continues_the_same_run(corpus_tokenizer: StencilTokenizer, tmp_path: Path) -> None:
    straight, _ = train(_cfg(), corpus_tokenizer, checkpoint=tmp_path / "s.pt", steps=10,
                        progress=False, bf16=False)  # fmt: skip
    train(_cfg(), corpus_tokenizer, checkpoint=tmp_path / "r.pt", steps=10, progress=False,
          bf16=False, max_new_steps=5)  # interrupted half way
    resumed, state = train(_cfg(), corpus_tokenizer, checkpoint=tmp_path / "r.pt", steps=10,
                           progress=False, bf16=False)  # fmt: skip
    assert state.step == 10 and len(state.log) == 10
    for x, y in zip(_weights(straight), _weights(resumed), strict=True):
        torch.testing.assert_close(x, y)


def test_a_checkpoint_resumes_only_the_run_that_wrote_it(
    corpus_tokenizer: StencilTokenizer, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "c.pt"
    first, _ = train(_cfg(), corpus_tokenizer, checkpoint=checkpoint, steps=4, progress=False, bf16=False)
    with pytest.raises(ValueError, match=r"another training run \(it differs in template_prob\)"):
        train(replace(_cfg(), template_prob=0.9), corpus_tokenizer, checkpoint=checkpoint, steps=4,
              progress=False, bf16=False)  # fmt: skip
    save_model_dir(first, tmp_path / "m", dtype=torch.float32)
    with pytest.raises(ValueError, match="the --init-from weights"):  # the next phase, same path
        train(_cfg(), corpus_tokenizer, checkpoint=checkpoint, steps=4, progress=False,
              bf16=False, init_from=tmp_path / "m")  # fmt: skip
    _, state = train(_cfg(), corpus_tokenizer, checkpoint=checkpoint, steps=4, progress=False, bf16=False)
    assert state.step == 4 and len(state.log) == 4  # the same run: resumed, already done


def test_a_run_reads_the_corpus_edition_its_config_names(corpus_tokenizer: StencilTokenizer) -> None:
    mc = model_config(_cfg(), corpus_tokenizer)
    batches = {e: make_batch(0, _cfg(batch_size=8, corpus_edition=e), mc, corpus_tokenizer) for e in (1, 2, 3, 4)}
    kinds = [document_at("train", i).kind for i in range(8)]
    assert kinds[5] == "job_offer" and kinds[4] == "invoice"  # rows editions 2, 3 and 4 changed
    for edition in (2, 3, 4):
        assert not torch.equal(batches[edition - 1].inputs, batches[edition].inputs)
    with pytest.raises(ValueError, match="corpus_edition=5"):
        _cfg(corpus_edition=5)


def test_a_checkpoint_recorded_before_editions_resumes_as_edition_1(
    corpus_tokenizer: StencilTokenizer, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "c.pt"
    train(_cfg(corpus_edition=1), corpus_tokenizer, checkpoint=checkpoint, steps=4, progress=False,
          bf16=False, max_new_steps=2)  # fmt: skip
    saved = torch.load(checkpoint, weights_only=False)
    del saved["run"]["config"]["corpus_edition"]  # as a run before editions recorded it
    torch.save(saved, checkpoint)
    with pytest.raises(ValueError, match=r"differs in corpus_edition"):  # it read edition 1
        train(_cfg(), corpus_tokenizer, checkpoint=checkpoint, steps=4, progress=False, bf16=False)
    _, state = train(_cfg(corpus_edition=1), corpus_tokenizer, checkpoint=checkpoint, steps=4,
                     progress=False, bf16=False)  # fmt: skip
    assert state.step == 4 and len(state.log) == 4  # resumed at step 2


def test_cli_writes_every_artifact(tokenizer_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "models" / "tiny-denoiser"
    main(["--kind", "denoiser", "--out", str(out), "--tokenizer", str(tokenizer_file),
          "--steps", "4", "--d-model", "32", "--layers", "2", "--heads", "2", "--ffn", "64",
          "--batch-size", "2", "--eval-every", "4", "--checkpoint", str(tmp_path / "c.pt")])  # fmt: skip
    for name in ("model.safetensors", "config.json", "tokenizer.json", "MODEL_CARD.md",
                 "loss_curve.png", "training.json"):  # fmt: skip
        assert (out / name).is_file(), name
    sums = (out.parent / "SHA256SUMS").read_text()
    assert "tiny-denoiser/model.safetensors" in sums
    summary = json.loads((out / "training.json").read_text())
    assert summary["steps"] == 4 and summary["tokens"] > 0 and summary["flops"] > 0
    card = (out / "MODEL_CARD.md").read_text()
    assert "training compute" in card and f"{summary['tokens']:,}" in card
    assert "Reproduce: `scripts/reproduce-model models/tiny-denoiser` (1 training run" in card
    assert "--d-model 32 --layers 2 --heads 2 --ffn 64" in _recipe(out)  # not the defaults
    assert "--batch-size 2 --steps 4" in _recipe(out)


def test_a_card_is_rewritten_from_training_json_for_weights_trained_elsewhere(
    tokenizer_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "models" / "tiny-denoiser"
    _tiny_cli(out, tokenizer_file, tmp_path / "a.pt")
    summary = _tiny_cli(out, tokenizer_file, tmp_path / "b.pt", "--init-from", str(out))
    # What scripts/train-gpu brings back: weights, config and training.json of a CUDA phase.
    summary.update(device="cuda", device_name="NVIDIA H200", precision="fp32 (TF32 matmuls)",
                   train_seconds=90.0)  # fmt: skip
    (out / "training.json").write_text(json.dumps(summary))
    (out / "MODEL_CARD.md").unlink()
    (out / "loss_curve.png").unlink()
    main(["--card", str(out)])
    card = (out / "MODEL_CARD.md").read_text()
    assert (out / "loss_curve.png").is_file()
    assert "| phase 2: wall time | 1.5 min on one NVIDIA H200 (cuda), fp32 (TF32 matmuls)" in card
    assert "| phase 1: wall time" in card and "CPU thread(s)" in card
    assert "--no-bf16 --init-from" in _recipe(out)
    assert "--batch-size 2 --device cuda --steps 3" in _recipe(out)
    assert "and 1.5 minutes on one NVIDIA H200" in card
    assert "tiny-denoiser/MODEL_CARD.md" in (out.parent / "SHA256SUMS").read_text()


def _tiny_cli(out: Path, tokenizer_file: Path, checkpoint: Path, *extra: str) -> dict:
    main(["--kind", "denoiser", "--out", str(out), "--tokenizer", str(tokenizer_file),
          "--steps", "3", "--d-model", "32", "--layers", "2", "--heads", "2", "--ffn", "64",
          "--batch-size", "2", "--eval-every", "3", "--no-bf16", "--checkpoint", str(checkpoint),
          *extra])  # fmt: skip
    return json.loads((out / "training.json").read_text())


def test_the_card_reproduces_each_phase_on_the_corpus_edition_it_read(
    tokenizer_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "models" / "tiny-denoiser"
    _tiny_cli(out, tokenizer_file, tmp_path / "a.pt", "--corpus-edition", "1")
    second = _tiny_cli(out, tokenizer_file, tmp_path / "b.pt", "--init-from", str(out))
    assert second["config"]["corpus_edition"] == CORPUS_EDITION == 4
    assert second["init_from"]["training"]["config"]["corpus_edition"] == 1
    card, recipe = (out / "MODEL_CARD.md").read_text(), _recipe(out)
    assert recipe.startswith("python -m research.train --kind tokenizer --corpus-edition 1\n")
    assert recipe.count("--corpus-edition 1") == 2  # the vocabulary and the first phase
    assert "Corpus: edition 1 in phase 1, edition 4 in phase 2 (" in card
    del second["init_from"]["training"]["config"]["corpus_edition"]  # recorded before editions
    (out / "training.json").write_text(json.dumps(second))
    main(["--card", str(out)])
    assert (out / "MODEL_CARD.md").read_text() == card  # such a phase read edition 1
    assert _recipe(out) == recipe


def test_a_continuation_adds_a_copy_head_and_its_card_adds_up_both_phases(
    tokenizer_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "models" / "tiny-denoiser"
    first = _tiny_cli(out, tokenizer_file, tmp_path / "a.pt", "--copy-dim", "0",
                      "--segment-boundaries")  # fmt: skip
    assert first["config"]["document_boundaries"] is False
    before = load_file(str(out / "model.safetensors"))
    cfg = replace(TrainConfig(kind="denoiser"), **{**TINY, "d_model": 32, "n_heads": 2, "copy_dim": 8})  # type: ignore[arg-type]
    model = StencilTransformer(model_config(cfg, StencilTokenizer.from_file(tokenizer_file)))
    new = load_initial_weights(model, out)
    assert new and all(name.startswith("copy.") for name in new)
    torch.testing.assert_close(model.embed.weight, before["embed.weight"].float())

    second = _tiny_cli(out, tokenizer_file, tmp_path / "b.pt", "--copy-dim", "8", "--init-from", str(out))
    assert second["init_from"]["training"]["steps"] == first["steps"]
    assert second["init_from"]["training"]["config"]["copy_dim"] == 0
    card = (out / "MODEL_CARD.md").read_text()
    assert f"{first['tokens'] + second['tokens']:,}" in card  # tokens of both phases
    assert "phase 1" in card and "phase 2" in card
    recipe = _recipe(out)
    assert "--copy-dim 0" in recipe and "--copy-dim 8 --no-bf16 --init-from" in recipe
    assert recipe.count("--segment-boundaries") == 1  # the first phase's recipe, not the second's

    third = _tiny_cli(out, tokenizer_file, tmp_path / "c.pt", "--copy-dim", "8",
                      "--room-buckets", "16", "--init-from", str(out))  # fmt: skip
    assert third["config"]["room_buckets"] == 16
    assert load_model(out).config.room_buckets == 16
    assert "--copy-dim 8 --room-buckets 16 --no-bf16 --init-from" in _recipe(out)

    fourth = _tiny_cli(out, tokenizer_file, tmp_path / "d.pt", "--copy-dim", "8",
                       "--room-buckets", "16", "--copy-twins", "--init-from", str(out))  # fmt: skip
    assert fourth["config"]["copy_twins"] is True
    loaded = load_model(out)  # the twin table is the tokenizer's, saved with the weights
    spaced, bare = StencilTokenizer.from_file(tokenizer_file).space_twins()
    assert loaded.copy.twins.tolist() == [spaced, bare] and spaced != bare
    assert "--room-buckets 16 --copy-twins --no-bf16 --init-from" in _recipe(out)
    assert load_backend(out).tokenizer.virtual_spaces is False

    fifth = _tiny_cli(out, tokenizer_file, tmp_path / "e.pt", "--copy-dim", "8",
                      "--room-buckets", "16", "--copy-twins", "--virtual-spaces",
                      "--init-from", str(out))  # fmt: skip
    assert fifth["config"]["virtual_spaces"] is True and load_model(out).config.virtual_spaces
    assert load_backend(out).tokenizer.virtual_spaces is True  # canvases follow the model
    assert _recipe(out).count("--virtual-spaces") == 1  # the last phase's recipe only
    assert "| virtual spaces | yes" in (out / "MODEL_CARD.md").read_text()
    with pytest.raises(SystemExit):  # a later phase may not drop it silently
        _tiny_cli(out, tokenizer_file, tmp_path / "f.pt", "--copy-dim", "8",
                  "--room-buckets", "16", "--copy-twins", "--init-from", str(out))  # fmt: skip
    assert load_model(out).config.virtual_spaces  # nothing was written

    sixth = _tiny_cli(out, tokenizer_file, tmp_path / "g.pt", "--copy-dim", "8",
                      "--room-buckets", "16", "--copy-twins", "--spaced-lines",
                      "--init-from", str(out))  # fmt: skip
    assert sixth["config"]["spaced_lines"] is True and sixth["config"]["virtual_spaces"] is True
    tokenizer = load_backend(out).tokenizer  # canvases and rows follow the model
    assert tokenizer.spaced_lines and tokenizer.virtual_spaces
    recipe = _recipe(out)
    assert "| spaced lines | yes" in (out / "MODEL_CARD.md").read_text()
    assert recipe.count("--spaced-lines") == 1
    assert recipe.count("--virtual-spaces") == 1  # the fifth phase's
    with pytest.raises(SystemExit):  # nor may it drop spaced lines
        _tiny_cli(out, tokenizer_file, tmp_path / "h.pt", "--copy-dim", "8", "--room-buckets",
                  "16", "--copy-twins", "--virtual-spaces", "--init-from", str(out))  # fmt: skip
    assert load_model(out).config.spaced_lines


def test_initial_weights_of_another_architecture_are_refused(tokenizer_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "models" / "tiny-denoiser"
    _tiny_cli(out, tokenizer_file, tmp_path / "a.pt", "--copy-dim", "0")
    cfg = replace(TrainConfig(kind="denoiser"), **{**TINY, "d_model": 32, "n_heads": 2, "n_layers": 3})  # type: ignore[arg-type]
    model = StencilTransformer(model_config(cfg, StencilTokenizer.from_file(tokenizer_file)))
    with pytest.raises(ValueError, match="does not fit"):
        load_initial_weights(model, out)


def test_train_gpu_scratch_runs_end_to_end_and_brings_back_what_the_device_returns(
    tmp_path: Path,
) -> None:
    """scripts/train-gpu-scratch as a lent GPU runs it, here on the CPU for seconds: a
    vocabulary learned from spaced text, both models from scratch on it, AR-FIM trained to the
    denoiser's compute; what it leaves is at most the device tool's 8 files."""
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "out"
    env = {**os.environ, "DEVICE": "cpu", "WORKERS": "0", "TOKENIZER_DOCS": "200",
           "VOCAB": "700", "BATCH": "2", "AR_BATCH": "2", "PYTHON": sys.executable,
           "CKPT_DIR": str(tmp_path / "work")}  # fmt: skip
    run = subprocess.run([str(root / "scripts" / "train-gpu-scratch"), str(out), "0.05", "0.05"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == ["ar/config.json", "ar/model.safetensors", "ar/training.json",
                     "den/config.json", "den/model.safetensors", "den/tokenizer.json",
                     "den/training.json", "train.log"]  # fmt: skip
    tok = StencilTokenizer.from_file(out / "den" / "tokenizer.json", spaced_lines=True)
    learned = StencilTokenizer.from_file(tmp_path / "work" / "learned.json")
    assert learned.vocab_size == 700 and extends(tok, learned)  # then the e-mail names added
    size = tok.vocab_size
    assert len(tok.encode(" adam")) == 1
    letter = [tok.token_text(t) for t in tok.encode("Clinic\n\nDear Dr. Smith,\n")]
    assert " Dear" in letter  # learned from spaced text
    summaries = {}
    for name, kind in (("den", "denoiser"), ("ar", "ar_fim")):
        config = json.loads((out / name / "config.json").read_text())
        assert config["kind"] == kind and config["vocab_size"] == size and config["spaced_lines"]
        assert config["copy_lower"]
        summaries[name] = json.loads((out / name / "training.json").read_text())
        assert "init_from" not in summaries[name]  # from scratch
    assert load_backend(out / "den").tokenizer.vocab_size == size  # the service loads it
    log = (out / "train.log").read_text()  # AR-FIM's target is the denoiser's compute
    assert f"denoiser: {summaries['den']['flops']} FLOPs; AR-FIM trains to the same" in log


def test_a_transplant_moves_a_model_onto_a_new_vocabulary_and_a_continuation_trains_it(
    tokenizer_file: Path, corpus_tokenizer: StencilTokenizer, tmp_path: Path
) -> None:
    source = tmp_path / "models" / "tiny-denoiser"
    _tiny_cli(source, tokenizer_file, tmp_path / "a.pt", "--copy-twins", "--spaced-lines")
    bigger = tmp_path / "bigger.json"
    main(["--kind", "tokenizer", "--spaced-lines", "--vocab-size", "700", "--tokenizer-docs",
          "150", "--out", str(bigger)])  # fmt: skip
    moved = tmp_path / "moved"
    main(["--transplant", str(source), "--tokenizer", str(bigger), "--out", str(moved)])
    old, new = load_model(source), load_model(moved)
    after = StencilTokenizer.from_file(bigger, spaced_lines=True)
    assert new.config.vocab_size == after.vocab_size == 700 and new.config.spaced_lines
    for name, weight in old.state_dict().items():  # the body is the source's
        if name not in ("embed.weight", "head.weight", "copy.twins"):
            torch.testing.assert_close(new.state_dict()[name], weight)
    assert new.copy.twins.tolist() == [list(t) for t in after.space_twins()]
    before_vocab = corpus_tokenizer.tok.get_vocab()
    for text, i in list(after.tok.get_vocab().items())[:300]:
        if after.is_special(i):
            torch.testing.assert_close(new.embed.weight[i], old.embed.weight[i])
        elif text in before_vocab:  # a token both spell alike keeps its rows
            j = before_vocab[text]
            torch.testing.assert_close(new.embed.weight[i], old.embed.weight[j])
            torch.testing.assert_close(new.head.weight[i], old.head.weight[j])
    spaced = [after.token_text(t) for t in after.encode("Clinic\n\nDear Dr. Smith,\n")]
    pieces = corpus_tokenizer.tok.encode(" Dear").ids
    assert " Dear" in spaced and len(pieces) > 1  # a new word: the mean of the pieces spelling it
    torch.testing.assert_close(new.embed.weight[after.tok.token_to_id("ĠDear")],
                                   old.embed.weight[pieces].mean(0))  # fmt: skip
    summary = json.loads((moved / "training.json").read_text())
    assert summary["vocabulary_transplant"]["vocab_size"] == 700
    in_place = tmp_path / "in-place"  # the card's Reproduce line moves models/NAME onto itself
    shutil.copytree(source, in_place)
    assert transplant_vocabulary(in_place, bigger, in_place) == summary["vocabulary_transplant"]
    assert load_file(str(in_place / "model.safetensors")).keys() == load_file(
        str(moved / "model.safetensors")).keys()  # fmt: skip
    (in_place / "training.json").unlink()
    with pytest.raises(ValueError, match="no training.json"):
        transplant_vocabulary(in_place, bigger, tmp_path / "elsewhere")
    assert summary["steps"] == json.loads((source / "training.json").read_text())["steps"]
    out = tmp_path / "models" / "tiny-moved"
    main(["--kind", "denoiser", "--out", str(out), "--tokenizer", str(bigger), "--steps", "2",
          "--d-model", "32", "--layers", "2", "--heads", "2", "--ffn", "64", "--batch-size", "2",
          "--eval-every", "2", "--no-bf16", "--copy-twins", "--spaced-lines",
          "--init-from", str(moved), "--checkpoint", str(tmp_path / "b.pt")])  # fmt: skip
    continued = json.loads((out / "training.json").read_text())
    assert len(training_phases(continued)) == 2  # the source's phase, then the continuation
    assert load_model(out).copy.twins.tolist() == new.copy.twins.tolist()
    card, recipe = (out / "MODEL_CARD.md").read_text(), _recipe(out)
    assert "--transplant" in recipe and "byte-level BPE learned from train documents, 700 tokens" in card
    sha = summary["vocabulary_transplant"]["tokenizer_sha256"]  # how to learn the vocabulary again
    assert (f"python -m research.train --kind tokenizer --spaced-lines --vocab-size 700 --out "
            f"var/tokenizer/{sha[:12]}.json\necho '{sha}  var/tokenizer/{sha[:12]}.json' | "
            "sha256sum --check\n") in recipe  # fmt: skip


def test_a_model_moves_onto_a_vocabulary_with_the_email_names_and_learns_lower_case_twins(
    tokenizer_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "models" / "tiny-denoiser"
    _tiny_cli(source, tokenizer_file, tmp_path / "a.pt", "--copy-twins", "--spaced-lines")
    extended = tmp_path / "extended.json"
    main(["--kind", "tokenizer", "--extend", str(tokenizer_file), "--out", str(extended)])
    before = StencilTokenizer.from_file(tokenizer_file)
    after = StencilTokenizer.from_file(extended, spaced_lines=True)
    assert extends(after, before) and f"+ {after.vocab_size - before.vocab_size} tokens" in capsys.readouterr().out
    moved = tmp_path / "moved"
    main(["--transplant", str(source), "--tokenizer", str(extended), "--out", str(moved)])
    record = json.loads((moved / "training.json").read_text())["vocabulary_transplant"]
    assert record["extends_source"] is True and record["vocab_size"] == after.vocab_size
    old, new = load_model(source), load_model(moved)  # every earlier token keeps its rows
    torch.testing.assert_close(new.embed.weight[: before.vocab_size], old.embed.weight)
    torch.testing.assert_close(new.head.weight[: before.vocab_size], old.head.weight)
    with pytest.raises(SystemExit):  # lower-case twins are twins
        _tiny_cli(tmp_path / "models" / "x", extended, tmp_path / "x.pt", "--copy-lower")
    assert "--copy-lower needs --copy-twins" in capsys.readouterr().err
    out = tmp_path / "models" / "tiny-lower"
    continued = _tiny_cli(out, extended, tmp_path / "b.pt", "--copy-twins", "--copy-lower",
                          "--spaced-lines", "--lr", "0.0005", "--init-from", str(moved))  # fmt: skip
    assert continued["config"]["copy_lower"] is True and continued["config"]["lr"] == 0.0005
    trained = load_model(out)
    assert trained.copy.lower_twins.tolist() == [list(t) for t in after.case_twins()]
    assert float(trained.copy.lower_gate.weight.detach().abs().sum()) > 0  # trained from zero
    card, recipe = (out / "MODEL_CARD.md").read_text(), _recipe(out)
    sha = record["tokenizer_sha256"]
    assert (f"python -m research.train --kind tokenizer --extend var/tokenizer/tokenizer.json "
            f"--out var/tokenizer/{sha[:12]}.json\necho '{sha}  var/tokenizer/{sha[:12]}.json' | "
            "sha256sum --check\n") in recipe  # fmt: skip
    assert "--copy-twins --copy-lower --lr 0.0005 --no-bf16" in recipe
    assert "| lower-case twins | yes" in card


def test_rows_of_joined_documents_run_past_one_document_and_stop_at_max_len(
    corpus_tokenizer: StencilTokenizer,
) -> None:
    for kind in ("denoiser", "ar_fim"):
        cfg = _cfg(kind, max_len=400, docs_per_row=6, batch_size=8)
        mc = model_config(cfg, corpus_tokenizer)
        one = max(len(corpus_tokenizer.encode(document_at("train", i).text)) for i in range(64))
        lengths = [int(row.sum()) for step in range(3)
                   for row in make_batch(step, cfg, mc, corpus_tokenizer).attention]  # fmt: skip
        assert max(lengths) > one  # a row holds more than the longest single document
        assert max(lengths) <= cfg.max_len
        assert min(lengths) < max(lengths)  # rows of 1 to docs_per_row documents
        again = make_batch(2, cfg, mc, corpus_tokenizer)
        torch.testing.assert_close(again.inputs, make_batch(2, cfg, mc, corpus_tokenizer).inputs)


def test_a_phase_at_a_longer_length_reads_longer_rows_and_its_card_reproduces_it(
    tokenizer_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "models" / "tiny-denoiser"
    first = _tiny_cli(out, tokenizer_file, tmp_path / "a.pt")
    assert load_model(out).config.max_len == first["config"]["max_len"] + 1 == 321
    second = _tiny_cli(out, tokenizer_file, tmp_path / "b.pt", "--max-len", "640",
                       "--docs-per-row", "4", "--init-from", str(out))  # fmt: skip
    assert second["config"]["max_len"] == 640 and second["config"]["docs_per_row"] == 4
    assert load_model(out).config.max_len == 641  # the model reads what it was trained on
    recipe = _recipe(out).splitlines()
    assert "--max-len" not in recipe[1] and "--docs-per-row" not in recipe[1]
    assert "--max-len 640 --docs-per-row 4" in recipe[2]
