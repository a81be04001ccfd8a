"""The block-diffusion sampler: fill a canvas's holes by iterative denoising.

The loop, per canvas (several canvases advance in lockstep in one batch):

1. Plan blocks: the hole positions, in canvas order, cut into blocks of ``block_length``
   (a ``choices`` hole is never cut). Blocks are decoded left to right; attention stays
   bidirectional over the whole canvas, so a block sees the locked text on its right.
2. Each step: one forward pass (full; with the dual cache only the active block's window,
   after a full one at each block's first step; with delayed caching only the block's masked
   positions and the tokens changed since their cache entries were written, and a full pass
   only at the blocks ``cache_refresh`` names), then
   :func:`_commit_step` pads the free holes' tails the model says are unused budget, picks
   which masked positions of the active block to commit under the commit rule (optionally
   only the likeliest while their summed error probability fits a budget, or only next to
   written text; never a word its neighbour already holds, nor two neighbours at once
   unless the model is sure of the right one, nor a word right of a masked position
   proposed the same word), writes them in one go (a pattern hole, decoded in order, may
   go on through the sure tokens after its written one, letters excepted), optionally
   re-masks a few unsure ones, and enforces the protect mask.
3. A block ends when nothing in it is masked; the request ends when no block is left, when
   ``should_stop()`` says so (cancelled: nothing is committed after), or when the step budget
   is down to one pass, which commits everything left (a flush).

All randomness comes from the one ``torch.Generator`` per canvas; at temperature 0 nothing is
drawn from it. Shapes: B batch, L canvas length, W window, V vocabulary, n positions.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gpu_worker.engine.canvas import Canvas, Hole
from gpu_worker.engine.config import SamplerConfig
from gpu_worker.engine.constraints import (
    CharAutomaton,
    ChoiceConstraint,
    PatternConstraint,
    token_table,
)
from gpu_worker.engine.model import hole_room

MAX_REMASKS_PER_POSITION = 1  # bounds re-masking, so every block finishes


# -- what the sampler reports ------------------------------------------------------------------
@dataclass
class StepInfo:
    """One step of one canvas: what ``on_step`` receives and the trace keeps."""

    step: int  # 0-based step (= forward pass) index within the request
    block: int  # index of the active block
    committed: list[int]  # canvas positions the model committed this step, ascending
    padded: list[int]  # hole positions set to pad because an EOS / pad ended their hole
    remasked: list[int]  # positions re-masked this step, ascending
    confidence: dict[str, float]  # min / mean / max probability of the step's decisions, n
    canvas_sha256: str  # sha256 of the canvas ids (int64 bytes) after the step
    ids: torch.Tensor  # [L] long on CPU: the canvas after the step (live preview; not hashed)
    masked_left: int  # masked positions left in the whole canvas after the step
    flush: bool  # True for the last pass of an exhausted step budget (commits everything)
    forward_ms: float  # wall time of the (batched) forward pass
    step_ms: float  # wall time of the whole step, forward included


@dataclass
class DenoiseResult:
    """The outcome of denoising one canvas."""

    ids: torch.Tensor  # [L] long on CPU: final ids; a hole's tail from its first EOS/pad is pad
    hole_texts: dict[str, str]  # request hole name -> its text (forced prefix stripped)
    document: str  # locked text and hole texts, in order
    steps: int  # steps taken (each one forward pass)
    forward_passes: int  # forward passes this canvas took part in
    trace: list[StepInfo]  # one entry per step, in order
    cancelled: bool  # should_stop() returned True; masks may remain
    blocks: int  # number of blocks planned


@dataclass
class _Decision:
    """Per eligible position: the token proposed and how sure the model is."""

    positions: list[int]  # [n] canvas positions, ascending
    tokens: list[int]  # [n] proposed tokens
    prob: list[float]  # [n] model probability of the proposed token
    score: torch.Tensor  # [n] float the commit rule's score (higher = surer; rules set -inf)
    held: dict[int, float] = field(default_factory=dict)  # deferred EOS / pad -> its score


@dataclass
class _Row:
    """The mutable state of one canvas in the batch."""

    canvas: Canvas
    generator: torch.Generator
    x: torch.Tensor  # [L] long view into the batch ids
    hole_at: list[int]  # [L] hole index per position, -1 = locked (a list: read one by one)
    free_at: list[bool]  # [L] whether the position lies in a free (unconstrained) hole
    blocks: list[torch.Tensor]  # [n_b] long positions of each block
    confidence: torch.Tensor  # [L] float probability at commit time (nan = never)
    remasks: torch.Tensor  # [L] long times each position was re-masked
    vocab: torch.Tensor  # [S, V] bool: the distinct static token sets (see _vocab_table)
    bias: torch.Tensor  # [S, V] float: 0 where ``vocab`` allows a token, -inf elsewhere
    vocab_ok: bool  # every static set allows a token (then a step need not check it)
    vocab_of: torch.Tensor  # [L] long: each position's set in ``vocab``
    cached_ids: torch.Tensor  # [L] long: the ids the row's cache rows were computed on
    words: frozenset[int] | None  # word tokens (the repeat rules), None = neither rule
    locked: torch.Tensor  # [L] long: the canvas ids, on the row's device (the protect mask's)
    protect: torch.Tensor  # [L] bool: the canvas protect mask, on the row's device
    choices: list[int]  # indices of the canvas's choices holes
    free_blocks: list[bool]  # per block: every position lies in a free hole (see _eligible)
    pattern_state: dict[int, int] = field(default_factory=dict)  # hole -> automaton state
    block: int = 0
    block_steps: int = 0
    steps: int = 0
    forward_passes: int = 0
    refreshed_block: int | None = None  # the block of the row's last cache refresh (None: never)
    done: bool = False
    cancelled: bool = False
    trace: list[StepInfo] = field(default_factory=list)


# -- public entry points -----------------------------------------------------------------------
def denoise(
    model: torch.nn.Module,
    canvas: Canvas,
    config: SamplerConfig,
    generator: torch.Generator,
    on_step: Callable[[StepInfo], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> DenoiseResult:
    """Fill ``canvas``'s holes. A pure function of its inputs and ``generator``'s state."""
    step_hook = (lambda _row, info: on_step(info)) if on_step is not None else None
    stop_hook = (lambda _row: should_stop()) if should_stop is not None else None
    return denoise_batch(model, [canvas], config, [generator], step_hook, stop_hook)[0]


def denoise_batch(
    model: torch.nn.Module,
    canvases: Sequence[Canvas],
    config: SamplerConfig,
    generators: Sequence[torch.Generator],
    on_step: Callable[[int, StepInfo], None] | None = None,
    should_stop: Callable[[int], bool] | None = None,
) -> list[DenoiseResult]:
    """Denoise several canvases (any lengths) in lockstep, one batched forward per step.

    Rows are right-padded with pad and hidden by the attention mask. A row's result equals
    its unbatched result up to float summation order (batched matrix products, padded
    attention): without the cache trivially; with the dual cache because each row refreshes
    its own cache rows when it starts a block, and steps on a window of its own block's
    positions (see :func:`_forward`). Hooks get the row index.
    """
    _check_inputs(model, canvases, config, generators)
    device = _model_device(model)
    length = max(c.length for c in canvases)
    ids = torch.full((len(canvases), length), model_int(model, "pad_id"), dtype=torch.long)
    attention = torch.zeros((len(canvases), length), dtype=torch.bool)
    for b, canvas in enumerate(canvases):
        ids[b, : canvas.length] = canvas.ids
        attention[b, : canvas.length] = True
    ids, attention = ids.to(device), attention.to(device)
    room = _room(model, canvases, length, device)
    rows = [
        _new_row(canvas, generators[b], ids[b, : canvas.length], config)
        for b, canvas in enumerate(canvases)
    ]
    cache: Any = None
    while True:
        active = _active_rows(rows, should_stop)
        if not active:
            break
        started = time.perf_counter()
        logits, where, cache = _forward(model, ids, attention, config, rows, active, cache, room)
        forward_ms = (time.perf_counter() - started) * 1000
        for i, b in enumerate(active):
            info = _row_step(rows[b], logits[i], where[i], config, forward_ms, started)
            if on_step is not None:
                on_step(b, info)
    return [_result(row) for row in rows]


# -- input checks and setup --------------------------------------------------------------------
def _check_inputs(
    model: torch.nn.Module,
    canvases: Sequence[Canvas],
    config: SamplerConfig,
    generators: Sequence[torch.Generator],
) -> None:
    if not isinstance(config, SamplerConfig):
        raise ValueError(f"config={config!r} must be a SamplerConfig")
    if not canvases:
        raise ValueError("canvases must hold at least one Canvas")
    if len(generators) != len(canvases):
        raise ValueError(
            f"generators has {len(generators)} entries for {len(canvases)} canvases: "
            "give one torch.Generator per canvas"
        )
    for g in generators:
        if not isinstance(g, torch.Generator):
            raise ValueError(f"generator={g!r} must be a torch.Generator")
    for canvas in canvases:
        mask_id, max_len = model_int(model, "mask_id"), model_int(model, "max_len")
        if canvas.mask_id != mask_id:
            raise ValueError(
                f"canvas mask id {canvas.mask_id} differs from the model's mask_id "
                f"{mask_id}: the canvas was built with another tokenizer"
            )
        if canvas.length > max_len:
            raise ValueError(f"canvas length {canvas.length} exceeds max_len={max_len}")
    if config.cache != "none" and not hasattr(model, "forward_window"):
        raise ValueError(
            f"cache={config.cache!r} needs a model with forward_window(); use cache='none'"
        )


def model_int(model: torch.nn.Module, name: str) -> int:
    """An integer property of the backend protocol (mask_id, pad_id, eos_id, max_len)."""
    value = getattr(model, name)
    return int(value)


def _model_device(model: torch.nn.Module) -> torch.device:
    for parameter in model.parameters():
        return parameter.device
    return torch.device("cpu")


def plan_blocks(canvas: Canvas, config: SamplerConfig) -> list[torch.Tensor]:
    """Hole positions in canvas order, cut into blocks of ``block_length`` positions.

    ``block_scope="hole"`` cuts each hole on its own; a ``choices`` hole is never cut (it is
    committed whole, so it joins the block where it starts).
    """
    blocks: list[list[int]] = []
    current: list[int] = []
    for hole in canvas.holes:
        if config.block_scope == "hole" and current:
            blocks.append(current)
            current = []
        if isinstance(hole.constraint, ChoiceConstraint):
            current.extend(range(hole.start, hole.end))
            if len(current) >= config.block_length:
                blocks.append(current)
                current = []
            continue
        for position in range(hole.start, hole.end):
            current.append(position)
            if len(current) == config.block_length:
                blocks.append(current)
                current = []
    if current:
        blocks.append(current)
    return [torch.tensor(block, dtype=torch.long) for block in blocks]


def _new_row(
    canvas: Canvas, generator: torch.Generator, x: torch.Tensor, config: SamplerConfig
) -> _Row:
    vocab, vocab_of = _vocab_table(canvas, config)
    hole_at = canvas.hole_index().tolist()
    free_at = [h >= 0 and canvas.holes[h].constraint is None for h in hole_at]
    blocks = plan_blocks(canvas, config)
    row = _Row(
        canvas=canvas,
        generator=generator,
        x=x,
        hole_at=hole_at,
        free_at=free_at,
        blocks=[b.to(x.device) for b in blocks],
        confidence=torch.full((canvas.length,), math.nan, device=x.device),
        remasks=torch.zeros(canvas.length, dtype=torch.long, device=x.device),
        vocab=vocab.to(x.device),
        bias=torch.zeros(vocab.shape).masked_fill(~vocab, -math.inf).to(x.device),
        vocab_ok=bool(vocab.any(dim=-1).all()),
        vocab_of=vocab_of.to(x.device),
        cached_ids=x.clone(),
        words=(_word_tokens(canvas)
               if config.ban_adjacent_repeats or config.hold_shifted_repeats else None),
        locked=canvas.ids.to(x.device),
        protect=canvas.protect.to(x.device),
        choices=[i for i, hole in enumerate(canvas.holes)
                 if isinstance(hole.constraint, ChoiceConstraint)],
        free_blocks=[all(free_at[p] for p in block.tolist()) for block in blocks],
    )  # fmt: skip
    for i, hole in enumerate(canvas.holes):
        if isinstance(hole.constraint, PatternConstraint):
            row.pattern_state[i] = hole.constraint.start
    _skip_finished_blocks(row)
    return row


def _word_tokens(canvas: Canvas) -> frozenset[int] | None:
    """The canvas vocabulary's word tokens (None without a tokenizer)."""
    if canvas.tokenizer is None:
        return None
    return token_table(canvas.tokenizer, int(canvas.free_vocab.numel())).words


