"""Train the Stencil tokenizer, the masked-diffusion denoiser and the AR-FIM baseline.

One command per artifact, reproducible from ``--seed``::

    python -m research.train --kind tokenizer
    python -m research.train --kind denoiser --out models/stencil-denoiser --seed 0 --minutes 40
    python -m research.train --kind ar_fim --out models/stencil-ar-fim --seed 0 --minutes 35

Data: documents from :mod:`research.corpus` (train split), generated on the fly; step ``s``
row ``i`` always reads document ``s * batch + i`` and draws its corruption from a generator
seeded by ``(seed, s, i)``, so a run is a pure function of its seed and its step count and a
resumed run continues exactly where it stopped.

The denoiser's examples mix two corruptions:
- *uniform*: mask ratio t ~ U(0, 1) over the whole document (the masked-diffusion ELBO);
- *holes*: cut hole-shaped spans (one mention of a repeated entity while another stays
  visible, field values, sentences), give each hole a budget of extra positions whose target is
  pad (a hole may be filled with fewer tokens than its budget), then mask each hole position
  with ratio t ~ U(0, 1): the conditional ELBO of infilling, as the sampler uses it.
Loss: cross-entropy on masked positions weighted by 1/t, normalised by the corrupted length.

The AR-FIM baseline reads the same documents and the same hole-shaped spans as middles in PSM
order (``<pre> prefix <suf> suffix <mid> middle <eos>``); the suffix is sometimes cut short,
as it is when a later hole stops the AR route's view of the right context.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from gpu_worker.engine.loaded import file_sha256
from gpu_worker.engine.model import (
    ModelConfig,
    ModelKind,
    StencilTransformer,
    count_flops_per_token,
    fit_fim_context,
    hole_room,
    load_weights,
)
from gpu_worker.engine.model import save_model as save_model_dir
from gpu_worker.engine.tokenizer import (
    StencilTokenizer,
    document_lead,
    encode_document,
    spaced_text,
)
from research.corpus import (
    CORPUS_EDITION,
    CORPUS_EDITIONS,
    Document,
    Span,
    document_at,
    document_pieces,
    email_name_words,
    join_documents,
    template_cut,
    tokenize_with_holes,
)

DEFAULT_TOKENIZER = Path("var/tokenizer/tokenizer.json")
TOKENIZER_DOCS = 24_000  # train documents the BPE merges are learned from
VOCAB_SIZE = 4096
COPY_KINDS = ("entity", "date", "number", "json_value")  # spans whose text may repeat
Encoder = Callable[[str], list[int]]


@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides a training run (saved in the checkpoint and the model card)."""

    kind: ModelKind
    seed: int = 0
    batch_size: int = 16
    max_len: int = 320  # longest training row; longer rows are cut
    lr: float = 2e-3
    min_lr_ratio: float = 0.1  # cosine decay ends at lr * this
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    hole_fraction: float = 0.8  # denoiser: share of rows corrupted with holes (else uniform)
    copy_hole_prob: float = 0.85  # a hole row's first hole is a repeated mention's occurrence
    max_extra_holes: int = 2  # further holes per hole row
    # Share of hole rows cut like a template (see template_holes): most of the body a hole,
    # only the typed fields and first mentions visible, as whole-document drafting requests are.
    template_prob: float = 0.3
    # Share of template rows that also hole the later mentions of an entity whose earlier
    # mentions all lie inside holes (a party named only in a holed first sentence): the model
    # must invent a name and repeat it, as requests that name nothing ask (evaluate.sample_case
    # with invent; by default it shows a name where the document first shows it outside holes).
    # Other template rows leave such later mentions visible. A recorded run without this key reads as 0.
    invent_prob: float = 0.0
    max_pad_budget: int = 12  # extra positions (target pad) after a hole's content
    # Share of holes whose pad tail may run to long_pad_budget positions or the content's own
    # length: people leave generous max_tokens, and a model that only ever saw short pad
    # tails keeps writing to fill a long budget.
    long_pad_prob: float = 0.5
    long_pad_budget: int = 36
    # Share of hole rows masked as the sampler leaves a hole part-way (mask_hole_tails): a
    # written start, the rest of the budget masked. A recorded run without this key reads as 0.
    ordered_hole_prob: float = 0.0
    # Hole rows tokenize locked text before a hole as documents do (a blank line before a hole
    # is "\n", "\n", as before a word), which is how a Canvas tokenizes it. False tokenizes that
    # text on its own ("\n\n", one token); a recorded run without this key reads as False.
    document_boundaries: bool = True
    # Holes that start a line or a JSON string value are tokenized with a virtual leading
    # space (ModelConfig.virtual_spaces), so the model writes " Joshua", not "Jos", "hua".
    # A recorded run without this key reads as False.
    virtual_spaces: bool = False
    # Every line start and JSON string value is encoded with a virtual space, locked text too
    # (ModelConfig.spaced_lines); implies virtual_spaces. A recorded run without this key reads as False.
    spaced_lines: bool = False
    min_t: float = 1e-3  # t ~ U(min_t, 1): 1/t stays finite
    fim_rate: float = 0.9  # AR-FIM: share of rows in PSM order
    suffix_cut_prob: float = 0.5  # AR-FIM: share of FIM rows whose suffix is cut short
    # AR-FIM: show holes as their budgets of mask tokens (gpu_worker.engine.model.ModelConfig
    # .fim_hole_masks); FIM rows then hole several spans and the middle is any one of them.
    fim_hole_masks: bool = False
    d_model: int = 160
    n_layers: int = 8
    n_heads: int = 5
    ffn_hidden: int = 432
    copy_dim: int = 64  # the copy head's width (0 = none); see gpu_worker.engine.model.CopyHead
    # The room embedding's size (0 = none); see gpu_worker.engine.model.ModelConfig.room_buckets.
    # Hole rows give each hole position the positions left in its budget; uniform rows 0.
    room_buckets: int = 0
    # Whether the copy head may copy a token as its spaced or bare twin (a name from a heading
    # into a sentence); see gpu_worker.engine.model.ModelConfig.copy_twins. Needs copy_dim.
    copy_twins: bool = False
    # Whether a twin may also be copied in lower case (a name into an e-mail address); see
    # gpu_worker.engine.model.ModelConfig.copy_lower. Needs copy_twins.
    copy_lower: bool = False
    data_offset: int = 0  # steps of documents to skip: a continuation reads documents anew
    # Documents joined into one row (research.corpus.join_documents): each row joins 1 to this
    # many, drawn per row, so rows run from one document to max_len tokens and the model learns
    # positions as far apart as max_len. 1: a row is one document.
    docs_per_row: int = 1
    # Which edition of the corpus the run reads (research.corpus.CORPUS_EDITION). A recorded
    # run without this key read edition 1 (see recorded()).
    corpus_edition: int = CORPUS_EDITION
    eval_every: int = 250
    checkpoint_every: int = 100

    def __post_init__(self) -> None:
        if self.spaced_lines:  # spaced lines imply virtual spaces
            object.__setattr__(self, "virtual_spaces", True)
        if self.copy_lower and not self.copy_twins:
            raise ValueError("copy_lower needs copy_twins")
        if self.corpus_edition not in CORPUS_EDITIONS:
            raise ValueError(f"corpus_edition={self.corpus_edition} is not one of {CORPUS_EDITIONS}")


# What a setting was before it was recorded: a saved config without the key ran with this.
EARLIER_DEFAULTS: dict[str, Any] = {"corpus_edition": 1}


def recorded(cfg: dict[str, Any], key: str) -> Any:
    """A saved config's ``key``: what it holds, else the value a run recorded without it used."""
    return cfg.get(key, EARLIER_DEFAULTS.get(key))


# -- corruption -------------------------------------------------------------------------------


@dataclass
class Example:
    """One training row: inputs, targets and per-position loss weights (all length L)."""

    inputs: list[int]
    targets: list[int]
    weights: list[float]  # 0 where no loss; 1 / (t * corrupted length) on masked positions
    kind: str  # "uniform" | "holes" | "template" | "fim" | "plain"
    room: list[int] | None = None  # hole rows: model.hole_room of the budgets; None = all 0


def repeated_spans(doc: Document) -> list[int]:
    """Indices of spans whose exact text also occurs at another span of the document."""
    by_text: dict[str, list[int]] = {}
    for i, span in enumerate(doc.spans):
        if span.kind in COPY_KINDS and span.end > span.start:
            by_text.setdefault(doc.span_text(span), []).append(i)
    return [i for idxs in by_text.values() if len(idxs) > 1 for i in idxs]


