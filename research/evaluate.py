"""Evaluate the denoiser and the AR-FIM baseline side by side on the corpus's test split.

``python -m research.evaluate`` cuts holes of known kinds into test documents (held-out
seeds, every phrase variant including the held-out ones) and fills them with both routes:

- ``entity_right``: the first mention of a repeated entity; the copy is only on its right;
- ``entity_left``: a later mention; a copy is on its left;
- ``sentence``: a whole free sentence;
- ``number_date``: a number, amount or date, with its format as a pattern constraint;
- ``choice``: a value from a list (a choices constraint);
- ``json_value``: a value of a JSON record, constrained by its property's schema.

Every case also has a second hole, a sentence elsewhere in the document, as a drafting
template has several holes. ``entity_right_single`` repeats the ``entity_right`` cases with
the target hole alone, so the AR route sees the whole right context too.

``--split val`` runs the same on the validation split: choose sampler settings and training
phases there, and report only the test split.

Metrics per hole kind: exact match, token accuracy, validity against the constraint,
locked-span preservation (the document's locked text byte-identical), and the per-token
negative ELBO (denoiser) / NLL (AR-FIM) of the true fill. Each case also records where its
hole starts, where its text also stands outside the holes (left, only right, nowhere: the
holes the right context decides, of every kind) and whether a held-out phrase variant wrote
it; the report tables exact match by each. 400 cases per kind by default (about 40 minutes
on one thread; ``--kinds`` splits a run, each kind scores the same alone). Writes
``bench/eval/results.json``, ``bench/eval/REPORT.md`` and ``bench/eval/exact_match.png``;
``python bench/compare_eval.py --routes bench/eval/results.json`` pairs the two models case
by case with 95% intervals.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from gpu_worker.engine.backends import load_backend
from gpu_worker.engine.constraints import JSON_STRING_BODY, integer_schema_pattern
from gpu_worker.engine.loaded import LoadedModel
from gpu_worker.engine.model import StencilTransformer, hole_room
from gpu_worker.engine.tokenizer import opens_line_or_value
from research.corpus import (
    DOCUMENT_SEPARATOR,
    SPACE_PREFIX,
    Document,
    Span,
    Split,
    document_at,
    join_documents,
    pattern_is_held_out,
    template_cut,
    tokenize_with_holes,
)

HOLE_KINDS = (
    "entity_right", "entity_left", "sentence", "number_date", "choice", "json_value",
    "entity_right_single",
)  # fmt: skip
CASE_SEED = 1234  # picks spans inside the documents
ELBO_SAMPLES = 8  # stratified mask ratios per negative-ELBO estimate
MAX_DOCS_SCANNED = 4000  # documents searched for cases of one kind
SPLIT_NAMES = {"test": "Test split (held-out seeds and phrase variants)",
               "val": "Validation split", "train": "Train split"}  # fmt: skip


@dataclass(frozen=True)
class HoleSpec:
    name: str
    kind: str  # the hole kind it is scored under
    span: Span
    target: str
    max_tokens: int
    constraint: dict[str, Any] | None


@dataclass(frozen=True)
class Case:
    """One evaluation request: a test document with holes (the first one is the target)."""

    kind: str
    doc: Document
    holes: tuple[HoleSpec, ...]

    def request(self, seed: int = 0) -> dict[str, Any]:
        """Canvas JSON: locked text between the holes."""
        segments: list[dict[str, Any]] = []
        cursor = 0
        for hole in sorted(self.holes, key=lambda h: h.span.start):
            segments.append({"text": self.doc.text[cursor : hole.span.start]})
            seg: dict[str, Any] = {"hole": hole.name, "max_tokens": hole.max_tokens}
            if hole.constraint is not None:
                seg["constraint"] = hole.constraint
            segments.append(seg)
            cursor = hole.span.end
        segments.append({"text": self.doc.text[cursor:]})
        return {"segments": [s for s in segments if s.get("text", None) != ""], "seed": seed}


# -- building cases -------------------------------------------------------------------------------
def _json_constraint(span: Span) -> dict[str, Any]:
    """A pattern / choices constraint equivalent to a JSON property's schema."""
    schema = json.loads(span.schema_json or "{}")
    if "enum" in schema:
        return {"choices": list(schema["enum"])}
    if schema.get("type") == "boolean":
        return {"choices": ["true", "false"]}
    if schema.get("type") == "integer":
        return {"pattern": integer_schema_pattern(schema)}
    if "pattern" in schema:
        return {"pattern": schema["pattern"]}
    return {"pattern": f"{JSON_STRING_BODY}{{{int(schema.get('minLength', 0))},}}"}


def _constraint(span: Span, kind: str) -> dict[str, Any] | None:
    if kind == "json_value":
        return _json_constraint(span)
    if kind == "choice" and span.choices is not None:
        return {"choices": list(span.choices)}
    if kind == "number_date" and span.pattern is not None:
        return {"pattern": span.pattern}
    return None


def _candidates(doc: Document, kind: str) -> list[Span]:
    texts = [doc.span_text(s) for s in doc.spans]

    def mentions(span: Span) -> list[Span]:
        text = doc.span_text(span)
        return [s for s, t in zip(doc.spans, texts, strict=True) if t == text and s.kind == "entity"]

    if kind in ("entity_right", "entity_right_single"):
        return [s for s in doc.spans if s.kind == "entity" and len(mentions(s)) > 1
                and min(m.start for m in mentions(s)) == s.start]  # fmt: skip
    if kind == "entity_left":
        return [s for s in doc.spans if s.kind == "entity" and len(mentions(s)) > 1
                and min(m.start for m in mentions(s)) < s.start]  # fmt: skip
    if kind == "sentence":
        return [s for s in doc.spans if s.kind == "sentence"]
    if kind == "number_date":
        return [s for s in doc.spans if s.kind in ("number", "date") and s.pattern]
    if kind == "choice":
        return [s for s in doc.spans if s.kind == "choice"]
    if kind == "json_value":
        return [s for s in doc.spans if s.kind == "json_value"]
    raise ValueError(f"hole kind {kind!r} is not one of {HOLE_KINDS}")


