"""Replay: re-run the engine from a run record and compare the traces step by step.

Kept Django-light: it reads a RunRecord's stored JSON and calls the engine's one entry point
(:func:`gpu_worker.engine.run.run`) on the route that produced the outcome. A record is read
by the rules of its schema_version (:mod:`audit.legacy` for version 1). It loads the model
directory the record names, which for a model version is that version's own directory (written
once, never changed), so a run replays with the version it ran with. A different weights
hash, tokenizer, runtime (torch, Python, device), code revision or batch makes the replay
*approximate*: it still runs, and the report says why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audit import legacy
from audit.canonical import sha256_hex
from audit.runbody import runtime_info
from audit.trace import Divergence, trace_compare, trace_hash
from gpu_worker.engine.outcome import ROUTES, Outcome

_RUNTIME_KEYS = ("torch", "torch_cuda", "python", "device", "git_revision", "stencil",
                 "cpu_kernels")  # fmt: skip
_RUNTIME_KEYS_NOT_IN_OLD_RECORDS = {"cpu_kernels"}


class ReplayError(Exception):
    """The run cannot be replayed at all (model directory gone, unknown route)."""


@dataclass
class ReplayReport:
    run_id: str
    identical: bool
    approximate: bool
    approximate_reasons: list[str] = field(default_factory=list)
    divergence: Divergence | None = None
    notes: list[str] = field(default_factory=list)  # other mismatches (outputs, hashes)
    steps_recorded: int = 0
    steps_replayed: int = 0
    device: str = "cpu"
    model: str = ""  # the model replayed with: the recorded version, or the configured model

    @property
    def summary(self) -> str:
        """One line: "identical (...)" or "diverged at step k: ...", flagged if approximate."""
        if self.divergence is not None:
            head = f"diverged at step {self.divergence.step}: {self.divergence.what}"
        elif self.identical:
            head = f"identical ({self.steps_replayed} steps, same output hash)"
        else:
            head = "diverged after the last step: " + "; ".join(self.notes)
        if self.approximate:
            head = "approximate replay (" + "; ".join(self.approximate_reasons) + "): " + head
        return head

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "identical": self.identical,
            "approximate": self.approximate,
            "approximate_reasons": self.approximate_reasons,
            "diverged_at": self.divergence.step if self.divergence else None,
            "divergence": self.divergence.what if self.divergence else None,
            "notes": self.notes,
            "steps_recorded": self.steps_recorded,
            "steps_replayed": self.steps_replayed,
            "device": self.device,
            "model": self.model,
            "summary": self.summary,
        }


def _pick_device(recorded: str) -> tuple[str, str | None]:
    """A torch device for a recorded device label ("cpu", "cuda:0" or "cuda:<GPU name>")."""
    import torch

    if not recorded.startswith("cuda"):
        return "cpu", None
    if not torch.cuda.is_available():
        return "cpu", f"recorded on {recorded}, no CUDA here: replayed on cpu"
    suffix = recorded.partition(":")[2]
    return (f"cuda:{suffix}" if suffix.isdigit() else "cuda"), None


def _sampler_config(recorded: dict[str, Any]) -> Any:
    from gpu_worker.engine.config import SamplerConfig

    return SamplerConfig.from_json(recorded)


def _short(digest: str) -> str:
    return digest[:12]


def replay_run(
    *, run_id: str, body: dict[str, Any], request: dict[str, Any], trace: list[dict[str, Any]],
    batch_requests: list[dict[str, Any]] | None = None,
) -> ReplayReport:  # fmt: skip
    """Re-run one recorded run; compare its trace, outputs and runtime with the record.

    ``batch_requests`` (every request of the recorded batch, in order) re-runs the whole
    batch as it ran, so a batched run replays exactly; without it the run replays alone.
    """
    import torch

    from gpu_worker.engine.backends import load_backend
    from gpu_worker.engine.model_files import archived_version
    from gpu_worker.runtime import device_name

    model = body["stencil.model"]
    runtime = body["stencil.runtime"]
    route = str(body["stencil.outcome_route"])  # the engine's route ("shadow-ar" ran "ar")
    if route not in ROUTES:
        raise ReplayError(f"route {route!r} has no replay runner (known: {list(ROUTES)})")
    device, device_note = _pick_device(str(runtime.get("device", "cpu")))
    model_dir = Path(model["dir"])
    named = _model_named(body)
    if not (model_dir / "model.safetensors").is_file():
        raise ReplayError(f"the weights of {named} are gone: {model_dir / 'model.safetensors'} "
                          "is not on this machine")  # fmt: skip
    loaded = load_backend(model_dir, device=device)
    if loaded.weights_sha256 != model["weights_sha256"]:  # retrained since: archived?
        kept = archived_version(model_dir, str(model["weights_sha256"]))
        if kept is not None:
            loaded = load_backend(kept, device=device)  # the weights it ran with

    reasons: list[str] = [device_note] if device_note else []
    if loaded.weights_sha256 != model["weights_sha256"]:
        reasons.append(
            f"weights sha256 differs: recorded {_short(model['weights_sha256'])}, "
            f"now {_short(loaded.weights_sha256)}"
        )
    if loaded.tokenizer_sha256 != model["tokenizer_sha256"]:
        reasons.append(
            f"tokenizer sha256 differs: recorded {_short(model['tokenizer_sha256'])}, "
            f"now {_short(loaded.tokenizer_sha256)}"
        )
    now = runtime_info(device_name(torch.device(device)))
    for key in _RUNTIME_KEYS:
        if key in _RUNTIME_KEYS_NOT_IN_OLD_RECORDS and key not in runtime:
            continue  # recorded before the key existed: nothing to compare
        if runtime.get(key) != now.get(key):
            reasons.append(f"{key} differs: recorded {runtime.get(key)}, now {now.get(key)}")
    batch_size = int(body["stencil.batch"]["size"])
    position = body["stencil.batch"].get("position")
    rebatch = batch_size > 1 and batch_requests is not None and position is not None
    if batch_size > 1 and not rebatch:
        reasons.append(f"recorded in a batch of {batch_size}, replayed alone")

    outcome = _rerun(
        route, loaded, _sampler_config(body["stencil.sampler"]["config"]),
        batch_requests if rebatch and batch_requests is not None
        else [{**request, "seed": body["stencil.generator"]["seed"]}],
        int(position) if rebatch and position is not None else 0,
    )  # fmt: skip
    replayed = trace_hash(outcome.trace)
    divergence = trace_compare(trace, replayed)
    recorded_out = body["stencil.outcome"]
    notes: list[str] = []
    if outcome.config_sha256 != body["stencil.sampler"]["config_sha256"]:
        notes.append("sampler config sha256 differs")
    if sha256_hex(outcome.document) != recorded_out["document_sha256"]:
        notes.append("output document hash differs")
    if int(outcome.forward_passes) != int(recorded_out["forward_passes"]):
        notes.append(f"forward passes {recorded_out['forward_passes']} -> {outcome.forward_passes}")
    if _trace_sha256(body, outcome) != recorded_out["trace_sha256"] and divergence is None:
        notes.append("the outcome's trace sha256 differs")
    return ReplayReport(
        run_id=run_id,
        identical=divergence is None and not notes,
        approximate=bool(reasons),
        approximate_reasons=reasons,
        divergence=divergence,
        notes=notes,
        steps_recorded=len(trace),
        steps_replayed=len(replayed),
        device=device,
        model=named,
    )


def _model_named(body: dict[str, Any]) -> str:
    """The model a record ran with, in words: its model version, or (a record from before
    versions were recorded, or a run outside a job) the model directory it names."""
    version = body.get("stencil.model_version")
    weights = _short(str(body["stencil.model"]["weights_sha256"]))
    if isinstance(version, dict) and version.get("id") is not None:
        return f"model version {version.get('name')} (id {version['id']}, weights {weights})"
    return f"the model in {body['stencil.model']['dir']} (weights {weights})"


def _rerun(route: str, loaded: Any, config: Any, requests: list[dict[str, Any]],
           position: int) -> Outcome:  # fmt: skip
    """The outcome of ``requests[position]``, re-run with all of ``requests`` as one batch."""
    from gpu_worker.engine.run import run_batch

    try:
        row = run_batch(route, loaded, requests, config)[position]
    except ValueError as exc:  # the model no longer fits the route
        raise ReplayError(f"the recorded run cannot be re-run: {exc}") from exc
    if isinstance(row, ValueError):
        raise ReplayError(f"the recorded request cannot be re-run: {row}")
    return row


def _trace_sha256(body: dict[str, Any], outcome: Outcome) -> str:
    """The replayed outcome's trace head, by the rules of the record's schema version."""
    if int(body.get("schema_version", legacy.SCHEMA_VERSION)) == legacy.SCHEMA_VERSION:
        return legacy.engine_trace_sha256_v1(outcome.trace)
    return outcome.trace_sha256


def replay_record(*, run_id: str, body: str, request: str, trace: str,
                  batch_requests: list[dict[str, Any]] | None = None) -> ReplayReport:  # fmt: skip
    return replay_run(
        run_id=run_id, body=json.loads(body), request=json.loads(request),
        trace=json.loads(trace), batch_requests=batch_requests,
    )  # fmt: skip
