"""The run record body: what reproduces a run, under OpenTelemetry GenAI names where they exist.

Built from two values: the engine's :class:`~gpu_worker.engine.outcome.Outcome` (what the run
produced, and which model produced it) and a :class:`RunContext` (where and why it ran).
Holds hashes of outputs and of intermediate state, never their text. The request canvas (the
input: locked text + hole specs) is stored beside the body, in ``RunRecord.request``.
The body's ``schema_version`` is ``RUN_RECORD_SCHEMA_VERSION``; older versions are read by
``audit.legacy``. ``stencil.model_version`` names the model version that ran; a body without
it ran the configured model named by ``stencil.model``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import subprocess
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from audit.canonical import json_sha256, sha256_hex
from audit.models import RUN_RECORD_SCHEMA_VERSION
from gpu_worker.engine.outcome import Outcome

SCHEMA = "stencil.audit.run_record"
# violation keys that are labels (kept); anything else in a violation is only hashed
_VIOLATION_LABELS = ("hole", "code", "kind", "rule", "name", "constraint")


@dataclass(frozen=True)
class RunContext:
    """Where, why and on what a run happened: what a run record holds beside the outcome."""

    job_id: str | None  # the job the run belongs to (None for a run outside a job)
    attempt: int  # 0 for the first attempt, then one per retry or fallback
    route: str  # the job's route label: "diffusion", "ar", "shadow-ar", ...
    model_dir: str  # the directory the model was loaded from
    request: Mapping[str, Any]  # the Canvas JSON as run, its seed included
    device: str  # the worker's device label (gpu_worker.runtime.device_name)
    correlation_id: str  # ties every attempt of one request together (diagnostics sampling)
    batch_job_ids: tuple[str, ...]  # every job of the denoising batch, in batch order
    router_decision: Mapping[str, Any]  # the router's RouteDecision.as_json()
    template_version: str | None = None  # "slug@number" of the draft's template
    # The model version that ran: {"id" (the ModelVersion row, None when no row names these
    # weights), "name", "weights_sha256", "scope" ("template:<slug>", "default", "configured")}
    model_version: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.attempt < 0:
            raise ValueError(f"attempt must be >= 0, got {self.attempt}")


@functools.lru_cache(maxsize=1)
def git_revision() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    revision = result.stdout.strip()
    return revision if result.returncode == 0 and revision else "unknown"


@functools.lru_cache(maxsize=1)
def stencil_version() -> str:
    """The installed package's version, else pyproject.toml's, else "unknown"."""
    try:
        return importlib.metadata.version("stencil")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        return str(tomllib.loads(pyproject.read_text())["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


def runtime_info(device: str) -> dict[str, Any]:
    """Versions and hardware that decide whether a replay can be bit-identical.

    ``device`` is the worker's label ("cpu", "cuda:NVIDIA H200", or a torch device string).
    """
    return {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "stencil": stencil_version(),
        "git_revision": git_revision(),
        "device": device,
        "platform": platform.machine(),
        # the CPU kernels ATen dispatches to (AVX2, AVX512, ...): float sums differ between them
        # in the last bits, so a CPU replay is bit-identical only on the same kernels
        # (ATEN_CPU_CAPABILITY pins them)
        "cpu_kernels": torch.backends.cpu.get_cpu_capability(),
    }


def generator_state_sha256(seed: int) -> str:
    """sha256 of a CPU torch.Generator's state right after ``manual_seed(seed)``."""
    state = torch.Generator(device="cpu").manual_seed(int(seed)).get_state()
    return sha256_hex(bytes(state.tolist()))


def canvas_hash(request: Mapping[str, Any]) -> str:
    return json_sha256(list(request.get("segments", [])))


def _holes(request: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [s for s in request.get("segments", []) if isinstance(s, Mapping) and "hole" in s]


def constraint_hash(request: Mapping[str, Any]) -> str:
    return json_sha256([[h.get("hole"), h.get("constraint")] for h in _holes(request)])


def violations_summary(violations: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in item.items() if k in _VIOLATION_LABELS and isinstance(v, str)}
        for item in violations
    ]


