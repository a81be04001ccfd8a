"""Span confidence and the domain score: fit on val, measure on test, beside the hand-written set.

    python bench/confidence/confidence_bench.py --write-models       # run, fit, write the model files, report
    python bench/confidence/confidence_bench.py --stage report         # report from saved runs

Stages: ``run`` fills the generated val/test cases (``research.evaluate.build_cases``, every
hole kind) and the hand-written documents (``bench/handwritten``) on both routes and keeps each
span's token probabilities, its text, whether it is right and the other model's judge NLL
(``bench/confidence/runs_{split}.json``); ``fit`` builds the domain profile from the train
split, chooses its threshold, the confidence signal, the isotonic curves and the low
thresholds on val, and writes ``domain_profile.json`` and ``confidence.json`` into both model
directories; ``report`` scores the test split and the hand-written test documents with what
``fit`` chose, prints the table and writes ``results.json``, ``REPORT.md`` and
``reliability.png`` here.

"Right": a hole with one answer (an entity, a number, a date, a choice, a JSON value, a
hand-written answer) is right when its text equals the answer (spaces at the ends aside). A
free hole (a sentence) is right when it equals the original, or when the *other* route's model
reads it, in its filled document, at a per-token NLL no higher than the 90th percentile of
what that model gives the original sentences on the val split: it reads as typical as the
corpus's own text. The denoiser's spans are judged by the AR-FIM model (its FIM NLL), the
AR-FIM model's by the denoiser (its negative ELBO), so that no model judges its own text (a
model's greedy text always reads as typical to itself).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

HERE = Path(__file__).resolve().parent
MODELS = {"diffusion": ROOT / "models/stencil-denoiser", "ar": ROOT / "models/stencil-ar-fim"}
KINDS = ("entity_right", "entity_left", "sentence", "number_date", "choice", "json_value")
FREE_KINDS = ("sentence", "free")
JUDGE_SEED = 0  # the denoiser judge's mask draws
JUDGE_QUANTILE = (
    0.9  # free text is right when the judge reads it as typical as this share of originals
)
PROFILE_DOCS = 3000  # train documents the domain profile reads
RIGHT_FLAGGED_BUDGET = 0.10  # on val: the low threshold flags at most this share of right spans
MARK_QUANTILE = 0.05  # tokens under this quantile of right spans' token probabilities are marked
DOMAIN_WEIGHTS = (
    0.0,
    1.0,
    2.0,
    4.0,
    8.0,
)  # tried on val: the signal minus w times the domain score
OOD_FREE_TARGET = 0.9  # the domain weight is the smallest flagging this share of val OOD free spans
HANDWRITTEN_COPIES = (
    3  # tried on val (in-sample Brier): 1 -> 0.0794 / 0.0675, 3 -> 0.0756 / 0.0668 (diffusion / ar)
)
UNFAMILIAR_LOW_BELOW = (
    0.5  # a span of an unfamiliar canvas is low unless more likely right than not
)
ELBO_PASSES = 16  # re-masked passes of a diffusion span's ELBO (bench/confidence/elbo_probe.py:
# val free sentences, mean log-prob + ELBO, AUROC 0.82 at 4 passes, 0.88 at 16)
MIN_CLASS_SPANS = 20  # a hole class with fewer val spans uses the route's pooled curve
ECE_BINS = 10


# -- running ------------------------------------------------------------------------------------
class Recorder:
    """Keeps the span tokens the engine scored last (wraps ``outcome_confidence``), and for
    the diffusion route each span's ELBO at ELBO_PASSES (``rescore.span_elbo``), for the AR
    route its re-read (``rescore.span_reread``): what the worker computes when its
    calibration's signal reads them, whatever the shipped file says."""

    def __init__(self, denoiser: Any, ar: Any) -> None:
        self.last: dict[str, Any] = {}
        self.denoiser, self.ar = denoiser, ar  # the routes' networks

    def install(self) -> None:
        import gpu_worker.engine.ar as ar
        import gpu_worker.engine.infill as infill
        from gpu_worker.engine.confidence import outcome_confidence, span_tokens
        from gpu_worker.engine.rescore import span_elbo, span_reread

        def wrapped(canvas: Any, ids: Any, probs: Any, tokenizer: Any, **kw: Any) -> Any:
            rescored = kw.get("rescored")
            if kw.get("route") == "diffusion" and rescored is None:
                rescored = span_elbo(self.denoiser, canvas, ids, passes=ELBO_PASSES)
            if kw.get("route") == "ar" and rescored is None:
                rescored = span_reread(self.ar, canvas, ids)
            self.last = {k: {"probs": t.probs, "class": t.hole_class, "rescored": t.rescored}
                         for k, t in span_tokens(canvas, ids, probs, tokenizer, rescored).items()}  # fmt: skip
            return outcome_confidence(canvas, ids, probs, tokenizer, **{**kw, "rescored": rescored})

        infill.outcome_confidence = wrapped
        ar.outcome_confidence = wrapped


