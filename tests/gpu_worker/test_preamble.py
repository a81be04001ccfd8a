"""Instruction models: the operator's stencil-preamble.json (the chat turn in the model's own
format, with the template's purpose and each hole's hint) stands before the document on the
canvas. The model reads it; the document never holds it; special tokens stand there only."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from gpu_worker.engine.backends import load_backend
from gpu_worker.engine.checkpoint import CheckpointError
from gpu_worker.engine.config import PRESETS, config_from_overrides
from gpu_worker.engine.infill import infill_request
from gpu_worker.engine.loaded import LoadedModel
from gpu_worker.engine.preamble import PREAMBLE_FILE

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "native"
CHAT = {  # each family's chat format, as its instruct checkpoint's chat template writes it
    "llada": {"text": "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nWrite the "
                      "document. {purpose}\n{hints}<|eot_id|><|start_header_id|>assistant"
                      "<|end_header_id|>\n\n", "hint": "- {hole}: {hint}\n"},
    "dream": {"text": "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>"
                      "user\nWrite the document. {purpose}\n{hints}<|im_end|>\n<|im_start|>"
                      "assistant\n", "hint": "- {hole}: {hint}\n"},
    "sdar": {"text": "<|im_start|>user\n{purpose}\n{hints}<|im_end|>\n<|im_start|>assistant\n",
             "hint": "{hole}: {hint}\n"},
}  # fmt: skip
CHAT_TOKENS = {"llada": ["<|startoftext|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
               "dream": ["<|im_start|>", "<|im_end|>"], "sdar": ["<|im_start|>", "<|im_end|>"]}  # fmt: skip
LOCKED = ["Dear ", ",\nThank you for seeing ", " at the clinic.\nKind regards,\n"]
REQUEST: dict[str, Any] = {
    "purpose": "A thank-you letter to a patient.",
    "segments": [{"text": LOCKED[0]}, {"hole": "name", "max_tokens": 5, "hint": "the patient"},
                 {"text": LOCKED[1]}, {"hole": "who", "max_tokens": 6, "hint": "the doctor"},
                 {"text": LOCKED[2]}, {"hole": "signature", "max_tokens": 4}],
    "seed": 2,
}  # fmt: skip


def _with_preamble(family: str, tmp_path: Path, preamble: dict[str, Any] | None = None) -> Path:
    directory = tmp_path / f"{family}-instruct"
    shutil.copytree(FIXTURES / f"{family}-tiny", directory)
    (directory / PREAMBLE_FILE).write_text(json.dumps(preamble or CHAT[family]))
    return directory


def _inputs(loaded: LoadedModel, request: dict[str, Any], preset: str = "careful") -> tuple[Any, list[torch.Tensor]]:
    """The outcome, and every ids tensor the network was given."""
    seen: list[torch.Tensor] = []
    network: Any = loaded.network
    real = network.forward_window

    def spy(ids: torch.Tensor, **kwargs: Any) -> Any:  # records, then runs the real forward
        if kwargs.get("cache") is None:
            seen.append(ids.clone())
        return real(ids, **kwargs)

    network.forward_window = spy
    try:
        outcome = infill_request(loaded, request, config=loaded.fit_config(config_from_overrides(preset)))
    finally:
        del network.forward_window
    return outcome, seen


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_the_preamble_tokens_are_in_the_model_input_before_the_document(family: str, tmp_path: Path) -> None:
    loaded = load_backend(_with_preamble(family, tmp_path))
    plain = load_backend(FIXTURES / f"{family}-tiny")
    tok = loaded.tokenizer
    outcome, seen = _inputs(loaded, REQUEST)
    first = seen[0][0].tolist()
    expected_chat = [tok.tok.token_to_id(t) for t in CHAT_TOKENS[family]]
    document_ids = _inputs(plain, REQUEST)[1][0][0].tolist()
    start = len(first) - len(document_ids)
    assert start > 0 and first[start:] == document_ids  # the preamble, then the canvas as before
    assert all(i in first[:start] for i in expected_chat)  # the chat tokens as their special ids
    preamble_text = tok.tok.decode(first[:start], skip_special_tokens=False)
    assert "A thank-you letter to a patient." in preamble_text
    assert "- name: the patient\n" in preamble_text or "name: the patient\n" in preamble_text
    assert "signature:" not in preamble_text  # a hole without a hint has no line
    assert all(ids[0, :start].tolist() == first[:start] for ids in seen)  # locked at every step


@pytest.mark.parametrize("family", ["llada", "dream", "sdar"])
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_output_document_is_the_locked_text_and_the_fills_only(
    family: str, preset: str, tmp_path: Path
) -> None:
    loaded = load_backend(_with_preamble(family, tmp_path))
    outcome, _ = _inputs(loaded, REQUEST, preset)
    holes = outcome.holes
    assert outcome.document == (LOCKED[0] + holes["name"] + LOCKED[1] + holes["who"] + LOCKED[2]
                                + holes["signature"])  # fmt: skip
    assert not [v for v in outcome.violations if v["name"].startswith("locked")]
    assert "thank-you letter" not in outcome.document


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("where", ["text", "hint", "purpose"])
def test_a_document_with_a_special_token_is_still_refused(family: str, where: str, tmp_path: Path) -> None:
    loaded = load_backend(_with_preamble(family, tmp_path))
    special = CHAT_TOKENS[family][-1]
    request = json.loads(json.dumps(REQUEST))
    if where == "text":
        request["segments"][2]["text"] = f",\n{special}Thank you for seeing "
    elif where == "hint":
        request["segments"][1]["hint"] = f"the patient{special}"
    else:
        request["purpose"] = f"A letter.{special}"
    with pytest.raises(ValueError, match="special token of this model") as caught:
        infill_request(loaded, request)
    assert special in str(caught.value) and "\n" not in str(caught.value)


def test_a_model_without_a_preamble_reads_the_raw_document(tmp_path: Path) -> None:
    loaded = load_backend(FIXTURES / "llada-tiny")
    assert loaded.preamble is None
    outcome, seen = _inputs(loaded, REQUEST)
    assert seen[0][0, 0].item() == loaded.tokenizer.encode(LOCKED[0])[0]
    assert outcome.document.startswith(LOCKED[0])


@pytest.mark.parametrize(("preamble", "named"), [
    ({"text": "<|im_start|>user\n{topic}<|im_end|>\n"}, "text holds {topic}"),
    ({"hint": "{hole}"}, 'needs {"text"'),
    ({"text": "<|mask|>user\n"}, "holds the mask token <|mask|>"),
    ({"text": "x", "footer": "y"}, "unknown field(s) ['footer']"),
])  # fmt: skip
def test_a_preamble_file_that_cannot_be_used_is_named_with_the_fix(
    preamble: dict[str, Any], named: str, tmp_path: Path
) -> None:
    directory = _with_preamble("dream", tmp_path, preamble)
    with pytest.raises(CheckpointError) as caught:
        load_backend(directory)
    message = str(caught.value)
    assert named in message and PREAMBLE_FILE in message and "\n" not in message


def test_without_a_preamble_a_special_token_in_the_document_is_refused_too() -> None:
    loaded = load_backend(FIXTURES / "dream-tiny")
    request = {"segments": [{"text": "Dear <|im_start|>"}, {"hole": "name", "max_tokens": 3}]}
    with pytest.raises(ValueError) as caught:
        infill_request(loaded, request)
    assert "'<|im_start|>', a special token of this model" in str(caught.value)
