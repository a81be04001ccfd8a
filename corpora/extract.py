"""Files to document texts: plain text, Markdown and .docx, and zips of them (Django-free).

Every file gives one :class:`Extracted`: its text, or the reason it was skipped (empty, over the
size limit, unreadable, unsupported). A zip is opened one level deep and its members are read
as files of their own (named ``archive.zip/path/inside``); a zip inside a zip is skipped.
"""

from __future__ import annotations

import io
import unicodedata
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath

TEXT_SUFFIXES = (".txt", ".text", ".md", ".markdown")
DOCX_SUFFIX = ".docx"
ZIP_SUFFIX = ".zip"
SUPPORTED = (*TEXT_SUFFIXES, DOCX_SUFFIX, ZIP_SUFFIX)
# Bytes that mark text as UTF-16 (decoded as such); anything else must be UTF-8.
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


@dataclass(frozen=True)
class Extracted:
    name: str
    text: str | None  # None: skipped, see reason
    reason: str = ""


@dataclass(frozen=True)
class Limits:
    max_file_bytes: int  # one file, or one zip member once unpacked
    max_files: int  # files in one upload, zip members counted


def normalise(text: str) -> str:
    """Line ends as "\\n", NFC, no trailing spaces on a line, no blank lines at either end."""
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    lines = [line.rstrip() for line in text.split("\n")]
    return "\n".join(lines).strip("\n")


def decode_text(data: bytes) -> str:
    """UTF-8 (a BOM allowed) or UTF-16 with its BOM; ValueError otherwise."""
    if data.startswith(UTF16_BOMS):
        return data.decode("utf-16")
    return data.decode("utf-8-sig")


def docx_text(data: bytes) -> str:
    """The paragraphs of a .docx, then its tables' rows (cells joined by tabs), one a line."""
    import docx

    document = docx.Document(io.BytesIO(data))
    lines = [p.text for p in document.paragraphs]
    for table in document.tables:
        for row in table.rows:
            lines.append("\t".join(cell.text for cell in row.cells))
    return "\n".join(lines)


def _suffix(name: str) -> str:
    return PurePosixPath(name).suffix.lower()


def extract_one(name: str, data: bytes, limits: Limits) -> Extracted:
    """One file that is not a zip."""
    suffix = _suffix(name)
    if suffix not in (*TEXT_SUFFIXES, DOCX_SUFFIX):
        shown = suffix or "no extension"
        return Extracted(name, None, f"unsupported file type ({shown}): give .txt, .md, .docx or .zip")
    if len(data) > limits.max_file_bytes:
        return Extracted(name, None, f"over the limit: {len(data):,} bytes, at most "
                                     f"{limits.max_file_bytes:,}")  # fmt: skip
    try:
        text = docx_text(data) if suffix == DOCX_SUFFIX else decode_text(data)
    except UnicodeDecodeError as exc:
        return Extracted(name, None, f"unreadable: not UTF-8 text (byte {exc.start})")
    except Exception as exc:  # python-docx raises several kinds on a damaged file
        return Extracted(name, None, f"unreadable: not a Word document ({type(exc).__name__})")
    if "\x00" in text:
        return Extracted(name, None, "unreadable: the text holds NUL characters (a binary file?)")
    text = normalise(text)
    if not text.strip():
        return Extracted(name, None, "empty: no text in the file")
    return Extracted(name, text)


def _zip_members(name: str, data: bytes, limits: Limits) -> Iterator[Extracted]:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = [i for i in archive.infolist() if not i.is_dir()]
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        yield Extracted(name, None, f"unreadable: not a zip archive ({exc})")
        return
    with archive:
        for info in infos:
            member = f"{name}/{info.filename}"
            base = PurePosixPath(info.filename).name
            if base.startswith(".") or info.filename.startswith("__MACOSX/"):
                continue  # system files a zip tool adds (.DS_Store, resource forks)
            if _suffix(info.filename) == ZIP_SUFFIX:
                yield Extracted(member, None, "unsupported: a zip inside a zip (unpack it first)")
                continue
            if info.file_size > limits.max_file_bytes:  # checked before anything is unpacked
                yield Extracted(member, None, f"over the limit: {info.file_size:,} bytes "
                                              f"unpacked, at most {limits.max_file_bytes:,}")  # fmt: skip
                continue
            try:
                content = archive.read(info)
            except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError) as exc:
                yield Extracted(member, None, f"unreadable: the zip member is damaged ({exc})")
                continue
            yield extract_one(member, content, limits)


def extract_files(files: list[tuple[str, bytes]], limits: Limits) -> list[Extracted]:
    """Each file's text or reason, zips opened, in the order given; past ``max_files`` the
    rest are skipped with that reason."""
    out: list[Extracted] = []
    for name, data in files:
        items = _zip_members(name, data, limits) if _suffix(name) == ZIP_SUFFIX else iter(
            [extract_one(name, data, limits)])  # fmt: skip
        for item in items:
            if len(out) >= limits.max_files:
                out.append(Extracted(item.name, None, f"over the limit: more than "
                                                      f"{limits.max_files:,} files in one upload; "
                                                      "this file and any after it were not read"))  # fmt: skip
                return out
            out.append(item)
    return out