def hole_ranges(request: dict[str, Any], holes: dict[str, str]) -> dict[str, tuple[int, int]]:
    """Each hole's character range in the filled document."""
    out, cursor = {}, 0
    for seg in request["segments"]:
        if "text" in seg:
            cursor += len(seg["text"])
        else:
            text = holes.get(seg["hole"], "")
            out[seg["hole"]] = (cursor, cursor + len(text))
            cursor += len(text)
    return out


def judge_nll(judge: Any, text: str, start: int, end: int) -> float:
    """The AR-FIM judge's per-token NLL of ``text[start:end]`` between its prefix and suffix."""
    from research.corpus import Document, Span
    from research.evaluate import Case, HoleSpec, ar_nll

    if end <= start:
        return float("inf")
    span = Span(start, end, "sentence", "target")
    doc = Document("judged", 0, "test", text, (span,), (), ())
    n = len(judge.tokenizer.encode(" " + text[start:end]))
    return ar_nll(
        judge,
        Case(
            "sentence", doc, (HoleSpec("target", "sentence", span, text[start:end], n + 3, None),)
        ),
    )


def denoiser_judge_nll(judge: Any, text: str, start: int, end: int) -> float:
    """The denoiser judge's per-token negative ELBO of ``text[start:end]`` in its document."""
    import torch

    from research.corpus import Document, Span
    from research.evaluate import Case, HoleSpec, denoiser_nelbo

    if end <= start:
        return float("inf")
    span = Span(start, end, "sentence", "target")
    doc = Document("judged", 0, "test", text, (span,), (), ())
    n = len(judge.tokenizer.encode(" " + text[start:end]))
    case = Case(
        "sentence", doc, (HoleSpec("target", "sentence", span, text[start:end], n + 3, None),)
    )
    return denoiser_nelbo(judge, case, torch.Generator().manual_seed(JUDGE_SEED))


JUDGES = {"ar": judge_nll, "diffusion": denoiser_judge_nll}  # the model that judges a free span
JUDGE_OF = {"diffusion": "ar", "ar": "diffusion"}  # a route's spans are judged by the other model


def run_split(split: str, per_kind: int, loaded: dict[str, Any], profile: Any, *, progress: bool,
              handwritten_only: bool = False) -> list[dict[str, Any]]:  # fmt: skip
    from bench.handwritten.load import load
    from gpu_worker.engine.run import run
    from research.evaluate import build_cases, exact

    recorder = Recorder(loaded["diffusion"].network, loaded["ar"].network)
    recorder.install()
    encode = loaded["diffusion"].tokenizer.encode
    jobs: list[dict[str, Any]] = []
    for kind in () if handwritten_only else KINDS:
        for i, case in enumerate(build_cases(kind, per_kind, encode, split=split)):  # type: ignore[arg-type]
            holes = {}
            for h in case.holes:
                hk = kind if h.name == "target" else "sentence"
                originals = ({j: JUDGES[j](loaded[j], case.doc.text, h.span.start, h.span.end)
                              for j in JUDGES} if hk in FREE_KINDS else None)  # fmt: skip
                holes[h.name] = {"kind": hk, "answer": h.target, "free": hk in FREE_KINDS,
                                 "original_nll": originals}  # fmt: skip
            jobs.append({"set": "generated", "id": f"{kind}-{i}", "doc_kind": case.doc.kind,
                         "ood": False, "request": case.request(), "holes": holes})  # fmt: skip
    for doc in load(split):
        holes = {h.name: {"kind": "answer" if h.answer else "free", "answer": h.answer,
                          "free": h.answer is None, "original_nll": None} for h in doc.holes}  # fmt: skip
        jobs.append({"set": "handwritten", "id": doc.id, "doc_kind": doc.kind, "ood": doc.domain == "ood",
                     "request": doc.request(encode), "holes": holes})  # fmt: skip
    records: list[dict[str, Any]] = []
    started = time.perf_counter()
    for j, job in enumerate(jobs):
        domain_score = profile.score([s["text"] for s in job["request"]["segments"] if "text" in s])
        for route, model in loaded.items():
            outcome = run(route, model, job["request"])
            ranges = hole_ranges(job["request"], outcome.holes)
            for name, spec in job["holes"].items():
                text = outcome.holes.get(name, "")
                right_exact = spec["answer"] is not None and exact(text, spec["answer"])
                judge = JUDGE_OF[route]
                nll = (JUDGES[judge](loaded[judge], outcome.document, *ranges[name])
                       if spec["free"] else None)  # fmt: skip
                records.append({
                    "split": split, "set": job["set"], "id": job["id"], "doc_kind": job["doc_kind"],
                    "ood": job["ood"], "route": route, "hole": name, "kind": spec["kind"],
                    "free": spec["free"], "class": recorder.last[name]["class"],
                    "probs": [round(float(p), 6) for p in recorder.last[name]["probs"]],
                    "rescored": recorder.last[name]["rescored"],
                    "text": text, "answer": spec["answer"], "exact": right_exact, "judge_nll": nll,
                    "judge": judge, "original_nll": (spec["original_nll"] or {}).get(judge),
                    "domain_score": domain_score,
                })  # fmt: skip
        if progress and j % 20 == 0:
            print(
                f"  {split}: {j + 1}/{len(jobs)} jobs, {time.perf_counter() - started:.0f}s",
                flush=True,
            )
    return records


