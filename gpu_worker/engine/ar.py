"""The AR-FIM route: fill a canvas's holes left to right with the fill-in-the-middle model.

The baseline and fallback of the diffusion route. For each hole, in document order:

    <pre> prefix <suf> suffix <mid> middle ... <eos>

where the prefix is everything before the hole (earlier holes already filled) and the suffix
is the locked text after it, up to the next hole (a causal model cannot condition on a hole
that is not filled yet). A model with ``fim_hole_masks`` instead reads the hole as its budget
of mask tokens and the whole rest of the canvas after it, later holes as their masks. The
middle is decoded one token at a time with the KV cache
(``forward_window(write_cache=True)``), so each new token costs one window of width one, until
EOS / pad or the hole's ``max_tokens``. Constraints as in the sampler: a ``choices`` hole
scores every whole candidate (and its EOS) under the model and takes the best (or samples from
the scores' softmax); a ``pattern`` hole only takes tokens that keep the pattern completable
within the positions left (:class:`gpu_worker.engine.constraints.PatternConstraint`).

Greedy at temperature 0; otherwise sampled from the request's ``torch.Generator`` (seeded by
the canvas's seed), never from the global RNG. The outcome is the one
:class:`gpu_worker.engine.outcome.Outcome`, with ``route="ar"``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gpu_worker.engine.canvas import Canvas, Hole, parse_canvas
from gpu_worker.engine.confidence import outcome_confidence, route_calibration
from gpu_worker.engine.config import SamplerConfig, config_from_request
from gpu_worker.engine.constraints import CharAutomaton, ChoiceConstraint, PatternConstraint
from gpu_worker.engine.loaded import LoadedModel
from gpu_worker.engine.model import KVCache, StencilTransformer, fit_fim_context
from gpu_worker.engine.outcome import AR, Hooks, Outcome
from gpu_worker.engine.rescore import span_reread
from gpu_worker.engine.validation import validate

ROUTE = AR  # Outcome.route of this route
MODEL_KIND = "ar_fim"  # the LoadedModel kind it needs


@dataclass
class _Context:
    """The FIM prompt of one hole and the model state after reading it."""

    ids: list[int]  # <pre> prefix <suf> suffix <mid>
    cache: KVCache
    last_logits: torch.Tensor  # [V] logits of the next token after the prompt


@dataclass
class _Fill:
    tokens: list[int]  # the middle's tokens (forced prefix included), without EOS
    forward_passes: int
    trace: list[dict[str, Any]]
    probs: list[float]  # the probability of each of ``tokens`` when it was chosen


def infill_request_ar(
    loaded: LoadedModel,
    request: str | dict[str, Any],
    *,
    config: SamplerConfig | None = None,
    hooks: Hooks | None = None,
) -> Outcome:
    """Fill the holes of a Canvas-JSON ``request`` with the AR-FIM model of ``loaded``.

    ``config`` (default: the request's ``sampler`` overrides on the default preset) supplies
    ``temperature``, ``top_p`` and ``precision``; the block fields do not apply to this route.
    ``hooks.should_stop`` is asked before every token; ``hooks.on_step`` gets each trace entry.
    Raises ``ValueError`` for a bad request or a model that is not a Stencil AR-FIM model.
    """
    network = ar_network(loaded)
    hooks = hooks or Hooks()
    started = time.perf_counter()
    canvas = parse_canvas(
        request, loaded.tokenizer, max_len=network.max_len, vocab_size=network.config.vocab_size
    )
    cfg = config if config is not None else config_from_request(canvas.sampler)
    encoded = time.perf_counter()
    generator = torch.Generator().manual_seed(canvas.seed)
    ids = canvas.ids.clone()  # [L]: holes get their tokens then pad, as the sampler leaves them
    probs = torch.full((canvas.length,), float("nan"))  # [L]: each written token's probability
    trace: list[dict[str, Any]] = []
    forward_passes = steps = 0
    cancelled = False
    for index, hole in enumerate(canvas.holes):
        if hooks.stop_requested():
            cancelled = True
            break
        fill = _fill_hole(network, loaded, canvas, ids, index, cfg, generator, hooks.should_stop)
        ids[hole.start : hole.end] = canvas.pad_id
        ids[hole.start : hole.start + len(fill.tokens)] = torch.tensor(fill.tokens, dtype=torch.long)
        probs[hole.start : hole.start + len(fill.probs)] = torch.tensor(fill.probs)
        forward_passes += fill.forward_passes
        steps += fill.forward_passes
        for entry in fill.trace:
            entry["step"] = len(trace)
            trace.append(entry)
            if hooks.on_step is not None:
                hooks.on_step(entry)
        if fill.forward_passes and hooks.stop_requested():
            cancelled = index < len(canvas.holes) - 1
            if cancelled:
                break
    decoded = time.perf_counter()
    holes = canvas.hole_texts(ids, loaded.tokenizer)
    document = canvas.document(ids, loaded.tokenizer)
    violations = validate(canvas, ids, loaded.tokenizer, hole_texts=holes, document=document)
    checked = time.perf_counter()
    calibration = route_calibration(loaded.directory, ROUTE)
    rescored = None
    if calibration is not None and calibration.rescores:  # the signal reads the span's re-read
        rescored = span_reread(network, canvas, ids)
    rescore = time.perf_counter() - checked
    confidence, domain = outcome_confidence(canvas, ids, probs, loaded.tokenizer,
                                            directory=loaded.directory, route=ROUTE,
                                            rescored=rescored)  # fmt: skip
    finished = time.perf_counter()
    return Outcome(
        holes=holes,
        document=document,
        forward_passes=forward_passes,
        steps=steps,
        timings={
            "encode": encoded - started,
            "decode": decoded - encoded,
            "validate": checked - decoded,
            **({"rescore": rescore} if rescored is not None else {}),
            "total": finished - started,
        },
        trace=trace,
        config=cfg.to_dict(),
        config_sha256=cfg.sha256,
        seed=canvas.seed,
        route=ROUTE,
        cancelled=cancelled,
        violations=[v.to_dict() for v in violations],
        model=loaded.identity(),
        device=str(next(network.parameters()).device),
        confidence=confidence,
        domain=domain,
    )


def infill_batch_ar(
    loaded: LoadedModel,
    requests: Sequence[dict[str, Any]],
    *,
    config: SamplerConfig | None = None,
    hooks: Sequence[Hooks] | None = None,
) -> list[Outcome | ValueError]:
    """:func:`infill_request_ar` for each request in turn (the route decodes one at a time).

    Same contract as the diffusion route's ``infill_batch``: one :class:`Hooks` per request,
    and a request that cannot be read comes back as its ``ValueError`` in its place.
    """
    ar_network(loaded)  # a wrong model is the caller's error, not one request's
    if hooks is not None and len(hooks) != len(requests):
        raise ValueError(f"hooks must give one Hooks per request: {len(hooks)} for {len(requests)}")
    outcomes: list[Outcome | ValueError] = []
    for index, request in enumerate(requests):
        try:
            outcomes.append(infill_request_ar(
                loaded, request, config=config, hooks=hooks[index] if hooks else None
            ))  # fmt: skip
        except ValueError as exc:
            outcomes.append(exc)
    return outcomes


def ar_network(loaded: LoadedModel) -> StencilTransformer:
    """The causal network of a Stencil AR-FIM model; ``ValueError`` for any other model."""
    network = loaded.network
    if loaded.kind != MODEL_KIND or not isinstance(network, StencilTransformer):
        raise ValueError(f"the AR route needs a Stencil ar_fim model, got kind={loaded.kind!r}")
    return network


# -- one hole -----------------------------------------------------------------------------------
def fim_prompt(canvas: Canvas, ids: torch.Tensor, index: int, network: StencilTransformer) -> list[int]:
    """``<pre> prefix <suf> suffix <mid>`` token ids for hole ``index``.

    The prefix is the canvas before the hole (filled holes' pad tails dropped); the suffix the
    locked tokens after it up to the next hole. A prompt too long for the model loses the far
    end of its prefix, as in training.
    """
    hole = canvas.holes[index]
    cfg = network.config
    terminators = {canvas.pad_id, canvas.eos_id}
    prefix = [int(t) for t in ids[: hole.start].tolist() if int(t) not in terminators]
    if cfg.fim_hole_masks:  # this hole and the later ones are masks in the canvas still
        suffix = [int(t) for t in ids[hole.start : canvas.length].tolist()]
    else:
        next_start = canvas.holes[index + 1].start if index + 1 < len(canvas.holes) else canvas.length
        suffix = [int(t) for t in ids[hole.end : next_start].tolist()]
    budget = cfg.max_len - hole.max_len - 2  # room for the middle and its EOS
    prefix, suffix = fit_fim_context(prefix, suffix, budget - 3)  # and for the three sentinels
    return [cfg.fim_prefix_id, *prefix, cfg.fim_suffix_id, *suffix, cfg.fim_middle_id]


def _fill_hole(
    network: StencilTransformer,
    loaded: LoadedModel,
    canvas: Canvas,
    ids: torch.Tensor,
    index: int,
    cfg: SamplerConfig,
    generator: torch.Generator,
    should_stop: Callable[[], bool] | None,
) -> _Fill:
    hole = canvas.holes[index]
    context = _read_prompt(network, fim_prompt(canvas, ids, index, network), cfg)
    if isinstance(hole.constraint, ChoiceConstraint):
        return _fill_choice(network, context, hole, hole.constraint, cfg, generator)
    return _fill_free(network, canvas, context, hole, cfg, generator, should_stop)


def _precision(cfg: SamplerConfig) -> torch.autocast:
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.precision == "bf16")


@torch.inference_mode()
def _read_prompt(network: StencilTransformer, prompt: list[int], cfg: SamplerConfig) -> _Context:
    device = next(network.parameters()).device
    with _precision(cfg):
        logits, cache = network.forward_window(
            torch.tensor([prompt], device=device), write_cache=True
        )  # logits [1, P, V]
    assert cache is not None
    return _Context(prompt, cache, logits[0, -1].float())


@torch.inference_mode()
def _step(
    network: StencilTransformer, cache: KVCache, token: int, position: int, cfg: SamplerConfig
) -> tuple[torch.Tensor, KVCache]:
    """Append one token at ``position``; logits [V] of the next one and the grown cache."""
    device = next(network.parameters()).device
    with _precision(cfg):
        logits, grown = network.forward_window(
            torch.tensor([[token]], device=device), start=position, cache=cache, write_cache=True
        )  # [1, 1, V]
    assert grown is not None
    return logits[0, -1].float(), grown


def _fill_free(
    network: StencilTransformer,
    canvas: Canvas,
    context: _Context,
    hole: Hole,
    cfg: SamplerConfig,
    generator: torch.Generator,
    should_stop: Callable[[], bool] | None,
) -> _Fill:
    """Decode a free or pattern hole token by token (the forced prefix on the first token)."""
    pattern = hole.constraint if isinstance(hole.constraint, PatternConstraint) else None
    state = pattern.start if pattern is not None else 0
    terminators = list(canvas.terminators())
    logits, cache, position = context.last_logits, context.cache, len(context.ids)
    tokens: list[int] = []
    chosen: list[float] = []
    trace: list[dict[str, Any]] = []
    passes = 1  # the prompt's forward
    for offset in range(hole.max_len):
        remaining = hole.max_len - offset
        if pattern is not None:
            allowed = pattern.allowed(state, remaining)
        elif offset == 0 and hole.start in canvas.allowed:
            allowed = canvas.allowed[hole.start]  # tokens that start with the forced prefix
        else:
            allowed = canvas.free_vocab.clone()
            allowed[terminators] = True
        token, prob = _choose(logits, allowed, cfg, generator)
        trace.append({"hole": hole.name, "offset": offset, "token": token, "p": round(prob, 6)})
        if token in terminators:
            break
        tokens.append(token)
        chosen.append(prob)
        if pattern is not None:
            state = pattern.advance(state, token)
            if state == CharAutomaton.DEAD:  # cannot happen: allowed() keeps it alive
                raise RuntimeError(f"pattern of hole {hole.name!r} died on token {token}")
        if offset + 1 == hole.max_len or (should_stop is not None and should_stop()):
            break
        logits, cache = _step(network, cache, token, position, cfg)
        position += 1
        passes += 1
    return _Fill(tokens, passes, trace, chosen)


def _choose(
    logits: torch.Tensor, allowed: torch.Tensor, cfg: SamplerConfig, generator: torch.Generator
) -> tuple[int, float]:
    """A token among ``allowed`` [V]: argmax at temperature 0, else a top-p sample."""
    vocab = logits.shape[-1]
    mask = torch.zeros(vocab, dtype=torch.bool)
    mask[: min(vocab, allowed.shape[0])] = allowed[:vocab]
    scores = logits.masked_fill(~mask, float("-inf"))  # [V]
    probs = torch.softmax(scores, dim=-1)
    if cfg.temperature == 0:
        token = int(scores.argmax())
    else:
        tempered = torch.softmax(scores / cfg.temperature, dim=-1)
        if cfg.top_p < 1.0:
            sorted_p, order = tempered.sort(descending=True)
            outside = sorted_p.cumsum(-1) - sorted_p > cfg.top_p  # keeps at least the top one
            tempered = torch.zeros_like(tempered).scatter(0, order, sorted_p.masked_fill(outside, 0.0))
        token = int(torch.multinomial(tempered, 1, generator=generator))
    return token, float(probs[token])


@torch.inference_mode()
def score_candidates(
    network: StencilTransformer, context: _Context, candidates: list[list[int]], cfg: SamplerConfig
) -> list[float]:
    """Log-probability of each whole candidate followed by EOS, given the prompt."""
    eos = network.config.eos_id
    device = next(network.parameters()).device
    first = torch.log_softmax(context.last_logits, dim=-1)  # [V]
    scores = []
    for tokens in candidates:
        total = float(first[tokens[0]])
        with _precision(cfg):
            logits, _ = network.forward_window(
                torch.tensor([tokens], device=device), start=len(context.ids), cache=context.cache
            )  # [1, n, V]
        logp = torch.log_softmax(logits[0].float(), dim=-1)  # [n, V]
        following = [*tokens[1:], eos]
        total += float(logp[torch.arange(len(tokens)), torch.tensor(following)].sum())
        scores.append(total)
    return scores


def _fill_choice(
    network: StencilTransformer,
    context: _Context,
    hole: Hole,
    choice: ChoiceConstraint,
    cfg: SamplerConfig,
    generator: torch.Generator,
) -> _Fill:
    candidates = [list(c) for c in choice.candidates]
    scores = torch.tensor(score_candidates(network, context, candidates, cfg))  # [C]
    if cfg.temperature == 0:
        pick = int(scores.argmax())
    else:
        pick = int(torch.multinomial(torch.softmax(scores / cfg.temperature, 0), 1, generator=generator))
    probs = torch.softmax(scores, 0)
    trace = [{"hole": hole.name, "choice": choice.choices[pick], "p": round(float(probs[pick]), 6)}]
    return _Fill(candidates[pick], 1 + len(candidates), trace,
                 [float(probs[pick])] * len(candidates[pick]))


__all__ = [
    "ROUTE", "ar_network", "fim_prompt", "infill_batch_ar", "infill_request_ar", "score_candidates",
]
