"""Exports of a draft: plain text, Markdown, and letters as PDF and Word (drafting.letters).

What a person sees as final is only what a person accepted: an export is the draft's current
text, clean when that text is the accepted revision and marked as not accepted otherwise; the
accepted revision itself can be exported by asking for it (``which="accepted"``).
"""

from __future__ import annotations

import re

from drafting import selectors
from drafting.errors import UserError
from drafting.letters import ExportText, letter_docx, letter_pdf
from drafting.models import Draft

EXPORT_WHICH = ("current", "accepted")
MARKDOWN_HARD_BREAK = "  \n"  # two trailing spaces: CommonMark's portable hard line break
_INLINE_SPECIAL = re.compile(r"([\\`*_\[\]<>|~])")
_LINE_START_SPECIAL = re.compile(r"^(\s*)([#>+=-]|\d+[.)])")


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


def markdown_inline(text: str) -> str:
    """Plain text that Markdown shows as written: emphasis, code, links, HTML escaped."""
    return _INLINE_SPECIAL.sub(r"\\\1", text)


def text_as_markdown(text: str) -> str:
    """A plain-text letter as Markdown that renders with its lines: each single line break is
    a hard break (a letterhead, an address, a signature block), a blank line a paragraph, and
    what Markdown would read as markup (a heading, a list, emphasis) is escaped."""
    paragraphs = re.split(r"\n[ \t]*\n", text.strip("\n"))
    out: list[str] = []
    for paragraph in paragraphs:
        lines = [_LINE_START_SPECIAL.sub(_escape_line_start, markdown_inline(line.rstrip()))
                 for line in paragraph.split("\n")]  # fmt: skip
        out.append(MARKDOWN_HARD_BREAK.join(lines))
    return "\n\n".join(out)


def _escape_line_start(match: re.Match[str]) -> str:
    lead, mark = match.group(1), match.group(2)
    if mark[0].isdigit():  # "1." starts a list: escape its dot
        return f"{lead}{mark[:-1]}\\{mark[-1]}"
    return f"{lead}\\{mark}"


EXPORT_FORMATS = ("txt", "md", "pdf", "docx")
DOCX_TYPE = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"


def draft_export(*, draft: Draft, fmt: str, which: str = "current") -> tuple[str | bytes, str]:
    """(content, content type) of the draft's text in ``fmt`` (txt, md, pdf, docx)."""
    chosen = export_text(draft=draft, which=which)
    if fmt in {"pdf", "docx"}:
        if fmt == "pdf":
            return letter_pdf(chosen, title=draft.title), "application/pdf"
        return letter_docx(chosen, title=draft.title), DOCX_TYPE
    if fmt == "txt":
        marked = chosen.status.replace("Draft, not accepted", "DRAFT, NOT ACCEPTED")
        header = "" if chosen.accepted else f"[{marked}]\n\n"
        return header + chosen.text, "text/plain; charset=utf-8"
    if fmt == "md":
        body = chosen.text
        if draft.template_version.doc_format != "markdown":
            body = text_as_markdown(body)
        title = markdown_inline(draft.title)
        return (f"# {title}\n\n*{chosen.status}*\n\n{body}\n",
                "text/markdown; charset=utf-8")  # fmt: skip
    raise UserError(f"unknown export format {fmt!r}")