def _active_rows(rows: list[_Row], should_stop: Callable[[int], bool] | None) -> list[int]:
    """Rows still to step; ``should_stop`` is asked once per row and step."""
    active = []
    for b, row in enumerate(rows):
        if row.done:
            continue
        if should_stop is not None and should_stop(b):
            row.cancelled = row.done = True
            continue
        active.append(b)
    return active


def _room(
    model: torch.nn.Module, canvases: Sequence[Canvas], length: int, device: torch.device
) -> torch.Tensor | None:
    """[B, length] long: each position's room in its hole's budget (model.hole_room), for a
    model with a room embedding (``config.room_buckets``); None for any other model."""
    if not getattr(getattr(model, "config", None), "room_buckets", 0):
        return None
    room = torch.zeros((len(canvases), length), dtype=torch.long)
    for b, canvas in enumerate(canvases):
        room[b] = hole_room(length, [(hole.start, hole.end) for hole in canvas.holes])
    return room.to(device)


def _is_flush(row: _Row, config: SamplerConfig) -> bool:
    return row.steps >= config.max_steps - 1


# -- the forward pass --------------------------------------------------------------------------
def _forward(
    model: torch.nn.Module,
    ids: torch.Tensor,  # [B, L]
    attention: torch.Tensor,  # [B, L] bool
    config: SamplerConfig,
    rows: list[_Row],
    active: list[int],
    cache: Any,
    room: torch.Tensor | None,  # [B, L] long, for a model with a room embedding (see _room)
) -> tuple[list[torch.Tensor], list[torch.Tensor], Any]:
    """Per active row (in ``active`` order) its logits [K, V] (float32) and ``where`` [L]:
    the logits row of each canvas position the step reads (-1 = not computed); and the cache.

    A step reads the logits of its active block's masked positions only (every position
    when it flushes), so the output head runs on those alone.

    Without the cache, one full forward of the active rows, cut to their longest canvas.
    With a cache (it keeps every row of the batch, so its tensors stay aligned): rows
    refreshing (see :func:`_refreshes`) or flushing run a full forward that rewrites their
    cache rows, and the others one window forward (see :func:`_window_forward`). A row
    with a smaller window fills it with positions that keep the cache's keys and values, so
    it sees what it would see alone.
    """
    windowed: Any = model  # forward_window is outside the minimal backend protocol
    out: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    with _precision(config, ids.device), torch.inference_mode():
        if config.cache == "none":
            index = torch.tensor(active, device=ids.device)
            length = max(rows[b].canvas.length for b in active)
            outputs, wheres = _block_outputs(rows, active, length, config, ids.device)
            extra = {} if room is None else {"room": room[index, :length]}
            if outputs is None or not hasattr(model, "forward_window"):
                logits = model(ids[index, :length], attention_mask=attention[index, :length], **extra)
                wheres = [torch.arange(length, device=ids.device)] * len(active)
            else:
                logits, _ = windowed.forward_window(
                    ids[index, :length], attention_mask=attention[index, :length], outputs=outputs,
                    **extra,
                )
            return list(_synced(logits)), wheres, None
        refresh = [b for b in active if _refreshes(rows[b], config) or _is_flush(rows[b], config)]
        if refresh:
            everyone = cache is None  # the first forward writes every row's cache
            chosen = list(range(len(rows))) if everyone else refresh
            index = torch.tensor(chosen, device=ids.device)
            steps_of = [b if b in refresh else None for b in chosen]
            outputs, wheres = _block_outputs(rows, steps_of, ids.shape[1], config, ids.device)
            logits, fresh = windowed.forward_window(
                ids[index], attention_mask=attention[index], write_cache=True, outputs=outputs,
                **({} if room is None else {"room": room[index]}),
            )
            cache = fresh if everyone else _write_rows(cache, index, fresh)
            for i, b in enumerate(chosen):
                rows[b].cached_ids = rows[b].x.clone()
                if b in refresh:
                    rows[b].refreshed_block = rows[b].block
                    out[b] = (logits[i], wheres[i])
        stepping = [b for b in active if b not in out]
        if stepping:
            stepped, cache = _window_forward(windowed, ids, attention, rows, stepping, cache,
                                             room, delayed=config.cache == "delayed")  # fmt: skip
            out.update(stepped)
    return [_synced(out[b][0]) for b in active], [out[b][1] for b in active], cache