# -- measuring ----------------------------------------------------------------------------------
def auroc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """Area under the ROC curve (ties count half); nan when one class is empty."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return float("nan")
    ranked = sorted([(s, 1) for s in pos] + [(s, 0) for s in neg])
    rank_sum, i = 0.0, 0
    while i < len(ranked):
        j = i
        while j < len(ranked) and ranked[j][0] == ranked[i][0]:
            j += 1
        mid = (i + j + 1) / 2  # 1-based mean rank of the tie group
        rank_sum += mid * sum(r[1] for r in ranked[i:j])
        i = j
    return (rank_sum - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg))


def ece(
    ps: Sequence[float], labels: Sequence[bool], bins: int = ECE_BINS
) -> tuple[float, list[dict[str, float]]]:
    """Expected calibration error over equal-width bins, and the bins (reliability diagram)."""
    table = []
    total = 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        idx = [i for i, p in enumerate(ps) if lo <= p < hi or (b == bins - 1 and p == 1.0)]
        if not idx:
            continue
        conf = sum(ps[i] for i in idx) / len(idx)
        acc = sum(bool(labels[i]) for i in idx) / len(idx)
        total += len(idx) / len(ps) * abs(conf - acc)
        table.append({"lo": lo, "hi": hi, "n": len(idx), "confidence": conf, "accuracy": acc})
    return total, table


def label(record: dict[str, Any], judge_bar: dict[str, float]) -> bool:
    if record["answer"] is not None and record["exact"]:
        return True
    if record["free"]:
        nll = record["judge_nll"]
        return nll is not None and math.isfinite(nll) and nll <= judge_bar[record["judge"]]
    return False


def quantile(xs: Sequence[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(math.ceil(q * len(xs))) - 1))] if xs else float("nan")


# -- fitting ------------------------------------------------------------------------------------
def fit(val: list[dict[str, Any]], unfamiliar_above: float | None = None) -> dict[str, Any]:
    """Choose on val: the judge's bar, each route's signal, curves, thresholds, mark level."""
    from gpu_worker.engine.confidence import (
        HOLE_CLASSES,
        RESCORE_READS,
        RESCORED_SIGNALS,
        SIGNALS,
        RouteCalibration,
        SpanTokens,
        hole_confidence,
        span_signal,
    )

    judge_bar = {}
    for judge in JUDGES:  # each judge's bar: the originals it reads (a route's spans, the other's)
        originals = [
            r["original_nll"] for r in val if r["original_nll"] is not None and r["judge"] == judge
        ]
        judge_bar[judge] = round(quantile(originals, JUDGE_QUANTILE), 6)
    routes: dict[str, RouteCalibration] = {}
    chosen: dict[str, Any] = {}
    for route in MODELS:
        rows = [r for r in val if r["route"] == route and r["probs"]]
        labels = [label(r, judge_bar) for r in rows]
        generated = [i for i, r in enumerate(rows) if r["set"] == "generated"]
        # 1. The signal: the best AUROC on the generated val spans (the corpus's own kinds),
        #    the route's and each hole class's own; the ELBO ones where the route has it.
        names = tuple(SIGNALS) + tuple(n for n in RESCORED_SIGNALS
                                       if all(RESCORE_READS[n] in (r.get("rescored") or {}) for r in rows))  # fmt: skip

        def sig(name: str, i: int, rows: list[dict[str, Any]] = rows) -> float:
            return span_signal(name, rows[i]["probs"], rows[i].get("rescored"))

        trials = {name: round(auroc([sig(name, i) for i in generated],
                                    [labels[i] for i in generated]), 4) for name in names}  # fmt: skip
        signal = max(trials, key=lambda k: trials[k])
        signals, class_trials = {}, {}
        for cls in HOLE_CLASSES:
            idx = [i for i in generated if rows[i]["class"] == cls]
            class_trials[cls] = {name: round(auroc([sig(name, i) for i in idx],
                                                   [labels[i] for i in idx]), 4) for name in names}  # fmt: skip
            best = max(class_trials[cls], key=lambda k: _or_zero(class_trials[cls][k]))
            if _or_zero(class_trials[cls][best]) > _or_zero(class_trials[cls][signal]):
                signals[cls] = best  # kept only where it beats the route's signal on val
        # 2. The domain weight: the one with the lowest val Brier score, the hand-written val
        #    spans counting as much as the generated ones, among those flagging OOD_FREE_TARGET
        #    of the val OOD free spans (the smallest flagging the most when none reaches it).
        ood_free = [i for i, r in enumerate(rows) if r["ood"] and r["free"]]
        options = []
        for weight in DOMAIN_WEIGHTS:
            calibrated = _fit_route(rows, labels, signal, weight, signals, unfamiliar_above)
            ps = [_p(rows[i], calibrated) for i in range(len(rows))]
            flagged = [hole_confidence(SpanTokens(rows[i]["probs"], [(0, 0)] * len(rows[i]["probs"]),
                                                  rows[i]["class"], rows[i].get("rescored")), calibrated,
                                       domain_score=rows[i]["domain_score"])["low"] for i in ood_free]  # fmt: skip
            share = sum(flagged) / max(1, len(flagged))
            options.append(
                (share >= OOD_FREE_TARGET, -_brier(rows, ps, labels), share, -weight, calibrated)
            )
        meets, neg_brier, share, neg_weight, calibrated = max(options, key=lambda o: o[:4])
        weight = -neg_weight
        routes[route] = calibrated
        chosen[route] = {"signal": signal, "signals": signals, "domain_weight": weight,
                         "elbo_passes": calibrated.elbo_passes,
                         "val_auroc_generated": trials[signal], "val_brier": round(-neg_brier, 4),
                         "val_ood_free_flagged": round(share, 4), "low_below": calibrated.low_below,
                         "mark_below": calibrated.mark_below, "trials": trials,
                         "class_trials": class_trials,
                         "weight_trials": {-o[3]: {"brier": round(-o[1], 4), "ood_free_flagged": round(o[2], 4)}
                                           for o in options}}  # fmt: skip
    return {"judge_bar": judge_bar, "routes": routes, "chosen": chosen,
            "count": len(val)}  # fmt: skip


def _or_zero(value: float) -> float:
    return 0.0 if math.isnan(value) else value


def _p(row: dict[str, Any], calibrated: Any) -> float:
    from gpu_worker.engine.confidence import SpanTokens, hole_confidence

    tokens = SpanTokens(row["probs"], [(0, 0)] * len(row["probs"]), row["class"], row.get("rescored"))
    return float(hole_confidence(tokens, calibrated, domain_score=row["domain_score"])["p"])


def _brier(rows: list[dict[str, Any]], ps: list[float], labels: list[bool]) -> float:
    """Mean squared error of ``ps``, the hand-written spans weighted to count as much, all
    together, as the generated ones."""
    hand = sum(r["set"] == "handwritten" for r in rows)
    gen = len(rows) - hand
    weights = [1.0 if r["set"] == "generated" else gen / max(1, hand) for r in rows]
    return sum(w * (p - y) ** 2 for w, p, y in zip(weights, ps, labels, strict=True)) / sum(weights)


def _fit_route(rows: list[dict[str, Any]], labels: list[bool], signal: str, weight: float,
               signals: dict[str, str] | None = None, unfamiliar_above: float | None = None) -> Any:  # fmt: skip
    """Isotonic curves per hole class, their low thresholds and the mark level, on val; the
    hand-written spans enter the curves HANDWRITTEN_COPIES times (there are few of them, and
    they are the text unlike the corpus that must map to a low p)."""
    from gpu_worker.engine.confidence import (
        ANY_CLASS,
        HOLE_CLASSES,
        UNFAMILIAR,
        Isotonic,
        RouteCalibration,
    )

    signals = signals or {}
    copies = [HANDWRITTEN_COPIES if r["set"] == "handwritten" else 1 for r in rows]

    def unfamiliar(i: int) -> bool:
        return unfamiliar_above is not None and rows[i]["domain_score"] > unfamiliar_above

    members = {ANY_CLASS: [i for i in range(len(rows)) if not unfamiliar(i)]}
    members.update(
        {cls: [i for i in members[ANY_CLASS] if rows[i]["class"] == cls] for cls in HOLE_CLASSES}
    )
    members[UNFAMILIAR] = [i for i in range(len(rows)) if unfamiliar(i)]
    own = [cls for cls in (*HOLE_CLASSES, UNFAMILIAR) if len(members[cls]) >= MIN_CLASS_SPANS]
    # The classes that get a curve of their own, so the shell scores each on the signal the
    # finished calibration reads it with (RouteCalibration.signal_for).
    shell = RouteCalibration(signal, dict.fromkeys((ANY_CLASS, *own), Isotonic((0.0,), (0.0,))),
                             {ANY_CLASS: 0.0}, 0.0, weight, dict(signals))  # fmt: skip

    def fitted(idx: list[int], cls: str) -> Isotonic:
        scores = [shell.score(rows[i]["probs"], rows[i]["domain_score"], cls, rows[i].get("rescored"))
                  for i in idx for _ in range(copies[i])]  # fmt: skip
        return Isotonic.fit(scores, [labels[i] for i in idx for _ in range(copies[i])])

    curves = {cls: fitted(members[cls], cls) for cls in (ANY_CLASS, *own)}
    calibration = RouteCalibration(signal, curves, {}, 0.0, weight,
                                   {k: v for k, v in signals.items() if k in curves})  # fmt: skip
    low: dict[str, float] = {}
    for cls in curves:
        right = sorted(curves[cls](calibration.score(rows[i]["probs"], rows[i]["domain_score"], cls,
                                                     rows[i].get("rescored")))
                       for i in members[cls] if labels[i])  # fmt: skip
        low[cls] = _low_threshold(right)
    if (
        UNFAMILIAR in curves
    ):  # too few right spans there for the budget rule: low unless likely right
        low[UNFAMILIAR] = max(low[UNFAMILIAR], UNFAMILIAR_LOW_BELOW)
    right_tokens = [p for r, y in zip(rows, labels, strict=True) if y for p in r["probs"]]
    fitted_route = RouteCalibration(signal, curves, low, round(quantile(right_tokens, MARK_QUANTILE), 4),
                                    weight, calibration.signals,
                                    unfamiliar_above if UNFAMILIAR in curves else None)  # fmt: skip
    if fitted_route.reads_elbo:
        return replace(fitted_route, elbo_passes=ELBO_PASSES)
    return fitted_route


def _low_threshold(right_ps: list[float]) -> float:
    """The highest threshold that flags at most RIGHT_FLAGGED_BUDGET of the right spans."""
    if not right_ps:
        return 0.5
    k = int(math.floor(RIGHT_FLAGGED_BUDGET * len(right_ps)))  # spans allowed under it
    # p < t flags a span: t = the (k+1)-th smallest right p flags at most k of them
    return round(right_ps[k] if k < len(right_ps) else right_ps[-1], 6)


def build_profile(val_texts: list[list[str]], ood_texts: list[list[str]]) -> Any:
    """The train split's profile, its threshold between the val corpus and val OOD templates."""
    from gpu_worker.engine.domain import DomainProfile
    from research.corpus import iter_split

    profile = DomainProfile.build([d.text for d in iter_split("train", PROFILE_DOCS)], threshold=1.0,
                                  source=f"research.corpus train split, first {PROFILE_DOCS} documents")  # fmt: skip
    corpus = sorted(profile.score(t) for t in val_texts)
    ood = sorted(profile.score(t) for t in ood_texts)
    # Midway between the most unusual val corpus template and the 10th-percentile OOD one.
    threshold = round((corpus[-1] + quantile(ood, 0.1)) / 2, 4)
    return DomainProfile(profile.words, profile.pairs, threshold, profile.source)


