"""Canvases longer than the model: each hole filled from a window of its nearest context."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_worker.engine.backends import load_backend
from gpu_worker.engine.canvas import parse_canvas
from gpu_worker.engine.infill import infill_batch
from gpu_worker.engine.loaded import LoadedModel
from gpu_worker.engine.outcome import AR, DIFFUSION
from gpu_worker.engine.run import run, run_batch
from gpu_worker.engine.sampler import model_int
from gpu_worker.engine.window import _window_for, infill_windowed

REPO = Path(__file__).resolve().parents[2]
PLACEHOLDER = REPO / "models" / "stencil-placeholder"
SHIPPED = REPO / "models" / "stencil-denoiser"
FAST = {"preset": "fast"}

PARAGRAPH = ("Clause {n}. The tenant shall keep the premises at {n} Harbour Street clean and in "
             "good repair, and shall tell the landlord in writing of any damage within seven "
             "days of finding it.\n")  # fmt: skip


@functools.cache
def model(directory: Path) -> LoadedModel:
    return load_backend(directory, device="cpu")


def context(loaded: LoadedModel) -> int:
    return model_int(loaded.network, "max_len")


def long_request(
    loaded: LoadedModel, times: float, holes: int = 5, seed: int = 3
) -> dict[str, Any]:
    """Locked clauses with ``holes`` holes spread through them, about ``times`` x max_len."""
    target = int(times * context(loaded))
    per = len(loaded.tokenizer.encode(PARAGRAPH.format(n=10)))
    clauses = max(holes + 1, (target - 12 * holes) // per + 1)
    segments: list[dict[str, Any]] = [{"text": "TENANCY AGREEMENT\n\n"}]
    every = clauses // holes
    for n in range(clauses):
        segments.append({"text": PARAGRAPH.format(n=n + 1)})
        if n % every == every - 1 and sum("hole" in s for s in segments) < holes:
            segments += [{"text": "Note: "}, {"hole": f"note{n}", "max_tokens": 12}, {"text": "\n"}]
    return {"segments": segments, "seed": seed, "sampler": FAST}


def canvas_tokens(loaded: LoadedModel, request: dict[str, Any]) -> int:
    return parse_canvas(request, loaded.tokenizer, max_len=1 << 30).length


def assert_locked_intact(request: dict[str, Any], holes: dict[str, str], document: str) -> None:
    at = 0
    for segment in request["segments"]:
        piece = segment["text"] if "text" in segment else holes[segment["hole"]]
        assert document[at : at + len(piece)] == piece, (at, piece)
        at += len(piece)
    assert at == len(document)


def test_a_canvas_three_times_the_model_is_filled_window_by_window() -> None:
    loaded = model(PLACEHOLDER)
    request = long_request(loaded, 3.0)
    assert canvas_tokens(loaded, request) >= 3 * context(loaded)
    (refused,) = infill_batch(loaded, [request])  # the model alone cannot read it
    assert isinstance(refused, ValueError) and "the canvas needs at least" in str(refused)

    outcome = run(DIFFUSION, loaded, request)
    names = [s["hole"] for s in request["segments"] if "hole" in s]
    assert list(outcome.holes) == names
    assert_locked_intact(request, outcome.holes, outcome.document)
    windows = {e["window"]["hole"]: e["window"] for e in outcome.trace}
    assert list(windows) == names  # one window per hole, in order, every step names its own
    for w in windows.values():
        assert w["left_tokens"] + w["right_tokens"] + 12 <= w["max_len"] == context(loaded)
        assert w["canvas_tokens"] == canvas_tokens(loaded, request) > w["max_len"]
    assert sum(w["left_tokens"] > context(loaded) // 2 for w in windows.values()) >= 3
    assert outcome.steps == len(outcome.trace) and outcome.forward_passes >= outcome.steps
    from audit.trace import trace_hash

    stored = trace_hash(outcome.trace)  # what the run record keeps: the window and its reason
    assert [s["data"]["window"] for s in stored] == [e["window"] for e in outcome.trace]


def test_windowed_runs_are_deterministic_and_batch_beside_short_requests() -> None:
    loaded = model(PLACEHOLDER)
    long = long_request(loaded, 2.2, holes=3)
    short = {"segments": [{"text": "Dear "}, {"hole": "name", "max_tokens": 6},
                          {"text": ",\nThank you."}], "seed": 4, "sampler": FAST}  # fmt: skip
    alone = infill_batch(loaded, [short])[0]
    first = run_batch(DIFFUSION, loaded, [short, long])
    again = run_batch(DIFFUSION, loaded, [short, long])
    assert not isinstance(first[0], ValueError) and not isinstance(alone, ValueError)
    assert first[0].trace_sha256 == alone.trace_sha256  # a fitting request runs as before
    assert all("window" not in e for e in first[0].trace)
    assert not isinstance(first[1], ValueError) and not isinstance(again[1], ValueError)
    assert first[1].trace_sha256 == again[1].trace_sha256
    assert first[1].document == again[1].document


@pytest.mark.slow
def test_the_shipped_denoiser_fills_a_2000_token_document() -> None:
    loaded = model(SHIPPED)
    request = long_request(loaded, 2000 / context(loaded), holes=6)
    assert canvas_tokens(loaded, request) >= 2000
    started = time.perf_counter()
    outcome = run(DIFFUSION, loaded, request)
    seconds = time.perf_counter() - started
    assert_locked_intact(request, outcome.holes, outcome.document)
    assert all(text.strip() for text in outcome.holes.values()), outcome.holes
    print(f"2000-token canvas ({canvas_tokens(loaded, request)} tokens, max_len "
          f"{context(loaded)}): {outcome.steps} steps, {seconds:.2f}s")  # fmt: skip


def test_the_shipped_models_read_a_1000_token_canvas_whole() -> None:
    loaded = model(SHIPPED)
    assert context(loaded) >= 1025
    request = long_request(loaded, 950 / context(loaded), holes=3)
    assert 900 <= canvas_tokens(loaded, request) <= context(loaded)
    outcome = run(DIFFUSION, loaded, request)
    assert all("window" not in e for e in outcome.trace)  # one canvas, no windows
    assert_locked_intact(request, outcome.holes, outcome.document)
    windowed = infill_windowed(infill_batch, loaded, request, context=321)
    assert not isinstance(windowed, ValueError)
    assert {e["window"]["max_len"] for e in windowed.trace} == {321}
    assert_locked_intact(request, windowed.holes, windowed.document)
    ar = model(REPO / "models" / "stencil-ar-fim")
    assert context(ar) >= 1025
    written = run(AR, ar, request)  # the AR route reads it whole too (it has no windows)
    assert_locked_intact(request, written.holes, written.document)


_TEXT = st.text(alphabet=st.sampled_from(list("abc de\nfg.,")), min_size=0, max_size=400)


@settings(max_examples=40, deadline=None)
@given(texts=st.lists(_TEXT, min_size=2, max_size=6), sizes=st.lists(st.integers(1, 40),
       min_size=1, max_size=5), at=st.integers(0, 4), max_len=st.integers(48, 160))  # fmt: skip
def test_every_window_fits_and_holds_the_nearest_context(
    texts: list[str], sizes: list[int], at: int, max_len: int
) -> None:
    loaded = model(PLACEHOLDER)
    segments: list[dict[str, Any]] = []
    for i, text in enumerate(texts):
        segments.append({"text": text or "x"})
        if i < len(sizes):
            segments.append({"hole": f"h{i}", "max_tokens": sizes[i]})
    holes = [i for i, s in enumerate(segments) if "hole" in s]
    where = holes[at % len(holes)]
    fills = {s["hole"]: "filled " * (i % 3) for i, s in enumerate(segments[:where]) if "hole" in s}
    request = {"segments": segments, "seed": 1}
    window = _window_for(loaded, request, segments, where, fills, max_len)
    assert canvas_tokens(loaded, window.request) <= max_len
    parts = window.request["segments"]
    (hole_at,) = [i for i, s in enumerate(parts) if "hole" in s]
    assert parts[hole_at] == segments[where]
    left = "".join(s["text"] if "text" in s else fills[s["hole"]] for s in segments[:where])
    right = ""
    for s in segments[where + 1 :]:
        if "hole" in s:
            break
        right += s["text"]
    kept_left = "".join(s["text"] for s in parts[:hole_at])
    kept_right = "".join(s["text"] for s in parts[hole_at + 1 :])
    assert left.endswith(kept_left) and right.startswith(kept_right)
    room = max_len - canvas_tokens(loaded, {"segments": [segments[where]]})
    if len(loaded.tokenizer.encode(left + right)) + 2 <= room:
        assert (kept_left, kept_right) == (left, right)  # all the context when it fits