def _refreshes(row: _Row, config: SamplerConfig) -> bool:
    """Whether the row's step runs a full forward that rewrites its cache rows: its first
    step, and a new block's (the delayed cache: as ``config.cache_refresh`` asks)."""
    if row.refreshed_block is None:
        return True
    every = config.cache_refresh if config.cache == "delayed" else 1
    return every > 0 and row.block - row.refreshed_block >= every


def _masked_in_block(row: _Row) -> torch.Tensor:
    """[n] ascending masked positions of the row's active block: what its step reads."""
    block = row.blocks[row.block]
    return block[row.x[block] == row.canvas.mask_id]


def _block_outputs(
    rows: list[_Row],
    stepping: Sequence[int | None],
    length: int,
    config: SamplerConfig,
    device: torch.device,
) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """For a full forward: the positions [len(stepping), K] whose logits the steps read (each
    row's masked block positions; None = every position, when a row flushes) and each row's
    ``where``. A None in ``stepping`` is a row that runs without a step (no outputs read)."""
    if any(b is not None and _is_flush(rows[b], config) for b in stepping):
        return None, [torch.arange(length, device=device)] * len(stepping)
    empty = torch.zeros(0, dtype=torch.long, device=device)
    reads = [_masked_in_block(rows[b]) if b is not None else empty for b in stepping]
    return _read_map(reads, None, length, device)