def template_texts(
    split: str, per_kind: int
) -> tuple[list[list[str]], list[list[str]], list[list[str]]]:
    """Locked segments of the generated templates, hand-written OOD and in-domain documents."""
    from bench.handwritten.load import load
    from gpu_worker.engine.tokenizer import StencilTokenizer
    from research.evaluate import build_cases

    tok = StencilTokenizer.from_file(MODELS["diffusion"] / "tokenizer.json")
    gen = [
        [s["text"] for s in case.request()["segments"] if "text" in s]
        for kind in KINDS
        for case in build_cases(kind, per_kind, tok.encode, split=split)  # type: ignore[arg-type]
    ]
    hand = load(split)
    ood = [[s["text"] for s in d.segments if "text" in s] for d in hand if d.domain == "ood"]
    ind = [[s["text"] for s in d.segments if "text" in s] for d in hand if d.domain == "in"]
    return gen, ood, ind


def choice_fields(split: str, per_kind: int) -> dict[str, tuple[int, bool]]:
    """Each generated choice case's candidate count and whether the rest of its document
    states the answer (the text around the hole decides it)."""
    from gpu_worker.engine.tokenizer import StencilTokenizer
    from research.evaluate import build_cases

    tok = StencilTokenizer.from_file(MODELS["diffusion"] / "tokenizer.json")
    out = {}
    for i, case in enumerate(build_cases("choice", per_kind, tok.encode, split=split)):  # type: ignore[arg-type]
        hole = next(h for h in case.holes if h.name == "target")
        text = case.doc.text
        rest = text[: hole.span.start] + "\0" + text[hole.span.end :]
        out[f"choice-{i}"] = (len(hole.span.choices or ()), hole.target in rest)
    return out