def pick_holes(doc: Document, rng: random.Random, cfg: TrainConfig) -> list[Span]:
    """Non-overlapping spans to cut as holes; with ``copy_hole_prob`` the first is one
    mention of a repeated text, and no other mention of that text is cut."""
    repeated = repeated_spans(doc)
    chosen: list[Span] = []
    if repeated and rng.random() < cfg.copy_hole_prob:
        chosen.append(doc.spans[rng.choice(repeated)])
    want = len(chosen) + rng.randint(0 if chosen else 1, cfg.max_extra_holes)
    order = list(range(len(doc.spans)))
    rng.shuffle(order)
    kept_visible = {doc.span_text(span) for span in chosen}
    for i in order:
        if len(chosen) >= want:
            break
        span = doc.spans[i]
        overlaps = any(span.start <= c.end and c.start <= span.end for c in chosen)
        inside = any(c.start <= span.start and span.end <= c.end for c in chosen)
        text = doc.span_text(span)
        # A hole may not cover a mention of a text whose other mention is already a hole.
        hides_copy = any(t in text for t in kept_visible)
        if span.end > span.start and not overlaps and not inside and not hides_copy:
            chosen.append(span)
    return chosen


def template_holes(doc: Document, rng: random.Random, invent_prob: float = 0.0) -> list[Span]:
    """Holes as a drafting template cuts them (:func:`research.corpus.template_cut`), each
    taken with one probability drawn per row from 0.5 to 1; with ``invent_prob`` (per row) a
    later mention of an entity seen only inside holes so far is a hole too."""
    keep = rng.uniform(0.5, 1.0)
    invent = invent_prob > 0 and rng.random() < invent_prob  # 0: the stream as before
    return template_cut(doc, lambda: rng.random() < keep, invent=invent)


def mask_exactly(
    positions: list[int], t: float, rng: random.Random
) -> tuple[set[int], float]:
    """A random subset of round(t * n) >= 1 positions, and its loss weight 1 / (t_eff * n).

    Masking an exact count (t_eff = k / n) instead of flipping a coin per position keeps the
    1/t-weighted loss from exploding when a small t masks one token by chance; the weight is
    still 1/t of the realised mask ratio, so the objective stays the masked-diffusion ELBO.
    """
    k = min(len(positions), max(1, round(t * len(positions))))
    return set(rng.sample(positions, k)), 1.0 / k


def mask_hole_tails(
    budgets: list[tuple[int, int, int]], length: int, rng: random.Random
) -> tuple[set[int], float] | None:
    """Each hole written from its start up to a random cut, the rest of its budget masked:
    the state the sampler reaches once a hole's first tokens are committed. Every pad position
    is masked, so the model learns to end a hole from the text already in it (uniformly masked
    rows almost always show some pad, and at decoding time none is visible until it is
    written). ``budgets``: (start, content end, budget end) per hole. None: nothing to mask
    inside ``length``. Weight 1/k as :func:`mask_exactly`."""
    masked: set[int] = set()
    for start, content_end, end in budgets:
        last_cut = content_end if end > content_end else content_end - 1
        cut = rng.randint(start, max(start, last_cut))
        masked.update(range(cut, min(end, length)))
    return (masked, 1.0 / len(masked)) if masked else None


def _pad_budget(n_content: int, rng: random.Random, cfg: TrainConfig) -> int:
    """The most pad positions after a hole's ``n_content`` tokens in one training row."""
    if rng.random() < cfg.long_pad_prob:
        return max(cfg.long_pad_budget, n_content)
    return cfg.max_pad_budget


def denoiser_example(
    doc: Document, encode: Encoder, rng: random.Random, cfg: TrainConfig, mc: ModelConfig,
    *, stratum: tuple[int, int] = (0, 1),
) -> Example:  # fmt: skip
    """``stratum`` (row, rows): t is drawn from that slice of (0, 1), so a batch covers it."""
    row, rows = stratum
    t = max(cfg.min_t, (row + rng.random()) / rows)
    if rng.random() >= cfg.hole_fraction:
        ids = encode_document(encode, doc.text, spaced=cfg.spaced_lines)[: cfg.max_len]
        chosen, w = mask_exactly(list(range(len(ids))), t, rng)
        inputs = [mc.mask_id if p in chosen else x for p, x in enumerate(ids)]
        weights = [w if p in chosen else 0.0 for p in range(len(ids))]
        return Example(inputs, ids, weights, "uniform")
    template = rng.random() < cfg.template_prob
    holes = (template and template_holes(doc, rng, cfg.invent_prob)) or pick_holes(doc, rng, cfg)
    ids, ranges = tokenize_with_holes(doc, holes, encode, document_boundaries=cfg.document_boundaries,
                                      virtual_spaces=cfg.virtual_spaces,
                                      spaced_lines=cfg.spaced_lines)  # fmt: skip
    targets: list[int] = []
    in_hole: list[bool] = []
    budgets: list[tuple[int, int, int]] = []  # (start, content end, budget end) in targets
    cursor = 0
    for a, b in sorted(ranges):
        targets += ids[cursor:a]
        in_hole += [False] * (a - cursor)
        # The hole's budget: its content, then positions whose target is pad.
        content = ids[a:b] + [mc.pad_id] * rng.randint(0, _pad_budget(b - a, rng, cfg))
        budgets.append((len(targets), len(targets) + b - a, len(targets) + len(content)))
        targets += content
        in_hole += [True] * len(content)
        cursor = b
    targets += ids[cursor:]
    in_hole += [False] * (len(ids) - cursor)
    targets, in_hole = targets[: cfg.max_len], in_hole[: cfg.max_len]
    positions = [p for p, h in enumerate(in_hole) if h] or [rng.randrange(len(targets))]
    if cfg.ordered_hole_prob and rng.random() < cfg.ordered_hole_prob:
        masked, w = mask_hole_tails(budgets, len(targets), rng) or mask_exactly(positions, t, rng)
    else:
        masked, w = mask_exactly(positions, t, rng)
    weights = [w if p in masked else 0.0 for p in range(len(targets))]
    inputs = [mc.mask_id if p in masked else x for p, x in enumerate(targets)]
    room = hole_room(len(targets), [(a, b) for a, _, b in budgets]).tolist()
    return Example(inputs, targets, weights, "template" if template else "holes", room)


def fim_example(
    doc: Document, encode: Encoder, rng: random.Random, cfg: TrainConfig, mc: ModelConfig
) -> Example:
    if rng.random() >= cfg.fim_rate:
        seq = (encode_document(encode, doc.text, spaced=cfg.spaced_lines) + [mc.eos_id])
        seq = seq[: cfg.max_len + 1]
        return _next_token_example(seq, "plain")
    holes: list[Span] = []  # with hole masks a share of rows is holed as a template (runs of sentences)
    if mc.fim_hole_masks and rng.random() < cfg.template_prob:
        holes = template_holes(doc, rng)
    if not holes:
        holes = pick_holes(doc, rng, cfg)
        holes = holes if mc.fim_hole_masks else holes[:1]
    ids, ranges = tokenize_with_holes(doc, holes, encode, document_boundaries=cfg.document_boundaries,
                                      virtual_spaces=cfg.virtual_spaces,
                                      spaced_lines=cfg.spaced_lines)  # fmt: skip
    ranges = sorted(ranges)
    # The middle: with hole masks any hole, those before it already filled (as the route fills
    # them, left to right) and those after it shown as masks; else the one hole.
    middle = rng.randrange(len(ranges)) if mc.fim_hole_masks else 0
    a, b = ranges[middle]
    suffix = ids[b:]
    if mc.fim_hole_masks:
        suffix, cursor = [], b
        for c, d in ranges[middle + 1 :]:
            suffix += ids[cursor:c] + [mc.mask_id] * (d - c + rng.randint(0, _pad_budget(d - c, rng, cfg)))
            cursor = d
        suffix += ids[cursor:]
    if suffix and rng.random() < cfg.suffix_cut_prob:
        suffix = suffix[: rng.randrange(len(suffix) + 1)]
    prefix = ids[:a]
    if mc.fim_hole_masks:
        suffix = [mc.mask_id] * (b - a + rng.randint(0, _pad_budget(b - a, rng, cfg))) + suffix
        # Room for the sentinels, the middle and its EOS in a row of max_len + 1 tokens.
        prefix, suffix = fit_fim_context(prefix, suffix, cfg.max_len + 1 - 4 - (b - a))
    seq = (
        [mc.fim_prefix_id] + prefix + [mc.fim_suffix_id] + suffix + [mc.fim_middle_id]
        + ids[a:b] + [mc.eos_id]
    )  # fmt: skip
    if len(seq) > cfg.max_len + 1:  # keep the middle: cut the prefix's far end
        seq = seq[len(seq) - cfg.max_len - 1 :]
    return _next_token_example(seq, "fim")


def _next_token_example(seq: list[int], kind: str) -> Example:
    n = len(seq) - 1
    return Example(seq[:-1], seq[1:], [1.0 / n] * n, kind)


