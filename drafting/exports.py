"""Exports of a draft: plain text and Markdown.

What a person sees as final is only what a person accepted: an export of text that is not the
accepted revision says so.
"""

from __future__ import annotations

from drafting.models import Draft
from drafting.services import UserError


def draft_export(*, draft: Draft, fmt: str) -> tuple[str, str]:
    """(content, content type) of the accepted revision (or the working text, marked)."""
    revision = draft.accepted_revision
    text = revision.text if revision else "".join(f.text for f in draft.fragments.all())
    if fmt == "txt":
        header = "" if revision else "[NOT ACCEPTED: contains provisional model text]\n\n"
        return header + text, "text/plain; charset=utf-8"
    if fmt == "md":
        status = (
            f"Accepted revision {revision.number}" if revision else "Draft, not accepted"
        )
        return f"# {draft.title}\n\n*{status}*\n\n{text}\n", "text/markdown; charset=utf-8"
    raise UserError(f"unknown export format {fmt!r}")