def choice_ceiling(scored: list[dict[str, Any]], per_kind: int) -> dict[str, Any]:
    """What any confidence can do on the generated choice holes. The corpus generator draws
    each choice uniformly and independently of the rest of the document
    (``research.corpus.choice``), so whatever a route picks is right with probability 1/k for
    a field of k candidates: no signal read from the document ranks right picks above wrong
    ones better than 1/k does. Its AUROC against the observed labels is the ceiling."""
    fields = choice_fields("test", per_kind)
    out: dict[str, Any] = {"decided_by_text": sum(d for _k, d in fields.values()),
                           "holes": len(fields)}  # fmt: skip
    for route in MODELS:
        rows = [r for r in scored if r["route"] == route and r["set"] == "generated"
                and r["kind"] == "choice" and r["id"] in fields]  # fmt: skip
        ys = [r["right"] for r in rows]
        out[route] = {"ceiling_auroc": round(auroc([1 / fields[r["id"]][0] for r in rows], ys), 4),
                      "right": round(sum(ys) / max(1, len(ys)), 4),
                      "chance": round(sum(1 / fields[r["id"]][0] for r in rows) / max(1, len(rows)), 4)}  # fmt: skip
    return out


def rescore_cost(cases_per_kind: int = 2) -> dict[str, Any]:
    """Each route's seconds per canvas writing it and re-reading its spans (under the shipped
    calibration: none when its signal reads no re-read), on generated val canvases, side by
    side in one run on this machine."""
    from gpu_worker.engine.backends import load_backend
    from gpu_worker.engine.run import run
    from research.evaluate import build_cases

    out: dict[str, Any] = {}
    for route, writing in (("diffusion", "denoise"), ("ar", "decode")):
        loaded = load_backend(MODELS[route])
        written, rescore = [], []
        for kind in KINDS:
            for case in build_cases(kind, cases_per_kind, loaded.tokenizer.encode, split="val"):
                outcome = run(route, loaded, case.request())
                written.append(outcome.timings[writing])
                rescore.append(outcome.timings.get("rescore", 0.0))
        out[route] = {"canvases": len(written), "write_s": round(sum(written) / len(written), 3),
                      "rescore_s": round(sum(rescore) / len(rescore), 3),
                      "rescore_over_write": round(sum(rescore) / sum(written), 3)}  # fmt: skip
    return out


