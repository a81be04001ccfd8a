"""Build the tiny *untrained* placeholder model (models/stencil-placeholder).

It exists so the whole path (web → job → worker → sampler → review) runs before and without
the trained denoiser, and so tests have a fast model. Its output is noise: the UI says
"model: untrained placeholder" whenever it is the configured model.

    python -m research.placeholder --out models/stencil-placeholder
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from gpu_worker.engine.model import ModelConfig, StencilTransformer, save_model
from gpu_worker.engine.tokenizer import StencilTokenizer

DEMO_DIR = Path(__file__).resolve().parent.parent / "drafting" / "demo"
VOCAB_SIZE = 1024
CORPUS_DOCS = 400


def _texts() -> list[str]:
    texts = [p.read_text() for p in sorted(DEMO_DIR.glob("*.j2"))]
    try:
        from research.corpus import iter_split

        texts += [doc.text for doc in iter_split("train", CORPUS_DOCS)]
    except ImportError:  # Faker is a training dependency; demo texts alone still work
        pass
    return texts


def build(out: Path, *, seed: int = 0) -> Path:
    tokenizer = StencilTokenizer.train(_texts(), vocab_size=VOCAB_SIZE)
    ids = tokenizer.special
    cfg = ModelConfig(
        kind="denoiser", vocab_size=tokenizer.vocab_size, pad_id=ids.pad, eos_id=ids.eos,
        mask_id=ids.mask, fim_prefix_id=ids.fim_prefix, fim_suffix_id=ids.fim_suffix,
        fim_middle_id=ids.fim_middle, d_model=64, n_layers=2, n_heads=2, ffn_hidden=176,
        max_len=512, extra={"placeholder": True, "seed": seed},
    )  # fmt: skip
    torch.manual_seed(seed)
    model = StencilTransformer(cfg)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(out / "tokenizer.json")
    save_model(model, out, dtype=torch.float32)
    (out / "MODEL_CARD.md").write_text(
        "# stencil-placeholder\n\nAn UNTRAINED 2-layer transformer (random weights, seed "
        f"{seed}) with a {tokenizer.vocab_size}-token BPE tokenizer. It exists so the service "
        "runs end to end before the trained denoiser is present and so tests have a fast "
        "model. Its text is noise. Built by `python -m research.placeholder`.\n"
    )
    (out / "build.json").write_text(json.dumps({"seed": seed, "vocab": VOCAB_SIZE}) + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("models/stencil-placeholder"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(build(args.out, seed=args.seed))


if __name__ == "__main__":
    main()
