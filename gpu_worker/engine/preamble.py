"""An instruction model's preamble: the chat turn placed before the document on the canvas.

An instruct checkpoint (LLaDA-8B-Instruct, Dream-v0-Instruct-7B, SDAR-Chat) was trained to write
an answer after its chat format's user turn. The operator gives that turn in a file beside the
weights, ``stencil-preamble.json``::

    {"text": "<|im_start|>user\\nWrite this document. {purpose}\\n{hints}<|im_end|>\\n<|im_start|>assistant\\n",
     "hint": "- {hole}: {hint}\\n"}

``text`` is the turn, with ``{purpose}`` (the canvas's ``purpose``: the template's) and
``{hints}`` (one ``hint`` line per hole that has a ``hint``, with ``{hole}`` its name and
``{hint}`` its hint). Only this file may hold the model's special tokens (its chat markers):
they are read as the special ids they spell. The purpose and the hints come from the request and
are ordinary text, and the canvas refuses a document that spells a special token.

The preamble's tokens are locked positions before the document's first token: the model reads
them, the sampler never changes them, and neither the document nor any hole's text holds them.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from gpu_worker.engine.canvas import Canvas
from gpu_worker.engine.checkpoint import CheckpointError
from gpu_worker.engine.tokenizer import StencilTokenizer

PREAMBLE_FILE = "stencil-preamble.json"
PURPOSE, HINTS, HOLE, HINT = "{purpose}", "{hints}", "{hole}", "{hint}"
_FIELDS = {"text": (PURPOSE, HINTS), "hint": (HOLE, HINT)}


@dataclass(frozen=True)
class Preamble:
    """The operator's chat turn (see the module docstring)."""

    text: str
    hint: str = ""


def load_preamble(directory: Path) -> Preamble | None:
    """The model directory's ``stencil-preamble.json``, or None without one; a
    :class:`CheckpointError` (one line: the file and the fix) for one that cannot be used."""
    path = Path(directory) / PREAMBLE_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not readable JSON ({exc}); fix the file or remove it") from None
    if not isinstance(data, dict) or not isinstance(data.get("text"), str) or not data["text"]:
        raise CheckpointError(f'{path}: needs {{"text": "<the chat turn before the document>"}}')
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise CheckpointError(f"{path}: unknown field(s) {unknown}; known: {sorted(_FIELDS)}")
    hint = data.get("hint", "")
    if not isinstance(hint, str):
        raise CheckpointError(f"{path}: hint must be a string with {HOLE} and {HINT}")
    for name, value in (("text", data["text"]), ("hint", hint)):
        stray = sorted(set(re.findall(r"\{[a-z_]+\}", value)) - set(_FIELDS[name]))
        if stray:
            raise CheckpointError(
                f"{path}: {name} holds {stray[0]}, which is not a placeholder of it "
                f"(it may hold {' and '.join(_FIELDS[name])})"
            )
    return Preamble(text=data["text"], hint=hint)


def check_preamble(preamble: Preamble, tokenizer: StencilTokenizer, directory: Path) -> None:
    """Refuse a preamble that spells the mask token (the sampler's, never the model's input
    outside a hole): one line naming the file and the fix."""
    for name, token in _special_ids(tokenizer).items():
        if token == tokenizer.special.mask and (name in preamble.text or name in preamble.hint):
            raise CheckpointError(
                f"{Path(directory) / PREAMBLE_FILE} holds the mask token {name}: remove it (the "
                "preamble is the chat turn before the document)"
            )


def preamble_ids(preamble: Preamble, canvas: Canvas, tokenizer: StencilTokenizer) -> list[int]:
    """The preamble's tokens for ``canvas``: the operator's text with its special tokens as
    their ids, the canvas's purpose and hints as ordinary text."""
    hints = [_fill(preamble.hint, {HOLE: name, HINT: str(hole["hint"])})
             for name, hole in canvas.groups.items() if preamble.hint and hole.get("hint")]  # fmt: skip
    parts = _fill(preamble.text, {PURPOSE: canvas.purpose, HINTS: ""}, inserts={HINTS: hints})
    specials = _special_ids(tokenizer)
    out: list[int] = []
    for text, operator in parts:
        out.extend(_encode_operator(text, specials, tokenizer) if operator else tokenizer.encode(text))
    return out


def with_preamble(canvas: Canvas, ids: list[int], *, max_len: int) -> Canvas:
    """``canvas`` with ``ids`` as locked positions before its first token (holes and per-position
    sets moved along); its pieces, and so its document, are unchanged."""
    if not ids:
        return canvas
    shift = len(ids)
    if canvas.length + shift > max_len:
        raise ValueError(
            f"the canvas needs {canvas.length + shift} tokens with the model's preamble "
            f"({shift} of them) but the model's context is max_len={max_len}"
        )
    return dataclasses.replace(
        canvas,
        ids=torch.cat([torch.tensor(ids, dtype=torch.long), canvas.ids]),
        protect=torch.cat([torch.ones(shift, dtype=torch.bool), canvas.protect]),
        holes=[dataclasses.replace(h, start=h.start + shift) for h in canvas.holes],
        allowed={p + shift: tokens for p, tokens in canvas.allowed.items()},
        preamble_length=shift,
    )


# -- internals ----------------------------------------------------------------------------------
Part = tuple[str, bool]  # text and whether the operator wrote it (True) or the request (False)


def _fill(template: str, values: dict[str, str], inserts: dict[str, list[list[Part]]] | None = None) -> list[Part]:
    """``template`` cut at its placeholders: operator text, and each placeholder's value as
    request text (or, for an ``inserts`` placeholder, its parts in order)."""
    keys = sorted(values, key=len, reverse=True)
    pattern = "(" + "|".join(re.escape(k) for k in keys) + ")"
    parts: list[Part] = []
    for piece in re.split(pattern, template):
        if piece in values:
            if inserts and piece in inserts:
                parts.extend(p for line in inserts[piece] for p in line)
            elif values[piece]:
                parts.append((values[piece], False))
        elif piece:
            parts.append((piece, True))
    return parts


def _special_ids(tokenizer: StencilTokenizer) -> dict[str, int]:
    """Each special token's text and id (the tokenizer's added special tokens)."""
    added = tokenizer.tok.get_added_tokens_decoder()
    return {token.content: int(i) for i, token in added.items() if token.special}


def _encode_operator(text: str, specials: dict[str, int], tokenizer: StencilTokenizer) -> list[int]:
    """Operator text with every special token it spells as its id, the rest tokenized."""
    if not specials:
        return tokenizer.encode(text)
    pattern = "(" + "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)) + ")"
    out: list[int] = []
    for piece in re.split(pattern, text):
        if piece in specials:
            out.append(specials[piece])
        elif piece:
            out.extend(tokenizer.encode(piece))
    return out


__all__ = ["PREAMBLE_FILE", "Preamble", "check_preamble", "load_preamble", "preamble_ids",
           "with_preamble"]  # fmt: skip
