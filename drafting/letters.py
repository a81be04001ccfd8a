"""A draft's text as a letter file: PDF (ReportLab) and Word (python-docx).

Every line of the text stays a line (a letterhead, an address and a signature block keep their
breaks), a blank line starts a new paragraph, long lines wrap. A text that is not an accepted
revision is watermarked DRAFT on every page.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

PAGE_MARGIN_PT = 64  # ~2.25 cm
FONT_SIZE_PT = 11
LINE_HEIGHT_PT = 15
FOOTER_SIZE_PT = 8
WATERMARK_SIZE_PT = 110
WATERMARK_GRAY = 0.85  # light: the text stays readable through it
WATERMARK_WORD = "DRAFT"
FONT_NAME = "StencilSans"
# DejaVu (Debian's fonts-dejavu) covers more scripts; ReportLab ships Vera, its ancestor.
FONT_CANDIDATES = (Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"),)


@dataclass(frozen=True)
class ExportText:
    """The text to export and what it is."""

    text: str
    accepted: bool  # the text is an accepted revision's
    status: str  # a line a person reads: "Accepted revision 4", "Draft, not accepted ..."


@lru_cache(maxsize=1)
def _font() -> str:
    """Register a Unicode TrueType font once; its name for the canvas."""
    import reportlab
    from reportlab.pdfbase import pdfmetrics
    from reportlab.pdfbase.ttfonts import TTFont

    bundled = Path(reportlab.__file__).resolve().parent / "fonts" / "Vera.ttf"
    path = next((p for p in (*FONT_CANDIDATES, bundled) if p.exists()), bundled)
    pdfmetrics.registerFont(TTFont(FONT_NAME, str(path)))
    return FONT_NAME


def letter_pdf(chosen: ExportText, *, title: str) -> bytes:
    """The text as an A4 PDF; watermarked DRAFT unless it is an accepted revision."""
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.utils import simpleSplit
    from reportlab.pdfgen.canvas import Canvas

    font = _font()
    buffer = io.BytesIO()
    pdf = Canvas(buffer, pagesize=A4, pageCompression=1)
    pdf.setTitle(title)
    pdf.setSubject(chosen.status)
    width, height = A4
    usable = width - 2 * PAGE_MARGIN_PT

    def start_page() -> float:
        if not chosen.accepted:
            _watermark(pdf, font, width, height)
        pdf.setFont(font, FONT_SIZE_PT)
        return height - PAGE_MARGIN_PT

    def end_page() -> None:  # the footer last, so text extraction reads the letter first
        pdf.setFont(font, FOOTER_SIZE_PT)
        pdf.setFillGray(0.4)
        pdf.drawString(PAGE_MARGIN_PT, PAGE_MARGIN_PT / 2, f"{title} · {chosen.status}")
        pdf.setFillGray(0)
        pdf.showPage()

    y = start_page()
    for line in chosen.text.rstrip("\n").split("\n"):
        pieces = simpleSplit(line, font, FONT_SIZE_PT, usable) or [""]
        for piece in pieces:
            if y < PAGE_MARGIN_PT + LINE_HEIGHT_PT:
                end_page()
                y = start_page()
            pdf.drawString(PAGE_MARGIN_PT, y, piece)
            y -= LINE_HEIGHT_PT
    end_page()
    pdf.save()
    return buffer.getvalue()


def _watermark(pdf: object, font: str, width: float, height: float) -> None:
    from reportlab.pdfgen.canvas import Canvas

    assert isinstance(pdf, Canvas)
    pdf.saveState()
    pdf.setFillGray(WATERMARK_GRAY)
    pdf.setFont(font, WATERMARK_SIZE_PT)
    pdf.translate(width / 2, height / 2)
    pdf.rotate(45)
    pdf.drawCentredString(0, -WATERMARK_SIZE_PT / 3, WATERMARK_WORD)
    pdf.restoreState()


def letter_docx(chosen: ExportText, *, title: str) -> bytes:
    """The text as a Word document: a paragraph per blank-line block, a line break per line;
    a draft carries DRAFT in every page's header."""
    from docx import Document
    from docx.shared import Pt, RGBColor

    document = Document()
    document.core_properties.title = title
    document.core_properties.subject = chosen.status
    style = document.styles["Normal"]
    style.font.size = Pt(FONT_SIZE_PT)
    section = document.sections[0]
    if not chosen.accepted:
        header = section.header.paragraphs[0]
        mark = header.add_run(f"{WATERMARK_WORD} — {chosen.status}")
        mark.bold = True
        mark.font.size = Pt(FONT_SIZE_PT + 3)
        mark.font.color.rgb = RGBColor(0xB0, 0x1E, 0x1E)
    footer = section.footer.paragraphs[0]
    footer.add_run(f"{title} · {chosen.status}").font.size = Pt(FOOTER_SIZE_PT)
    for block in _blocks(chosen.text):
        paragraph = document.add_paragraph()
        for index, line in enumerate(block):
            run = paragraph.add_run(line)
            if index < len(block) - 1:
                run.add_break()
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def _blocks(text: str) -> list[list[str]]:
    """Paragraphs (split at blank lines), each a list of its lines."""
    blocks: list[list[str]] = [[]]
    for line in text.rstrip("\n").split("\n"):
        if line.strip() == "":
            if blocks[-1]:
                blocks.append([])
            continue
        blocks[-1].append(line)
    return [b for b in blocks if b]
