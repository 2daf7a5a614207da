"""Structured formats: PDF, HTML, Word and Markdown, read as extracted text plus where it is.

Each reader gives an `Extracted`: the text in blocks (a PDF page by page, so a 2,000-page file
is read in flat memory) and `Marks` that the blocks fill in as they are read: page starts,
section headings and their paths, the section boundaries the chunker respects, the title.
Chunk offsets point into the extracted text (the concatenated blocks) exactly.

Libraries, chosen by measurement (scripts/bench/bench_extract.py on SciFact rendered to PDF and
HTML by scripts/render_scifact.py; figures in docs/formats.md):
- PDF: pypdfium2 (PDFium; Apache-2.0/BSD-3). Several times faster per page than pypdf (pure
  Python) with the same word recall on one- and two-column pages; it reads encrypted-with-an-
  empty-password files and reports damage and passwords as distinct errors. PyMuPDF is AGPL:
  not an option for the core.
- HTML: trafilatura (Apache-2.0). It keeps the main content and drops navigation, sidebars,
  cookie banners and footers by structure and link density, not only by tag names, decodes
  legacy encodings from the page's own declaration, and gives headings as Markdown. A plain
  body-text extraction (selectolax) is faster but keeps the boilerplate.
- Word: python-docx (MIT): paragraphs with their heading styles, tables, core properties.
"""
from __future__ import annotations

import bisect
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from semsearch.errors import CorpusError, InputError

log = logging.getLogger(__name__)

PDF_EXTS = {".pdf"}
HTML_EXTS = {".html", ".htm", ".xhtml"}
GZ_EXTS = {".gz"}  # gzipped pages only (x.html.gz): the walk skips other .gz files
DOCX_EXTS = {".docx"}
MARKDOWN_EXTS = {".md", ".markdown"}
BINARY_EXTS = PDF_EXTS | DOCX_EXTS | GZ_EXTS  # skipped by the walk's NUL-byte check otherwise
STRUCTURED_EXTS = PDF_EXTS | HTML_EXTS | GZ_EXTS | DOCX_EXTS | MARKDOWN_EXTS
MAX_CARRY = 8 << 20  # a Markdown "line" longer than this is cut anyway


@dataclass
class Marks:
    """Where things are in the extracted text; filled in as its blocks are read."""

    boundaries: list[int] = field(default_factory=list)  # section starts (sorted offsets)
    headings: list[int] = field(default_factory=list)  # heading offsets (sorted) ...
    paths: list[str] = field(default_factory=list)  # ... and the heading path each starts
    bare: set[int] = field(default_factory=set)  # headings followed at once by another heading
    page_starts: list[int] = field(default_factory=list)  # offset where page i + 1 starts
    outline: list[tuple[int, str]] = field(default_factory=list)  # PDF bookmarks: (page, path), by page
    title: str | None = None
    pages: int | None = None

    def add_heading(self, offset: int, level: int, text: str, stack: list[tuple[int, str]]) -> None:
        while stack and stack[-1][0] >= level:
            stack.pop()
        stack.append((level, text))
        self.boundaries.append(offset)
        self.headings.append(offset)
        self.paths.append(" > ".join(t for _, t in stack))
        if self.title is None and level == 1:
            self.title = text

    def locate(self, start: int, end: int) -> dict:
        """The metadata of a chunk at [start, end): page (and page_end), section, title."""
        meta: dict = {}
        if self.page_starts:
            page = bisect.bisect_right(self.page_starts, start)
            meta["page"] = max(page, 1)
            last = bisect.bisect_right(self.page_starts, max(end - 1, start))
            if last > meta["page"]:
                meta["page_end"] = last
            if self.outline:
                k = bisect.bisect_right([p for p, _ in self.outline], meta["page"]) - 1
                if k >= 0:
                    meta["section"] = self.outline[k][1]
        k = bisect.bisect_right(self.headings, start) - 1
        # A chunk that opens with headings ('# Setup', '## Calibration', text) is in the last one.
        if k >= 0 and start - self.headings[k] <= 8:  # it starts on heading k's line
            while k in self.bare and k + 1 < len(self.headings) and self.headings[k + 1] < end:
                k += 1
        if k >= 0:
            meta["section"] = self.paths[k]
        if self.title:
            meta["title"] = self.title
        return meta


@dataclass
class Extracted:
    blocks: Iterator[str]
    marks: Marks
    keeps_lines: bool = False  # Markdown: line numbers of the file itself


def extract(path: Path, on_bytes: Callable[[int], None] | None = None) -> Extracted:
    """The extracted text of a structured file. Problems found on opening (encrypted, damaged,
    no pages) raise CorpusError here, before anything is indexed; a PDF without any text layer
    raises it when its last page has been read."""
    ext = path.suffix.lower()
    if ext in PDF_EXTS:
        return _pdf(path, on_bytes)
    if ext in HTML_EXTS or ext in GZ_EXTS:
        return _html(path, on_bytes)
    if ext in DOCX_EXTS:
        text, title = docx_text(path)
    else:
        from semsearch.corpus.base import check_utf8 as _check_utf8
        from semsearch.corpus.streaming import text_blocks

        _check_utf8(path)
        marks = Marks()
        return Extracted(markdown_blocks(text_blocks(path, on_bytes=on_bytes), marks), marks, keeps_lines=True)
    marks = Marks(title=title)
    if on_bytes is not None:
        on_bytes(path.stat().st_size)
    return Extracted(markdown_blocks(iter([text]), marks), marks)


