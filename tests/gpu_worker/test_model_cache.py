"""The Stencil transformer's forward passes for the sampler: the ForwardCache contract."""

from __future__ import annotations

import pytest
import torch

from gpu_worker.engine.model import StencilTransformer
from gpu_worker.engine.model_cache import DelayedCache, DualCache, ExactForward
from gpu_worker.engine.sampler import ForwardCache, PlainForward


def batch(model: StencilTransformer) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of random ids (the second three shorter) and their attention."""
    ids = torch.randint(16, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))
    attention = torch.ones_like(ids, dtype=torch.bool)
    attention[1, 9:] = False
    ids[1, 9:] = model.pad_id
    return ids, attention


@pytest.mark.parametrize("mode", ["none", "dual", "delayed"])
def test_each_mode_provides_the_samplers_forward_cache(model: StencilTransformer, mode: str) -> None:
    cache = model.forward_cache(mode)
    assert isinstance(cache, ForwardCache)
    assert type(cache) is {"none": ExactForward, "dual": DualCache, "delayed": DelayedCache}[mode]


def test_an_unknown_mode_is_refused_by_name(model: StencilTransformer) -> None:
    with pytest.raises(ValueError, match="cache='prefix' is not one of"):
        model.forward_cache("prefix")


@pytest.mark.parametrize("mode", ["none", "dual", "delayed"])
def test_full_returns_the_logits_of_the_positions_read_in_order(
    model: StencilTransformer, mode: str
) -> None:
    ids, attention = batch(model)
    with torch.inference_mode():
        exact = model(ids, attention_mask=attention)  # [2, 12, V]
        reads = [torch.tensor([2, 5, 7]), torch.tensor([4])]
        logits = model.forward_cache(mode).full(ids, attention, [0, 1], reads=reads, room=None)
    assert torch.allclose(logits[0, :3], exact[0, [2, 5, 7]], atol=1e-5)
    assert torch.allclose(logits[1, :1], exact[1, [4]], atol=1e-5)


def test_a_rows_logits_do_not_depend_on_the_other_rows(model: StencilTransformer) -> None:
    """The first full forward writes every row's cache; a later step of one row reads only
    its own rows of it."""
    ids, attention = batch(model)
    reads = [torch.tensor([3, 4]), torch.tensor([1, 2])]
    blocks = [torch.tensor([3, 4, 5]), torch.tensor([1, 2])]
    with torch.inference_mode():
        both = DualCache(model)
        both.full(ids, attention, [0, 1], reads=reads, room=None)
        stepped = both.window(ids, attention, [1], blocks=blocks[1:], reads=reads[1:], room=None)
        alone = DualCache(model)
        alone.full(ids[1:], attention[1:], [0], reads=reads[1:], room=None)
        single = alone.window(ids[1:], attention[1:], [0], blocks=blocks[1:], reads=reads[1:], room=None)
    assert torch.allclose(stepped[0, :2], single[0, :2], atol=1e-5)


def test_a_window_needs_a_full_forward_first(model: StencilTransformer) -> None:
    ids, attention = batch(model)
    with pytest.raises(RuntimeError, match="needs a full forward first"):
        DualCache(model).window(ids, attention, [0], blocks=[torch.tensor([1])],
                                reads=[torch.tensor([1])], room=None)  # fmt: skip


def test_the_delayed_cache_recomputes_what_changed_since_it_was_cached(
    model: StencilTransformer,
) -> None:
    ids, attention = batch(model)
    cache = DelayedCache(model)
    with torch.inference_mode():
        cache.full(ids, attention, [0, 1], reads=None, room=None)
        changed = ids.clone()
        changed[0, 8] = model.mask_id  # a position outside the block, changed since
        assert cache._windows(changed, [0], [torch.tensor([3, 4])], [torch.tensor([3])])[0].tolist() == [3, 8]
        cache.window(changed, attention, [0], blocks=[torch.tensor([3, 4])],
                     reads=[torch.tensor([3])], room=None)  # fmt: skip
        assert cache._windows(changed, [0], [torch.tensor([3, 4])], [torch.tensor([3])])[0].tolist() == [3]


def test_plain_forward_serves_any_network_reading_its_positions(model: StencilTransformer) -> None:
    ids, attention = batch(model)
    with torch.inference_mode():
        exact = model(ids, attention_mask=attention)
        logits = PlainForward(model).full(ids, attention, [1], reads=[torch.tensor([0, 6])], room=None)
    assert torch.allclose(logits[0, :2], exact[1, [0, 6]], atol=1e-5)
