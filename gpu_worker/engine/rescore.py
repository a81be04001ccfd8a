"""Re-reading a route's finished spans: how likely the model finds its own text once the
whole canvas is filled.

**The denoiser** (``span_elbo``): a few-pass ELBO of each span.

The sampler's committed-token probabilities are read once, at each token's commit, with the
span's later tokens still masked. Re-reading the finished span tells a careful span from a
lucky one: for each request hole, ``passes`` rows of the filled canvas (the hole's text in
place, its pad tail dropped) each mask a stratified random share of the hole's tokens (pass
``i`` of ``n`` masks about ``(i + u) / n`` of them, ``u`` uniform), and the denoiser reads
every row in one forward pass per chunk. A hole gets::

    {"elbo": mean over passes of the mean log-probability of its masked tokens,
     "elbo_min": mean over passes of the least likely masked token's log-probability}

(the Monte Carlo estimate of the masked-diffusion bound on the span's per-token
log-likelihood, and its worst token). The masks come from a generator seeded by the
canvas's seed, so a replay rescores alike. :mod:`gpu_worker.engine.confidence` maps these,
as it maps the committed probabilities, to the span's calibrated confidence; the diffusion
route computes them when its calibration's signal reads them (``RouteCalibration.rescores``).

**The AR-FIM model** (``span_reread``) wrote each hole seeing the later holes as masks. Once
every hole is filled it reads each span again in the route's own prompt, between the whole
filled prefix and suffix (the hole's positions as masks where the model was trained so), and
a hole gets ``{"reread": minus the per-token NLL of its tokens and their EOS}``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from gpu_worker.engine.canvas import Canvas
from gpu_worker.engine.model import fit_fim_context, hole_room
from gpu_worker.engine.sampler.cache import forward_cache_for

RESCORE_SEED_OFFSET = 0x5C0E  # the mask draws' seed: the canvas's plus this
ROWS_PER_FORWARD = 16  # rows of one forward pass


def filled_sequence(canvas: Canvas, ids: torch.Tensor) -> tuple[list[int], list[tuple[int, int]]]:
    """The canvas's final tokens with each hole's pad tail (and any mask) dropped, and each
    hole's [start, end) in them (``canvas.holes`` order)."""
    values = ids.tolist()
    out: list[int] = []
    ranges: list[tuple[int, int]] = []
    cursor = 0
    for hole in canvas.holes:
        out.extend(int(t) for t in values[cursor : hole.start])
        kept = [t for t in canvas.kept_tokens(ids, hole) if t != canvas.mask_id]
        ranges.append((len(out), len(out) + len(kept)))
        out.extend(kept)
        cursor = hole.end
    out.extend(int(t) for t in values[cursor : canvas.length])
    return out, ranges


def span_elbo(
    network: Any, canvas: Canvas, ids: torch.Tensor, *, passes: int
) -> dict[str, dict[str, float]]:
    """Each request hole's ``{"elbo", "elbo_min"}`` from ``passes`` re-masked rows (a hole
    without tokens is left out). ``ids`` [L] is the canvas as the route finished it."""
    if passes < 1:
        raise ValueError(f"passes must be at least 1: {passes}")
    seq, ranges = filled_sequence(canvas, ids)
    generator = torch.Generator().manual_seed(int(canvas.seed) + RESCORE_SEED_OFFSET)
    rows: list[tuple[str, torch.Tensor, torch.Tensor]] = []  # (hole, masked positions, room)
    for name in canvas.groups:
        spans = [i for i, h in enumerate(canvas.holes) if h.group == name]
        positions = torch.tensor([p for i in spans for p in range(*ranges[i])], dtype=torch.long)
        n = int(positions.numel())
        if n == 0:
            continue
        room = hole_room(len(seq), [ranges[i] for i in spans])
        ratios = (torch.arange(passes) + torch.rand(passes, generator=generator)) / passes
        counts = (ratios * n).round().clamp(1, n).long()
        order = torch.rand(passes, n, generator=generator).argsort(-1)
        for p in range(passes):
            rows.append((name, positions[order[p, : int(counts[p])]].sort().values, room))
    sums: dict[str, list[float]] = {}
    for first in range(0, len(rows), ROWS_PER_FORWARD):
        chunk = rows[first : first + ROWS_PER_FORWARD]
        for (name, _masked, _room), (mean, least) in zip(
            chunk, _score_rows(network, canvas, seq, chunk), strict=True
        ):
            got = sums.setdefault(name, [0.0, 0.0])
            got[0] += mean / passes
            got[1] += least / passes
    return {name: {"elbo": round(v[0], 6), "elbo_min": round(v[1], 6)} for name, v in sums.items()}


