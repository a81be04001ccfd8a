"""The command line: fill a Canvas JSON file with a model directory, print the answer as JSON.

    python -m gpu_worker.infill FILE.json [--model models/stencil-denoiser] [--route ar] [--trace]

prints the holes, the document, forward passes, timings and the trace hash as JSON. The route
defaults to the model's own (AR for an AR-FIM model, else diffusion). Bad input gives one line
on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpu_worker.engine.outcome import ROUTES
from gpu_worker.engine.run import route_for, run

DEFAULT_MODEL_DIR = Path("models/stencil-denoiser")
MODEL_DIR_ENV = "STENCIL_MODEL_DIR"
EXIT_BAD_INPUT = 2
EXIT_FAILURE = 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gpu_worker.infill",
        description="Fill the holes of a Canvas JSON file with the Stencil denoiser.",
    )
    parser.add_argument("file", help="Canvas JSON file ('-' reads stdin)")
    parser.add_argument(
        "--model",
        default=os.environ.get(MODEL_DIR_ENV, str(DEFAULT_MODEL_DIR)),
        help=f"model directory (default: ${MODEL_DIR_ENV} or {DEFAULT_MODEL_DIR})",
    )
    parser.add_argument("--route", choices=ROUTES, help="route (default: the model's own)")
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    parser.add_argument("--trace", action="store_true", help="also print the per-step trace")
    return parser


def _read_request(path: str) -> dict[str, Any]:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object (Canvas JSON), got {type(data).__name__}")
    return data


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        request = _read_request(args.file)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        from gpu_worker.engine.backends import load_backend

        loaded = load_backend(Path(args.model), device=args.device)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        print(f"error: cannot load model {args.model}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    try:
        outcome = run(args.route or route_for(loaded), loaded, request)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:  # the CLI promises one line, never a traceback
        print(f"error: infill failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    report: dict[str, Any] = {
        "holes": outcome.holes,
        "document": outcome.document,
        "forward_passes": outcome.forward_passes,
        "steps": outcome.steps,
        "timings": outcome.timings,
        "trace_sha256": outcome.trace_sha256,
        "config_sha256": outcome.config_sha256,
        "seed": outcome.seed,
        "route": outcome.route,
        "violations": outcome.violations,
        "model": outcome.model,
        "confidence": outcome.confidence,
        "domain": outcome.domain,
    }
    if args.trace:
        report["trace"] = outcome.trace
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