def _budget(n_tokens: int) -> int:
    """A hole's max_tokens: room to spare, as a person would leave (the tail becomes pad)."""
    return n_tokens + max(3, n_tokens // 2)


def _hole(name: str, kind: str, doc: Document, span: Span, encode: Callable[[str], list[int]]) -> HoleSpec:
    target = doc.span_text(span)
    n = len(encode(SPACE_PREFIX + target)) if doc.text[span.start - 1 : span.start] == SPACE_PREFIX else len(encode(target))
    return HoleSpec(name, kind, span, target, _budget(n), _constraint(span, kind))


STARTS = {"line": "a line (or the document)", "value": "a JSON string value",
          "inside": "inside a line"}  # fmt: skip


def hole_start(doc: Document, span: Span) -> str:
    """Where a hole starts (a key of STARTS): a line's byte-level BPE tokens are bare
    ("Jos", "hua"), inside a line a word carries its space (" Joshua"); see
    ``ModelConfig.virtual_spaces``."""
    before = doc.text[: span.start]
    if not before or before.endswith("\n"):
        return "line"
    return "value" if opens_line_or_value(before) else "inside"


PHRASES = {"seen": "a phrase variant training reads", "held_out": "a phrase variant held out for test",
           "layout": "layout (a header line, a JSON value)"}  # fmt: skip


def phrase_class(doc: Document, span: Span) -> str:
    """Which of PHRASES wrote ``span``: a phrase variant training also reads, one held out
    for the test split (``corpus.pattern_is_held_out``), or layout (a header line, a JSON value)."""
    pattern = doc.pattern_at(span)
    if pattern is None:
        return "layout"
    return "held_out" if pattern_is_held_out(doc.kind, pattern) else "seen"


COPIES = {"left": "on its left", "right": "only on its right", "none": "nowhere else"}


def copy_side(case: Case) -> str:
    """Where the target's text also stands, as a whole word run, in what the model is shown
    (one of COPIES): on its left (whatever is on its right), only on its right (a hole the
    right context decides, of any hole kind: a date or a choice repeated later, not only an
    entity), or nowhere."""
    target = case.holes[0]
    word = re.compile(r"(?<!\w)" + re.escape(target.target) + r"(?!\w)")
    others = sorted((h.span.start, h.span.end) for h in case.holes[1:])

    def shown(a: int, b: int) -> str:  # the document's text in [a, b) outside the other holes
        pieces, cursor = [], a
        for start, end in others:
            if a <= start and end <= b:
                pieces.append(case.doc.text[cursor:start])
                cursor = end
        return "\n".join(pieces + [case.doc.text[cursor:b]])

    if word.search(shown(0, target.span.start)):
        return "left"
    return "right" if word.search(shown(target.span.end, len(case.doc.text))) else "none"


# Case fields the report groups exact match by: (column header, {value: row title}).
TABLED = {"starts": ("hole starts", STARTS), "copy": ("its text also stands", COPIES),
          "phrase": ("written by", PHRASES)}  # fmt: skip


def _second_hole(doc: Document, target: Span, rng: random.Random) -> Span | None:
    """A sentence away from the target that hides no mention of the target's text."""
    text = doc.span_text(target)
    options = [
        s for s in doc.spans
        if s.kind == "sentence" and (s.end < target.start or s.start > target.end)
        and text not in doc.span_text(s)
    ]  # fmt: skip
    return rng.choice(options) if options else None


def build_cases(
    kind: str, count: int, encode: Callable[[str], list[int]], *, split: Split = "test"
) -> list[Case]:
    """``count`` cases of ``kind`` from ``split`` (deterministic)."""
    cases: list[Case] = []
    for index in range(MAX_DOCS_SCANNED):
        if len(cases) >= count:
            break
        doc = document_at(split, index)
        rng = random.Random(f"{CASE_SEED}:{kind.removesuffix('_single')}:{index}")
        options = _candidates(doc, kind)
        if not options:
            continue
        holes = [_hole(name, scored, doc, span, encode)
                 for name, scored, span in _cut(doc, kind, options, rng)]  # fmt: skip
        cases.append(Case(kind, doc, tuple(holes)))
    return cases


def _cut(doc: Document, kind: str, options: list[Span], rng: random.Random) -> list[tuple[str, str, Span]]:
    """A case's holes in ``doc``: (name, scored kind, span) of the target, drawn from
    ``options`` (its candidates of ``kind``), and, but for ``entity_right_single``, a second
    sentence."""
    target = rng.choice(options)
    cut = [("target", kind, target)]
    second = _second_hole(doc, target, rng)
    if kind != "entity_right_single" and second is not None:
        cut.append(("other", "sentence_extra", second))
    return cut


def build_long_cases(
    kind: str, count: int, encode: Callable[[str], list[int]], *, tokens: int,
    split: Split = "test",
) -> list[Case]:  # fmt: skip
    """``count`` cases of ``kind`` on long canvases: consecutive documents of ``split`` joined
    (:func:`research.corpus.join_documents`) while the text stays within ``tokens`` tokens.
    The target and the second hole are cut as :func:`build_cases` cuts them, in one document
    of the row drawn at random (the copies an entity hole needs stand in that document)."""
    cases: list[Case] = []
    index = 0
    while len(cases) < count and index < MAX_DOCS_SCANNED:
        docs = [document_at(split, index)]
        used = len(encode(docs[0].text))
        while True:
            following = document_at(split, index + len(docs))
            more = len(encode(DOCUMENT_SEPARATOR + following.text))
            if used + more > tokens:
                break
            docs.append(following)
            used += more
        rng = random.Random(f"{CASE_SEED}:long:{kind.removesuffix('_single')}:{index}")
        index += len(docs)
        order = list(range(len(docs)))
        rng.shuffle(order)
        found = next(((i, c) for i in order if (c := _candidates(docs[i], kind))), None)
        if found is None:
            continue
        at, options = found
        joined = join_documents(docs)
        before = sum(len(d.spans) for d in docs[:at])  # joined.spans: each document's in turn
        holes = [_hole(name, scored, joined, joined.spans[before + docs[at].spans.index(span)], encode)
                 for name, scored, span in _cut(docs[at], kind, options, rng)]  # fmt: skip
        cases.append(Case(kind, joined, tuple(holes)))
    return cases


# -- scoring ------------------------------------------------------------------------------------------
def locked_preserved(case: Case, document: str, holes: dict[str, str]) -> bool:
    """Whether every locked segment sits byte-identical in ``document`` around the holes."""
    cursor = 0
    for seg in case.request()["segments"]:
        if "text" in seg:
            if document[cursor : cursor + len(seg["text"])] != seg["text"]:
                return False
            cursor += len(seg["text"])
        else:
            cursor += len(holes.get(seg["hole"], ""))
    return cursor == len(document)


def is_valid(hole: HoleSpec, text: str) -> bool:
    """The fill satisfies the hole's constraint (free holes: any non-empty text)."""
    if not text.strip():
        return False
    c = hole.constraint
    if c is None:
        return True
    if "choices" in c:
        return text in c["choices"]
    if hole.kind == "json_value":
        import jsonschema

        schema = json.loads(hole.span.schema_json or "{}")
        value: Any = text
        if schema.get("type") in ("integer", "boolean"):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                return False
        return jsonschema.Draft202012Validator(schema).is_valid(value)
    return re.fullmatch(c["pattern"], text, flags=re.ASCII) is not None


def token_accuracy(pred: str, target: str, encode: Callable[[str], list[int]]) -> float:
    want, got = encode(target), encode(pred)
    return sum(a == b for a, b in zip(want, got, strict=False)) / max(1, len(want))


@torch.no_grad()
def denoiser_nelbo(loaded: LoadedModel, case: Case, generator: torch.Generator) -> float:
    """Per-token negative ELBO (nats) of the target hole's true fill (content then pad to its
    budget) given the locked text, the other hole fully masked; per content token + 1."""
    net = loaded.network
    assert isinstance(net, StencilTransformer)
    cfg = net.config
    tok = loaded.tokenizer
    spans = [h.span for h in case.holes]
    ids, ranges = tokenize_with_holes(case.doc, spans, tok.encode,
                                      virtual_spaces=tok.virtual_spaces,
                                      spaced_lines=tok.spaced_lines)  # fmt: skip
    row: list[int] = []
    region: list[int] = []  # positions of the target's budget
    n_content = 0  # the target's true tokens
    budgets: list[tuple[int, int]] = []  # every hole's (start, end) in the row
    cursor = 0
    for (a, b), hole in sorted(zip(ranges, case.holes, strict=True), key=lambda x: x[0][0]):
        row += ids[cursor:a]
        budgets.append((len(row), len(row) + hole.max_tokens))
        if hole.name == "target":
            content = ids[a:b][: hole.max_tokens]
            region = list(range(len(row), len(row) + hole.max_tokens))
            row += content + [cfg.pad_id] * (hole.max_tokens - len(content))
            n_content = len(content)
        else:
            row += [cfg.mask_id] * hole.max_tokens
        cursor = b
    row += ids[cursor:]
    truth = torch.tensor(row[: cfg.max_len])
    pos = torch.tensor([p for p in region if p < cfg.max_len])
    k, n = ELBO_SAMPLES, len(pos)
    t = (torch.arange(k) + torch.rand(k, generator=generator)) / k  # [K] stratified in (0, 1)
    # Mask exactly round(t * n) >= 1 positions and weight by 1 / t_eff = n / count, as training
    # does: a coin per position can mask one token at t = 0.001 and weigh it 1000 times.
    count = (t * n).round().clamp(1, n)  # [K]
    ranks = torch.rand(k, n, generator=generator).argsort(-1).argsort(-1)  # [K, n] a permutation
    draws = ranks < count[:, None]  # [K, n]
    t = count / n
    inputs = truth.repeat(k, 1)  # [K, L]
    masked = torch.zeros_like(inputs, dtype=torch.bool)
    masked[:, pos] = draws
    inputs[masked] = cfg.mask_id
    room = hole_room(len(truth), budgets).repeat(k, 1)  # used by a model with a room embedding
    logits = net(inputs, room=room).float()  # [K, L, V]
    ce = F.cross_entropy(logits.transpose(1, 2), truth.repeat(k, 1), reduction="none")  # [K, L]
    nelbo = ((ce * masked).sum(1) / t).mean()
    return float(nelbo) / (n_content + 1)


@torch.no_grad()
def ar_nll(loaded: LoadedModel, case: Case) -> float:
    """Per-token NLL (nats) of the target's true middle and its EOS, in the AR route's prompt
    (earlier holes filled with their truth, the suffix up to the next hole, or with
    ``fim_hole_masks`` the rest of the document with this hole and the later ones as masks)."""
    net = loaded.network
    assert isinstance(net, StencilTransformer)
    cfg = net.config
    enc = loaded.tokenizer.encode
    target = next(h for h in case.holes if h.name == "target")
    later = [h.span.start for h in case.holes if h.span.start > target.span.start]
    prefix = case.doc.text[: target.span.start]
    middle = case.doc.span_text(target.span)
    if prefix.endswith(SPACE_PREFIX):
        prefix, middle = prefix[:-1], SPACE_PREFIX + middle
    else:  # the route's canvas gives such a hole a virtual space (earlier holes hold truth)
        middle = loaded.tokenizer.virtual_prefix(prefix, at_document_start=not prefix) + middle
    suffix_end = min(later) if later else len(case.doc.text)
    suffix = case.doc.text[target.span.end : suffix_end]
    if suffix.endswith(SPACE_PREFIX) and later:
        suffix = suffix[:-1]
    mid = enc(middle) + [cfg.eos_id]
    prefix = loaded.tokenizer.document_prefix(prefix) + prefix  # at the document's start
    seq = [cfg.fim_prefix_id, *enc(prefix), cfg.fim_suffix_id, *enc(suffix), cfg.fim_middle_id]
    if cfg.fim_hole_masks:  # the route's own prompt: this hole and the later ones as masks
        from gpu_worker.engine.ar import fim_prompt
        from gpu_worker.engine.canvas import parse_canvas

        rest = Case(case.kind, case.doc, tuple(h for h in case.holes if h.span.start >= target.span.start))
        canvas = parse_canvas(rest.request(), loaded.tokenizer, max_len=net.max_len, vocab_size=cfg.vocab_size)
        seq = fim_prompt(canvas, canvas.ids, 0, net)
    seq = seq[max(0, len(seq) + len(mid) - cfg.max_len) :]
    full = torch.tensor([seq + mid])
    logits = net(full[:, :-1]).float()[0, len(seq) - 1 :]  # [n+1, V]
    return float(F.cross_entropy(logits, torch.tensor(mid)))


def judged_nll(judge: LoadedModel, text: str) -> float:
    """Mean NLL per token (nats) of ``text`` read left to right by the AR model, as the plain
    rows it was trained on (no FIM sentinels, EOS last): how much a document reads like the
    corpus to it. Lower is more typical; it favours AR-FIM's own fills."""
    net = judge.network
    assert isinstance(net, StencilTransformer)
    ids = (judge.tokenizer.encode_document(text) + [net.config.eos_id])[: net.config.max_len + 1]
    with torch.no_grad():
        logits = net(torch.tensor([ids[:-1]])).float()[0]
    return float(F.cross_entropy(logits, torch.tensor(ids[1:])))


# -- running -----------------------------------------------------------------------------------------
@dataclass
class Score:
    exact: list[float] = field(default_factory=list)  # spaces at the ends aside
    strict: list[float] = field(default_factory=list)  # byte for byte, spaces counted
    token_acc: list[float] = field(default_factory=list)
    valid: list[float] = field(default_factory=list)
    locked: list[float] = field(default_factory=list)
    nll: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    passes: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        def mean(xs: list[float]) -> float:
            return round(sum(xs) / len(xs), 4) if xs else float("nan")

        return {
            "cases": len(self.exact), "exact_match": mean(self.exact),
            "exact_match_strict": mean(self.strict),
            "token_accuracy": mean(self.token_acc), "validity": mean(self.valid),
            "locked_preserved": mean(self.locked), "nll_per_token": mean(self.nll),
            "seconds_per_case": mean(self.seconds), "forward_passes": mean(self.passes),
        }  # fmt: skip


Route = Callable[[dict[str, Any]], Any]


def run_route(
    name: str, route: Route, loaded: LoadedModel, cases: list[Case],
    nll: Callable[[Case], float], records: list[dict[str, Any]],
) -> Score:  # fmt: skip
    score = Score()
    enc = loaded.tokenizer.encode
    for case in cases:
        started = time.perf_counter()
        outcome = route(case.request())
        elapsed = time.perf_counter() - started
        target = case.holes[0]
        pred = outcome.holes.get("target", "")
        score.exact.append(float(exact(pred, target.target)))
        score.strict.append(float(pred == target.target))
        score.token_acc.append(token_accuracy(pred, target.target, enc))
        score.valid.append(float(is_valid(target, pred)))
        score.locked.append(float(locked_preserved(case, outcome.document, outcome.holes)))
        score.nll.append(nll(case))
        score.seconds.append(elapsed)
        score.passes.append(float(outcome.forward_passes))
        records.append({
            "model": name, "kind": case.kind, "doc_kind": case.doc.kind, "seed": case.doc.seed,
            "target": target.target, "prediction": pred, "exact": score.exact[-1],
            "exact_strict": score.strict[-1],
            "valid": score.valid[-1], "locked_preserved": score.locked[-1],
            "holes": [h.name for h in case.holes], "starts": hole_start(case.doc, target.span),
            "phrase": phrase_class(case.doc, target.span), "copy": copy_side(case),
        })  # fmt: skip
    return score


def evaluate(
    denoiser_dir: Path, ar_dir: Path, *, per_kind: int, kinds: tuple[str, ...] = HOLE_KINDS,
    sampler: dict[str, Any] | None = None, progress: bool = True, split: Split = "test",
) -> dict[str, Any]:  # fmt: skip
    """Both models on the same cases; the results dictionary written to results.json."""
    from tqdm import tqdm

    from gpu_worker.engine.ar import infill_request_ar
    from gpu_worker.engine.infill import infill_request

    denoiser, ar = load_backend(denoiser_dir), load_backend(ar_dir)
    overrides = sampler or {}

    def diffusion(request: dict[str, Any]) -> Any:
        return infill_request(denoiser, {**request, "sampler": overrides})

    def autoregressive(request: dict[str, Any]) -> Any:
        return infill_request_ar(ar, request)

    results: dict[str, Any] = {"per_kind": {}, "cases": [], "sampler": overrides, "split": split}
    for kind in tqdm(kinds, desc="hole kinds", disable=not progress):
        cases = build_cases(kind, per_kind, denoiser.tokenizer.encode, split=split)
        # The negative ELBO's mask draws are seeded per kind: a run of some kinds scores them
        # as a run of all kinds does.
        gen = torch.Generator().manual_seed(CASE_SEED + HOLE_KINDS.index(kind))
        d = run_route("denoiser", diffusion, denoiser, cases,
                      partial(denoiser_nelbo, denoiser, generator=gen), results["cases"])  # fmt: skip
        a = run_route("ar_fim", autoregressive, ar, cases, lambda c: ar_nll(ar, c), results["cases"])
        results["per_kind"][kind] = {"denoiser": d.summary(), "ar_fim": a.summary()}
    results["models"] = {
        m.name: {"kind": m.kind, "weights_sha256": m.weights_sha256,
                 "parameters": sum(p.numel() for p in m.network.parameters())}
        for m in (denoiser, ar)
    }  # fmt: skip
    return results


# -- reporting ---------------------------------------------------------------------------------------
def markdown_table(results: dict[str, Any]) -> str:
    head = ("| hole kind | n | exact match (D / AR) | exact, spaces counted (D / AR) | "
            "token acc. (D / AR) | valid (D / AR) | locked kept (D / AR) | "
            "nats/token (D -ELBO / AR NLL) | s/case (D / AR) |")  # fmt: skip
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for kind, m in results["per_kind"].items():
        d, a = m["denoiser"], m["ar_fim"]
        em_d, em_a = f"{d['exact_match']:.2f}", f"{a['exact_match']:.2f}"
        if d["exact_match"] != a["exact_match"]:  # bold the better one
            em_d, em_a = (f"**{em_d}**", em_a) if d["exact_match"] > a["exact_match"] else (em_d, f"**{em_a}**")
        lines.append(
            f"| {kind} | {d['cases']} | {em_d} / {em_a} | "
            f"{d.get('exact_match_strict', float('nan')):.2f} / "
            f"{a.get('exact_match_strict', float('nan')):.2f} | "
            f"{d['token_accuracy']:.2f} / {a['token_accuracy']:.2f} | "
            f"{d['validity']:.2f} / {a['validity']:.2f} | "
            f"{d['locked_preserved']:.2f} / {a['locked_preserved']:.2f} | "
            f"{d['nll_per_token']:.2f} / {a['nll_per_token']:.2f} | "
            f"{d['seconds_per_case']:.2f} / {a['seconds_per_case']:.2f} |"
        )
    return "\n".join(lines)


def field_table(results: dict[str, Any], field: str) -> str:
    """Exact match over every kind's cases, grouped by a case field of TABLED; each target
    once (``entity_right_single`` repeats ``entity_right``'s targets and is left out)."""
    header, titles = TABLED[field]
    lines = [f"| {header} | n | exact match (D / AR) |", "|---|---|---|"]
    for value, title in titles.items():
        em = {}
        for model in ("denoiser", "ar_fim"):
            hits = [r["exact"] for r in results["cases"] if r["model"] == model
                    and r.get(field) == value and not r["kind"].endswith("_single")]  # fmt: skip
            em[model] = (sum(hits) / len(hits), len(hits)) if hits else (float("nan"), 0)
        if em["denoiser"][1]:
            lines.append(f"| {title} | {em['denoiser'][1]} | "
                         f"{em['denoiser'][0]:.2f} / {em['ar_fim'][0]:.2f} |")  # fmt: skip
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(results["per_kind"])
    x = range(len(kinds))
    fig, ax = plt.subplots(figsize=(9, 4))
    for offset, model in ((-0.2, "denoiser"), (0.2, "ar_fim")):
        values = [results["per_kind"][k][model]["exact_match"] for k in kinds]
        ax.bar([i + offset for i in x], values, width=0.4, label=model)
    ax.set_xticks(list(x), kinds, rotation=20, ha="right")
    ax.set_ylabel("exact match")
    ax.set_ylim(0, 1)
    split = SPLIT_NAMES[results.get("split", "test")].split(" (")[0]
    ax.set_title(f"{split}: exact match by hole kind")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cell(text: str, width: int = 60) -> str:
    """One Markdown table cell: newlines and pipes escaped, cut to ``width`` characters."""
    return text.replace("\n", "\\n").replace("|", "\\|").replace("`", "'")[:width]


def write_report(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    plot(results, out / "exact_match.png")
    examples = []
    seen: set[tuple[str, str]] = set()
    for rec in results["cases"]:
        key = (rec["kind"], rec["model"])
        if key not in seen:
            seen.add(key)
            examples.append(f"| {rec['kind']} | {rec['model']} | {rec['doc_kind']} | "
                            f"`{_cell(rec['target'])}` | `{_cell(rec['prediction'])}` |")  # fmt: skip
    split = results.get("split", "test")
    text = [
        "# Evaluation: Stencil denoiser vs AR-FIM baseline",
        "",
        f"{SPLIT_NAMES[split]}. Command: `python -m research.evaluate"
        + ("`." if split == "test" else f" --split {split}`."),
        "Each case holds the target hole plus a second hole (a sentence elsewhere), except",
        "`entity_right_single`. D = denoiser through the diffusion sampler (`gpu_worker.infill`),",
        "AR = AR-FIM route (`gpu_worker.engine.ar`). nats/token: the denoiser's negative ELBO of the",
        "true fill within its budget, the AR model's NLL of the true middle and its EOS, both per",
        "content token + 1.",
        "",
        markdown_table(results),
        "",
        f"Sampler overrides: `{json.dumps(results['sampler'])}`. Models: "
        + ", ".join(f"{k} ({v['parameters']:,} parameters)" for k, v in results["models"].items()),
        "",
        "![exact match](exact_match.png)",
        "",
        "## Exact match by where the hole starts",
        "Each table counts a target once (`entity_right_single` repeats `entity_right`'s).",
        "Byte-level BPE spells a word that starts a line or a JSON string value without its",
        "leading space, in other tokens than inside a line, unless the model writes holes there",
        "with a virtual space (`ModelConfig.virtual_spaces`) or reads all text so",
        "(`ModelConfig.spaced_lines`).",
        "",
        field_table(results, "starts"),
        "",
        "## Exact match by where the target's text also stands",
        "Outside the case's holes, as a whole word run (`copy_side`): on its left, only on its",
        "right (a hole its right context decides, of any kind: an entity, a date repeated later),",
        "or nowhere. `python bench/compare_eval.py --routes results.json` pairs the two models",
        "case by case with 95% intervals, per hole kind too.",
        "",
        field_table(results, "copy"),
        "",
        "## Exact match by the phrase that wrote the target",
        "The test split draws every phrase variant, the held-out ones too; training and val read",
        "only the others (`phrase_class`).",
        "",
        field_table(results, "phrase"),
        "",
        "## First case of each kind",
        "| hole kind | model | document | target | prediction |",
        "|---|---|---|---|---|",
        *examples,
        "",
    ]
    (out / "REPORT.md").write_text("\n".join(text))


# -- whole documents ----------------------------------------------------------------------------
def sample_case(
    doc: Document, encode: Callable[[str], list[int]], *, invent: bool = False
) -> Case:
    """A drafting request made of a whole document, holed as a template is
    (:func:`research.corpus.template_cut`, every hole taken): every sentence, choice and
    JSON value, and every later mention of an entity the document shows outside them. What a
    person types stays locked: numbers, dates, and each entity where it first stands outside a
    sentence (the parties in an NDA's signature block, which the clauses then copy). With
    ``invent`` an entity named only inside holes is holed everywhere, and the model invents it."""
    kind_of = {"entity": "entity_left", "sentence": "sentence"}
    holes = tuple(
        _hole(f"h{i}", kind_of.get(span.kind, span.kind), doc, span, encode)
        for i, span in enumerate(template_cut(doc, invent=invent))
    )
    return Case("document", doc, holes)


def write_samples(
    denoiser_dir: Path,
    out: Path,
    *,
    seed: int = 0,
    sampler: dict[str, Any] | None = None,
    ar_dir: Path | None = None,
    judge_per_kind: int = 5,
    split: Split = "test",
) -> str:
    """``SAMPLES.md``: one ``split`` document of each kind written by the denoiser (the default
    preset with ``sampler`` overrides), each hole's text marked, beside the original and, with
    ``ar_dir``, the same holes filled by AR-FIM, and a table of how typical the documents
    read over ``judge_per_kind`` documents of each kind (see :func:`judged_nll`). Returns the
    Markdown."""
    from gpu_worker.engine.ar import infill_request_ar
    from gpu_worker.engine.config import config_from_request
    from gpu_worker.engine.infill import infill_request
    from research.corpus import KINDS

    denoiser = load_backend(denoiser_dir)
    ar = load_backend(ar_dir) if ar_dir is not None and (ar_dir / "config.json").is_file() else None
    config = config_from_request(sampler or {})  # a "preset" key names the preset
    lines = ["# One document of each kind, written by the denoiser", "",
             f"Model `{denoiser.name}`, sampler `{json.dumps(sampler or {})}` over the default "
             f"preset, seed {seed}. {SPLIT_NAMES[split]}. Holes: every",
             "sentence, choice and JSON value and every later mention of an entity shown outside",
             "them; what a person types (numbers, dates, a name where it stands alone, such as a",
             "signature) stays locked (`sample_case`). Text written by a model is between ⟦ and",
             "⟧. Under each: the original and AR-FIM's fill.",
             "Command: `python -m research.evaluate --samples"
             + ("" if split == "test" else f" --split {split}")
             + (f" --sampler '{json.dumps(sampler)}'" if sampler else "")
             + ("" if out == Path("bench/eval") else f" --out {out}") + "`.", ""]  # fmt: skip
    header = len(lines)  # the judged table goes after the header, before the documents
    judged = ar is not None and judge_per_kind > 0
    table = [f"How typical the documents read: mean NLL per token (nats) of the whole text, "
             f"read left to right by AR-FIM, over {judge_per_kind} {split} documents of each kind "
             "holed as below (lower is more typical; the judge favours its own fills), and how "
             "many of their holes each model wrote exactly as the original (spaces at the ends "
             "aside): the later mentions of entities, and all holes; and the share of the words "
             f"in the holes that neither the first {LEXICON_DOCS:,} train documents nor the "
             "document's locked text spells (a word spelled from pieces, such as \"Sngineer\"; "
             "the originals' held-out phrase variants and values hold a few).", "",
             "| kind | original | denoiser | AR-FIM | entity holes exact (D / AR of n) | "
             "all holes exact (D / AR of n) | words not in the train corpus (original / D / "
             "AR) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    lexicon = train_lexicon() if judged else frozenset()
    totals = [0.0, 0.0, 0.0]
    all_counts = HoleCounts()
    for kind in KINDS:
        sums = [0.0, 0.0, 0.0]
        counts = HoleCounts()
        for n, doc in enumerate(first_of_kind(split, kind, judge_per_kind if judged else 1)):
            case = sample_case(doc, denoiser.tokenizer.encode)
            outcome = infill_request(denoiser, case.request(seed), config=config)
            fill = infill_request_ar(ar, case.request(seed), config=config) if ar is not None else None
            texts = [doc.text, _marked(doc, case, outcome.holes, marks=False)]
            if fill is not None:
                texts.append(_marked(doc, case, fill.holes, marks=False))
            nll = [judged_nll(ar, text) for text in texts] if ar is not None else []
            if judged:
                sums = [t + x / judge_per_kind for t, x in zip(sums, nll, strict=True)]
                assert fill is not None  # a judge is AR-FIM, which also fills
                counts.add(case, outcome.holes, fill.holes, lexicon)
            if n == 0:  # the first document of each kind is shown whole
                lines += _sample_lines(kind, split, doc, case, outcome, fill, nll)
        if judged:
            table.append(f"| {kind} | {sums[0]:.2f} | {sums[1]:.2f} | {sums[2]:.2f} | "
                         f"{counts.cells()} |")  # fmt: skip
            totals = [t + x / len(KINDS) for t, x in zip(totals, sums, strict=True)]
            all_counts.merge(counts)
    if judged:
        unseen = ", ".join(f"{w} ({n})" if n > 1 else w
                           for w, n in all_counts.unseen_words_d.most_common(24))  # fmt: skip
        table += [f"| **mean** | {totals[0]:.2f} | {totals[1]:.2f} | {totals[2]:.2f} | "
                  f"{all_counts.cells()} |", "",
                  f"The denoiser's words not in the train corpus, most frequent first: {unseen or 'none'}.",
                  ""]  # fmt: skip
        lines[header:header] = table
    text = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    (out / "SAMPLES.md").write_text(text)
    return text


LETTERS = re.compile(r"[A-Za-z]+")
LEXICON_DOCS = 20_000  # train documents whose words make the lexicon of the samples' table


def train_lexicon(docs: int = LEXICON_DOCS) -> frozenset[str]:
    """Every word (a run of letters) of the first ``docs`` train documents. A word a model
    writes that is not here is one it spelled itself from pieces ("Sngineer"): a held-out
    phrase variant holds a few such words too, which the originals' column counts."""
    return frozenset(w for i in range(docs) for w in LETTERS.findall(document_at("train", i).text))


def locked_text(case: Case) -> str:
    """The text of ``case``'s document outside its holes, what a model is shown."""
    cuts = sorted((h.span.start, h.span.end) for h in case.holes)
    starts = [0] + [end for _, end in cuts]
    ends = [start for start, _ in cuts] + [len(case.doc.text)]
    return "".join(case.doc.text[a:b] for a, b in zip(starts, ends, strict=True))


@dataclass
class HoleCounts:
    """Holes written exactly as the original, by the denoiser and by AR-FIM: entity holes
    (the later mentions) and all holes; and the words (runs of letters) in the holes of the
    original, the denoiser's and AR-FIM's text, with how many of them are in neither the
    lexicon (:func:`train_lexicon`) nor the document's locked text (a Faker town such as
    "Lawsonmouth" copied from the letterhead is no misspelling), the denoiser's such words
    counted by spelling."""

    entities: int = 0
    entities_d: int = 0
    entities_ar: int = 0
    holes: int = 0
    holes_d: int = 0
    holes_ar: int = 0
    words: int = 0
    words_d: int = 0
    words_ar: int = 0
    unseen: int = 0
    unseen_d: int = 0
    unseen_ar: int = 0
    unseen_words_d: Counter[str] = field(default_factory=Counter)

    def add(
        self, case: Case, denoiser: dict[str, str], ar: dict[str, str], lexicon: frozenset[str]
    ) -> None:
        shown = set(LETTERS.findall(locked_text(case)))

        def known(word: str) -> bool:
            return word in lexicon or word in shown

        for hole in case.holes:
            d, a = (exact(fills.get(hole.name, ""), hole.target) for fills in (denoiser, ar))
            self.holes += 1
            self.holes_d += d
            self.holes_ar += a
            if hole.kind == "entity_left":  # sample_case's kind for a later mention
                self.entities += 1
                self.entities_d += d
                self.entities_ar += a
            original, mine, theirs = (LETTERS.findall(text) for text in (
                hole.target, denoiser.get(hole.name, ""), ar.get(hole.name, "")))  # fmt: skip
            self.words += len(original)
            self.words_d += len(mine)
            self.words_ar += len(theirs)
            self.unseen += sum(not known(w) for w in original)
            self.unseen_d += sum(not known(w) for w in mine)
            self.unseen_ar += sum(not known(w) for w in theirs)
            self.unseen_words_d.update(w for w in mine if not known(w))

    def merge(self, other: HoleCounts) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def cells(self) -> str:
        share = " / ".join(f"{u / max(w, 1):.1%}" for u, w in (
            (self.unseen, self.words), (self.unseen_d, self.words_d),
            (self.unseen_ar, self.words_ar)))  # fmt: skip
        return (f"{self.entities_d} / {self.entities_ar} of {self.entities} | "
                f"{self.holes_d} / {self.holes_ar} of {self.holes} | {share}")  # fmt: skip


def first_of_kind(split: Split, kind: str, count: int) -> Iterator[Document]:
    """The first ``count`` documents of ``kind`` in ``split``, in order."""
    index = found = 0
    while found < count:
        doc = document_at(split, index)
        index += 1
        if doc.kind == kind:
            found += 1
            yield doc


def _sample_lines(
    kind: str, split: Split, doc: Document, case: Case, outcome: Any, fill: Any, nll: list[float]
) -> list[str]:
    """Markdown of one whole document as the denoiser fills it (``outcome``), the original and
    AR-FIM's ``fill`` (None: no AR-FIM); ``nll``: the AR-judged NLL/token of the original, the
    denoiser's text and AR-FIM's, or empty without a judge."""
    lines = [f"## {kind} ({split} seed {doc.seed})", "",
             f"{len(case.holes)} holes, {_exact_holes(case, outcome.holes)} written exactly "
             "as the original, "
             f"{outcome.forward_passes} forward passes, "
             f"{outcome.timings.get('total', 0.0):.2f} s, violations: {len(outcome.violations)}"
             + (f", AR-judged NLL/token {nll[1]:.2f} (original {nll[0]:.2f})." if nll else "."),
             "", "```text", _marked(doc, case, outcome.holes), "```", "",
             "<details><summary>original</summary>", "", "```text", doc.text, "```",
             "", "</details>", ""]  # fmt: skip
    if fill is not None:
        lines += [f"<details><summary>AR-FIM: {_exact_holes(case, fill.holes)} of "
                  f"{len(case.holes)} holes exact, "
                  f"{fill.forward_passes} forward passes, "
                  f"{fill.timings.get('total', 0.0):.2f} s, AR-judged NLL/token "
                  f"{nll[2]:.2f}</summary>", "", "```text",
                  _marked(doc, case, fill.holes), "```", "", "</details>", ""]  # fmt: skip
    return lines


def _exact_holes(case: Case, holes: dict[str, str]) -> int:
    """How many of the case's holes ``holes`` fills exactly as the original (spaces aside)."""
    return sum(exact(holes.get(h.name, ""), h.target) for h in case.holes)


def exact(text: str, target: str) -> bool:
    """A hole's text equals the original's, spaces at the ends aside."""
    return text.strip() == target.strip()


def _marked(doc: Document, case: Case, holes: dict[str, str], *, marks: bool = True) -> str:
    """The document with each hole's text from ``holes`` (between ⟦ and ⟧ with ``marks``)."""
    marked, cursor = [], 0
    left, right = ("⟦", "⟧") if marks else ("", "")
    for hole in sorted(case.holes, key=lambda h: h.span.start):
        marked += [doc.text[cursor : hole.span.start], f"{left}{holes.get(hole.name, '')}{right}"]
        cursor = hole.span.end
    marked.append(doc.text[cursor:])
    return "".join(marked)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Evaluate the denoiser and AR-FIM side by side.")
    parser.add_argument("--denoiser", type=Path, default=Path("models/stencil-denoiser"))
    parser.add_argument("--ar", type=Path, default=Path("models/stencil-ar-fim"))
    parser.add_argument("--per-kind", type=int, default=400,
                        help="cases per hole kind (400: about 40 minutes on one thread)")  # fmt: skip
    parser.add_argument("--kinds", default=",".join(HOLE_KINDS))
    parser.add_argument("--merge", type=Path, nargs="+", metavar="RESULTS",
                        help="write one report from the results.json of runs of other --kinds "
                             "(the same models, sampler and split)")
    parser.add_argument("--sampler", default="{}", help="SamplerConfig overrides as JSON")
    parser.add_argument("--out", type=Path, default=Path("bench/eval"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--split", choices=["test", "val"], default="test",
                        help="val: for choosing settings; report the test split")  # fmt: skip
    parser.add_argument("--update-model-cards", action="store_true",
                        help="write the metrics into each model's MODEL_CARD.md")  # fmt: skip
    parser.add_argument("--samples", action="store_true",
                        help="only write SAMPLES.md: one whole document of each kind")  # fmt: skip
    parser.add_argument("--judge-per-kind", type=int, default=5,
                        help="--samples: documents per kind in the AR-judged table")  # fmt: skip
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.samples:
        print(write_samples(args.denoiser, args.out, sampler=json.loads(args.sampler),
                            ar_dir=args.ar, judge_per_kind=args.judge_per_kind,
                            split=args.split))  # fmt: skip
        return
    if args.merge:
        results = merge_results([json.loads(p.read_text()) for p in args.merge])
    else:
        kinds = tuple(k for k in args.kinds.split(",") if k)
        results = evaluate(args.denoiser, args.ar, per_kind=args.per_kind, kinds=kinds,
                           sampler=json.loads(args.sampler), split=args.split)  # fmt: skip
    write_report(results, args.out)
    print(markdown_table(results))
    if args.update_model_cards:
        update_model_cards(results, {"denoiser": args.denoiser, "ar_fim": args.ar})


def merge_results(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's results from runs of disjoint ``--kinds`` (kinds in HOLE_KINDS order)."""
    first = runs[0]
    for run in runs[1:]:
        for key in ("models", "sampler", "split"):
            if run[key] != first[key]:
                raise ValueError(f"the runs differ in {key}: {first[key]!r} and {run[key]!r}")
    per_kind = {k: v for run in runs for k, v in run["per_kind"].items()}
    if len(per_kind) != sum(len(run["per_kind"]) for run in runs):
        raise ValueError("the runs share a hole kind: merge runs of disjoint --kinds")
    order = [k for k in HOLE_KINDS if k in per_kind]
    return {**first, "per_kind": {k: per_kind[k] for k in order},
            "cases": [c for k in order for run in runs for c in run["cases"] if c["kind"] == k]}


def update_model_cards(results: dict[str, Any], dirs: dict[str, Path]) -> None:
    from research.train import write_model_card, write_sha256sums

    for model, directory in dirs.items():
        summary = json.loads((directory / "training.json").read_text())
        metrics = {k: m[model] for k, m in results["per_kind"].items()}
        write_model_card(directory, summary, metrics)
    write_sha256sums(next(iter(dirs.values())).parent)


__all__ = ["HOLE_KINDS", "Case", "build_cases", "evaluate", "exact", "main"]

if __name__ == "__main__":
    main()