# -- reporting ----------------------------------------------------------------------------------
def score_records(
    records: list[dict[str, Any]], routes: dict[str, Any], judge_bar: dict[str, float]
) -> list[dict[str, Any]]:
    from gpu_worker.engine.confidence import SpanTokens, hole_confidence

    out = []
    for r in records:
        offsets = [(i, i + 1) for i in range(len(r["probs"]))]
        conf = hole_confidence(SpanTokens(r["probs"], offsets, r["class"], r.get("rescored")), routes[r["route"]],
                               domain_score=r["domain_score"])  # fmt: skip
        out.append({**r, "p": conf["p"], "low": conf["low"], "right": label(r, judge_bar)})
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ps, ys = [r["p"] for r in rows], [r["right"] for r in rows]
    e, bins = ece(ps, ys) if rows else (float("nan"), [])
    exact_rows = [r for r in rows if r["exact"]]
    right_rows = [r for r in rows if r["right"]]
    return {"n": len(rows), "right": round(sum(ys) / len(ys), 4) if rows else float("nan"),
            "auroc": round(auroc(ps, ys), 4), "ece": round(e, 4),
            "exact_flagged": round(sum(r["low"] for r in exact_rows) / len(exact_rows), 4) if exact_rows else float("nan"),
            "right_flagged": round(sum(r["low"] for r in right_rows) / len(right_rows), 4) if right_rows else float("nan"),
            "flagged": round(sum(r["low"] for r in rows) / len(rows), 4) if rows else float("nan"),
            "bins": bins}  # fmt: skip