def _read_map(
    reads: list[torch.Tensor],
    windows: list[torch.Tensor] | None,
    length: int,
    device: torch.device,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The output indices [A, K] of each row's ``reads`` (ascending positions) in its window
    (ascending positions; None = the whole sequence, where a position is its own index),
    filled up by repeating a row's first; and each row's ``where`` [length]: the output row of
    each read position (-1 elsewhere)."""
    width = max(1, max(int(read.numel()) for read in reads))
    outputs = torch.zeros((len(reads), width), dtype=torch.long, device=device)
    wheres = []
    for i, read in enumerate(reads):
        n = int(read.numel())
        where = torch.full((length,), -1, dtype=torch.long, device=device)
        if n:
            at = read if windows is None else torch.searchsorted(windows[i], read)
            outputs[i, :n] = at
            outputs[i, n:] = at[0]
            where[read] = torch.arange(n, device=device)
        wheres.append(where)
    return outputs, wheres


def _stack_windows(
    windows: list[torch.Tensor], length: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows' window positions as one [A, W] tensor (W the widest window), each row filled up
    with positions outside its window; and the [A, W] filler mask."""
    width = max(int(window.numel()) for window in windows)
    positions = torch.empty((len(windows), width), dtype=torch.long, device=device)
    filler = torch.zeros((len(windows), width), dtype=torch.bool, device=device)
    for i, window in enumerate(windows):
        n = int(window.numel())
        positions[i, :n] = window
        if n < width:
            outside = torch.ones(length, dtype=torch.bool, device=device)
            outside[window] = False
            positions[i, n:] = outside.nonzero().squeeze(-1)[: width - n]
            filler[i, n:] = True
    return positions, filler


def _window_forward(
    windowed: Any,
    ids: torch.Tensor,  # [B, L]
    attention: torch.Tensor,  # [B, L] bool
    rows: list[_Row],
    stepping: list[int],
    cache: Any,
    room: torch.Tensor | None,  # [B, L] long or None, see _room
    *,
    delayed: bool,
) -> tuple[dict[int, tuple[torch.Tensor, torch.Tensor]], Any]:
    """One window forward of the ``stepping`` rows: row -> (logits, where), and the cache.

    ``dual`` (Fast-dLLM): the window is the row's active block, every other position is
    read from the cache written when the block began. ``delayed`` (dKV-Cache's delayed
    caching): the window is the block's masked positions plus every position whose token
    changed since its cache entry was written (a token committed or padded last step, or in
    the previous block's last step when this block began without a refresh); their keys and
    values are written back, so a committed token is recomputed once, in the step after its
    commit, and read from the cache after that.
    """
    device = ids.device
    reads = [_masked_in_block(rows[b]) for b in stepping]
    if delayed:
        windows = []
        for b, read in zip(stepping, reads, strict=True):
            row = rows[b]
            inside = row.x != row.cached_ids  # [L] stale positions ...
            inside[read] = True  # ... and the ones the step reads
            windows.append(inside.nonzero().squeeze(-1))  # ascending
    else:
        windows = [rows[b].blocks[rows[b].block] for b in stepping]  # ascending each
    # filler positions lie outside a row's window and keep their cached keys and values
    positions, filler = _stack_windows(windows, ids.shape[1], device)
    outputs, wheres = _read_map(reads, windows, ids.shape[1], device)
    index = torch.tensor(stepping, device=device)
    everyone = len(stepping) == len(rows)
    # Writing the window into the cache in place (write_cache) spares a copy of it per layer.
    # The dual cache may take it too when every row steps: a block's own keys and values are
    # recomputed at each of its steps, and rewritten by the refresh that begins the next.
    logits, fresh = windowed.forward_window(
        ids[index].gather(1, positions),
        positions=positions,
        cache=cache if everyone else _read_rows(cache, index),
        attention_mask=attention[index],
        from_cache=filler if bool(filler.any()) else None,
        write_cache=delayed or everyone,
        outputs=outputs,
        **({} if room is None else {"room": room[index].gather(1, positions)}),
    )
    if delayed or everyone:
        cache = fresh if everyone else _write_rows(cache, index, fresh)
    if delayed:
        for b, window in zip(stepping, windows, strict=True):
            rows[b].cached_ids[window] = rows[b].x[window]
    return {b: (logits[i], wheres[i]) for i, b in enumerate(stepping)}, cache


def _read_rows(cache: Any, index: torch.Tensor) -> Any:
    """The dual cache of the rows in ``index`` (a new cache of the same type)."""

    def pick(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.index_select(0, index)

    return type(cache)(
        [k.index_select(0, index) for k in cache.keys],
        [v.index_select(0, index) for v in cache.values],
        pick(cache.copy_keys),
        pick(cache.ids),
    )


def _write_rows(cache: Any, index: torch.Tensor, fresh: Any) -> Any:
    """``cache`` with the rows in ``index`` replaced by ``fresh``'s (in place)."""
    for old, new in zip(cache.keys + cache.values, fresh.keys + fresh.values, strict=True):
        old[index] = new
    if cache.copy_keys is not None:
        cache.copy_keys[index] = fresh.copy_keys
        cache.ids[index] = fresh.ids
    return cache


def _synced(logits: torch.Tensor) -> torch.Tensor:
    """float32 logits, after the device has finished (so forward timings are true)."""
    if logits.device.type == "cuda":
        torch.cuda.synchronize(logits.device)
    return logits.float()


def _precision(
    config: SamplerConfig, device: torch.device
) -> contextlib.AbstractContextManager[None]:
    if config.precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


# -- one step of one row -----------------------------------------------------------------------
def _row_step(
    row: _Row,
    logits: torch.Tensor,  # [W, V] the row's window logits
    where: torch.Tensor,  # [L] the logits row of each canvas position
    config: SamplerConfig,
    forward_ms: float,
    started: float,
) -> StepInfo:
    flush = _is_flush(row, config)
    block = row.block
    if flush:
        committed, padded, probs = _flush(row, logits, where, config)
        remasked: list[int] = []
    else:
        committed, padded, probs = _commit_step(row, logits, where, config)
        remasked = _remask(row, config, committed) if config.remask != "none" else []
    row.x.copy_(torch.where(row.protect, row.locked, row.x))  # the protect mask, every step
    row.steps += 1
    row.forward_passes += 1
    row.block_steps += 1
    _skip_finished_blocks(row)
    if flush:
        row.done = True
    if row.done:
        _strip_tails(row)
    info = StepInfo(
        step=row.steps - 1,
        block=block,
        committed=sorted(committed),
        padded=sorted(padded),
        remasked=sorted(remasked),
        confidence=_summary(probs),
        canvas_sha256=canvas_sha256(row.x),
        ids=row.x.detach().to("cpu", copy=True),
        masked_left=int((row.x == row.canvas.mask_id).sum()),
        flush=flush,
        forward_ms=forward_ms,
        step_ms=(time.perf_counter() - started) * 1000,
    )
    row.trace.append(info)
    return info


def _commit_step(
    row: _Row, logits: torch.Tensor, where: torch.Tensor, config: SamplerConfig
) -> tuple[list[int], list[int], list[float]]:
    """Commit positions of the active block; returns (committed, padded, probabilities)."""
    block = row.blocks[row.block]  # [n_b]
    committed: list[int] = []
    padded: list[int] = []
    probs: list[float] = []
    for hole_index in _unscored_choices(row, block):
        positions, prob = _commit_choice(row, hole_index, logits, where, config)
        committed.extend(positions)
        probs.append(prob)
    eligible = _eligible(row, block, all_free=row.free_blocks[row.block])
    scores = _allowed_scores(row, eligible, logits, where)  # [n, V]
    if config.stop_on_eos and config.tail_threshold < 1.0 and eligible.numel():
        tails = _pad_tails(row, eligible, scores, config)
        if tails:
            padded.extend(tails)
            keep = row.x[eligible] == row.canvas.mask_id
            eligible, scores = eligible[keep], scores[keep]
    decision = _propose(row, eligible, scores, config)
    if decision is None:
        return committed, padded, probs
    quota = _quota(row, block, config) if config.commit_rule == "even" else 0
    chosen = _select(row, decision, quota, config)  # indices into the decision
    if decision.held and config.commit_rule != "even":
        chosen = _release_ends(row, decision, chosen, config)
    picks = [(decision.positions[i], decision.tokens[i], decision.prob[i])
             for i in sorted(chosen)]  # fmt: skip
    written, ended = _write(row, picks, config, no_repeats=config.ban_adjacent_repeats,
                            before=committed)  # fmt: skip
    committed.extend(written)
    padded.extend(ended)
    probs.extend(decision.prob)
    if config.pattern_runs and config.commit_rule != "even":
        for position in written:
            if row.hole_at[position] in row.pattern_state:
                run, run_padded, run_probs = _pattern_run(
                    row, position, int(block[-1]), logits, where, config
                )
                committed.extend(run)
                padded.extend(run_padded)
                probs.extend(run_probs)
    return committed, padded, probs


def _pattern_run(
    row: _Row,
    position: int,
    last: int,
    logits: torch.Tensor,
    where: torch.Tensor,
    config: SamplerConfig,
) -> tuple[list[int], list[int], list[float]]:
    """``pattern_runs``: after a pattern hole's ``position`` is written, its next masked
    positions (up to the block's ``last``) are proposed one by one from the same logits,
    each under the automaton state its left neighbour's token led to, and written while
    each passes the rule and ``neighbour_threshold`` and holds no letter; an EOS / pad ends
    the hole. Returns (committed, padded, probabilities), as :func:`_commit_step` does."""
    hole = row.canvas.holes[row.hole_at[position]]
    assert isinstance(hole.constraint, PatternConstraint)
    words, mask_id = hole.constraint.table.words, row.canvas.mask_id
    committed: list[int] = []
    padded: list[int] = []
    probs: list[float] = []
    nxt = position + 1
    while nxt < hole.end and nxt <= last and int(row.x[nxt]) == mask_id and int(where[nxt]) >= 0:
        eligible = torch.tensor([nxt], dtype=torch.long, device=row.x.device)
        decision = _propose(row, eligible, _allowed_scores(row, eligible, logits, where), config)
        assert decision is not None
        token, prob = decision.tokens[0], decision.prob[0]
        if token in words or prob < config.neighbour_threshold:
            break
        if not bool(_passes(decision.score[0], config)):
            break
        written, ended = _write(row, [(nxt, token, prob)], config, no_repeats=False)
        committed.extend(written)
        padded.extend(ended)
        probs.append(prob)
        nxt += 1
    return committed, padded, probs


def _pad_tails(
    row: _Row, eligible: torch.Tensor, scores: torch.Tensor, config: SamplerConfig
) -> list[int]:
    """Pad each free hole's masked tail, from the hole's last position leftwards, while the
    model gives EOS and pad together more than ``tail_threshold``; the walk stops at a
    committed token, a position not in ``eligible`` (outside the active block), or the hole's
    first position (never padded). ``scores`` [n, V] are ``eligible``'s allowed scores.
    Returns the padded positions."""
    holes = row.canvas.holes
    positions = eligible.tolist()
    free = [i for i, p in enumerate(positions) if row.free_at[p]]
    if not free:
        return []
    ends = list(row.canvas.terminators())
    if len(free) < len(positions):
        scores = scores[torch.tensor(free, dtype=torch.long, device=scores.device)]
    end_prob = torch.softmax(scores, dim=-1)[:, ends].sum(-1).tolist()
    prob_at = {positions[i]: p for i, p in zip(free, end_prob, strict=True)}
    x = row.x.tolist()
    padded: list[int] = []
    for hole_index in sorted({row.hole_at[positions[i]] for i in free}):
        hole = holes[hole_index]
        for position in range(hole.end - 1, hole.start, -1):
            if x[position] == row.canvas.pad_id:
                continue  # the tail padded before
            if prob_at.get(position, 0.0) <= config.tail_threshold:
                break
            padded.append(position)
    if padded:
        at = torch.tensor(padded, dtype=torch.long, device=row.x.device)
        row.x[at] = row.canvas.pad_id
        row.confidence[at] = torch.tensor([prob_at[p] for p in padded], device=row.x.device)
    return padded


def _eligible(row: _Row, block: torch.Tensor, all_free: bool = False) -> torch.Tensor:
    """[n] masked positions of the block that may be committed now; ``all_free`` says every
    position of ``block`` lies in a free hole (then each masked one is).

    A pattern hole is decoded in order, so only its leftmost masked position is eligible; a
    choices hole is committed whole elsewhere.
    """
    masked = block[row.x[block] == row.canvas.mask_id]
    if all_free:
        return masked
    keep: list[int] = []
    seen_pattern: set[int] = set()
    x = row.x.tolist()
    for position in masked.tolist():
        if row.free_at[position]:
            keep.append(position)
            continue
        hole_index = row.hole_at[position]
        constraint = row.canvas.holes[hole_index].constraint
        if isinstance(constraint, ChoiceConstraint):
            continue
        if isinstance(constraint, PatternConstraint):
            hole = row.canvas.holes[hole_index]
            if hole_index in seen_pattern or _first_masked(row, hole, x) != position:
                continue
            seen_pattern.add(hole_index)
        keep.append(position)
    return torch.tensor(keep, dtype=torch.long, device=block.device)


def _first_masked(row: _Row, hole: Hole, x: list[int]) -> int:
    """The first masked position of ``hole`` in ``x`` (the canvas as a list), -1 if none."""
    mask_id = row.canvas.mask_id
    return next((p for p in range(hole.start, hole.end) if x[p] == mask_id), -1)


def _vocab_table(canvas: Canvas, config: SamplerConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct static token sets [S, V] bool of the canvas's positions, and the set of
    each position [L] (a pattern hole's positions are decided per step, see :func:`_allowed`).

    A free position may take the canvas's free vocabulary; a position with a forced prefix
    only tokens that start with it. With ``stop_on_eos`` a free hole's first position never
    takes EOS / pad: a hole asked for is never left empty.
    """
    sets = [canvas.free_vocab]
    index = torch.zeros(canvas.length, dtype=torch.long)
    for position, tokens in canvas.allowed.items():
        sets.append(tokens)
        index[position] = len(sets) - 1
    for hole in canvas.holes:
        if config.stop_on_eos and hole.constraint is None:
            position = hole.start
            content = sets[int(index[position])].clone()
            content[list(canvas.terminators())] = False
            if bool(content.any()):
                sets.append(content)
                index[position] = len(sets) - 1
    return torch.stack(sets), index


def _defer_early_ends(row: _Row, decision: _Decision) -> None:
    """With ``stop_on_eos``: an EOS / pad proposed in a free hole waits while an earlier
    position of that hole is still masked (its score becomes -inf, the score it had is kept in
    ``held``), so where a hole ends is decided after what it says; the hole's earliest masked
    position is never deferred. See :func:`_release_ends` for the threshold rules."""
    ends, positions, tokens = row.canvas.terminators(), decision.positions, decision.tokens
    if not any(token in ends for token in tokens):
        return
    first: dict[int, int] = {}  # hole -> its first masked position, looked up once
    scores, x = decision.score.tolist(), row.x.tolist()
    for i, (position, token) in enumerate(zip(positions, tokens, strict=True)):
        if token not in ends:
            continue
        hole_index = row.hole_at[position]
        hole = row.canvas.holes[hole_index]
        if hole_index not in first:
            first[hole_index] = _first_masked(row, hole, x)
        if hole.constraint is None and 0 <= first[hole_index] < position:
            decision.held[i] = scores[i]
    if decision.held:
        held = torch.tensor(sorted(decision.held), dtype=torch.long, device=decision.score.device)
        decision.score[held] = -math.inf


def _allowed_scores(
    row: _Row, positions: torch.Tensor, logits: torch.Tensor, where: torch.Tensor
) -> torch.Tensor:
    """[n, V] the logits of ``positions`` with every token they may not take at -inf: each
    position's static set (see :func:`_vocab_table`); a pattern hole's position takes its
    automaton state's set instead."""
    reads = where[positions]
    scores = logits.index_select(0, reads)  # [n, V], a copy
    if positions.numel() == 0:
        return scores
    sets = row.vocab_of[positions]
    if scores.shape[-1] == row.bias.shape[-1]:
        # adding 0 / -inf is masking for logits that are finite or -inf, in one cheap pass
        scores.add_(row.bias.index_select(0, sets))
    else:  # a model vocabulary wider than the canvas's: the extra tokens are never allowed
        scores.masked_fill_(_widened(~row.vocab[sets], scores.shape[-1]), -math.inf)
    patterned: list[int] = []  # rows of pattern-hole positions
    for i, position in enumerate(positions.tolist()):
        hole_index = row.hole_at[position]
        if hole_index in row.pattern_state:
            patterned.append(i)
            allowed = _pattern_allowed(row, hole_index, position)
            if not bool(allowed.any()):
                raise RuntimeError(f"no allowed token at position {position}")
            banned = _widened(~allowed[None, :], scores.shape[-1])[0]
            scores[i] = logits[int(reads[i])].masked_fill(banned, -math.inf)
    if not row.vocab_ok:  # some static set is empty: is it one of these positions'?
        nonempty = row.vocab[sets].any(dim=-1)
        nonempty[patterned] = True
        if not bool(nonempty.all()):
            raise RuntimeError(f"no allowed token at some of positions {positions.tolist()}")
    return scores


def _widened(banned: torch.Tensor, width: int) -> torch.Tensor:
    """[n, width] bool: ``banned`` [n, V] with the tokens past V banned too."""
    if width == banned.shape[-1]:
        return banned
    return torch.cat([banned, banned.new_ones((banned.shape[0], width - banned.shape[-1]))], -1)


def _pattern_allowed(row: _Row, hole_index: int, position: int) -> torch.Tensor:
    """[V] bool: the tokens a pattern hole's automaton allows at ``position`` now."""
    hole = row.canvas.holes[hole_index]
    assert isinstance(hole.constraint, PatternConstraint)
    state = row.pattern_state[hole_index]
    return hole.constraint.allowed(state, hole.end - position).to(row.vocab.device)


def _ban_repeats(row: _Row, positions: torch.Tensor, scores: torch.Tensor) -> None:
    """In place: each free-hole position's score of the word token written right before it
    or right after it (past the hole's tail pad) becomes -inf. A position with a forced
    prefix is left alone (its few tokens are not narrowed further); any other free position
    allows thousands of tokens, so two bans never leave it without one."""
    words = row.words
    if words is None:
        return
    x, pad_id = row.x.tolist(), row.canvas.pad_id
    rows: list[int] = []
    tokens: list[int] = []
    for i, position in enumerate(positions.tolist()):
        if not row.free_at[position] or position in row.canvas.allowed:
            continue  # constrained, or a forced prefix's few tokens: never narrowed further
        right = position + 1
        while right < len(x) and x[right] == pad_id:
            right += 1
        neighbours = {x[position - 1]} if position > 0 else set()
        neighbours |= {x[right]} if right < len(x) else set()
        for token in sorted(neighbours):
            if token in words:
                rows.append(i)
                tokens.append(token)
    if rows:
        scores[rows, tokens] = -math.inf


def _repeats_left(
    row: _Row, position: int, token: int, written: dict[int, int], before: Sequence[int]
) -> bool:
    """Whether ``token``, in a free hole, is a word token equal to the one committed right
    before ``position`` in this step: in ``written`` (not yet on the canvas) or ``before``."""
    if row.words is None or token not in row.words or not row.free_at[position]:
        return False
    left = position - 1
    if left in written:
        return written[left] == token
    return left >= 0 and left in before and int(row.x[left]) == token


def _propose(
    row: _Row, positions: torch.Tensor, scores: torch.Tensor, config: SamplerConfig
) -> _Decision | None:
    """Sample (or take the argmax of) a token per position and score the rule's confidence;
    ``scores`` [n, V] are the positions' allowed scores (see :func:`_allowed_scores`)."""
    if positions.numel() == 0:
        return None
    if config.ban_adjacent_repeats:
        _ban_repeats(row, positions, scores)
    probs = torch.softmax(scores, dim=-1)  # [n, V] the model's distribution over allowed tokens
    tokens = _pick_tokens(scores, config, row.generator)  # [n]
    prob = probs.gather(-1, tokens[:, None]).squeeze(-1)  # [n]
    if config.commit_rule == "margin":
        others = probs.scatter(-1, tokens[:, None], 0.0)
        score = prob - others.max(dim=-1).values
    elif config.commit_rule == "entropy":
        score = -torch.special.entr(probs).sum(-1)  # minus the entropy in nats
    else:
        score = prob
    decision = _Decision(positions.tolist(), tokens.tolist(), prob.tolist(), score)
    if config.stop_on_eos:
        _defer_early_ends(row, decision)
    if config.hold_shifted_repeats:
        _hold_shifted_repeats(row, decision)
    return decision


def _hold_shifted_repeats(row: _Row, decision: _Decision) -> None:
    """In place: a free-hole position whose left neighbour in its hole is proposed in this
    same decision (so it is still masked) with the same word token gets score -inf for this
    step; the run's leftmost position keeps its score (see ``hold_shifted_repeats``)."""
    words, positions, tokens = row.words, decision.positions, decision.tokens
    if words is None or len(positions) < 2:
        return
    held = [
        i for i in range(1, len(positions))
        if positions[i - 1] == positions[i] - 1 and tokens[i - 1] == tokens[i]
        and tokens[i] in words and row.free_at[positions[i]]
        and row.hole_at[positions[i - 1]] == row.hole_at[positions[i]]
    ]  # fmt: skip
    if held:
        decision.score[torch.tensor(held, dtype=torch.long, device=decision.score.device)] = -math.inf


def _pick_tokens(
    scores: torch.Tensor, config: SamplerConfig, generator: torch.Generator
) -> torch.Tensor:
    """[n] tokens: argmax at temperature 0 (no draw), else a top-p sample from the generator."""
    if config.temperature == 0:
        return scores.argmax(dim=-1)
    tempered = torch.softmax(scores / config.temperature, dim=-1)  # [n, V]
    if config.top_p < 1.0:
        sorted_p, order = tempered.sort(dim=-1, descending=True)
        outside = sorted_p.cumsum(-1) - sorted_p > config.top_p  # keeps at least the top one
        sorted_p = sorted_p.masked_fill(outside, 0.0)
        tempered = torch.zeros_like(tempered).scatter(-1, order, sorted_p)
    draws = torch.multinomial(tempered.to(generator.device), 1, generator=generator)
    return draws.squeeze(-1).to(scores.device)


def _quota(row: _Row, block: torch.Tensor, config: SamplerConfig) -> int:
    """The even rule's count this step: ceil(masked left / steps left), the LLaDA schedule.

    ceil(n / s) then ceil((n - that) / (s - 1)) ... gives base + 1 on the first n mod s
    steps and base after. Once the block's steps are spent, everything eligible.
    """
    masked = int((row.x[block] == row.canvas.mask_id).sum())
    steps_left = config.steps_per_block - row.block_steps
    return masked if steps_left <= 0 else max(1, -(-masked // steps_left))


def _select(row: _Row, decision: _Decision, quota: int, config: SamplerConfig) -> list[int]:
    """Indices into the decision of the positions to commit (never none); ``quota`` is the
    even rule's count (see :func:`_quota`), unread by the other rules."""
    score = decision.score
    if config.commit_rule == "even":
        k = max(1, min(quota, int(torch.isfinite(score).sum())))
        return torch.topk(score, k).indices.tolist()
    chosen = _passes(score, config).nonzero().squeeze(-1).tolist()
    if not chosen:
        return [int(score.argmax())]
    if config.error_budget > 0:
        chosen = _within_budget(decision, chosen, config.error_budget)
    if config.neighbour_threshold > 0:
        chosen = _apart(row, decision, chosen, config.neighbour_threshold)
    if config.anchored:
        chosen = _anchored(row, decision, chosen)
    return chosen


def _anchored(row: _Row, decision: _Decision, chosen: list[int]) -> list[int]:
    """``chosen`` without each free-hole position that is neither next to a position that is
    not masked nor chained to one through other chosen positions of its hole (see
    ``anchored``; a chain stops at a hole's edge, as ``_apart``'s neighbour bar does); when
    none is left, the surest anchored position of the decision. Ascending."""
    x, mask_id, positions = row.x.tolist(), row.canvas.mask_id, decision.positions

    def fixed(p: int) -> bool:  # constrained, or next to written text or the canvas's edge
        return (not row.free_at[p] or p == 0 or x[p - 1] != mask_id
                or p + 1 == len(x) or x[p + 1] != mask_id)  # fmt: skip

    index = {positions[i]: i for i in chosen}
    kept = {p for p in index if fixed(p)}
    hole_at = row.hole_at
    for p in sorted(index):  # chains growing rightwards from an anchor ...
        if p - 1 in kept and hole_at[p - 1] == hole_at[p]:
            kept.add(p)
    for p in sorted(index, reverse=True):  # ... and leftwards, inside a hole
        if p + 1 in kept and hole_at[p + 1] == hole_at[p]:
            kept.add(p)
    if kept:
        return sorted(index[p] for p in kept)
    score = decision.score.tolist()
    anchored = [i for i, p in enumerate(positions) if fixed(p) and math.isfinite(score[i])]
    if not anchored:
        return chosen
    return [max(anchored, key=lambda i: (score[i], -i))]


def _within_budget(decision: _Decision, chosen: list[int], budget: float) -> list[int]:
    """The likeliest of ``chosen`` (ties: the leftmost first) while their summed error
    probability 1 - p stays within ``budget``; at least the likeliest one. Ascending."""
    prob = decision.prob
    keep: list[int] = []
    spent = 0.0
    for i in sorted(chosen, key=lambda j: -prob[j]):  # a stable sort: ties keep their order
        spent += 1.0 - prob[i]
        if keep and spent > budget:
            break
        keep.append(i)
    return sorted(keep)


def _apart(row: _Row, decision: _Decision, chosen: list[int], bar: float) -> list[int]:
    """``chosen`` (ascending) without each position whose left neighbour in its hole is
    committed in the same step and whose probability is below ``bar``, walking left to right
    (a dropped position frees its right neighbour). The leftmost chosen position stays."""
    positions, prob = decision.positions, decision.prob
    keep: list[int] = []
    kept: set[int] = set()
    for i in sorted(chosen, key=positions.__getitem__):
        p = positions[i]
        if p - 1 in kept and row.hole_at[p - 1] == row.hole_at[p] and prob[i] < bar:
            continue
        keep.append(i)
        kept.add(p)
    return sorted(keep)


def _passes(score: torch.Tensor | float, config: SamplerConfig) -> Any:
    """[n] bool (or one bool for a float): the scores sure enough for a threshold / margin /
    entropy rule."""
    if config.commit_rule == "entropy":
        return -score <= config.entropy_threshold
    return score >= config.threshold


def _release_ends(
    row: _Row, decision: _Decision, chosen: list[int], config: SamplerConfig
) -> list[int]:
    """``chosen`` plus each held-back EOS / pad that passes the rule on its own score, has
    at least ``neighbour_threshold`` probability (it was judged with those positions
    masked), and whose hole has every earlier masked position committed in this same step: a
    hole the model is sure of ends in the pass that writes it, not one pass later."""
    positions, probs = decision.positions, decision.prob
    x, mask_id = row.x.tolist(), row.canvas.mask_id
    picked = set(chosen)
    committing = {positions[i] for i in picked}
    for i in sorted(decision.held, key=lambda j: positions[j]):
        position = positions[i]
        if not _passes(decision.held[i], config) or probs[i] < config.neighbour_threshold:
            continue
        hole = row.canvas.holes[row.hole_at[position]]
        earlier = (p for p in range(hole.start, position) if x[p] == mask_id)
        if all(p in committing for p in earlier):
            picked.add(i)
            committing.add(position)
    return sorted(picked)


def _write(
    row: _Row,
    picks: Sequence[tuple[int, int, float]],
    config: SamplerConfig,
    *,
    no_repeats: bool,
    before: Sequence[int] = (),
) -> tuple[list[int], list[int]]:
    """Commit ``picks`` (position, token, probability; masked positions, ascending) left to
    right, so an EOS / pad pads the rest of its hole (see :func:`_pad_after`) and a later
    pick it padded is skipped; with ``no_repeats`` (``ban_adjacent_repeats``) so is a pick
    whose left neighbour took the same word in this step (an earlier pick, or one of
    ``before``, this step's earlier commits). The tokens are written to the canvas in one
    go at the end. Returns (committed, padded) positions."""
    ends = row.canvas.terminators()
    written: dict[int, int] = {}  # position -> token, in commit order
    confidence: list[float] = []
    padded: list[int] = []
    for position, token, prob in picks:
        if position in padded:
            continue  # padded by an EOS committed before it
        if no_repeats and _repeats_left(row, position, token, written, before):
            continue
        written[position] = token
        confidence.append(prob)
        hole_index = row.hole_at[position]
        hole = row.canvas.holes[hole_index]
        constraint = hole.constraint
        if isinstance(constraint, PatternConstraint):
            state = constraint.advance(row.pattern_state[hole_index], token)
            if token not in ends and state == CharAutomaton.DEAD:
                raise RuntimeError(f"pattern hole {hole.name!r} took a disallowed token {token}")
            row.pattern_state[hole_index] = state
        if token in ends and (config.stop_on_eos or constraint is not None):
            padded.extend(_pad_after(row, hole, position))
    if written:  # one write for the step's commits (the pads are written by _pad_after)
        at = torch.tensor(list(written), dtype=torch.long, device=row.x.device)
        row.x[at] = torch.tensor(list(written.values()), dtype=torch.long, device=row.x.device)
        row.confidence[at] = torch.tensor(confidence, device=row.x.device)
    return list(written), padded


def _pad_after(row: _Row, hole: Hole, position: int) -> list[int]:
    """Set the masked positions of ``hole`` after ``position`` to pad (positions left of it
    may still await their write: see :func:`_write`)."""
    span = torch.arange(position + 1, hole.end, device=row.x.device)
    span = span[row.x[span] == row.canvas.mask_id]
    row.x[span] = row.canvas.pad_id
    return span.tolist()


def _unscored_choices(row: _Row, block: torch.Tensor) -> list[int]:
    """Choices holes starting in this block that are still masked."""
    choices = row.choices
    if not choices:
        return []
    positions = set(block.tolist())
    holes = row.canvas.holes
    return [
        i
        for i in choices
        if holes[i].start in positions and int(row.x[holes[i].start]) == row.canvas.mask_id
    ]


def _commit_choice(
    row: _Row, hole_index: int, logits: torch.Tensor, where: torch.Tensor, config: SamplerConfig
) -> tuple[list[int], float]:
    """Score every candidate as a whole and commit one; returns (positions, posterior)."""
    hole = row.canvas.holes[hole_index]
    assert isinstance(hole.constraint, ChoiceConstraint)
    log_probs = torch.log_softmax(logits[where[hole.start : hole.end]], dim=-1)  # [h, V]
    pad = row.canvas.pad_id
    candidates = torch.tensor(
        [list(c) + [pad] * (hole.max_len - len(c)) for c in hole.constraint.candidates],
        dtype=torch.long,
        device=log_probs.device,
    )  # [C, h]: each candidate's tokens, then pad to the hole's end
    positions = torch.arange(hole.max_len, device=log_probs.device)
    totals = log_probs[positions[None, :], candidates].sum(-1)  # [C] log-likelihoods
    posterior = torch.softmax(totals, dim=-1)  # [C]
    if config.temperature == 0:
        pick = int(totals.argmax())
    else:
        weights = torch.softmax(totals / config.temperature, dim=-1).to(row.generator.device)
        pick = int(torch.multinomial(weights, 1, generator=row.generator))
    row.x[hole.start : hole.end] = candidates[pick]
    row.confidence[hole.start : hole.end] = float(posterior[pick])
    return list(range(hole.start, hole.end)), float(posterior[pick])


def _remask(row: _Row, config: SamplerConfig, just_committed: list[int]) -> list[int]:
    """Re-mask up to ``remask_budget`` unsure committed tokens of the active block.

    Only free-text hole positions (never locked, never constrained, never EOS / pad, never
    this step's commits), each at most MAX_REMASKS_PER_POSITION times, least confident first.
    """
    if row.block >= len(row.blocks) or config.remask_budget == 0:
        return []
    block = row.blocks[row.block]
    fresh = torch.tensor(just_committed, dtype=torch.long, device=block.device)
    candidates = block[
        (row.x[block] != row.canvas.mask_id)
        & ~torch.isin(row.x[block], torch.tensor(row.canvas.terminators(), device=block.device))
        & ~torch.isin(block, fresh)
        & (row.remasks[block] < MAX_REMASKS_PER_POSITION)
        & (row.confidence[block] < config.remask_below)
        & ~row.canvas.protect.to(block.device)[block]
    ]
    free = [
        p for p in candidates.tolist() if row.canvas.holes[row.hole_at[p]].constraint is None
    ]
    if not free:
        return []
    chosen_t = torch.tensor(free, dtype=torch.long, device=block.device)
    order = row.confidence[chosen_t].argsort()[: config.remask_budget]
    chosen = chosen_t[order]
    row.x[chosen] = row.canvas.mask_id
    row.confidence[chosen] = math.nan
    row.remasks[chosen] += 1
    return chosen.tolist()


def _flush(
    row: _Row, logits: torch.Tensor, where: torch.Tensor, config: SamplerConfig
) -> tuple[list[int], list[int], list[float]]:
    """The budget's last pass: commit every masked position of the canvas from one forward.

    Pattern holes are walked left to right with the same logits, so they still match.
    """
    committed: list[int] = []
    padded: list[int] = []
    probs: list[float] = []
    for hole_index, hole in enumerate(row.canvas.holes):
        if int(row.x[hole.start]) == row.canvas.mask_id and isinstance(
            hole.constraint, ChoiceConstraint
        ):
            positions, prob = _commit_choice(row, hole_index, logits, where, config)
            committed.extend(positions)
            probs.append(prob)
            continue
        while True:  # each pass commits at least one position of this hole
            span = torch.arange(hole.start, hole.end, device=row.x.device)
            masked = span[row.x[span] == row.canvas.mask_id]
            if masked.numel() == 0:
                break
            eligible = _eligible(row, masked)
            scores = _allowed_scores(row, eligible, logits, where)
            decision = _propose(row, eligible, scores, config)
            assert decision is not None
            picks = zip(decision.positions, decision.tokens, decision.prob, strict=True)
            written, ended = _write(row, list(picks), config, no_repeats=False)
            committed.extend(written)
            padded.extend(ended)
            probs.extend(decision.prob)
    return committed, padded, probs


# -- bookkeeping -------------------------------------------------------------------------------
def _skip_finished_blocks(row: _Row) -> None:
    """Advance past blocks with nothing masked; mark the row done after the last."""
    while row.block < len(row.blocks):
        block = row.blocks[row.block]
        if bool((row.x[block] == row.canvas.mask_id).any()):
            return
        row.block += 1
        row.block_steps = 0
    row.done = True


def _strip_tails(row: _Row) -> None:
    """From a hole's first EOS / pad on, every position becomes pad."""
    for hole in row.canvas.holes:
        span = row.x[hole.start : hole.end]
        ends = torch.isin(span, torch.tensor(row.canvas.terminators(), device=span.device))
        if bool(ends.any()):
            first = int(ends.nonzero()[0])
            span[first:] = row.canvas.pad_id


def canvas_sha256(ids: torch.Tensor) -> str:
    """sha256 of ids as little-endian int64 bytes."""
    return hashlib.sha256(ids.detach().to("cpu", torch.int64).numpy().tobytes()).hexdigest()


def _summary(probs: list[float]) -> dict[str, float]:
    if not probs:
        return {"n": 0.0, "min": 0.0, "mean": 0.0, "max": 0.0}
    return {
        "n": float(len(probs)),
        "min": min(probs),
        "mean": sum(probs) / len(probs),
        "max": max(probs),
    }


def _result(row: _Row) -> DenoiseResult:
    ids = row.x.detach().cpu().clone()
    tokenizer = row.canvas.tokenizer
    texts = row.canvas.hole_texts(ids, tokenizer) if tokenizer is not None else {}
    document = row.canvas.document(ids, tokenizer) if tokenizer is not None else ""
    return DenoiseResult(
        ids=ids,
        hole_texts=texts,
        document=document,
        steps=row.steps,
        forward_passes=row.forward_passes,
        trace=row.trace,
        cancelled=row.cancelled,
        blocks=len(row.blocks),
    )


__all__ = ["DenoiseResult", "StepInfo", "canvas_sha256", "denoise", "denoise_batch", "plan_blocks"]
