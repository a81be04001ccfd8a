"""The Stencil transformer's configuration: architecture and special-token ids, saved as
``config.json`` beside the weights so a checkpoint describes itself."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

ModelKind = Literal["denoiser", "ar_fim"]
CONFIG_FORMAT = "stencil-transformer/1"


@dataclass(frozen=True)
class ModelConfig:
    """Architecture and special-token ids of a Stencil model; saved as ``config.json``."""

    kind: ModelKind  # "denoiser" (bidirectional, masked diffusion) or "ar_fim" (causal)
    vocab_size: int
    pad_id: int  # pads a hole's unused tail and a batch's short rows
    eos_id: int  # ends a document (and, for AR-FIM, a middle)
    mask_id: int  # the absorbing state of masked diffusion
    fim_prefix_id: int  # AR-FIM sentinels (PSM order: <pre> prefix <suf> suffix <mid> middle)
    fim_suffix_id: int
    fim_middle_id: int
    d_model: int = 256
    n_layers: int = 6
    n_heads: int = 4
    ffn_hidden: int = 688  # SwiGLU hidden width (~8/3 d_model, rounded to a multiple of 16)
    max_len: int = 512  # longest sequence the RoPE tables and training cover
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    # The copy head (a pointer over the sequence, as pointer-generator networks): the output
    # mixes the vocabulary softmax with a distribution over the tokens already in the
    # sequence, so copying a name from elsewhere in the document works for every token, rare
    # ones included, instead of being learned one token at a time. 0 = no copy head.
    copy_dim: int = 0
    # Copying across a space (needs the copy head): byte-level BPE spells a word at a line's
    # start without its leading space ("East" in a letterhead) and inside a line with it
    # (" East" in "Signed: Dr. Hogan, East ..."), two unrelated ids, so a pointer that copies
    # ids cannot copy a name's first token from a heading into a sentence. With copy_twins the
    # pointer can also copy a token as its spaced or bare twin (the same text with or without
    # one leading space; see CopyHead and tokenizer.space_twins). The twin table is part of the
    # weights (``copy.twins``). Its gate starts almost closed, so adding it to a trained model
    # changes its output by about 2% of the copy mass until it is trained.
    copy_twins: bool = False
    # Copying into lower case (needs copy_twins): an e-mail address spells a name in lower
    # case ("adam.diaz@..."), other tokens than " Adam" and " Diaz" (and other pieces, unless
    # the vocabulary has the lower-case words: corpus.email_name_words). With copy_lower a
    # twin copy may also be the twin's lower-case spelling (tokenizer.case_twins; the table is
    # ``copy.lower_twins``). Its gate starts almost closed too.
    copy_lower: bool = False
    # The room embedding: an input embedding, added to each position's token embedding, of
    # how many positions of its hole's budget are left from it (1..room_buckets, more is
    # clipped to room_buckets; 0 = not in a hole, or not known). Without it a model cannot
    # see where one hole ends and the next begins when no locked text lies between them (two
    # sentences in a row), and writes the first sentence on into the second's budget.
    # Zero-initialised, so adding it to a trained model changes nothing until it is trained.
    # 0 = none (the sampler then passes no room).
    room_buckets: int = 0
    # Virtual spaces: a hole that starts a line or a JSON string value is written with a
    # leading space the document does not have (" Joshua", one token, where the document's
    # own line-start "Joshua" is "Jos", "hua"), and the space is stripped. A tokenization
    # rule the model is trained with, so it lives here; see tokenizer.opens_line_or_value.
    virtual_spaces: bool = False
    # Spaced lines: every line start and JSON string value has such a virtual space, in
    # locked text too (tokenizer.spaced_text), so a name at a line's start is the same tokens
    # as inside a line and a hole can copy it. Implies virtual_spaces.
    spaced_lines: bool = False
    # AR-FIM hole masks: the prompt shows the hole being filled as its budget of mask tokens
    # at the start of the suffix, and every later hole of the canvas as its own budget of
    # masks (``<pre> prefix <suf> <mask>*n suffix <mid> middle``). Without them a hole's
    # size is not in the prompt, and the first of a run of holes (sentences in a row) has an
    # empty suffix, so the model writes whatever span most often follows the prefix (a
    # buyer's name where an invoice's payment sentence belongs). See gpu_worker.engine.ar.fim_prompt.
    fim_hole_masks: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # free-form provenance (corpus, seed)

    @property
    def causal(self) -> bool:
        return self.kind == "ar_fim"

    def to_json(self) -> dict[str, Any]:
        return {"format": CONFIG_FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelConfig:
        data = dict(data)
        fmt = data.pop("format", CONFIG_FORMAT)
        if fmt != CONFIG_FORMAT:
            raise ValueError(f"config format {fmt!r} is not {CONFIG_FORMAT!r}")
        return cls(**data)


__all__ = ["CONFIG_FORMAT", "ModelConfig", "ModelKind"]