def extract_text(path: Path) -> tuple[str, dict]:
    """The whole extracted text and the file's metadata (title, pages): for callers that take a
    file as one document (semsearch.corpus.read_documents)."""
    ex = extract(path)
    text = "".join(ex.blocks)
    meta = {k: v for k, v in (("title", ex.marks.title), ("pages", ex.marks.pages)) if v}
    return text, meta


# ---- Markdown structure -------------------------------------------------------------------

_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")


def markdown_blocks(blocks: Iterator[str], marks: Marks) -> Iterator[str]:
    """The blocks again, cut after a newline, with their ATX and setext headings (outside code
    fences) added to `marks` before each is handed on."""
    stack: list[tuple[int, str]] = []
    state = {"fence": None, "prev": None}  # open fence marker; (offset, text) of the previous line
    carry, base = "", 0
    for block in blocks:
        carry += block
        cut = carry.rfind("\n") + 1
        if cut == 0 and len(carry) < MAX_CARRY:
            continue
        cut = cut or len(carry)
        piece, carry = carry[:cut], carry[cut:]
        _scan_markdown(piece, base, marks, stack, state)
        base += len(piece)
        yield piece
    if carry:
        _scan_markdown(carry, base, marks, stack, state)
        yield carry


def _scan_markdown(piece: str, base: int, marks: Marks, stack: list, state: dict) -> None:
    pos = 0
    for line in piece.splitlines(keepends=True):
        off, pos = base + pos, pos + len(line)
        s = line.rstrip("\r\n")
        fence = _FENCE.match(s)
        if fence:
            if state["fence"] is None:
                state["fence"] = fence.group(1)
            elif fence.group(1) == state["fence"]:
                state["fence"] = None
            state["prev"] = None
            continue
        if state["fence"] is not None:
            continue
        m = _ATX.match(s)
        if m and (m.group(2) or "").strip():
            _heading(marks, off, len(m.group(1)), m.group(2).strip(), stack, state)
            continue
        prev = state["prev"]
        if _SETEXT.match(s) and prev is not None and prev[0] >= base:
            _heading(marks, prev[0], 1 if s.strip()[0] == "=" else 2, prev[1], stack, state)
            continue
        if s.strip():
            state["last_heading"] = False
        state["prev"] = (off, s.strip()) if s.strip() and not s.lstrip().startswith(("-", "*", "+", ">", "|")) else None


def _heading(marks: Marks, off: int, level: int, text: str, stack: list, state: dict) -> None:
    if state.get("last_heading") and marks.headings:
        marks.bare.add(len(marks.headings) - 1)  # nothing but blank lines since the last heading
    marks.add_heading(off, level, text, stack)
    state["prev"], state["last_heading"] = None, True


# ---- HTML ---------------------------------------------------------------------------------

def _html(path: Path, on_bytes: Callable[[int], None] | None) -> Extracted:
    """A page's main content with its headings from the page's own structure (htmldoc), not
    from a Markdown re-parse of the text."""
    from semsearch.corpus.htmldoc import is_gz_page, page_bytes, read_html

    if path.suffix.lower() in GZ_EXTS and not is_gz_page(path):
        raise CorpusError(f"{path}: not a gzipped HTML page (.html.gz)")
    doc = read_html(page_bytes(path), path)
    marks = Marks(title=doc.title)
    stack: list[tuple[int, str]] = []
    prev_end = None  # where the previous heading's line ends
    for h in doc.headings:
        if prev_end is not None and not doc.text[prev_end:h.offset].strip():
            marks.bare.add(len(marks.headings) - 1)  # nothing but blank lines since the last heading
        marks.add_heading(h.offset, h.level, h.text, stack)
        prev_end = doc.text.find("\n", h.offset) % (len(doc.text) + 1)
    if on_bytes is not None:
        on_bytes(path.stat().st_size)
    return Extracted(iter([doc.text]), marks)


def html_text(data: bytes, path: Path) -> tuple[str, str | None]:
    """The main content of an HTML page as text (headings as `#` lines), and its title."""
    from semsearch.corpus.htmldoc import read_html

    doc = read_html(data, path)
    return doc.text, doc.title


# ---- Word ---------------------------------------------------------------------------------

