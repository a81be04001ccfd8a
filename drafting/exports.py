"""Exports of a draft: plain text and Markdown.

What a person sees as final is only what a person accepted: an export is the draft's current
text, clean when that text is the accepted revision and marked as not accepted otherwise; the
accepted revision itself can be exported by asking for it (``which="accepted"``).
"""

from __future__ import annotations

from dataclasses import dataclass

from drafting import selectors
from drafting.models import Draft
from drafting.services import UserError

EXPORT_WHICH = ("current", "accepted")


@dataclass(frozen=True)
class ExportText:
    """The text to export and what it is."""

    text: str
    accepted: bool  # the text is an accepted revision's
    status: str  # a line a person reads: "Accepted revision 4", "Draft, not accepted ..."


def export_text(*, draft: Draft, which: str = "current") -> ExportText:
    if which not in EXPORT_WHICH:
        raise UserError(f"which must be one of {', '.join(EXPORT_WHICH)}")
    revision = draft.accepted_revision
    if which == "accepted":
        if revision is None:
            raise UserError("this draft has no accepted revision yet")
        return ExportText(revision.text, True, f"Accepted revision {revision.number}")
    text = selectors.draft_text(draft=draft)
    if revision is not None and revision.text == text:
        return ExportText(text, True, f"Accepted revision {revision.number}")
    if revision is not None:
        return ExportText(text, False, f"Draft, not accepted: changed after revision "
                                       f"{revision.number} was accepted")  # fmt: skip
    return ExportText(text, False, "Draft, not accepted")


def draft_export(*, draft: Draft, fmt: str, which: str = "current") -> tuple[str, str]:
    """(content, content type) of the draft's text in ``fmt``."""
    chosen = export_text(draft=draft, which=which)
    if fmt == "txt":
        marked = chosen.status.replace("Draft, not accepted", "DRAFT, NOT ACCEPTED")
        header = "" if chosen.accepted else f"[{marked}]\n\n"
        return header + chosen.text, "text/plain; charset=utf-8"
    if fmt == "md":
        return (f"# {draft.title}\n\n*{chosen.status}*\n\n{chosen.text}\n",
                "text/markdown; charset=utf-8")  # fmt: skip
    raise UserError(f"unknown export format {fmt!r}")