@dataclass
class Batch:
    inputs: torch.Tensor  # [B, L] long
    targets: torch.Tensor  # [B, L] long
    weights: torch.Tensor  # [B, L] float
    attention: torch.Tensor  # [B, L] bool, True = real position
    tokens: int  # real positions in the batch
    room: torch.Tensor  # [B, L] long, see model.hole_room (0 outside holes)

    def to(self, device: torch.device) -> Batch:
        if self.inputs.device == device:
            return self
        return Batch(self.inputs.to(device), self.targets.to(device), self.weights.to(device),
                     self.attention.to(device), self.tokens, self.room.to(device))  # fmt: skip


def collate(examples: list[Example], pad_id: int) -> Batch:
    length = max(len(e.inputs) for e in examples)
    b = len(examples)
    inputs = torch.full((b, length), pad_id, dtype=torch.long)
    targets = torch.full((b, length), pad_id, dtype=torch.long)
    weights = torch.zeros((b, length))
    attention = torch.zeros((b, length), dtype=torch.bool)
    room = torch.zeros((b, length), dtype=torch.long)
    for r, e in enumerate(examples):
        n = len(e.inputs)
        inputs[r, :n] = torch.tensor(e.inputs)
        targets[r, :n] = torch.tensor(e.targets)
        weights[r, :n] = torch.tensor(e.weights)
        attention[r, :n] = True
        if e.room is not None:
            room[r, :n] = torch.tensor(e.room)
    return Batch(inputs, targets, weights, attention, int(attention.sum()), room)


def make_batch(
    step: int, cfg: TrainConfig, mc: ModelConfig, tok: StencilTokenizer, *, split: str = "train"
) -> Batch:
    """The batch of ``step``: a pure function of (seed, step, config)."""
    examples = []
    for row in range(cfg.batch_size):
        index = (step + (cfg.data_offset if split == "train" else 0)) * cfg.batch_size + row
        rng = random.Random(f"{cfg.seed}:{split}:{step}:{row}")
        if cfg.docs_per_row > 1:  # the row's documents: its own run of docs_per_row indices
            count = rng.randint(1, cfg.docs_per_row)
            doc = join_documents([document_at(split, index * cfg.docs_per_row + j,  # type: ignore[arg-type]
                                              edition=cfg.corpus_edition) for j in range(count)])
        else:
            doc = document_at(split, index, edition=cfg.corpus_edition)  # type: ignore[arg-type]
        if cfg.kind == "denoiser":
            stratum = (row, cfg.batch_size)
            examples.append(denoiser_example(doc, tok.encode, rng, cfg, mc, stratum=stratum))
        else:
            examples.append(fim_example(doc, tok.encode, rng, cfg, mc))
    return collate(examples, mc.pad_id)


class StepBatches(torch.utils.data.Dataset[Batch]):
    """The batches of a run, indexed by step, for a DataLoader whose worker processes make
    them ahead of the training step (an accelerator outruns one process's Python)."""

    def __init__(self, cfg: TrainConfig, mc: ModelConfig, tok: StencilTokenizer) -> None:
        self.cfg, self.mc, self.tok = cfg, mc, tok

    def __getitem__(self, step: int) -> Batch:
        return make_batch(step, self.cfg, self.mc, self.tok)


def batch_stream(
    cfg: TrainConfig, mc: ModelConfig, tok: StencilTokenizer, *, start: int, workers: int
) -> Iterator[Batch]:
    """``make_batch(start)``, ``make_batch(start + 1)``, ...: in this process, or made by
    ``workers`` processes and handed over in step order (the same batches either way)."""
    if workers <= 0:
        yield from (make_batch(step, cfg, mc, tok) for step in itertools.count(start))
        return
    loader = torch.utils.data.DataLoader(
        StepBatches(cfg, mc, tok), batch_size=None, num_workers=workers, prefetch_factor=8,
        sampler=itertools.count(start),
    )  # fmt: skip
    yield from loader


def batch_loss(model: StencilTransformer, batch: Batch, *, bf16: bool) -> torch.Tensor:
    """Mean over rows of the weighted cross-entropy (scalar)."""
    # Padding is only ever at a row's end, so a causal model needs no key mask and a
    # bidirectional one masks the padded keys.
    batch = batch.to(next(model.parameters()).device)
    mask = None if model.config.causal else batch.attention
    with torch.autocast(batch.inputs.device.type, dtype=torch.bfloat16, enabled=bf16):
        log_probs = model.target_log_probs(batch.inputs, batch.targets, mask, batch.room)
    return -(log_probs.float() * batch.weights).sum() / batch.inputs.shape[0]


# -- the copy probe ---------------------------------------------------------------------------


@torch.no_grad()
def copy_probe(
    model: StencilTransformer, tok: StencilTokenizer, *, docs: int = 48, offset: int = 0,
    edition: int = CORPUS_EDITION,
) -> float:
    """Share of val documents whose masked first mention of a repeated entity is predicted
    exactly (one forward, argmax, hole of exactly the entity's length; denoiser only)."""
    mc = model.config
    hits = total = 0
    for index in range(offset, offset + docs):
        doc = document_at("val", index, edition=edition)
        repeated = [i for i in repeated_spans(doc) if doc.spans[i].kind == "entity"]
        if not repeated:
            continue
        first = doc.spans[min(repeated, key=lambda i: doc.spans[i].start)]
        ids, ((a, b),) = tokenize_with_holes(doc, [first], tok.encode,
                                             virtual_spaces=mc.virtual_spaces,
                                             spaced_lines=mc.spaced_lines)  # fmt: skip
        if len(ids) > mc.max_len:
            continue
        inputs = torch.tensor([ids], device=next(model.parameters()).device)
        inputs[0, a:b] = mc.mask_id
        pred = model(inputs).argmax(-1)[0, a:b]  # [b - a]
        hits += int(pred.tolist() == ids[a:b])
        total += 1
    return hits / max(1, total)


# -- the loop ---------------------------------------------------------------------------------


@dataclass
class TrainState:
    step: int = 0
    total_steps: int = 0  # fixed once (from --steps, or from --minutes after calibration)
    tokens: int = 0
    seconds: float = 0.0
    log: list[dict[str, float]] = field(default_factory=list)


BUDGET_MARGIN = 0.93  # share of --minutes planned for steps (evaluations take the rest)
RECALIBRATE_UNTIL = 0.6  # the step count is re-estimated until this share of it is done
FLOPS_CALIBRATION_STEPS = 50  # --target-flops: tokens per step measured over these (< warm-up)


def _budget_steps(state: TrainState, minutes: float, *, recalibrate: bool) -> int:
    """The step count a ``--minutes`` budget allows at the speed measured so far.

    Re-estimated every 50 steps while under 60% done (a shared CPU changes speed), then
    frozen so the learning-rate schedule can finish; cut short if the budget runs out. The
    count is recorded, and ``--steps`` with it reproduces the run exactly.
    """
    budget = minutes * 60 * BUDGET_MARGIN
    if not state.total_steps and not recalibrate:
        return 0  # still measuring the speed
    if state.seconds >= minutes * 60:
        return state.step  # out of time: this step is the last
    frozen = state.total_steps and state.step >= RECALIBRATE_UNTIL * state.total_steps
    if state.total_steps and (frozen or not recalibrate):
        return state.total_steps
    recent = state.log[-50:]
    per_step = (recent[-1]["seconds"] - recent[0]["seconds"]) / max(1, len(recent) - 1)
    return max(state.step + 1, int(state.step + (budget - state.seconds) / max(per_step, 1e-6)))


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine)


def model_config(cfg: TrainConfig, tok: StencilTokenizer) -> ModelConfig:
    s = tok.special
    return ModelConfig(
        kind=cfg.kind, vocab_size=tok.vocab_size, pad_id=s.pad, eos_id=s.eos, mask_id=s.mask,
        fim_prefix_id=s.fim_prefix, fim_suffix_id=s.fim_suffix, fim_middle_id=s.fim_middle,
        d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
        ffn_hidden=cfg.ffn_hidden, max_len=cfg.max_len + 1, copy_dim=cfg.copy_dim,
        room_buckets=cfg.room_buckets, copy_twins=cfg.copy_twins, copy_lower=cfg.copy_lower,
        virtual_spaces=cfg.virtual_spaces, spaced_lines=cfg.spaced_lines,
        fim_hole_masks=cfg.fim_hole_masks,
        extra={"corpus": f"research.corpus train split, edition {cfg.corpus_edition}",
               "seed": cfg.seed},
    )  # fmt: skip


def _run_record(cfg: TrainConfig, init_from: Path | None) -> dict[str, Any]:
    """What makes a run the same run: its config and the weights it started from."""
    start = None
    if init_from is not None:
        start = file_sha256(init_from / "model.safetensors")
    return {"config": json.loads(json.dumps(asdict(cfg))), "init_from_sha256": start}