def docx_text(path: Path) -> tuple[str, str | None]:
    """A .docx as Markdown: heading styles as '#' headings, paragraphs, tables as '|' rows."""
    import docx
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    try:
        d = docx.Document(str(path))
    except Exception as e:  # noqa: BLE001 - not a zip, no document part, bad XML: all one outcome
        raise CorpusError(f"{path}: not a readable Word document ({type(e).__name__}: {' '.join(str(e).split())})") from e
    title = (d.core_properties.title or "").strip() or None
    out: list[str] = []
    for el in d.element.body.iterchildren():
        tag = el.tag.rsplit("}", 1)[-1]
        if tag == "p":
            p = Paragraph(el, d)
            text = " ".join(p.text.split())
            if not text:
                continue
            style = (p.style.name if p.style is not None else "") or ""
            level = 1 if style == "Title" else _heading_level(style)
            if style == "Title" and title is None:
                title = text
            out.append(("#" * level + " " + text) if level else text)
        elif tag == "tbl":
            for row in Table(el, d).rows:
                cells = [" ".join(c.text.split()) for c in row.cells]
                if any(cells):
                    out.append("| " + " | ".join(cells) + " |")
    return "\n\n".join(out) + ("\n" if out else ""), title


def _heading_level(style: str) -> int:
    m = re.match(r"Heading (\d)$", style)
    return min(int(m.group(1)), 6) if m else 0


# ---- PDF ----------------------------------------------------------------------------------

def _names_encryption(path: Path) -> bool:
    """Whether the file's bytes hold an /Encrypt entry, as an encrypted PDF's trailer or
    cross-reference stream does (both uncompressed). PDFium's last error is process-wide and some
    failed loads leave it as it was: a damaged PDF read after an encrypted one reported the
    password error again (tests/test_formats.py)."""
    import mmap

    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m.find(b"/Encrypt") >= 0
    except (OSError, ValueError):  # (an empty file cannot be mapped)
        return False


def _pdf(path: Path, on_bytes: Callable[[int], None] | None) -> Extracted:
    import pypdfium2 as pdfium

    try:
        pdf = pdfium.PdfDocument(str(path))
    except pdfium.PdfiumError as e:
        msg = str(e)
        if "password" in msg.lower():
            if _names_encryption(path):
                raise CorpusError(f"{path}: encrypted PDF: needs a password") from e
            msg = "PDFium could not load it"  # its password error, left over from another file
        raise CorpusError(f"{path}: damaged PDF ({msg})") from e
    n = len(pdf)
    if n == 0:
        pdf.close()
        raise CorpusError(f"{path}: PDF has no pages")
    marks = Marks(pages=n)
    try:
        info = pdf.get_metadata_dict(skip_empty=True)
        marks.title = " ".join(str(info.get("Title", "")).split()) or None
        stack: list[tuple[int, str]] = []
        for item in pdf.get_toc(max_depth=6):
            if hasattr(item, "get_title"):  # pypdfium2 5: bookmark objects
                dest = item.get_dest()
                title, index = item.get_title(), dest.get_index() if dest is not None else None
            else:  # pypdfium2 4: named tuples
                title, index = item.title, item.page_index
            if index is None:
                continue
            while stack and stack[-1][0] >= item.level:
                stack.pop()
            stack.append((item.level, " ".join((title or "").split())))
            marks.outline.append((index + 1, " > ".join(t for _, t in stack)))
        marks.outline.sort(key=lambda t: t[0])
    except Exception as e:  # noqa: BLE001 - a bad outline or info dictionary loses only the titles
        log.info("%s: no outline or title (%s)", path, e)
    size = path.stat().st_size if on_bytes is not None else 0
    return Extracted(_pdf_blocks(pdf, path, n, marks, on_bytes, size), marks)


def _pdf_blocks(pdf, path: Path, n: int, marks: Marks, on_bytes, size: int) -> Iterator[str]:
    """The pages' text, one block a page, cleaned by semsearch.corpus.pdfclean (running headers
    and footers, page numbers, contents pages); pages are read a few ahead of the one given."""
    from semsearch.corpus import pdfclean

    offset = empty = 0
    done_bytes = 0
    try:
        texts = pdfclean.clean_pages(pdfclean.read_page(pdf, i) for i in range(n))
        cur, blank = next(texts)
        pending = ""  # the end of the previous page when it ended in a hyphenated word
        for i in range(n):
            nxt, nxt_blank = next(texts) if i + 1 < n else (None, False)
            empty += blank  # no text layer (a contents page left empty by cleaning is not)
            marks.page_starts.append(offset)  # where the page's text (or its carried-over word) starts
            block = pending + cur
            pending = ""
            if nxt is not None and re.search(r"[^\W\d_]-$", block) and re.match(r"[a-z]", nxt):
                # a word hyphenated across the page break: its start waits for its end
                cut = len(block) - len(re.search(r"[^\W\d_]*-$", block).group(0))
                block, pending = block[:cut], block[cut:-1]
            elif nxt is not None and block:
                block += "\n\n"
            offset += len(block)
            if on_bytes is not None:
                now = size * (i + 1) // n
                on_bytes(now - done_bytes)
                done_bytes = now
            if block:
                yield block
            cur, blank = nxt, nxt_blank
    finally:
        pdf.close()
    if empty == n:
        raise CorpusError(f"{path}: no text layer: {n} page{'s' if n != 1 else ''}, scanned? (OCR is not built in)")
    if empty:
        log.warning("%s: %d of %d pages have no text layer (scanned?)", path, empty, n)
