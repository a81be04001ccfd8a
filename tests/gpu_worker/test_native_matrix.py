"""Every preset on every backend: the shipped Stencil network, native LLaDA, Dream and SDAR (block
diffusion), and transformers' BERT and ModernBERT masked LMs fill a canvas and keep its locked
text byte-identical. A backend without a window forward runs a cached preset without its cache,
and the config it ran says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpu_worker.engine.backends import load_backend
from gpu_worker.engine.config import PRESETS, config_from_overrides
from gpu_worker.engine.infill import infill_request
from gpu_worker.engine.loaded import LoadedModel
from gpu_worker.engine.tokenizer import StencilTokenizer

transformers = pytest.importorskip("transformers")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "native"
LOCKED = ["Dear ", ",\nThank you for seeing ", " at the clinic on Monday.\nKind regards,\n"]
REQUEST = {
    "segments": [{"text": LOCKED[0]}, {"hole": "name", "max_tokens": 5}, {"text": LOCKED[1]},
                 {"hole": "who", "max_tokens": 6}, {"text": LOCKED[2]},
                 {"hole": "signature", "max_tokens": 4}],
    "seed": 3,
}  # fmt: skip
BACKENDS = ["stencil", "llada", "dream", "sdar", "bert", "modernbert"]


def _hf_masked_lm(directory: Path, tokenizer: StencilTokenizer, kind: str) -> Path:
    special = tokenizer.special
    common = {"vocab_size": tokenizer.vocab_size, "hidden_size": 16, "num_hidden_layers": 2,
              "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 128,
              "pad_token_id": special.pad, "eos_token_id": special.eos}  # fmt: skip
    if kind == "bert":
        model = transformers.BertForMaskedLM(transformers.BertConfig(**common))
    else:
        config = transformers.ModernBertConfig(
            **common, bos_token_id=special.eos, cls_token_id=special.eos, sep_token_id=special.eos,
            global_attn_every_n_layers=1,
        )  # fmt: skip
        model = transformers.ModernBertForMaskedLM(config)
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.5)
    model.save_pretrained(str(directory))
    tokenizer.save(directory / "tokenizer.json")
    data = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**data, "mask_token_id": special.mask}))
    return directory


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory, tokenizer: StencilTokenizer,
             model_dir: Path) -> dict[str, LoadedModel]:  # fmt: skip
    return {
        "stencil": load_backend(model_dir),
        "llada": load_backend(FIXTURES / "llada-tiny"),
        "dream": load_backend(FIXTURES / "dream-tiny"),
        "sdar": load_backend(FIXTURES / "sdar-tiny"),
        "bert": load_backend(_hf_masked_lm(tmp_path_factory.mktemp("bert"), tokenizer, "bert")),
        "modernbert": load_backend(
            _hf_masked_lm(tmp_path_factory.mktemp("modernbert"), tokenizer, "modernbert")
        ),
    }


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_on_every_backend_keeps_the_locked_text(
    backends: dict[str, LoadedModel], backend: str, preset: str
) -> None:
    loaded = backends[backend]
    config = loaded.fit_config(config_from_overrides(preset))
    outcome = infill_request(loaded, REQUEST, config=config)
    document, holes = outcome.document, outcome.holes
    rebuilt = LOCKED[0] + holes["name"] + LOCKED[1] + holes["who"] + LOCKED[2] + holes["signature"]
    assert document == rebuilt
    assert not [v for v in outcome.violations if v["name"].startswith("locked")]
    cache = PRESETS[preset].cache if loaded.has_window_forward else "none"
    if backend == "sdar" and cache != "none":
        cache = "block"  # the cache that runs on a block-diffusion model is its block KV cache
    assert outcome.config["cache"] == cache


def test_native_backends_keep_a_cached_presets_cache(backends: dict[str, LoadedModel]) -> None:
    for name in ("stencil", "llada", "dream"):
        assert backends[name].fit_config(PRESETS["balanced"]).cache == "dual"
    assert backends["sdar"].fit_config(PRESETS["balanced"]).cache == "block"
    for name in ("bert", "modernbert"):
        assert backends[name].fit_config(PRESETS["balanced"]).cache == "none"
