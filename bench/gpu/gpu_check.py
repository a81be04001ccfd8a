"""GPU check: the real LLaDA-8B, Dream-7B and SDAR-8B shapes, random weights, in bf16 on one GPU.

Not a test: it measures and writes ``REPORT.md`` and ``results.json`` into ``--out`` (default
bench/gpu). For each family it writes a random-weight checkpoint at the real shape as the Hub
lays it out (config.json with the real keys, bf16 safetensors shards, a tokenizer), loads it
through ``load_backend`` as a worker would (meta-device network, shards read onto the GPU),
and times:

- load: seconds, GPU memory allocated after the load and at peak, host peak RSS;
- forward: ms per full forward at canvas 256 and 1024 (batch 1, median of ``--repeats``);
- denoise: a canvas of locked text with holes under the ``balanced`` preset (the dual cache)
  and the same preset with ``cache="none"``: ms per step, sampler overhead per step (step time
  minus forward time), and the cache's speed-up;
- throughput: jobs/s at batch 1, 4 and 8 (``denoise_batch``, balanced).

Random weights give near-uniform logits, so the threshold rule commits about one token a step:
a job here takes as many steps as its holes have tokens (a trained model takes fewer).

    scripts/gpu-check [--out bench/gpu] [--families llada dream] [--repeats 5]
    scripts/gpu-check --tiny --device cpu --out /tmp/gpu-check   # the same code at toy shapes
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gpu_worker.engine.backends import load_backend  # noqa: E402
from gpu_worker.engine.canvas import Canvas, parse_canvas  # noqa: E402
from gpu_worker.engine.config import PRESETS, SamplerConfig  # noqa: E402
from gpu_worker.engine.loaded import LoadedModel  # noqa: E402
from gpu_worker.engine.native import FAMILIES  # noqa: E402
from gpu_worker.engine.native.transformer import NativeTransformer  # noqa: E402
from gpu_worker.engine.sampler import denoise_batch  # noqa: E402
from gpu_worker.engine.tokenizer import StencilTokenizer  # noqa: E402

# config.json of each family at its real size (LLaDA-8B-Base's, Dream-v0-Base-7B's and SDAR-8B-Chat's keys);
# the ids of the special tokens are set from the check's tokenizer.
REAL_SHAPES: dict[str, dict[str, Any]] = {
    "llada": {
        "model_type": "llada", "architectures": ["LLaDAModelLM"], "d_model": 4096, "n_heads": 32,
        "n_kv_heads": 32, "n_layers": 32, "mlp_hidden_size": 12288, "mlp_ratio": 4,
        "vocab_size": 126464, "embedding_size": 126464, "max_sequence_length": 4096,
        "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "block_type": "llama", "activation_type": "silu",
        "layer_norm_type": "rms", "rope": True, "rope_full_precision": True, "alibi": False,
        "include_bias": False, "include_qkv_bias": False, "weight_tying": False,
    },
    "dream": {
        "model_type": "Dream", "architectures": ["DreamModel"], "hidden_size": 3584,
        "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28,
        "intermediate_size": 18944, "vocab_size": 152064, "max_position_embeddings": 131072,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "hidden_act": "silu", "rope_scaling": None,
        "tie_word_embeddings": False, "use_sliding_window": False,
    },
    "sdar": {  # SDAR-8B-Chat's keys
        "model_type": "sdar", "architectures": ["SDARForCausalLM"], "hidden_size": 4096,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "num_hidden_layers": 36, "intermediate_size": 12288, "vocab_size": 151936,
        "max_position_embeddings": 32768, "rope_theta": 1000000, "rms_norm_eps": 1e-6,
        "hidden_act": "silu", "rope_scaling": None, "tie_word_embeddings": False,
        "use_sliding_window": False, "attention_bias": False, "block_size": 4,
    },
}  # fmt: skip
TINY = {  # the same keys at toy sizes (--tiny)
    "llada": {"d_model": 64, "n_heads": 4, "n_kv_heads": 4, "n_layers": 2, "mlp_hidden_size": 128,
              "vocab_size": 1024, "embedding_size": 1024, "max_sequence_length": 2048},
    "dream": {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 1024},
    "sdar": {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24,
             "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 1024},
}  # fmt: skip
CANVASES = (256, 1024)  # forward timings
TINY_RUN = {"lengths": [32, 64], "locked_tokens": 24, "hole_tokens": 8, "repeats": 1}  # --tiny
BATCHES = (1, 4, 8)
SHARD_BYTES = 2 << 30  # about 2 GiB a shard, as the Hub's checkpoints are cut
TEXT = ("Dear Dr. Smith, thank you for seeing Mr. John Carter at the clinic on Monday. He has had "
        "a cough for three weeks and a mild fever since the weekend. ")  # fmt: skip


# -- the checkpoint ---------------------------------------------------------------------------
def check_tokenizer() -> StencilTokenizer:
    return StencilTokenizer.train([TEXT] * 50, vocab_size=400)


def write_checkpoint(directory: Path, family: str, shape: dict[str, Any], device_name: str) -> None:
    """A random bf16 checkpoint under the family's own tensor names, in shards, beside the
    tokenizer.json already in ``directory``. Run in a child process, so the host memory it
    takes is not counted as the loader's."""
    device = torch.device(device_name)
    spec = next(f for f in FAMILIES if f.name == family)
    special = StencilTokenizer.from_file(directory / "tokenizer.json").special
    config = {**shape, "mask_token_id": special.mask, "eos_token_id": special.eos,
              "pad_token_id": special.pad, "torch_dtype": "bfloat16"}  # fmt: skip
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    cfg = spec.read_config(config, directory / "config.json")
    with torch.device("meta"):
        shapes = {n: p.shape for n, p in NativeTransformer(cfg, mask_id=0, pad_id=0, eos_id=0).named_parameters()}
    from safetensors.torch import save_file

    generator = torch.Generator(device=device).manual_seed(0)
    weight_map: dict[str, str] = {}
    shard: dict[str, torch.Tensor] = {}
    shard_bytes, names = 0, list(spec.weight_map(cfg).items())

    def flush() -> None:
        nonlocal shard, shard_bytes
        name = f"model-{len(set(weight_map.values())) + 1:05d}.safetensors"
        save_file(shard, str(directory / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
        shard, shard_bytes = {}, 0

    for key, target in names:
        full = shapes[target.param]
        rows = full[0] if target.rows is None else target.rows.stop - target.rows.start
        size = (rows, *full[1:])
        if len(size) == 1:  # norms near 1, biases near 0
            value = torch.ones(size, device=device) if "norm" in target.param else torch.zeros(size, device=device)
        else:
            value = torch.randn(size, device=device, generator=generator) * 0.02
        shard[key] = value.to(torch.bfloat16).cpu()
        shard_bytes += shard[key].numel() * 2
        if shard_bytes >= SHARD_BYTES:
            flush()
    if shard:
        flush()
    index = {"metadata": {"total_size": cfg.num_parameters() * 2}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))


# -- timings -----------------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    fn()  # warm-up
    sync(device)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def canvas_for(loaded: LoadedModel, locked_tokens: int, hole_tokens: int) -> Canvas:
    """Locked text of about ``locked_tokens`` tokens with two holes in it."""
    text = TEXT * (1 + locked_tokens // max(1, len(loaded.tokenizer.encode(TEXT))))
    cut = len(text) // 2
    segments = [{"text": text[:cut]}, {"hole": "a", "max_tokens": hole_tokens // 2},
                {"text": " " + text[cut:]}, {"hole": "b", "max_tokens": hole_tokens - hole_tokens // 2}]  # fmt: skip
    network = loaded.network
    assert isinstance(network, NativeTransformer)
    return parse_canvas({"segments": segments}, loaded.tokenizer, max_len=network.max_len,
                        vocab_size=network.config.vocab_size)  # fmt: skip


def denoise_stats(loaded: LoadedModel, canvases: list[Canvas], config: SamplerConfig,
                  device: torch.device) -> dict[str, float]:  # fmt: skip
    generators = [torch.Generator().manual_seed(i) for i in range(len(canvases))]
    sync(device)
    started = time.perf_counter()
    results = denoise_batch(loaded.network, canvases, config, generators)
    sync(device)
    wall = time.perf_counter() - started
    trace = results[0].trace
    return {
        "wall_s": wall,
        "jobs_per_s": len(canvases) / wall,
        "steps": len(trace),
        "ms_per_step": 1000 * wall / max(1, len(trace)),
        "forward_ms_mean": statistics.mean(s.forward_ms for s in trace),
        "overhead_ms_per_step": statistics.mean(s.step_ms - s.forward_ms for s in trace),
    }


def check_family(family: str, shape: dict[str, Any], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    device = torch.device(args.device)
    tokenizer = check_tokenizer()
    directory = work / f"{family}-random"
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(directory / "tokenizer.json")
    started = time.perf_counter()
    writer = multiprocessing.get_context("spawn").Process(
        target=write_checkpoint, args=(directory, family, shape, args.device)
    )
    writer.start()
    writer.join()
    if writer.exitcode != 0:
        raise RuntimeError(f"writing the random {family} checkpoint failed (exit {writer.exitcode})")
    write_s = time.perf_counter() - started
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    loaded = load_backend(directory, device=device, dtype="bf16")
    sync(device)
    out: dict[str, Any] = {
        "family": family, "parameters": sum(p.numel() for p in loaded.network.parameters()),
        "precision": loaded.precision,
        "write_checkpoint_s": round(write_s, 2), "load_s": round(time.perf_counter() - started, 2),
        "host_peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20), 2),
    }  # fmt: skip
    if device.type == "cuda":
        out["gpu_allocated_gib"] = round(torch.cuda.memory_allocated(device) / (1 << 30), 2)
        out["gpu_peak_load_gib"] = round(torch.cuda.max_memory_allocated(device) / (1 << 30), 2)
    network = loaded.network
    assert isinstance(network, NativeTransformer)
    with torch.inference_mode():
        for length in args.lengths:
            ids = torch.randint(0, tokenizer.vocab_size, (1, length), device=device)
            out[f"forward_ms_{length}"] = round(median_ms(functools.partial(network, ids), device, args.repeats), 2)
    canvas = canvas_for(loaded, args.locked_tokens, args.hole_tokens)
    out["canvas_tokens"] = canvas.length
    balanced = loaded.fit_config(PRESETS["balanced"])  # SDAR: the model's attention blocks
    cached = denoise_stats(loaded, [canvas], balanced, device)
    exact = denoise_stats(loaded, [canvas], balanced.replace(cache="none"), device)
    out["denoise_balanced"] = cached
    out["denoise_no_cache"] = exact
    out["cache_speedup"] = round(exact["ms_per_step"] / cached["ms_per_step"], 2)
    out["jobs_per_s"] = {str(b): round(denoise_stats(loaded, [canvas] * b, balanced, device)["jobs_per_s"], 3)
                         for b in BATCHES}  # fmt: skip
    if device.type == "cuda":
        out["gpu_peak_run_gib"] = round(torch.cuda.max_memory_allocated(device) / (1 << 30), 2)
    shutil.rmtree(directory, ignore_errors=True)
    return out


# -- the report --------------------------------------------------------------------------------
def device_label(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    return f"CPU {platform.processor() or platform.machine()} (torch {torch.__version__})"


def report(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# GPU check: LLaDA-8B, Dream-7B and SDAR-8B shapes, random weights, bf16",
        "",
        f"Device: {meta['device']}. Command: `{meta['command']}`. Shapes: "
        f"{'toy (--tiny)' if meta['tiny'] else 'the real checkpoints'}. Random weights give "
        "near-uniform logits, so the threshold preset commits about one token a step.",
        "",
        "| family | parameters | load s | GPU GiB after load | peak GiB | host peak RSS GiB | "
        + " | ".join(f"fwd ms @{n}" for n in meta["lengths"]) + " |",
        "|---|---|---|---|---|---|" + "---|" * len(meta["lengths"]),
    ]
    for r in results:
        lines.append(
            f"| {r['family']} | {_count(r['parameters'])} | {r['load_s']} | {r.get('gpu_allocated_gib', '-')} | "
            f"{r.get('gpu_peak_run_gib', '-')} | {r['host_peak_rss_gib']} | "
            + " | ".join(str(r[f"forward_ms_{n}"]) for n in meta["lengths"]) + " |"
        )
    lines += ["", f"Denoising one canvas of {results[0]['canvas_tokens']} tokens (locked text and two "
              "holes), preset balanced:", "",
              "| family | ms/step dual cache | ms/step no cache | cache speed-up | sampler overhead "
              "ms/step | jobs/s batch 1 | batch 4 | batch 8 |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        c, jobs = r["denoise_balanced"], r["jobs_per_s"]
        lines.append(
            f"| {r['family']} | {c['ms_per_step']:.1f} | {r['denoise_no_cache']['ms_per_step']:.1f} | "
            f"{r['cache_speedup']}x | {c['overhead_ms_per_step']:.1f} | {jobs['1']} | {jobs['4']} | {jobs['8']} |"
        )
    return "\n".join(lines) + "\n"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--families", nargs="+", default=[f.name for f in FAMILIES])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lengths", type=int, nargs="+", default=list(CANVASES), help="forward canvases")
    parser.add_argument("--locked-tokens", type=int, default=192)
    parser.add_argument("--hole-tokens", type=int, default=64)
    parser.add_argument("--tiny", action="store_true", help="toy shapes and canvases (tests it on a CPU)")
    parser.add_argument("--work", default=None, help="where checkpoints are written (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.tiny:
        for key, value in TINY_RUN.items():
            setattr(args, key, value)
        torch.set_num_threads(1)  # toy shapes: threads only add contention
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device; run this on a GPU machine (or --tiny --device cpu)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="gpu-check-"))
    results = []
    for family in args.families:
        shape = {**REAL_SHAPES[family], **(TINY[family] if args.tiny else {})}
        print(f"{family}: writing and loading a random checkpoint ...", flush=True)
        results.append(check_family(family, shape, args, work))
        print(json.dumps(results[-1]), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    meta = {"device": device_label(device), "tiny": args.tiny, "lengths": args.lengths,
            "command": "scripts/gpu-check " + " ".join(argv if argv is not None else sys.argv[1:])}  # fmt: skip
    (out / "results.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    (out / "REPORT.md").write_text(report(results, meta))
    print((out / "REPORT.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
