"""The settings a person gives a training run (checked here, used by research.finetune), and
the evaluation table as the run page shows it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from drafting.services import UserError


@dataclass(frozen=True)
class Knob:
    name: str
    label: str
    default: float | int | None
    low: float
    high: float
    integer: bool = True
    help: str = ""


KNOBS = (
    Knob("minutes", "Training minutes", 30, 0.05, 600, integer=False,
         help="wall-clock budget for the training steps (the evaluation comes after)"),
    Knob("steps", "Exact steps", None, 1, 1_000_000,
         help="optional: a step count instead of minutes (reproduces a run exactly)"),
    Knob("seed", "Seed", 0, 0, 2**31 - 1),
    Knob("original_share", "Share of the original corpus", 0.25, 0.0, 0.9, integer=False,
         help="rows drawn from the corpus the model was trained on, so it keeps what it knew"),
    Knob("held_out_share", "Held-out share", 0.1, 0.02, 0.5, integer=False,
         help="documents kept out of training for the evaluation"),
    Knob("lr", "Peak learning rate", 3e-4, 1e-6, 1e-2, integer=False),
    Knob("eval_cases", "Held-out cases per hole kind", 60, 1, 2000),
    Knob("regression_cases", "Original test-split cases per hole kind", 25, 0, 2000),
    Knob("threads", "CPU threads", 2, 1, 64),
)  # fmt: skip


@dataclass(frozen=True)
class TrainingForm:
    values: dict[str, Any]

    @classmethod
    def defaults(cls) -> list[dict[str, Any]]:
        return [{**asdict(k), "value": "" if k.default is None else k.default} for k in KNOBS]

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        """The run's settings from a form or a JSON body: every knob, defaults filled in;
        UserError naming each bad one."""
        out: dict[str, Any] = {}
        errors: dict[str, str] = {}
        unknown = sorted(set(data) - {k.name for k in KNOBS} - {"csrfmiddlewaretoken"})
        if unknown:
            raise UserError(f"Unknown settings: {', '.join(unknown)}.")
        for knob in KNOBS:
            raw = data.get(knob.name)
            if raw is None or (isinstance(raw, str) and not raw.strip()):
                out[knob.name] = knob.default
                continue
            try:
                value = (int(raw) if knob.integer else float(raw)) if not isinstance(raw, bool) else None
            except (TypeError, ValueError):
                value = None
            if value is None or not knob.low <= value <= knob.high:
                kind = "a whole number" if knob.integer else "a number"
                errors[knob.name] = f"{knob.label}: give {kind} from {knob.low:g} to {knob.high:g}."
                continue
            out[knob.name] = value
        if errors:
            raise UserError(" ".join(errors.values()), errors=errors)
        return out


def evaluation_rows(evaluation: dict[str, Any] | None) -> dict[str, Any] | None:
    """The evaluation's tables (held-out documents, original test split) as rows for the
    page: per hole kind, n, exact match base / tuned / difference with its interval, NLL."""
    if not evaluation:
        return None
    tables = {}
    for part in ("held_out", "regression"):
        rows = []
        for kind, m in (evaluation.get(part) or {}).get("per_kind", {}).items():
            rows.append({"kind": kind, **m})
        tables[part] = rows
    return {"tables": tables, "summary": evaluation.get("summary", {}),
            "samples": evaluation.get("samples", [])}  # fmt: skip
