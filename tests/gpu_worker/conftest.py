"""Shared fixtures for the sampler's tests: a tokenizer trained here and a tiny random model."""

from __future__ import annotations

import functools
import itertools
from pathlib import Path

import pytest
import torch

from gpu_worker.engine.model import ModelConfig, StencilTransformer, save_model
from gpu_worker.engine.tokenizer import StencilTokenizer

torch.set_num_threads(1)  # tiny models: threads only add contention on a shared CPU

NAMES = ["Alice", "Bob", "Dr Smith", "Maria", "Chen", "Olga", "Ravi", "Zoe"]
PLACES = ["London", "the clinic", "Paris", "our office", "Room 12", "the lab"]
ACTS = ["seeing", "meeting", "calling", "visiting", "thanking", "helping"]
THINGS = ["invoice 2041", "the report", "your letter", "order 77", "the contract", "a note"]


def corpus() -> list[str]:
    """A few hundred deterministic sentences, enough for a small byte-level BPE."""
    lines = []
    for name, place, act, thing in itertools.islice(
        itertools.product(NAMES, PLACES, ACTS, THINGS), 0, None, 7
    ):
        lines.append(f"Dear {name}, thank you for {act} me at {place} about {thing}.")
        lines.append(f'{{"name": "{name}", "age": {len(place) * 3}, "ok": true}}')
    return lines


@pytest.fixture(scope="session")
def tokenizer() -> StencilTokenizer:
    return StencilTokenizer.train(corpus(), vocab_size=400)


@functools.cache
def shipped_tokenizer() -> StencilTokenizer:
    """The shipped denoiser's tokenizer (a plain function: Hypothesis tests call it too)."""
    root = Path(__file__).resolve().parents[2]
    return StencilTokenizer.from_file(root / "models" / "stencil-denoiser" / "tokenizer.json")


def make_model(
    tokenizer: StencilTokenizer,
    *,
    seed: int = 0,
    max_len: int = 160,
    copy_dim: int = 8,
    room_buckets: int = 0,
    copy_twins: bool = False,
) -> StencilTransformer:
    """A tiny bidirectional denoiser with peaky random logits (so rules commit differently),
    with a copy head as the shipped models have (and, with ``room_buckets``, a random room
    embedding, so the room of each position changes the logits; with ``copy_twins``, a copy
    head that may copy a token as its space twin, its gate random too)."""
    special = tokenizer.special
    cfg = ModelConfig(
        kind="denoiser",
        vocab_size=tokenizer.vocab_size,
        pad_id=special.pad,
        eos_id=special.eos,
        mask_id=special.mask,
        fim_prefix_id=special.fim_prefix,
        fim_suffix_id=special.fim_suffix,
        fim_middle_id=special.fim_middle,
        d_model=32,
        n_layers=2,
        n_heads=2,
        ffn_hidden=64,
        max_len=max_len,
        copy_dim=copy_dim,
        room_buckets=room_buckets,
        copy_twins=copy_twins,
    )
    generator = torch.Generator().manual_seed(seed)
    model = StencilTransformer(cfg)
    if copy_twins:
        model.copy.set_twins(*tokenizer.space_twins())
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.4)
    return model.eval()


@pytest.fixture(scope="session")
def model(tokenizer: StencilTokenizer) -> StencilTransformer:
    return make_model(tokenizer)


@pytest.fixture(scope="session")
def room_model(tokenizer: StencilTokenizer) -> StencilTransformer:
    """The tiny model with a room embedding (ModelConfig.room_buckets) and copy twins, as the
    shipped denoiser has."""
    return make_model(tokenizer, room_buckets=6, copy_twins=True)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer: StencilTokenizer,
              model: StencilTransformer) -> Path:  # fmt: skip
    """A model directory like models/stencil-denoiser, holding the tiny model."""
    directory = tmp_path_factory.mktemp("tiny-denoiser")
    save_model(model, directory, dtype=torch.float32)
    tokenizer.save(directory / "tokenizer.json")
    return directory
