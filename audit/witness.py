"""The checkpoint witness: the latest signed checkpoint, kept apart from the checkpoint file.

The checkpoint file grows by one signed line per checkpoint; someone who can rewrite the
database and that file could cut both tails and leave a shorter log that still verifies. The
witness holds a copy of the newest checkpoint line somewhere else (``AUDIT_CHECKPOINT_WITNESS``;
by default beside the file, which only guards against accidents: point it at storage the
database host cannot write). The verifier requires the file to reach the witness's size with the
same root, and no checkpoint is signed over a file that falls short of it.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings

from audit import checkpoints


def witness_path() -> Path:
    configured = str(getattr(settings, "AUDIT_CHECKPOINT_WITNESS", "") or "")
    if configured:
        return Path(configured)
    return Path(str(settings.AUDIT_CHECKPOINT_FILE) + ".witness")


def witness_write(checkpoint: checkpoints.Checkpoint) -> None:
    """Replace the witness with ``checkpoint`` (written whole, then renamed into place)."""
    path = witness_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(checkpoint.to_line(), encoding="utf-8")
    os.replace(tmp, path)


def witness_read() -> checkpoints.Checkpoint | None:
    """The witnessed checkpoint, or None when there is no witness; ValueError if unreadable."""
    path = witness_path()
    if not path.exists():
        return None
    try:
        return checkpoints.parse_line(path.read_text(encoding="utf-8"))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"the checkpoint witness {path} is unreadable ({exc})") from None


def cut_tail(file_size: int, witnessed: checkpoints.Checkpoint | None) -> str | None:
    """Why a checkpoint file ending at ``file_size`` falls short of the witness, or None."""
    if witnessed is None or file_size >= witnessed.size:
        return None
    return (
        f"the checkpoint file ends at size {file_size} but the witness "
        f"{witness_path()} holds a signed checkpoint at size {witnessed.size}: "
        "its tail was cut"
    )