def report(
    test: list[dict[str, Any]], fitted: dict[str, Any], profile: Any, per_kind: int
) -> dict[str, Any]:
    scored = score_records(test, fitted["routes"], fitted["judge_bar"])
    results: dict[str, Any] = {"judge_bar": fitted["judge_bar"], "chosen": fitted["chosen"],
                               "domain_threshold": profile.threshold, "routes": {}}  # fmt: skip
    for route in MODELS:
        gen = [r for r in scored if r["route"] == route and r["set"] == "generated"]
        ood = [r for r in scored if r["route"] == route and r["set"] == "handwritten" and r["ood"]]
        ind = [
            r for r in scored if r["route"] == route and r["set"] == "handwritten" and not r["ood"]
        ]
        results["routes"][route] = {
            "generated_test": summarize(gen),
            "per_kind": {k: summarize([r for r in gen if r["kind"] == k]) for k in KINDS},
            "ood_free_flagged": round(sum(r["low"] for r in ood if r["free"]) / max(1, sum(r["free"] for r in ood)), 4),
            "ood_all": summarize(ood),
            "handwritten_in": summarize(ind),
            "handwritten_in_per_kind": {k: summarize([r for r in ind if r["kind"] == k]) for k in ("answer", "free")},
        }  # fmt: skip
    ids = sorted({(r["id"], r["ood"]) for r in scored if r["set"] == "handwritten"})
    needs = {}
    for doc_id, ood in ids:
        per_route = [any(r["low"] for r in scored if r["id"] == doc_id and r["route"] == route)
                     for route in MODELS]  # fmt: skip
        needs[doc_id] = (ood, all(per_route))
    results["ood_needs_person"] = round(
        sum(n for o, n in needs.values() if o) / max(1, sum(o for o, _ in needs.values())), 4
    )
    gen_t, ood_t, in_t = template_texts("test", per_kind)
    results["domain"] = {
        "ood_warned": round(sum(profile.score(t) > profile.threshold for t in ood_t) / len(ood_t), 4),
        "in_warned": round(sum(profile.score(t) > profile.threshold for t in in_t) / len(in_t), 4),
        "generated_warned": round(sum(profile.score(t) > profile.threshold for t in gen_t) / len(gen_t), 4),
        "counts": {"ood": len(ood_t), "in": len(in_t), "generated": len(gen_t)},
    }  # fmt: skip
    results["choice_ceiling"] = choice_ceiling(scored, per_kind)
    results["rescore_cost"] = rescore_cost()
    results["scored"] = [{k: r[k] for k in ("set", "id", "route", "hole", "kind", "text", "answer", "p", "low", "right", "ood")}
                         for r in scored]  # fmt: skip
    return results


