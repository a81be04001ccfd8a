"""The Stencil transformer: attention direction, KV caches, padding and checkpoints."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gpu_worker.engine.model import (
    KVCache,
    ModelConfig,
    StencilTransformer,
    count_flops_per_token,
    hole_room,
    load_model,
    save_model,
)
from gpu_worker.engine.tokenizer import StencilTokenizer


def _config(
    tokenizer: StencilTokenizer, kind: str = "denoiser", max_len: int = 64, copy_dim: int = 0
) -> ModelConfig:
    s = tokenizer.special
    return ModelConfig(
        kind=kind, vocab_size=tokenizer.vocab_size, pad_id=s.pad, eos_id=s.eos, mask_id=s.mask,  # type: ignore[arg-type]
        fim_prefix_id=s.fim_prefix, fim_suffix_id=s.fim_suffix, fim_middle_id=s.fim_middle,
        d_model=32, n_layers=2, n_heads=4, ffn_hidden=64, max_len=max_len, copy_dim=copy_dim,
    )  # fmt: skip


def _model(tokenizer: StencilTokenizer, kind: str = "denoiser", copy_dim: int = 0) -> StencilTransformer:
    torch.manual_seed(0)
    return StencilTransformer(_config(tokenizer, kind, copy_dim=copy_dim)).eval()


COPY_HEAD = pytest.mark.parametrize("copy_dim", [0, 16], ids=["no-copy-head", "copy-head"])


def _ids(tokenizer: StencilTokenizer, text: str = "Dear Alice, thank you for seeing me.") -> torch.Tensor:
    return torch.tensor([tokenizer.encode(text)])


@torch.no_grad()
def test_logits_have_one_row_per_position_and_token(tokenizer: StencilTokenizer) -> None:
    ids = _ids(tokenizer)
    assert _model(tokenizer)(ids).shape == (1, ids.shape[1], tokenizer.vocab_size)


@COPY_HEAD
@torch.no_grad()
def test_denoiser_sees_the_right_context(tokenizer: StencilTokenizer, copy_dim: int) -> None:
    model, ids = _model(tokenizer, copy_dim=copy_dim), _ids(tokenizer)
    changed = ids.clone()
    changed[0, -1] = tokenizer.special.mask
    assert not torch.allclose(model(ids)[0, 0], model(changed)[0, 0])


@COPY_HEAD
@torch.no_grad()
def test_ar_model_never_sees_the_future(tokenizer: StencilTokenizer, copy_dim: int) -> None:
    model, ids = _model(tokenizer, "ar_fim", copy_dim=copy_dim), _ids(tokenizer)
    changed = ids.clone()
    changed[0, -1] = tokenizer.special.mask
    torch.testing.assert_close(model(ids)[0, :-1], model(changed)[0, :-1])


@COPY_HEAD
@torch.no_grad()
def test_ar_incremental_decoding_with_the_cache_equals_a_full_forward(tokenizer: StencilTokenizer, copy_dim: int) -> None:
    model, ids = _model(tokenizer, "ar_fim", copy_dim=copy_dim), _ids(tokenizer)
    full = model(ids)[0]  # [L, V]
    logits, cache = model.forward_window(ids[:, :4], write_cache=True)
    steps = [logits[0, -1]]
    for position in range(4, ids.shape[1]):
        assert cache is not None
        logits, cache = model.forward_window(ids[:, position : position + 1], start=position,
                                             cache=cache, write_cache=True)  # fmt: skip
        steps.append(logits[0, -1])
    torch.testing.assert_close(torch.stack(steps), full[3:], atol=1e-4, rtol=1e-4)


@COPY_HEAD
@torch.no_grad()
def test_denoiser_window_over_a_fresh_cache_equals_the_full_forward(tokenizer: StencilTokenizer, copy_dim: int) -> None:
    model, ids = _model(tokenizer, copy_dim=copy_dim), _ids(tokenizer)
    full, cache = model.forward_window(ids, write_cache=True)
    window, _ = model.forward_window(ids[:, 3:7], start=3, cache=cache)
    torch.testing.assert_close(window[0], full[0, 3:7], atol=1e-4, rtol=1e-4)


@COPY_HEAD
@torch.no_grad()
def test_per_row_windows_equal_each_rows_own_window(tokenizer: StencilTokenizer, copy_dim: int) -> None:
    """Rows stepping on their own positions (not contiguous) in one forward: a row's filler
    positions keep the cache's keys, so its positions' logits are those of a forward of the
    row alone over just those positions."""
    model, ids = _model(tokenizer, copy_dim=copy_dim), _ids(tokenizer)
    rows = torch.cat([ids, ids.flip(1)])  # [2, L]
    _, cache = model.forward_window(rows, write_cache=True)
    assert cache is not None
    own = [torch.tensor([1, 2, 6]), torch.tensor([4, 5])]  # each row's active positions
    for b, p in enumerate(own):  # the rows moved on since the cache was written
        rows[b, p] = tokenizer.special.mask
    positions = torch.tensor([[1, 2, 6], [4, 5, 0]])  # row 1 filled up with position 0
    filler = torch.tensor([[False, False, False], [False, False, True]])
    batched, _ = model.forward_window(rows.gather(1, positions), positions=positions, cache=cache,
                                      from_cache=filler)  # fmt: skip
    one_row = [KVCache([k[b : b + 1] for k in cache.keys], [v[b : b + 1] for v in cache.values],
                       None if cache.copy_keys is None else cache.copy_keys[b : b + 1],
                       None if cache.ids is None else cache.ids[b : b + 1])
               for b in range(2)]  # fmt: skip
    for b, p in enumerate(own):
        alone, _ = model.forward_window(rows[b : b + 1, p], positions=p[None], cache=one_row[b])
        torch.testing.assert_close(batched[b, : len(p)], alone[0], atol=1e-4, rtol=1e-4)
    # a run of positions is the contiguous window's forward
    run, _ = model.forward_window(rows[:1, 3:6], start=3, cache=one_row[0])
    as_positions, _ = model.forward_window(rows[:1, 3:6], positions=torch.tensor([[3, 4, 5]]),
                                           cache=one_row[0])  # fmt: skip
    torch.testing.assert_close(run, as_positions, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="inside the cache"):
        model.forward_window(rows[:, :1], positions=torch.tensor([[0], [rows.shape[1]]]),
                             cache=cache)  # fmt: skip
    # asked for the new cache, a per-row window writes into the one it was given: the
    # same logits and keys as the copying splice, without the copy
    copied = KVCache([k.clone() for k in cache.keys], [v.clone() for v in cache.values],
                     None if cache.copy_keys is None else cache.copy_keys.clone(),
                     None if cache.ids is None else cache.ids.clone())  # fmt: skip
    window = rows.gather(1, positions)
    kept, _ = model.forward_window(window, positions=positions, cache=copied, from_cache=filler)
    written, fresh = model.forward_window(window, positions=positions, cache=cache,
                                          from_cache=filler, write_cache=True)  # fmt: skip
    assert fresh is not None and fresh.keys[0] is cache.keys[0]
    assert torch.equal(kept, batched) and torch.equal(written, batched)
    assert not torch.equal(copied.keys[-1], fresh.keys[-1])  # the window's keys went in
    if copy_dim:
        assert fresh.ids is cache.ids and fresh.ids is not None and torch.equal(fresh.ids, rows)


@COPY_HEAD
@torch.no_grad()
def test_padded_keys_do_not_change_real_positions(tokenizer: StencilTokenizer, copy_dim: int) -> None:
    model, ids = _model(tokenizer, copy_dim=copy_dim), _ids(tokenizer)
    n = ids.shape[1]
    padded = torch.cat([ids, torch.full((1, 5), tokenizer.special.pad)], dim=1)
    mask = torch.tensor([[True] * n + [False] * 5])
    torch.testing.assert_close(model(padded, mask)[0, :n], model(ids)[0], atol=1e-4, rtol=1e-4)


def test_sequence_longer_than_max_len_is_refused(tokenizer: StencilTokenizer) -> None:
    model = _model(tokenizer)
    with pytest.raises(ValueError, match="max_len"):
        model(torch.zeros((1, 65), dtype=torch.long))


@COPY_HEAD
@torch.no_grad()
def test_save_then_load_gives_the_same_logits(tokenizer: StencilTokenizer, copy_dim: int, tmp_path: Path) -> None:
    model, ids = _model(tokenizer, copy_dim=copy_dim), _ids(tokenizer)
    save_model(model, tmp_path, dtype=torch.float32)
    loaded = load_model(tmp_path)
    assert loaded.config == model.config
    torch.testing.assert_close(loaded(ids), model(ids))


def test_flops_per_token_grow_with_depth(tokenizer: StencilTokenizer) -> None:
    cfg = _config(tokenizer)
    deeper = replace(cfg, n_layers=cfg.n_layers * 2)
    assert count_flops_per_token(deeper, 128) > count_flops_per_token(cfg, 128) > 0


@COPY_HEAD
@torch.no_grad()
def test_target_log_probs_equal_the_logits_read_at_the_targets(
    tokenizer: StencilTokenizer, copy_dim: int
) -> None:
    model, ids = _model(tokenizer, copy_dim=copy_dim), _ids(tokenizer)
    ids[0, 2:5] = tokenizer.special.mask
    targets = torch.roll(ids, 1, dims=1)
    expected = torch.log_softmax(model(ids), dim=-1).gather(-1, targets[..., None])[..., 0]
    torch.testing.assert_close(model.target_log_probs(ids, targets), expected, atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_the_copy_head_points_only_at_tokens_present_and_never_at_mask_or_pad(
    tokenizer: StencilTokenizer,
) -> None:
    model, ids = _model(tokenizer, copy_dim=16), _ids(tokenizer)
    s = tokenizer.special
    ids[0, 1:3] = s.mask
    ids[0, 4] = s.pad
    model.copy.gate.bias.fill_(-50.0)  # all of the output from the pointer
    probs = torch.softmax(model(ids)[0], dim=-1)  # [L, V]
    present = set(ids[0].tolist()) - {s.mask, s.pad}
    outside = [t for t in range(tokenizer.vocab_size) if t not in present]
    assert float(probs[:, outside].sum(-1).max()) < 1e-6
    assert torch.allclose(probs.sum(-1), torch.ones(ids.shape[1]), atol=1e-5)


@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 12)), max_size=5), st.integers(0, 40))
def test_hole_room_counts_down_to_each_budgets_end_and_is_zero_elsewhere(
    spans: list[tuple[int, int]], length: int
) -> None:
    budgets: list[tuple[int, int]] = []
    for start, size in spans:  # disjoint budgets, as a canvas's holes are
        if all(start >= e or start + size <= s for s, e in budgets):
            budgets.append((start, start + size))
    room = hole_room(length, budgets).tolist()
    assert len(room) == length
    for p in range(length):
        inside = [end for start, end in budgets if start <= p < end]
        assert room[p] == (min(inside[0], length) - p if inside else 0)


@torch.no_grad()
def test_the_room_embedding_starts_at_zero_and_then_tells_adjacent_holes_apart(
    tokenizer: StencilTokenizer, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    model = StencilTransformer(replace(_config(tokenizer, copy_dim=16), room_buckets=4)).eval()
    ids = _ids(tokenizer)
    ids[0, 2:8] = tokenizer.special.mask
    one = hole_room(ids.shape[1], [(2, 8)])[None]  # one hole of 6
    two = hole_room(ids.shape[1], [(2, 5), (5, 8)])[None]  # two holes of 3, no text between
    assert float(model.room.weight.abs().sum()) == 0.0  # added to a trained model: no change
    torch.testing.assert_close(model(ids, room=two), model(ids))
    model.room.weight.normal_()
    assert not torch.allclose(model(ids, room=one), model(ids, room=two))
    torch.testing.assert_close(model(ids, room=one.clamp(max=4)), model(ids, room=one))  # clipped
    # a window over the cache, given its positions' room, equals the full forward
    full, cache = model.forward_window(ids, write_cache=True, room=two)
    positions = torch.tensor([[2, 3, 6]])
    window, _ = model.forward_window(ids.gather(1, positions), positions=positions, cache=cache,
                                     room=two.gather(1, positions))  # fmt: skip
    torch.testing.assert_close(window[0], full[0, [2, 3, 6]], atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="room has shape"):
        model(ids, room=two[:, :3])
    save_model(model, tmp_path, dtype=torch.float32)
    loaded = load_model(tmp_path)
    assert loaded.config.room_buckets == 4
    torch.testing.assert_close(loaded(ids, room=two), model(ids, room=two))


def _twin_model(tokenizer: StencilTokenizer) -> StencilTransformer:
    torch.manual_seed(0)
    model = StencilTransformer(replace(_config(tokenizer, copy_dim=16), copy_twins=True)).eval()
    model.copy.set_twins(*tokenizer.space_twins())
    return model


def test_space_twins_pair_each_token_with_its_spelling_with_one_leading_space(
    tokenizer: StencilTokenizer,
) -> None:
    spaced, bare = tokenizer.space_twins()
    pairs = [(i, s) for i, s in enumerate(spaced) if s != i]
    assert pairs
    for i in range(tokenizer.vocab_size):
        if tokenizer.is_special(i):
            assert spaced[i] == bare[i] == i
        elif spaced[i] != i:
            assert tokenizer.token_text(spaced[i]) == " " + tokenizer.token_text(i)
            assert bare[spaced[i]] == i and bare[i] == i
        elif bare[i] != i:
            assert " " + tokenizer.token_text(bare[i]) == tokenizer.token_text(i)
            assert spaced[bare[i]] == i


@torch.no_grad()
def test_copy_twins_move_the_pointer_to_a_tokens_spaced_twin_and_start_almost_closed(
    tokenizer: StencilTokenizer, tmp_path: Path
) -> None:
    model = _twin_model(tokenizer)
    spaced, _ = tokenizer.space_twins()
    word = next(i for i, s in enumerate(spaced) if s != i)  # a bare token with a spaced twin
    ids = torch.tensor([tokenizer.encode("Dear Bob, thank you") + [word] + [tokenizer.special.mask] * 2])
    assert spaced[word] not in ids[0].tolist()
    plain = StencilTransformer(replace(model.config, copy_twins=False)).eval()
    plain.load_state_dict(model.state_dict(), strict=False)
    # closed gate: about 2% of the copy mass moves, nothing else changes
    closed = torch.softmax(model(ids), -1)
    assert float((closed - torch.softmax(plain(ids), -1)).abs().sum(-1).max()) < 0.05
    model.copy.gate.bias.fill_(-50.0)  # all of the output from the pointer ...
    model.copy.twin_gate.bias.copy_(torch.tensor([50.0, 50.0]))  # ... all of it to spaced twins
    probs = torch.softmax(model(ids)[0], -1)
    landing = {spaced[t] for t in ids[0].tolist()} - {tokenizer.special.mask}
    outside = [t for t in range(tokenizer.vocab_size) if t not in landing]
    assert float(probs[:, outside].sum(-1).max()) < 1e-6
    assert float(probs[:, spaced[word]].max()) > 0.01 and float(probs[:, word].max()) < 1e-6
    targets = torch.roll(ids, 1, dims=1)  # the training path reads the same mixture
    expected = torch.log_softmax(model(ids), dim=-1).gather(-1, targets[..., None])[..., 0]
    torch.testing.assert_close(model.target_log_probs(ids, targets), expected, atol=1e-4, rtol=1e-4)
    save_model(model, tmp_path, dtype=torch.bfloat16)  # the table stays integer, not bf16
    assert torch.equal(load_model(tmp_path).copy.twins, model.copy.twins)
    with pytest.raises(ValueError, match="copy_twins needs a copy head"):
        StencilTransformer(replace(model.config, copy_dim=0))


@torch.no_grad()
def test_copy_lower_moves_a_twin_copy_to_its_lower_case_spelling_and_starts_almost_closed(
    tokenizer: StencilTokenizer, tmp_path: Path
) -> None:
    """" Bob" in a letter, copied as " bob" (an e-mail address): the pointer reaches a token
    that is nowhere in the sequence."""
    tok, added = tokenizer.with_words([" Bob", " bob"])  # each one token
    assert added and len(tok.encode(" Bob")) == 1
    torch.manual_seed(0)
    cfg = replace(_config(tok, copy_dim=16), copy_twins=True, copy_lower=True)
    model = StencilTransformer(cfg).eval()
    model.copy.set_twins(*tok.space_twins())
    model.copy.set_lower_twins(*tok.case_twins())
    ids = torch.tensor([tok.encode("Dear Bob, thank you") + [tok.special.mask] * 2])
    bob, lower_bob = tok.encode(" Bob")[0], tok.encode(" bob")[0]
    assert lower_bob not in ids[0].tolist()
    plain = StencilTransformer(replace(cfg, copy_lower=False)).eval()
    plain.load_state_dict(model.state_dict(), strict=False)
    closed = torch.softmax(model(ids), -1)  # about 2% of the twin mass moves, nothing else
    assert float((closed - torch.softmax(plain(ids), -1)).abs().sum(-1).max()) < 0.01
    model.copy.gate.bias.fill_(-50.0)  # all of the output from the pointer ...
    model.copy.twin_gate.bias.copy_(torch.tensor([50.0, 50.0]))  # ... to spaced twins ...
    model.copy.lower_gate.bias.fill_(50.0)  # ... in lower case
    probs = torch.softmax(model(ids)[0], -1)
    spaced_lower, _ = tok.case_twins()
    landing = {spaced_lower[t] for t in ids[0].tolist()} - {tok.special.mask}
    outside = [t for t in range(tok.vocab_size) if t not in landing]
    assert lower_bob in landing and float(probs[:, outside].sum(-1).max()) < 1e-6
    assert float(probs[:, lower_bob].max()) > 0.01 and float(probs[:, bob].max()) < 1e-6
    targets = torch.roll(ids, 1, dims=1)  # the training path reads the same mixture
    expected = torch.log_softmax(model(ids), dim=-1).gather(-1, targets[..., None])[..., 0]
    torch.testing.assert_close(model.target_log_probs(ids, targets), expected, atol=1e-4, rtol=1e-4)
    save_model(model, tmp_path, dtype=torch.bfloat16)
    assert torch.equal(load_model(tmp_path).copy.lower_twins, model.copy.lower_twins)
    with pytest.raises(ValueError, match="copy_lower needs copy_twins"):
        StencilTransformer(replace(cfg, copy_twins=False))