def _save_checkpoint(
    path: Path, model: StencilTransformer, opt: torch.optim.Optimizer, state: TrainState,
    run: dict[str, Any],
) -> None:  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "state": asdict(state),
                "run": run}, tmp)  # fmt: skip
    tmp.replace(path)


def _check_same_run(checkpoint: Path, saved: dict[str, Any], run: dict[str, Any]) -> None:
    """A checkpoint resumes only the run that wrote it: another config or other starting
    weights (the next phase of a model, say) would silently continue the wrong run. A
    checkpoint from before runs were recorded resumes as it did."""
    before = saved.get("run")
    if before is None or before == run:
        return
    changed = sorted(k for k in run["config"] if recorded(before["config"], k) != run["config"][k])
    if before.get("init_from_sha256") != run["init_from_sha256"]:
        changed.append("the --init-from weights")
    if not changed:  # a recorded run without a setting used the value it reads as
        return
    raise ValueError(
        f"{checkpoint} holds another training run (it differs in {', '.join(changed)}); "
        "delete it, or pass --checkpoint with a new path for this run"
    )


def train(
    cfg: TrainConfig,
    tok: StencilTokenizer,
    *,
    checkpoint: Path,
    steps: int | None = None,
    minutes: float | None = None,
    bf16: bool = True,
    progress: bool = True,
    probe_docs: int = 48,
    max_new_steps: int | None = None,
    init_from: Path | None = None,
    device: str = "cpu",
    workers: int = 0,
    target_flops: float | None = None,
    prior_flops: float = 0.0,
) -> tuple[StencilTransformer, TrainState]:
    """Train (or resume from ``checkpoint``) until the step budget is spent, or for at most
    ``max_new_steps`` steps in this call (the checkpoint then resumes the same run).

    ``init_from``: a model directory whose weights start a fresh run (a continuation of an
    earlier model with new modules, such as the copy head, initialised from the seed).
    ``target_flops``: the step count is set so the model's whole chain (``prior_flops`` for
    the phases before this one) reaches this compute; it is fixed from the tokens of the first
    ``FLOPS_CALIBRATION_STEPS`` steps, before warm-up ends, so ``--steps`` reproduces it.
    ``minutes`` with it is a cap. ``workers``: processes that make batches ahead (see
    batch_stream); ``device``: where the model trains (the returned model is on the CPU)."""
    from tqdm import tqdm

    if steps is None and minutes is None and target_flops is None:
        raise ValueError("give steps, minutes or target_flops")
    if tok.spaced_lines != cfg.spaced_lines:  # rows are made with tok.encode
        raise ValueError(f"the tokenizer's spaced_lines={tok.spaced_lines} is not the "
                         f"config's {cfg.spaced_lines}")  # fmt: skip
    mc = model_config(cfg, tok)
    torch.manual_seed(cfg.seed)  # weight init only; data and corruption use their own seeds
    model = StencilTransformer(mc)
    set_copy_tables(model, tok)  # an earlier model without them gets them here
    if init_from is not None and not checkpoint.is_file():
        load_initial_weights(model, init_from)
    model.to(device)
    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay
    )
    state = TrainState(total_steps=steps or 0)
    run = _run_record(cfg, init_from)
    if checkpoint.is_file():
        saved = torch.load(checkpoint, weights_only=False, map_location=device)
        _check_same_run(checkpoint, saved, run)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        state = TrainState(**saved["state"])
        if steps is not None:
            state.total_steps = steps
    flops_per_token = count_flops_per_token(mc, cfg.max_len // 2)
    bar = tqdm(total=state.total_steps or None, initial=state.step, disable=not progress,
               desc=f"train {cfg.kind}", unit="step",
               mininterval=1.0 if sys.stderr.isatty() else 30.0)  # fmt: skip
    first_step = state.step
    first_tokens = state.tokens
    batches = batch_stream(cfg, mc, tok, start=state.step, workers=workers)
    while state.total_steps == 0 or state.step < state.total_steps:
        if max_new_steps is not None and state.step - first_step >= max_new_steps:
            _save_checkpoint(checkpoint, model, opt, state, run)
            break
        t0 = time.time()
        model.train()
        batch = next(batches)  # batch_loss moves it to the model's device
        for group in opt.param_groups:
            group["lr"] = lr_at(state.step, max(state.total_steps, 1), cfg)
        loss = batch_loss(model, batch, bf16=bf16)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        state.step += 1
        state.tokens += batch.tokens
        state.seconds += time.time() - t0
        entry = {"step": state.step, "tokens": state.tokens, "loss": loss.item(),
                 "seconds": state.seconds}  # fmt: skip
        if target_flops is not None and steps is None:
            if state.step - first_step == FLOPS_CALIBRATION_STEPS and not state.total_steps:
                per_step = (state.tokens - first_tokens) / FLOPS_CALIBRATION_STEPS * flops_per_token
                left = target_flops - prior_flops - state.tokens * flops_per_token
                state.total_steps = state.step + max(1, math.ceil(left / per_step))
            if minutes is not None and state.seconds >= minutes * 60 and state.total_steps:
                print(f"time cap: stopped at step {state.step} of {state.total_steps}",
                      file=sys.stderr)  # fmt: skip
                state.total_steps = state.step
            bar.total = state.total_steps or None
        elif minutes is not None and steps is None:
            state.total_steps = _budget_steps(state, minutes, recalibrate=state.step % 50 == 20)
            bar.total = state.total_steps
        if state.total_steps and (state.step % cfg.eval_every == 0 or state.step == state.total_steps):
            model.eval()
            if cfg.kind == "denoiser":
                entry["copy_probe"] = copy_probe(model, tok, docs=probe_docs, edition=cfg.corpus_edition)
            entry["val_loss"] = float(validation_loss(model, tok, cfg, mc, bf16=bf16))
        state.log.append(entry)
        bar.update(1)
        bar.set_postfix(loss=f"{entry['loss']:.3f}", tok=state.tokens, refresh=False)
        if state.step % cfg.checkpoint_every == 0 or state.step == state.total_steps:
            _save_checkpoint(checkpoint, model, opt, state, run)
    bar.close()
    del batches  # stops the batch workers
    state.log[-1]["flops"] = float(state.tokens * flops_per_token)
    return model.cpu().eval(), state


def set_copy_tables(model: StencilTransformer, tok: StencilTokenizer) -> None:
    """The copy head's twin tables, functions of the tokenizer: the space twins (copy_twins)
    and the lower-case twins (copy_lower), where the model's config has them."""
    if model.config.copy_twins:
        model.copy.set_twins(*tok.space_twins())
    if model.config.copy_lower:
        model.copy.set_lower_twins(*tok.case_twins())


def load_initial_weights(model: StencilTransformer, directory: Path) -> list[str]:
    """Copy a saved model's weights into ``model``; returns the names it did not have (new
    modules keep their seeded initialisation). Any other mismatch is an error."""
    result = model.load_state_dict(load_weights(directory), strict=False)
    new = [k for k in result.missing_keys if not k.startswith(("copy.", "room."))]
    if result.unexpected_keys or new:
        raise ValueError(
            f"{directory} does not fit this architecture: unexpected {result.unexpected_keys}, "
            f"missing {new}"
        )
    return list(result.missing_keys)


@torch.no_grad()
def validation_loss(
    model: StencilTransformer, tok: StencilTokenizer, cfg: TrainConfig, mc: ModelConfig,
    *, bf16: bool, batches: int = 2,
) -> float:  # fmt: skip
    """Mean training objective on fixed val batches (same corruption recipe)."""
    losses = [
        float(batch_loss(model, make_batch(s, cfg, mc, tok, split="val"), bf16=bf16))
        for s in range(batches)
    ]
    return sum(losses) / len(losses)


# -- artifacts --------------------------------------------------------------------------------


def plot_curve(log: list[dict[str, float]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    tokens = [e["tokens"] / 1e6 for e in log]
    ax.plot(tokens, [e["loss"] for e in log], lw=0.6, alpha=0.5, label="train loss")
    val = [(e["tokens"] / 1e6, e["val_loss"]) for e in log if "val_loss" in e]
    if val:
        ax.plot(*zip(*val, strict=True), "o-", label="val loss")
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("loss")
    ax.set_ylim(0, min(8.0, max(e["loss"] for e in log)))
    probe = [(e["tokens"] / 1e6, e["copy_probe"]) for e in log if "copy_probe" in e]
    if probe:
        ax2 = ax.twinx()
        ax2.plot(*zip(*probe, strict=True), "s--", color="tab:red", label="copy probe (val)")
        ax2.set_ylabel("entity copy exact match")
        ax2.set_ylim(0, 1)
        ax2.legend(loc="upper center")
    ax.legend(loc="upper right")
    ax.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_sha256sums(models_root: Path) -> Path:
    """models/SHA256SUMS over every file of every shipped model directory."""
    lines = []
    for path in sorted(models_root.rglob("*")):
        if path.is_file() and path.name != "SHA256SUMS":
            lines.append(f"{file_sha256(path)}  {path.relative_to(models_root).as_posix()}")
    out = models_root / "SHA256SUMS"
    out.write_text("\n".join(lines) + "\n")
    return out


def training_summary(
    cfg: TrainConfig, model: StencilTransformer, state: TrainState
) -> dict[str, Any]:
    last = state.log[-1]
    vals = [e for e in state.log if "val_loss" in e]
    tail = state.log[-50:]
    return {
        "kind": cfg.kind,
        "parameters": model.num_parameters(),
        "steps": state.step,
        "tokens": state.tokens,
        "flops": last.get("flops", float(state.tokens * count_flops_per_token(model.config, cfg.max_len // 2))),
        "train_seconds": round(state.seconds, 1),
        "tokens_per_second": round(state.tokens / max(state.seconds, 1e-9), 1),
        "final_train_loss": round(sum(e["loss"] for e in tail) / len(tail), 4),
        "final_val_loss": round(vals[-1]["val_loss"], 4) if vals else None,
        "final_copy_probe": vals[-1].get("copy_probe") if vals else None,
        "config": asdict(cfg),
    }  # fmt: skip


def render_model_card(
    out: Path, summary: dict[str, Any], metrics: dict[str, dict[str, float]] | None = None
) -> str:
    """MODEL_CARD.md text: data, size, compute, metrics (from the evaluation, when run), limits."""
    cfg = summary["config"]
    kind = summary["kind"]
    objective = (
        "masked diffusion: t ~ U(0,1), cross-entropy on masked positions weighted by 1/t; "
        f"{cfg['hole_fraction']:.0%} of rows corrupt hole-shaped spans (one mention of a "
        "repeated entity with another left visible, field values, sentences) with a pad budget "
        f"of up to {cfg['max_pad_budget']} positions"
        + (
            f" ({cfg['long_pad_prob']:.0%} of holes: up to {cfg['long_pad_budget']} or the "
            "content's length, whichever is more)"
            if cfg.get("long_pad_prob")
            else ""
        )
        + (
            f"; {cfg['template_prob']:.0%} of hole rows cut like a template (most sentences, "
            "choices, JSON values and later mentions at once)"
            if cfg.get("template_prob")
            else ""
        )
        + (
            f", {cfg['invent_prob']:.0%} of those also holing every later mention of an "
            "entity named only inside holes (the model invents the name and repeats it)"
            if cfg.get("invent_prob")
            else ""
        )
        + (
            f"; {cfg['ordered_hole_prob']:.0%} of hole rows show each hole's start written and "
            "mask the rest of its budget, pad included (the state the sampler leaves a hole in)"
            if cfg.get("ordered_hole_prob")
            else ""
        )
        + ", the rest mask uniformly"
        if kind == "denoiser"
        else "next-token cross-entropy; "
        f"{cfg['fim_rate']:.0%} of rows in fill-in-the-middle PSM order with hole-shaped middles, "
        f"{cfg['suffix_cut_prob']:.0%} of those with the suffix cut short"
        + ("; the hole and every later one shown as its budget of mask tokens "
           "(`ModelConfig.fim_hole_masks`)" if cfg.get("fim_hole_masks") else "")
    )
    lines = [
        f"# {out.name}",
        "",
        f"Stencil {'masked-diffusion denoiser (bidirectional)' if kind == 'denoiser' else 'AR-FIM baseline (causal, fill-in-the-middle)'}.",
        "",
        "## Data",
        "Synthetic drafting documents from `research.corpus` (train split: seeds from 0, shared",
        "phrase variants only): referral letters, discharge summaries, incident reports, NDA clauses,",
        "invoices, job offers, meeting minutes, JSON records. Values from Faker (MIT licence), prose",
        "from hand-written phrase banks (`research/phrases.py`). Generated on the fly; no document",
        f"is seen twice. {_editions_sentence(summary)} Tokenizer: {_tokenizer_sentence(out, summary)}",
        "",
        "## Size and compute",
        "| | |",
        "|---|---|",
        f"| parameters | {summary['parameters']:,} |",
        f"| layers / d_model / heads / SwiGLU width | {cfg['n_layers']} / {cfg['d_model']} / {cfg['n_heads']} / {cfg['ffn_hidden']} |",
        f"| objective | {objective} |",
        "| output | vocabulary softmax mixed with the copy head's pointer over the sequence's own "
        "tokens (`gpu_worker.engine.model.CopyHead`), returned as log-probabilities |"
        if cfg.get("copy_dim")
        else "| output | vocabulary softmax (logits) |",
        *_compute_rows(summary),
        f"| final train / val loss | {summary['final_train_loss']} / {summary['final_val_loss']} |",
        "| weights | bf16 safetensors |",
        "",
        _reproduce_line(out, summary),
    ]
    if summary.get("final_copy_probe") is not None:
        lines += ["", f"Copy probe at the end of training (first mention of a repeated entity "
                  f"masked, one forward, val split): {summary['final_copy_probe']:.2f} exact."]  # fmt: skip
    lines += ["", "## Metrics (test split, `python -m research.evaluate`)"]
    if metrics:
        lines += ["| hole kind | exact match | token acc. | valid | locked kept | nats/token |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for hole_kind, m in metrics.items():
            lines.append(
                f"| {hole_kind} | {m['exact_match']:.2f} | {m['token_accuracy']:.2f} | "
                f"{m['validity']:.2f} | {m['locked_preserved']:.2f} | {m['nll_per_token']:.2f} |"
            )
        lines.append("")
        lines.append("Full table, both models side by side: `bench/eval/REPORT.md`.")
    else:
        lines.append("Not evaluated yet.")
    lines += [
        "",
        "## Limits",
        "- Trained only on eight synthetic document kinds in English; it knows their phrasing, not",
        "  the world. Clinical and legal text it writes is template-like and not reviewed by experts.",
        f"- Small ({summary['parameters'] / 1e6:.1f}M parameters, {_training_time(summary)}"
        "): it can invent names, dates and amounts; copying an entity from elsewhere in",
        "  the document is imperfect, and it sometimes cuts a name short or runs past its end",
        "  (see the metrics and `bench/eval/SAMPLES.md`).",
        "- Free prose is weak: sentences mostly keep to the document's kind, but they repeat names",
        "  and phrases and now and then borrow from another kind. Use it for fields and short",
        "  spans; review every sentence it writes.",
        "- Arithmetic (an invoice total) is not computed, only guessed from context.",
        "- Output is provisional until a person accepts it.",
        "",
    ]
    return "\n".join(lines)


def training_phases(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs behind a model, oldest first: a continuation (``--init-from``) records the
    summary it started from, so the chain adds up to the compute of what ships."""
    earlier = (summary.get("init_from") or {}).get("training")
    return [*(training_phases(earlier) if earlier else []), summary]


def chain_flops(summary: dict[str, Any]) -> float:
    """The training compute of a model's whole chain of phases (FLOPs)."""
    return float(sum(p["flops"] for p in training_phases(summary)))


def _training_time(summary: dict[str, Any]) -> str:
    """'7.4 hours of CPU training', with the accelerator's minutes beside it where any ran."""
    phases = training_phases(summary)
    cpu = sum(p["train_seconds"] for p in phases if "device_name" not in p)
    text = f"{cpu / 3600:.1f} hours of CPU training"
    for name in sorted({p["device_name"] for p in phases if "device_name" in p}):
        seconds = sum(p["train_seconds"] for p in phases if p.get("device_name") == name)
        text += f" and {seconds / 60:.1f} minutes on one {name}"
    return text


def _compute_rows(summary: dict[str, Any]) -> list[str]:
    phases = training_phases(summary)
    cfg = summary["config"]
    rows = []
    for n, phase in enumerate(phases, 1):
        head = f"phase {n}: " if len(phases) > 1 else ""
        copy = phase["config"].get("copy_dim", 0)
        where = f"{phase.get('threads', 1)} CPU thread(s)"
        if "device_name" in phase:
            where = f"one {phase['device_name']} ({phase['device']})"
        joined = phase["config"].get("docs_per_row", 1)
        rows_are = (f", rows of up to {phase['config'].get('max_len', 320):,} tokens"
                    f"{f' joining up to {joined} documents' if joined > 1 else ''}")  # fmt: skip
        rows += [
            f"| {head}steps x batch | {phase['steps']:,} x {phase['config']['batch_size']}"
            f"{f' (copy head {copy}' if copy else ' (no copy head'}{rows_are}) |",
            f"| {head}training tokens | {phase['tokens']:,} |",
            f"| {head}wall time | {phase['train_seconds'] / 60:.1f} min on {where}, "
            f"{phase.get('precision', 'bf16 autocast')}, "
            f"{phase['tokens_per_second']:,.0f} tokens/s |",
        ]
    flops = chain_flops(summary)
    rows += [
        f"| training tokens, all phases | {sum(p['tokens'] for p in phases):,} |",
        f"| training compute, all phases | {flops:.3g} FLOPs (6N + attention per token) |",
        f"| context | {cfg.get('max_len', 320) + 1:,} tokens ("
        + ("a longer canvas is filled window by window, `gpu_worker.engine.window`) |"
           if summary.get("kind") == "denoiser" else "the AR route refuses a longer canvas) |"),
        f"| copy head | {cfg.get('copy_dim', 0) or 'none'} |",
        f"| room embedding | {cfg['room_buckets']} buckets: positions left in the hole's budget "
        "(`ModelConfig.room_buckets`) |"
        if cfg.get("room_buckets")
        else "| room embedding | none |",
        "| copy twins | yes: a token may be copied as its spaced or bare twin "
        "(`ModelConfig.copy_twins`) |"
        if cfg.get("copy_twins")
        else "| copy twins | no |",
        "| lower-case twins | yes: a twin may be copied in lower case, a name into an e-mail "
        "address (`ModelConfig.copy_lower`) |"
        if cfg.get("copy_lower")
        else "| lower-case twins | no |",
        "| virtual spaces | yes: a hole that starts a line or a JSON string value is written "
        "with a leading space, then stripped (`ModelConfig.virtual_spaces`) |"
        if cfg.get("virtual_spaces")
        else "| virtual spaces | no |",
        "| spaced lines | yes: every line start and JSON string value is encoded with a virtual "
        "space, locked text too, then stripped (`ModelConfig.spaced_lines`) |"
        if cfg.get("spaced_lines")
        else "| spaced lines | no |",
    ]
    return rows


def _editions_sentence(summary: dict[str, Any]) -> str:
    """Which corpus edition (``research.corpus.CORPUS_EDITION``) each phase read."""
    editions = [recorded(p["config"], "corpus_edition") for p in training_phases(summary)]
    if len(set(editions)) == 1:
        return f"Corpus edition {editions[0]}."
    parts, first = [], 1
    for edition, run in itertools.groupby(editions):
        last = first + len(list(run)) - 1
        parts.append(f"edition {edition} in " + (f"phase {first}" if first == last else f"phases {first}-{last}"))
        first = last + 1
    return f"Corpus: {', '.join(parts)} (`research.corpus.CORPUS_EDITION`)."


def _last_transplant(summary: dict[str, Any]) -> dict[str, Any] | None:
    moves = [p["vocabulary_transplant"] for p in training_phases(summary) if "vocabulary_transplant" in p]
    return moves[-1] if moves else None


def _tokenizer_sentence(out: Path, summary: dict[str, Any]) -> str:
    """The card's word on the vocabulary the weights read: its size and hash as saved beside
    them (how it was learned is not recorded; the Reproduce line gives the command)."""
    saved = out / "tokenizer.json"
    size = json.loads((out / "config.json").read_text())["vocab_size"]
    text = f"byte-level BPE learned from train documents, {size:,} tokens"
    moved = _last_transplant(summary)
    if moved is not None and moved.get("extends_source"):
        text = (f"byte-level BPE learned from train documents, with every e-mail name word of "
                f"the corpus made one token (`--kind tokenizer --extend`), {size:,} tokens")  # fmt: skip
    if saved.is_file():
        text += f" (`tokenizer.json`, sha256 {file_sha256(saved)[:12]}…)"
    if moved is not None:
        text += (f"; the weights moved onto it from a {moved['source_vocab_size']:,}-token "
                 "vocabulary (`python -m research.train --transplant`) and trained on")  # fmt: skip
    return text + "."


def _edition_flag(cfg: dict[str, Any]) -> str:
    """The command-line flag that makes a run read the corpus edition ``cfg`` read."""
    edition = recorded(cfg, "corpus_edition")
    return f" --corpus-edition {edition}" if edition != CORPUS_EDITION else ""


def _tokenizer_command(moved: dict[str, Any], cfg: dict[str, Any], path: str, source: str) -> str:
    if moved.get("extends_source"):  # the source's vocabulary with the e-mail name words
        return f"python -m research.train --kind tokenizer --extend {source} --out {path}"
    size = f" --vocab-size {moved['vocab_size']}" if moved["vocab_size"] != VOCAB_SIZE else ""
    spaced = " --spaced-lines" if cfg.get("spaced_lines") else ""
    return (f"python -m research.train --kind tokenizer{spaced}{size}{_edition_flag(cfg)} "
            f"--out {path}")  # fmt: skip


ARCHITECTURE_FLAGS = (("d_model", "--d-model"), ("n_layers", "--layers"), ("n_heads", "--heads"),
                      ("ffn_hidden", "--ffn"))  # fmt: skip


def reproduce_commands(out: Path, summary: dict[str, Any]) -> list[str]:
    """The shell commands that rebuild ``out``'s weights into ``models/<out.name>``, in order,
    from the repository root (``scripts/reproduce-model`` runs them): the first vocabulary,
    one command per training run (a resumed run re-plans its cosine schedule for the new step
    count, so the runs repeat as they ran, each ``--init-from`` run on its own checkpoint), and
    where the weights moved onto another vocabulary, that vocabulary (checked against its
    recorded sha256) and the move."""
    first = _edition_flag(training_phases(summary)[0]["config"])  # the first vocabulary's corpus
    commands = [f"python -m research.train --kind tokenizer{first}"]
    vocabulary: str | None = None
    for n, phase in enumerate(training_phases(summary)):
        cfg = phase["config"]
        command = f"python -m research.train --kind {phase['kind']} --out models/{out.name}"
        for key, flag in ARCHITECTURE_FLAGS:
            if cfg.get(key, getattr(TrainConfig, key)) != getattr(TrainConfig, key):
                command += f" {flag} {cfg[key]}"
        command += f" --seed {cfg['seed']} --copy-dim {cfg.get('copy_dim', 0)}"
        if cfg.get("room_buckets"):
            command += f" --room-buckets {cfg['room_buckets']}"
        if cfg.get("copy_twins"):
            command += " --copy-twins"
        if cfg.get("copy_lower"):
            command += " --copy-lower"
        if cfg.get("fim_hole_masks"):
            command += " --fim-hole-masks"
        if cfg.get("lr", TrainConfig.lr) != TrainConfig.lr:
            command += f" --lr {cfg['lr']}"
        if phase.get("precision", "").startswith("fp32"):
            command += " --no-bf16"
        if phase["kind"] == "denoiser":  # a corruption share missing from cfg ran at 0
            for key in ("long_pad_prob", "template_prob", "ordered_hole_prob", "invent_prob"):
                value = cfg.get(key, 0.0)
                if value != getattr(TrainConfig, key):
                    command += f" --{key.replace('_', '-')} {value}"
        if not cfg.get("document_boundaries", False):
            command += " --segment-boundaries"
        if cfg.get("spaced_lines"):
            command += " --spaced-lines"
        elif cfg.get("virtual_spaces"):
            command += " --virtual-spaces"
        command += _edition_flag(cfg)
        if n:  # a run of its own: its own checkpoint (a checkpoint resumes only its own run)
            command += (f" --init-from models/{out.name}"
                        f" --checkpoint var/train/{out.name}/phase-{n + 1}.pt")  # fmt: skip
        if cfg["batch_size"] != TrainConfig.batch_size:
            command += f" --batch-size {cfg['batch_size']}"
        if cfg.get("max_len", TrainConfig.max_len) != TrainConfig.max_len:
            command += f" --max-len {cfg['max_len']}"
        if cfg.get("docs_per_row", 1) != 1:
            command += f" --docs-per-row {cfg['docs_per_row']}"
        if "device" in phase:
            command += f" --device {phase['device']}"
        if vocabulary is not None:  # runs after a move read the vocabulary moved onto
            command += f" --tokenizer {vocabulary}"
        resumes = phase.get("phases") or [phase["steps"]]
        commands += [f"{command} --steps {steps}" for steps in resumes]
        moved = phase.get("vocabulary_transplant")
        if moved:  # then the weights moved onto another vocabulary
            source = vocabulary or str(DEFAULT_TOKENIZER)
            vocabulary = f"var/tokenizer/{moved['tokenizer_sha256'][:12]}.json"
            commands += [
                _tokenizer_command(moved, cfg, vocabulary, source),
                f"echo '{moved['tokenizer_sha256']}  {vocabulary}' | sha256sum --check",
                f"python -m research.train --transplant models/{out.name} "
                f"--tokenizer {vocabulary} --out models/{out.name}",
            ]
    return commands


def _reproduce_line(out: Path, summary: dict[str, Any]) -> str:
    """The card's one line on rebuilding the weights (the commands: :func:`reproduce_commands`)."""
    runs = sum(len(p.get("phases") or [p["steps"]]) for p in training_phases(summary))
    return (f"Reproduce: `scripts/reproduce-model models/{out.name}` ({runs} training "
            f"run{'s' if runs > 1 else ''} from `training.json`; `--dry-run` lists the commands).")  # fmt: skip


def write_model_card(
    out: Path, summary: dict[str, Any], metrics: dict[str, dict[str, float]] | None = None
) -> None:
    (out / "MODEL_CARD.md").write_text(render_model_card(out, summary, metrics))


def tokenizer_texts(
    docs: int, *, spaced: bool = False, edition: int = CORPUS_EDITION
) -> Iterator[str]:
    """What the BPE merges are learned from: the first ``docs`` train documents (of the
    corpus's ``edition``), each cut at every span boundary (see :func:`tokenizer_pieces`)."""
    for i in range(docs):
        yield from tokenizer_pieces(document_at("train", i, edition=edition), spaced=spaced)


def tokenizer_pieces(doc: Document, *, spaced: bool = False) -> list[str]:
    """``doc`` cut at every span boundary. ``spaced``: the pieces as a tokenizer with spaced
    lines reads the document (joined, they are its first line's virtual space and its
    ``spaced_text``), so a word that starts a line is learned with its space (" Dear"), as
    such a model sees it."""
    pieces = document_pieces(doc)
    if not spaced:
        return pieces
    out, tail = [], ""  # tail: the document so far, as far back as spaced_text looks
    for n, piece in enumerate(pieces):
        lead = document_lead(piece, spaced=True) if n == 0 else ""
        out.append(lead + spaced_text(tail + piece)[len(spaced_text(tail)) :])
        tail = (tail + piece)[-16:]
    return out


def train_tokenizer(
    out: Path, *, docs: int = TOKENIZER_DOCS, vocab_size: int = VOCAB_SIZE, spaced: bool = False,
    edition: int = CORPUS_EDITION,
) -> StencilTokenizer:
    """A byte-level BPE vocabulary of ``vocab_size`` learned from :func:`tokenizer_texts`,
    saved to ``out``."""
    texts = tokenizer_texts(docs, spaced=spaced, edition=edition)
    tok = StencilTokenizer.train(texts, vocab_size=vocab_size)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(out)
    return tok


def transplant_vocabulary(source: Path, tokenizer: Path, out: Path) -> dict[str, Any]:
    """``source``'s model moved onto the vocabulary in ``tokenizer``, written to ``out``
    (weights, config, the tokenizer, and ``training.json``: the source's, with a
    ``vocabulary_transplant`` record, so the chain's compute still adds up). Returns that record.

    The transformer, copy head and room embedding keep their weights. A new token's input
    embedding is the mean of the embeddings of the source tokens that spell it, and its output
    row is that of the first of them (the source's score for the word's start); special tokens
    keep theirs, at the ids every Stencil vocabulary gives them. The copy head's twin table is
    the new vocabulary's. A continuation (``--init-from out`` with ``--tokenizer``) then trains
    the model on its new tokens. Tokenization rules (virtual spaces, spaced lines) stay the
    source's."""
    from gpu_worker.engine.model import load_model

    if not (source / "training.json").is_file():
        raise ValueError(f"{source} has no training.json: a transplant continues a Stencil "
                         "model's chain of phases")  # fmt: skip
    summary = json.loads((source / "training.json").read_text())
    source_sha256 = file_sha256(source / "model.safetensors")  # before ``out`` may replace it
    old = load_model(source)
    oc = old.config
    rules = {"virtual_spaces": oc.virtual_spaces, "spaced_lines": oc.spaced_lines}
    before = StencilTokenizer.from_file(source / "tokenizer.json", **rules)
    after = StencilTokenizer.from_file(tokenizer, **rules)
    if after.special != before.special:
        raise ValueError(f"{tokenizer} gives the special tokens other ids ({after.special}) "
                         f"than {source} ({before.special})")  # fmt: skip
    mc = replace(oc, vocab_size=after.vocab_size)
    model = StencilTransformer(mc)
    state = {k: v for k, v in old.state_dict().items()
             if k not in ("embed.weight", "head.weight", "copy.twins", "copy.lower_twins")}  # fmt: skip
    model.load_state_dict(state, strict=False)
    set_copy_tables(model, after)
    embed, head = old.embed.weight.detach(), old.head.weight.detach()
    with torch.no_grad():
        for i in range(after.vocab_size):
            if after.is_special(i):
                model.embed.weight[i], model.head.weight[i] = embed[i], head[i]
                continue
            # the source's BPE on the token's byte-level spelling (a lone byte of a character too)
            pieces = [t.id for t in before.tok.model.tokenize(after.tok.id_to_token(i))]
            model.embed.weight[i] = embed[pieces].mean(0)
            model.head.weight[i] = head[pieces[0]]
    save_model_dir(model, out, dtype=torch.float32)  # a starting point, not a shipped model
    if tokenizer.resolve() != (out / "tokenizer.json").resolve():
        shutil.copyfile(tokenizer, out / "tokenizer.json")
    record = {"tokenizer_sha256": file_sha256(out / "tokenizer.json"),
              "vocab_size": after.vocab_size, "source_vocab_size": before.vocab_size,
              "source_weights_sha256": source_sha256}  # fmt: skip
    if extends(after, before):
        record["extends_source"] = True
    summary["vocabulary_transplant"] = record
    (out / "training.json").write_text(json.dumps(summary, indent=1) + "\n")
    return record


def extends(after: StencilTokenizer, before: StencilTokenizer) -> bool:
    """Whether ``after`` is ``before`` with tokens added (:meth:`StencilTokenizer.with_words`):
    every token of ``before`` at its id, and its merges first, in order."""
    old, new = (json.loads(t.tok.to_str())["model"] for t in (before, after))
    return (after.vocab_size > before.vocab_size
            and all(new["vocab"].get(text) == i for text, i in old["vocab"].items())
            and new["merges"][: len(old["merges"])] == old["merges"])  # fmt: skip


def extend_tokenizer(source: Path, out: Path) -> tuple[StencilTokenizer, int]:
    """``source``'s vocabulary with every e-mail name word of the corpus one token
    (:func:`research.corpus.email_name_words`), saved to ``out``; and how many it added."""
    tok, added = StencilTokenizer.from_file(source).with_words(email_name_words())
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(out)
    return tok, added


def _config_of(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    return dict(json.loads(path.read_text())) if path.is_file() else {}


def _previous_training(directory: Path) -> dict[str, Any]:
    """What a continuation starts from: the earlier model's weights hash and its training
    summary (its own ``init_from`` chain included), so the model card can add up the compute."""
    record: dict[str, Any] = {"weights_sha256": file_sha256(directory / "model.safetensors")}
    summary_path = directory / "training.json"
    if summary_path.is_file():
        earlier = json.loads(summary_path.read_text())
        earlier.pop("log", None)
        record["training"] = earlier
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Train a Stencil tokenizer or model.")
    parser.add_argument("--kind", choices=["tokenizer", "denoiser", "ar_fim"])
    parser.add_argument("--card", type=Path, metavar="DIR",
                        help="only rewrite DIR's model card and loss curve from its "
                             "training.json (weights trained elsewhere, such as scripts/train-gpu)")
    parser.add_argument("--out", type=Path, help="model directory (or tokenizer.json path)")
    parser.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE,
                        help="tokenizer: the vocabulary's size, special tokens included")
    parser.add_argument("--tokenizer-docs", type=int, default=TOKENIZER_DOCS,
                        help="tokenizer: train documents the merges are learned from")
    parser.add_argument("--extend", type=Path, metavar="TOKENIZER",
                        help="with --kind tokenizer: TOKENIZER's vocabulary with each e-mail "
                             "name word of the corpus one token (see extend_tokenizer)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--minutes", type=float, help="wall-clock budget (fixes the step count)")
    parser.add_argument("--steps", type=int, help="exact step count (overrides --minutes)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="where to train: cpu or cuda")
    parser.add_argument("--workers", type=int, default=0,
                        help="processes that make batches ahead of the step (0 = none)")
    parser.add_argument("--target-flops", type=float,
                        help="train until the model's whole chain of phases reaches this many "
                             "FLOPs (the step count is fixed after 50 steps; --minutes caps it)")
    parser.add_argument("--checkpoint-every", type=int, default=TrainConfig.checkpoint_every)
    parser.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
    parser.add_argument("--max-len", type=int, default=TrainConfig.max_len,
                        help="the longest training row in tokens (the model reads one more)")
    parser.add_argument("--docs-per-row", type=int, default=TrainConfig.docs_per_row,
                        help="join up to this many documents into a row (see TrainConfig)")
    parser.add_argument("--d-model", type=int, default=TrainConfig.d_model)
    parser.add_argument("--layers", type=int, default=TrainConfig.n_layers)
    parser.add_argument("--heads", type=int, default=TrainConfig.n_heads)
    parser.add_argument("--ffn", type=int, default=TrainConfig.ffn_hidden)
    parser.add_argument("--copy-dim", type=int, default=TrainConfig.copy_dim)
    parser.add_argument("--room-buckets", type=int, default=TrainConfig.room_buckets,
                        help="denoiser: the room embedding's size (0 = none; see ModelConfig)")
    parser.add_argument("--copy-twins", action="store_true",
                        help="the copy head may copy a token as its spaced or bare twin")
    parser.add_argument("--copy-lower", action="store_true",
                        help="a twin may be copied in lower case (needs --copy-twins)")
    parser.add_argument("--fim-hole-masks", action="store_true",
                        help="AR-FIM: show each hole as its budget of mask tokens in the prompt")
    parser.add_argument("--lr", type=float, default=TrainConfig.lr,
                        help="peak learning rate (warm-up, then cosine decay to a tenth)")
    parser.add_argument("--eval-every", type=int, default=TrainConfig.eval_every)
    parser.add_argument("--long-pad-prob", type=float, default=TrainConfig.long_pad_prob,
                        help="denoiser: share of holes with a long pad tail (see TrainConfig)")
    parser.add_argument("--ordered-hole-prob", type=float, default=TrainConfig.ordered_hole_prob,
                        help="denoiser: share of hole rows with a written start and a masked "
                             "tail (see mask_hole_tails)")  # fmt: skip
    parser.add_argument("--invent-prob", type=float, default=TrainConfig.invent_prob,
                        help="denoiser: share of template rows that hole names shown only in holes")
    parser.add_argument("--template-prob", type=float, default=TrainConfig.template_prob,
                        help="denoiser: share of hole rows cut like a template")
    parser.add_argument("--corpus-edition", type=int, choices=CORPUS_EDITIONS, default=CORPUS_EDITION,
                        help="the corpus edition the model or tokenizer learns from (see "
                             "research.corpus.CORPUS_EDITION; the default is the current one)")
    parser.add_argument("--no-bf16", action="store_true", help="train in float32")
    parser.add_argument("--segment-boundaries", action="store_true",
                        help="hole rows tokenize locked text before a hole on its own "
                             "(how phases before TrainConfig.document_boundaries ran)")  # fmt: skip
    parser.add_argument("--virtual-spaces", action="store_true",
                        help="holes that start a line or a JSON string value are written "
                             "with a virtual leading space (see ModelConfig.virtual_spaces)")
    parser.add_argument("--spaced-lines", action="store_true",
                        help="every line start and JSON string value, locked text too, is "
                             "encoded with a virtual space (see ModelConfig.spaced_lines); "
                             "implies --virtual-spaces; a tokenizer learns its merges from "
                             "text so spaced")
    parser.add_argument("--checkpoint", type=Path, help="default var/train/<out name>/ckpt.pt")
    parser.add_argument("--init-from", type=Path,
                        help="start from this model directory's weights (new modules seeded)")
    parser.add_argument("--transplant", type=Path, metavar="DIR",
                        help="only move DIR's model onto the --tokenizer vocabulary, into --out "
                             "(continue it with --init-from; see transplant_vocabulary)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.card is not None:
        summary = json.loads((args.card / "training.json").read_text())
        plot_curve(summary.pop("log"), args.card / "loss_curve.png", f"{args.card.name}: training")
        write_model_card(args.card, summary)
        write_sha256sums(args.card.parent)
        print(f"{args.card / 'MODEL_CARD.md'}: {len(training_phases(summary))} phases")
        return
    if args.transplant is not None:
        if args.out is None:
            parser.error("--transplant needs --out")
        record = transplant_vocabulary(args.transplant, args.tokenizer, args.out)
        print(f"{args.transplant} -> {args.out}: {record['source_vocab_size']:,} -> "
              f"{record['vocab_size']:,} tokens")  # fmt: skip
        return
    if args.kind is None:
        parser.error("--kind is required (or --card DIR, or --transplant DIR)")
    if args.copy_lower and not args.copy_twins:
        parser.error("--copy-lower needs --copy-twins")
    if args.extend is not None:
        if args.kind != "tokenizer" or args.out is None:
            parser.error("--extend goes with --kind tokenizer and --out")
        extended, added = extend_tokenizer(args.extend, args.out)
        print(f"tokenizer: {args.extend} + {added} tokens = {extended.vocab_size} -> {args.out} "
              f"(sha256 {file_sha256(args.out)})")  # fmt: skip
        return
    if args.kind == "tokenizer":
        target: Path = args.out or args.tokenizer
        trained = train_tokenizer(target, docs=args.tokenizer_docs, vocab_size=args.vocab_size,
                                  spaced=args.spaced_lines, edition=args.corpus_edition)  # fmt: skip
        print(f"tokenizer: {trained.vocab_size} tokens -> {target} (sha256 {file_sha256(target)})")
        return
    if args.out is None:
        parser.error("--out is required for a model")
    if args.minutes is None and args.steps is None and args.target_flops is None:
        parser.error("give --minutes, --steps or --target-flops")
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 training: TF32 matmuls
        torch.backends.cudnn.allow_tf32 = True
    tok = StencilTokenizer.from_file(args.tokenizer, spaced_lines=args.spaced_lines)
    cfg = TrainConfig(
        kind=args.kind, seed=args.seed, batch_size=args.batch_size, max_len=args.max_len,
        docs_per_row=args.docs_per_row, d_model=args.d_model,
        n_layers=args.layers, n_heads=args.heads, ffn_hidden=args.ffn, copy_dim=args.copy_dim,
        room_buckets=args.room_buckets, copy_twins=args.copy_twins, copy_lower=args.copy_lower,
        fim_hole_masks=args.fim_hole_masks, lr=args.lr, eval_every=args.eval_every,
        long_pad_prob=args.long_pad_prob,
        template_prob=args.template_prob, ordered_hole_prob=args.ordered_hole_prob,
        invent_prob=args.invent_prob, checkpoint_every=args.checkpoint_every,
        document_boundaries=not args.segment_boundaries,
        virtual_spaces=args.virtual_spaces, spaced_lines=args.spaced_lines,
        corpus_edition=args.corpus_edition,
    )  # fmt: skip
    checkpoint = args.checkpoint or Path("var/train") / args.out.name / "ckpt.pt"
    if args.init_from:  # a later phase may add a tokenization rule, never drop one
        before = _config_of(args.init_from)
        for flag, key in (("--virtual-spaces", "virtual_spaces"), ("--spaced-lines", "spaced_lines")):
            if before.get(key) and not getattr(cfg, key):
                parser.error(f"{args.init_from} was trained with {flag}: pass it again "
                             "(a phase without it would tokenize text another way)")  # fmt: skip
    previous = _previous_training(args.init_from) if args.init_from else None
    if previous is not None and "training" in previous:
        seen = max(p["config"].get("data_offset", 0) + p["steps"]
                   for p in training_phases(previous["training"]))  # fmt: skip
        cfg = replace(cfg, data_offset=seen)
    prior_flops = 0.0
    if previous is not None and "training" in previous:
        prior_flops = chain_flops(previous["training"])
    model, state = train(
        cfg, tok, checkpoint=checkpoint, steps=args.steps, minutes=args.minutes,
        bf16=not args.no_bf16, init_from=args.init_from, device=args.device,
        workers=args.workers, target_flops=args.target_flops, prior_flops=prior_flops,
    )  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    save_model_dir(model, out, dtype=torch.bfloat16)
    shutil.copyfile(args.tokenizer, out / "tokenizer.json")
    plot_curve(state.log, out / "loss_curve.png", f"{out.name}: training")
    summary = training_summary(cfg, model, state)
    summary["precision"] = "fp32" if args.no_bf16 else "bf16 autocast"
    summary["threads"] = args.threads
    if args.device != "cpu":
        summary["device"] = args.device
        summary["device_name"] = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
        if args.no_bf16 and args.device.startswith("cuda"):
            summary["precision"] = "fp32 (TF32 matmuls)"
    if previous is not None:
        summary["init_from"] = previous
    (out / "training.json").write_text(json.dumps({**summary, "log": state.log}, indent=1) + "\n")
    write_model_card(out, summary)
    write_sha256sums(out.parent)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