def table(results: dict[str, Any]) -> str:
    lines = ["| route | set | n | right | AUROC | ECE | exact-right flagged | right flagged | flagged |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for route, r in results["routes"].items():
        rows: list[tuple[str, dict[str, Any]]] = [("generated test", r["generated_test"])]
        rows += [(f"  {k}", v) for k, v in r["per_kind"].items()]
        rows += [("hand-written in-domain", r["handwritten_in"])]
        rows += [(f"  {k}", v) for k, v in r["handwritten_in_per_kind"].items()]
        rows += [("hand-written OOD", r["ood_all"])]
        for name, s in rows:
            lines.append(f"| {route} | {name} | {s['n']} | {s['right']} | {s['auroc']} | {s['ece']} | "
                         f"{s['exact_flagged']} | {s['right_flagged']} | {s['flagged']} |")  # fmt: skip
    lines.append("")
    for route, r in results["routes"].items():
        lines.append(f"- {route}: OOD free spans flagged low: {r['ood_free_flagged']}")
    d = results["domain"]
    lines.append(f"- domain warning (threshold {results['domain_threshold']}): OOD templates {d['ood_warned']}, "
                 f"hand-written in-domain {d['in_warned']}, generated test templates {d['generated_warned']}")  # fmt: skip
    lines.append(
        f"- OOD templates that end as needs-a-person (every route low): {results['ood_needs_person']}"
    )
    lines.append(
        f"- free text is right under the other model's judge NLL <= {results['judge_bar']} nats/token"
    )
    cc = results.get("choice_ceiling")
    if cc:
        per_route = ", ".join(f"{route} right {cc[route]['right']} (chance {cc[route]['chance']}), "
                              f"ceiling AUROC {cc[route]['ceiling_auroc']}" for route in MODELS)  # fmt: skip
        lines.append(f"- choices: the generator draws each one independently of its document; the text "
                     f"around the hole states the answer in {cc['decided_by_text']} of {cc['holes']} test "
                     f"holes, so a pick is right with probability 1/k whatever the signal: {per_route} "
                     "(the AUROC of 1/k itself, the best any confidence can rank them)")  # fmt: skip
    for route, rc in (results.get("rescore_cost") or {}).items():
        lines.append(f"- re-reading the spans costs ({route}, {rc['canvases']} generated val canvases, this CPU): "
                     f"{rc['rescore_s']} s per canvas beside {rc['write_s']} s writing them "
                     f"({rc['rescore_over_write']} times)")  # fmt: skip
    for route, c in results["chosen"].items():
        lines.append(f"- {route}: signal {c['signal']}, class signals {c['signals'] or 'none'}, "
                     f"ELBO passes {c.get('elbo_passes', 0)}, domain weight {c['domain_weight']}, val AUROC "
                     f"(generated) {c['val_auroc_generated']}, val OOD free flagged {c['val_ood_free_flagged']}, low below {c['low_below']}, mark below {c['mark_below']}")  # fmt: skip
    lines += ["", "What was tried on val (the choice: the best; a hole class keeps a signal of its own only where it beats the route's):", ""]  # fmt: skip
    for route, c in results["chosen"].items():
        lines.append(f"- {route}: val AUROC per signal, generated spans: {c['trials']}")
        for cls, trials in c.get("class_trials", {}).items():
            lines.append(f"  - {cls} spans: {trials}")
        weights = {w: f"Brier {t['brier']}, OOD free flagged {t['ood_free_flagged']}"
                   for w, t in c.get("weight_trials", {}).items()}  # fmt: skip
        lines.append(f"  - domain weight (val, hand-written weighted as much as generated): {weights}")
    lines.append(f"- the unfamiliar curve: spans of canvases whose domain score is over the bar, "
                 f"hand-written val spans counted {HANDWRITTEN_COPIES} times, low under {UNFAMILIAR_LOW_BELOW}")  # fmt: skip
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", label="perfect calibration")
    for route, r in results["routes"].items():
        for name, key, style in (
            ("generated test", "generated_test", "-o"),
            ("hand-written in", "handwritten_in", "--s"),
        ):
            bins = r[key]["bins"]
            ax.plot([b["confidence"] for b in bins], [b["accuracy"] for b in bins], style,
                    label=f"{route}, {name} (ECE {r[key]['ece']})")  # fmt: skip
    ax.set_xlabel("confidence p (calibrated on val)")
    ax.set_ylabel("share right")
    ax.set_title("Span confidence: reliability on test")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--per-kind", type=int, default=60, help="generated cases per hole kind and split"
    )
    parser.add_argument("--stage", choices=("all", "run", "fit", "report"), default="all")
    parser.add_argument("--splits", default="val,test", help="splits the run stage fills")
    parser.add_argument(
        "--write-models", action="store_true", help="write the fitted files into models/"
    )
    args = parser.parse_args(argv)
    gen_v, ood_v, _in_v = template_texts("val", args.per_kind)
    profile = build_profile(gen_v, ood_v)
    if args.stage in ("all", "run"):
        from gpu_worker.engine.backends import load_backend

        loaded = {route: load_backend(d) for route, d in MODELS.items()}
        for split in args.splits.split(","):
            records = run_split(split, args.per_kind, loaded, profile, progress=True)
            (HERE / f"runs_{split}.json").write_text(json.dumps(records))
        if args.stage == "run":
            return 0
    val = json.loads((HERE / "runs_val.json").read_text())
    test = json.loads((HERE / "runs_test.json").read_text())
    fitted = fit(val, profile.threshold)
    if args.write_models or args.stage == "fit":
        write_models(fitted, profile)
    if args.stage == "fit":
        return 0
    results = report(test, fitted, profile, args.per_kind)
    text = table(results)
    print(text)
    (HERE / "results.json").write_text(json.dumps(results, indent=1, default=_jsonable))
    (HERE / "REPORT.md").write_text("# Span confidence and domain score (test split)\n\n"
                                    "`python bench/confidence/confidence_bench.py --stage report`\n\n" + text + "\n")  # fmt: skip
    plot(results, HERE / "reliability.png")
    return 0


def _jsonable(value: Any) -> Any:
    return float(value) if isinstance(value, float) else str(value)


def write_models(fitted: dict[str, Any], profile: Any) -> None:
    """confidence.json and domain_profile.json into both model directories."""
    from gpu_worker.engine.confidence import CALIBRATION_FILE, Calibration
    from gpu_worker.engine.domain import PROFILE_FILE

    calibration = Calibration(
        fitted["routes"], source=f"bench/confidence/confidence_bench.py, val split ({fitted['count']} spans)",
        metrics={"judge_bar": fitted["judge_bar"],
                 **{r: {k: c[k] for k in ("val_auroc_generated", "val_ood_free_flagged")}
                    for r, c in fitted["chosen"].items()}},
    )  # fmt: skip
    for directory in MODELS.values():
        (directory / CALIBRATION_FILE).write_text(
            json.dumps(calibration.to_json(), indent=1) + "\n"
        )
        (directory / PROFILE_FILE).write_text(
            json.dumps(profile.to_json(), separators=(",", ":")) + "\n"
        )
    from research.train import write_sha256sums

    write_sha256sums(ROOT / "models")  # the checksums cover every shipped file


Runner = Callable[..., Any]

if __name__ == "__main__":
    sys.exit(main())
