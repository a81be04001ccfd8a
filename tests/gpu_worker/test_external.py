"""The external loader: a tiny Hugging Face masked LM built and saved here, loaded offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpu_worker.engine.backends import load_backend
from gpu_worker.engine.config import config_from_overrides
from gpu_worker.engine.external import (
    TRUST_REMOTE_CODE_ENV,
    ExternalDenoiser,
    RemoteCodeRefused,
    is_hf_directory,
    load_external,
)
from gpu_worker.engine.infill import infill_request
from gpu_worker.engine.tokenizer import StencilTokenizer
from tests.gpu_worker.conftest import corpus

transformers = pytest.importorskip("transformers")


def _tiny_bert_dir(directory: Path, tokenizer: StencilTokenizer, **config_extra: object) -> Path:
    """A BertForMaskedLM of a few thousand parameters in HF format, with our tokenizer."""
    special = tokenizer.special
    config = transformers.BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=32, max_position_embeddings=128,
        pad_token_id=special.pad, eos_token_id=special.eos,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(config).eval()
    model.save_pretrained(str(directory))
    tokenizer.save(directory / "tokenizer.json")
    data = json.loads((directory / "config.json").read_text())
    data.update({"mask_token_id": special.mask, **config_extra})
    (directory / "config.json").write_text(json.dumps(data))
    return directory


@pytest.fixture
def hf_dir(tmp_path: Path, tokenizer: StencilTokenizer) -> Path:
    return _tiny_bert_dir(tmp_path / "tiny-bert", tokenizer)


def test_hf_directory_is_told_apart_from_a_stencil_one(hf_dir: Path, model_dir: Path) -> None:
    assert is_hf_directory(hf_dir)
    assert not is_hf_directory(model_dir)


def test_load_backend_dispatches_hf_dirs_to_the_external_loader(hf_dir: Path, model_dir: Path) -> None:
    assert load_backend(hf_dir).kind == "external"
    assert load_backend(model_dir).kind == "denoiser"


def test_external_logits_equal_the_hf_models_own(hf_dir: Path, tokenizer: StencilTokenizer) -> None:
    loaded = load_external(hf_dir)
    ids = torch.tensor([tokenizer.encode("Dear Alice, thank you.")])
    reference = transformers.BertForMaskedLM.from_pretrained(str(hf_dir)).eval()
    with torch.no_grad():
        ours = loaded.network(ids)
        theirs = reference(input_ids=ids).logits
    assert ours.shape == (1, ids.shape[1], tokenizer.vocab_size)
    torch.testing.assert_close(ours, theirs)


def test_special_ids_come_from_the_checkpoint_config(hf_dir: Path, tokenizer: StencilTokenizer) -> None:
    loaded = load_external(hf_dir)
    network = loaded.network
    assert isinstance(network, ExternalDenoiser)
    assert network.mask_id == tokenizer.special.mask
    assert network.pad_id == tokenizer.special.pad
    assert network.max_len == 128
    assert loaded.tokenizer.special.mask == tokenizer.special.mask


def test_missing_mask_id_is_refused_with_a_clear_error(tmp_path: Path, tokenizer: StencilTokenizer) -> None:
    directory = _tiny_bert_dir(tmp_path / "no-mask", tokenizer)
    data = json.loads((directory / "config.json").read_text())
    del data["mask_token_id"]
    (directory / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="no mask token id"):
        load_external(directory)


def test_custom_code_checkpoint_is_refused_by_default(
    tmp_path: Path, tokenizer: StencilTokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TRUST_REMOTE_CODE_ENV, raising=False)
    directory = _tiny_bert_dir(
        tmp_path / "mdlm-like", tokenizer, model_type="mdlm",
        auto_map={"AutoModelForMaskedLM": "modeling_mdlm.MDLM"},
    )  # fmt: skip
    (directory / "modeling_mdlm.py").write_text("raise SystemExit('remote code ran')\n")
    with pytest.raises(RemoteCodeRefused, match=TRUST_REMOTE_CODE_ENV):
        load_backend(directory)


def test_external_model_fills_a_canvas_through_the_sampler(hf_dir: Path) -> None:
    loaded = load_external(hf_dir)
    request = {
        "segments": [{"text": "Dear "}, {"hole": "name", "max_tokens": 4},
                     {"text": ", thank you for seeing me."}],
        "sampler": {"cache": "none"},
    }  # fmt: skip
    outcome = infill_request(loaded, request)
    assert outcome.document.startswith("Dear ")
    assert outcome.document.endswith(", thank you for seeing me.")
    assert not [v for v in outcome.violations if v["name"].startswith("locked")]


# -- WordPiece, cached presets, precision ------------------------------------------------------
WORDPIECE_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _wordpiece_bert_dir(directory: Path) -> Path:
    """A tiny cased BERT with a WordPiece vocabulary: no token starts with a space (a word
    start is spelled bare, a continuation "##ing")."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(corpus(), trainers.WordPieceTrainer(vocab_size=300, special_tokens=WORDPIECE_SPECIALS))
    ids = {name: tok.token_to_id(name) for name in WORDPIECE_SPECIALS}
    config = transformers.BertConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=128, pad_token_id=ids["[PAD]"],
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.BertForMaskedLM(config).eval().save_pretrained(str(directory))
    tok.save(str(directory / "tokenizer.json"))
    data = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**data, "mask_token_id": ids["[MASK]"]}))
    return directory


def test_a_wordpiece_hole_after_a_locked_space_is_written(tmp_path: Path) -> None:
    """The locked space before a hole moves into the hole's first token, which must start a
    word: in WordPiece that is any token without "##" (its text after a word is " seeing"),
    not, as in byte-level BPE, a token spelled with a leading space (WordPiece has none)."""
    loaded = load_external(_wordpiece_bert_dir(tmp_path / "wordpiece-bert"))
    tokenizer = loaded.tokenizer
    word = tokenizer.tok.token_to_id("seeing")
    piece = next(i for t, i in tokenizer.tok.get_vocab().items() if t.startswith("##"))
    assert word is not None
    assert tokenizer.token_text(word) == " seeing"
    assert not tokenizer.token_text(piece).startswith(" ")
    request = {
        "segments": [{"text": "Dear Alice, thank you for "}, {"hole": "act", "max_tokens": 3},
                     {"text": "."}],
        "sampler": {"preset": "careful"},
    }  # fmt: skip
    outcome = infill_request(loaded, request)
    assert outcome.holes["act"] != ""
    assert outcome.document == f"Dear Alice, thank you for {outcome.holes['act']}."


def test_a_transformers_model_runs_a_cached_preset_without_its_cache(hf_dir: Path) -> None:
    loaded = load_external(hf_dir)
    assert not loaded.has_window_forward
    config = loaded.fit_config(config_from_overrides("balanced"))
    assert config.cache == "none"
    assert config.replace(cache="dual") == config_from_overrides("balanced")
    outcome = infill_request(loaded, {"segments": [{"text": "Dear "}, {"hole": "name", "max_tokens": 4}]},
                             config=config)  # fmt: skip
    assert outcome.config["cache"] == "none"


def test_a_transformers_model_loaded_in_bf16_records_bf16(hf_dir: Path) -> None:
    loaded = load_external(hf_dir, dtype=torch.bfloat16)
    assert {p.dtype for p in loaded.network.parameters()} == {torch.bfloat16}
    assert loaded.identity()["precision"] == "bf16"
    assert loaded.identity()["family"] == "transformers"