def _score_rows(
    network: Any, canvas: Canvas, seq: list[int], chunk: list[tuple[str, torch.Tensor, torch.Tensor]]
) -> list[tuple[float, float]]:
    """(mean, min) log-probability of the true tokens at each row's masked positions."""
    device = next(network.parameters()).device
    truth = torch.tensor(seq, dtype=torch.long)
    inputs = truth.repeat(len(chunk), 1)
    masked = torch.zeros_like(inputs, dtype=torch.bool)
    for r, (_name, positions, _room) in enumerate(chunk):
        masked[r, positions] = True
    inputs[masked] = canvas.mask_id
    attention = torch.ones_like(inputs, dtype=torch.bool)
    uses_room = bool(getattr(getattr(network, "config", None), "room_buckets", 0))
    room = torch.stack([r for _n, _p, r in chunk]).to(device) if uses_room else None
    with torch.inference_mode():
        logits = forward_cache_for(network, "none").full(
            inputs.to(device), attention.to(device), list(range(len(chunk))), reads=None, room=room
        )
        logp = torch.log_softmax(logits.float(), dim=-1)
        picked = logp.gather(-1, truth.to(device).repeat(len(chunk), 1)[..., None])[..., 0].cpu()
    out = []
    for r in range(len(chunk)):
        values = picked[r][masked[r]]
        out.append((float(values.mean()), float(values.min())))
    return out


def span_reread(network: Any, canvas: Canvas, ids: torch.Tensor) -> dict[str, dict[str, float]]:
    """Each request hole's ``{"reread"}`` from the AR-FIM ``network`` (a hole without tokens
    is left out). ``ids`` [L] is the canvas as the AR route finished it."""
    cfg = network.config
    device = next(network.parameters()).device
    seq, ranges = filled_sequence(canvas, ids)
    totals: dict[str, list[float]] = {}  # hole -> [summed NLL, tokens]
    for hole, (a, b) in zip(canvas.holes, ranges, strict=True):
        if b <= a:
            continue
        middle = [*seq[a:b], cfg.eos_id]
        masks = [canvas.mask_id] * hole.max_len if cfg.fim_hole_masks else []
        budget = cfg.max_len - hole.max_len - 2  # as the route's prompt: the middle and its EOS
        prefix, suffix = fit_fim_context(seq[:a], masks + seq[b:], budget - 3)
        prompt = [cfg.fim_prefix_id, *prefix, cfg.fim_suffix_id, *suffix, cfg.fim_middle_id]
        full = torch.tensor([prompt + middle], dtype=torch.long, device=device)
        with torch.inference_mode():
            logits = network(full[:, :-1]).float()[0, len(prompt) - 1 :]
            nll = F.cross_entropy(logits, full[0, len(prompt) :], reduction="sum")
        got = totals.setdefault(hole.group, [0.0, 0.0])
        got[0] += float(nll)
        got[1] += len(middle)
    return {name: {"reread": round(-v[0] / v[1], 6)} for name, v in totals.items()}


__all__ = ["filled_sequence", "span_elbo", "span_reread"]