def output_tokens(trace: Sequence[Mapping[str, Any]]) -> int | None:
    """Tokens committed over the run, when the trace says (committed minus re-masked)."""
    total = 0
    seen = False
    for step in trace:
        for key, sign in (("committed", 1), ("remasked", -1)):
            value = step.get(key)
            if isinstance(value, list | tuple):
                total += sign * len(value)
                seen = True
            elif isinstance(value, int) and not isinstance(value, bool):
                total += sign * value
                seen = True
    return total if seen else None


def _precision(config: Mapping[str, Any], model: Mapping[str, Any]) -> Any:
    """The arithmetic the network really ran in: bf16 when its weights are bf16 (a checkpoint
    loaded in bf16) or the config asked for bf16 autocast; else the weights' dtype."""
    weights, compute = model.get("precision"), config.get("precision")
    return "bf16" if "bf16" in (weights, compute) else (weights or compute)


def _model_version(context: RunContext, outcome: Outcome) -> dict[str, Any]:
    """The body's ``stencil.model_version``; a run outside a job names only the weights."""
    weights = outcome.model["weights_sha256"]
    if context.model_version is None:
        return {"id": None, "name": Path(context.model_dir).name, "weights_sha256": weights,
                "scope": "configured"}  # fmt: skip
    return {**dict(context.model_version), "weights_sha256": weights}


def run_body_build(
    *, run_id: str, context: RunContext, outcome: Outcome, diagnostics: bool
) -> dict[str, Any]:
    config = dict(outcome.config)
    request = context.request
    holes = _holes(request)
    max_tokens = sum(int(h.get("max_tokens", 0) or 0) for h in holes)
    batch = list(context.batch_job_ids)
    model_name = Path(context.model_dir).name
    return {
        "schema": SCHEMA,
        "schema_version": RUN_RECORD_SCHEMA_VERSION,
        "gen_ai.operation.name": "text_completion",
        "gen_ai.provider.name": "stencil",
        "gen_ai.request.model": model_name,
        "gen_ai.response.model": model_name,
        "gen_ai.response.id": run_id,
        "gen_ai.request.seed": int(outcome.seed),
        "gen_ai.request.temperature": config.get("temperature"),
        "gen_ai.request.top_p": config.get("top_p"),
        "gen_ai.request.max_tokens": max_tokens,
        "gen_ai.usage.output_tokens": output_tokens(outcome.trace),
        "gen_ai.response.finish_reasons": ["cancelled" if outcome.cancelled else "stop"],
        "stencil.job_id": context.job_id,
        "stencil.attempt": context.attempt,
        "stencil.correlation_id": context.correlation_id,
        "stencil.route": context.route,
        "stencil.outcome_route": outcome.route,
        "stencil.router_decision": dict(context.router_decision),
        "stencil.model": {
            "dir": str(context.model_dir),
            "weights_sha256": outcome.model["weights_sha256"],
            "tokenizer_sha256": outcome.model["tokenizer_sha256"],
        },
        "stencil.model_version": _model_version(context, outcome),
        "stencil.sampler": {"config": config, "config_sha256": outcome.config_sha256},
        "stencil.generator": {
            "seed": int(outcome.seed),
            "initial_state_sha256": generator_state_sha256(outcome.seed),
        },
        "stencil.precision": _precision(config, outcome.model),
        "stencil.runtime": runtime_info(context.device),
        "stencil.batch": {
            "size": max(len(batch), 1),
            "job_ids": batch,
            "position": batch.index(context.job_id) if context.job_id in batch else None,
        },
        "stencil.canvas": {
            "sha256": canvas_hash(request),
            "holes": len(holes),
            "constraint_sha256": constraint_hash(request),
            "template_version": context.template_version,
            "request_seed": request.get("seed"),
        },
        "stencil.timings": dict(outcome.timings),
        "stencil.outcome": {
            "forward_passes": int(outcome.forward_passes),
            "steps": int(outcome.steps),
            "cancelled": bool(outcome.cancelled),
            "violations_count": len(outcome.violations),
            "violations": violations_summary(outcome.violations),
            "violations_sha256": json_sha256(list(outcome.violations)),
            "trace_sha256": outcome.trace_sha256,
            "trace_steps": len(outcome.trace),
            "document_sha256": sha256_hex(outcome.document),
            "holes_sha256": {name: sha256_hex(text) for name, text in outcome.holes.items()},
        },
        "stencil.diagnostics": diagnostics,
    }
