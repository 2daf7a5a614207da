"""PDF page cleaning: running headers and footers, page numbers, contents and index pages.

A page is read as lines in PDFium's text order, each with where it sits (baseline, font size,
weight) when PDFium can say. What is dropped:

- Running headers and footers. Only lines in a page's margin bands are candidates: the lines
  above the first wide gap (1.6 line pitches or more) at the top of the page, or below the last
  one at the bottom, within the outer fifth of the page. A candidate goes when
  (a) its text, digits aside, is in a margin band of a page up to two pages away (two: odd and
      even pages carry different headers), or
  (b) it is a page number, or
  (c) a page up to two away has a margin line on the same baseline in the same size, above that
      page's highest (below its lowest) body line: a header whose text changes (the current
      section) in a slot that is a header slot, or
  (d) at the top of the page only, it is set smaller than the body text and stands apart: a
      journal's running head on a one-page article, with no other page to compare it with.
      (Not at the bottom: footnotes are small and stand apart too.)
  Body lines never are candidates, however much they resemble a header: no text is lost.
  On a page without bands (set without gaps, or without positions from PDFium), the first and
  last two lines in text order are the candidates, for (a) and (b) only.
- Contents and index pages: a page where most lines are entries (a title, dot leaders, a page
  number; or an index term and its page numbers) loses its entries and short lines, keeping
  any prose. A contents page repeats the headings of the body with page numbers that mean
  nothing to a search; kept, it is the best match for any question that names a section (it
  names them all), and it pushes the section itself down. Marking it instead would need every
  search to demote marked chunks, and a window of 254 tokens mixes it with the next page anyway.
"""
from __future__ import annotations

import re
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Iterator

REACH = 2  # pages on each side compared: odd and even pages alternate headers
GAP = 1.6  # a margin band ends at a gap of this many line pitches
BAND = 0.2  # ... within this share of the page height from its edge
EDGE_LINES = 2  # without positions: lines at each end in text order that may be a header or footer

PAGE_NO = re.compile(r"^\s*(?:page\s+)?(?:\d{1,5}|[ivxlcdm]{1,8})(?:\s*(?:of|/)\s*\d{1,5})?\s*$", re.I)
HYPHEN_BREAK = re.compile(r"(?<=[^\W\d_])[-\u00ad\x02]\n(?=[^\W\d_])")
_NUM = r"(?:\d{1,4}|[ivxlcdm]{1,7})"
_LEADER = re.compile(rf"\S.*?(?:\s*[.·…_⋅]){{3,}}\s*{_NUM}\s*$", re.I)
_ENDNUM = re.compile(rf"^\s*(?:[\dA-Z]{{1,3}}(?:\.\d+)*\.?\s+)?[^\W\d].{{2,}}?\s{_NUM}\s*$", re.I)
_INDEX = re.compile(r"^\s*[^\W\d][^,]{0,80},\s*\d{1,4}(?:\s*[-–]\s*\d{1,4})?(?:\s*,\s*\d{1,4}(?:\s*[-–]\s*\d{1,4})?)*\s*$")
_PROSE = re.compile(r"^(?:\S+\s+){7,}\S*[.!?:;]\s*$")


@dataclass
class Line:
    text: str
    base: float | None = None  # baseline, PDF points from the page's bottom
    size: float | None = None  # font size, points
    bold: bool = False


@dataclass
class Page:
    lines: list[Line]
    height: float = 0.0
    pitch: float = 0.0  # usual distance between body baselines
    size: float = 0.0  # usual body font size
    top: set[int] | None = None  # indices of the lines in the top margin band (None: no positions)
    bottom: set[int] | None = None

    @property
    def placed(self) -> bool:
        return self.top is not None

    def edges(self) -> set[int]:
        """The lines that may be a header or footer: the margin bands; on a page without any
        (no positions, or no gap around the header), the first and last lines in text order."""
        if self.top or self.bottom:
            return self.top | self.bottom
        full = [k for k, ln in enumerate(self.lines) if ln.text.strip()]
        return set(full[:EDGE_LINES] + full[-EDGE_LINES:])


def fold(line: str) -> str:
    """A line with its numbers (arabic, or roman on their own) made one symbol, spaces and case
    folded: a running header with another page number folds to the same string."""
    s = re.sub(r"\d+", "#", " ".join(line.split())).lower()
    return re.sub(r"\b[ivxlc]{1,7}\b(?=\s*$)|^[ivxlc]{1,7}\b", "#", s)


# ---- reading a page -------------------------------------------------------------------------

def read_page(pdf, i: int) -> Page:
    """Page i's lines in text order, placed when PDFium's characters line up with its text."""
    import pypdfium2.raw as raw_api

    page = pdf[i]
    try:
        height = float(page.get_height())
        tp = page.get_textpage()
        try:
            n = tp.count_chars()
            # PDFium marks a hyphen it took for a line-end one as U+FFFE here (\x02 in bounded text)
            raw = (tp.get_text_range(0, n) if n > 0 else "").replace("\ufffe", "\x02")
            lines: list[Line] = []
            placed = len(raw) == n  # one UTF-16 unit a character: indices line up
            starts = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", raw)]
            ends = [m.start() for m in re.finditer(r"\r\n|\r|\n", raw)] + [len(raw)]
            for a, b in zip(starts, ends):
                text = raw[a:b]
                ln = Line(text)
                ks = [a + k for k, c in enumerate(text) if not c.isspace() and c != "\x02"] if placed else []
                if ks:
                    mid = ks[len(ks) // 2]
                    _, ln.base = _origin(raw_api, tp, mid)
                    ln.size = float(raw_api.FPDFText_GetFontSize(tp.raw, mid)) or None
                    ln.bold = raw_api.FPDFText_GetFontWeight(tp.raw, mid) >= 600
                lines += _split_hyphens(ln)
        finally:
            tp.close()
    finally:
        page.close()
    return _measure(Page(lines, height))


def _origin(raw_api, tp, k: int) -> tuple[float | None, float | None]:
    import ctypes

    x, y = ctypes.c_double(), ctypes.c_double()
    if raw_api.FPDFText_GetCharOrigin(tp.raw, k, x, y):
        return x.value, y.value
    return None, None


def _split_hyphens(ln: Line) -> list[Line]:
    # PDFium marks a hyphen that ends a line as \x02 and joins the next line to it: a word
    # broken there is whole again; elsewhere (before a page number) the break comes back.
    text = re.sub(r"(?<=[^\W\d_])\x02(?=[^\W\d_])", "", ln.text)
    if "\x02" not in text:
        ln.text = text
        return [ln]
    parts = text.split("\x02")
    return [Line(p + ("-" if k < len(parts) - 1 else ""), ln.base, ln.size, ln.bold) for k, p in enumerate(parts)]


def lines_of_text(text: str) -> Page:
    """A page from bare text (no positions)."""
    return Page([Line(t) for t in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")])


def _measure(p: Page) -> Page:
    """The page's body pitch and size, and its margin bands."""
    placed = [(k, ln) for k, ln in enumerate(p.lines) if ln.text.strip() and ln.base is not None]
    full = [ln for ln in p.lines if ln.text.strip()]
    if not placed or len(placed) < len(full) or p.height <= 0:
        return p  # positions missing for some lines: text order only
    bases = sorted({round(ln.base, 1) for _, ln in placed}, reverse=True)
    # the pitch from lines that follow each other in text order (in one column, in two-column
    # pages, whose baselines need not line up)
    diffs = [a.base - b.base for (_, a), (_, b) in zip(placed, placed[1:]) if a.base - b.base > 0.5]
    sizes = [ln.size for _, ln in placed for _ in range(max(len(ln.text) // 10, 1)) if ln.size]
    p.pitch = statistics.median(diffs) if diffs else 0.0
    p.size = statistics.median(sizes) if sizes else 0.0
    if p.size:  # a short page's few lines (or PDFium joining some) can make the median a gap
        p.pitch = min(p.pitch, 1.6 * p.size)
    p.top, p.bottom = set(), set()
    if not diffs:
        return p
    for band, order, inside in ((p.top, bases, lambda b: b >= p.height * (1 - BAND)),
                                (p.bottom, bases[::-1], lambda b: b <= p.height * BAND)):
        for m in range(1, min(3, len(order))):
            if abs(order[m - 1] - order[m]) >= GAP * p.pitch:
                if inside(order[m - 1]):
                    keep = set(order[:m])
                    band.update(k for k, ln in placed if round(ln.base, 1) in keep)
                break
    if len(p.top) + len(p.bottom) >= len(placed):
        p.top, p.bottom = set(), set()  # nothing left for a body: no bands
    return p


# ---- deciding ---------------------------------------------------------------------------------

def _body_extent(p: Page) -> tuple[float, float] | None:
    bases = [ln.base for k, ln in enumerate(p.lines) if ln.text.strip() and ln.base is not None
             and k not in p.top and k not in p.bottom]
    return (max(bases), min(bases)) if bases else None


def running_lines(p: Page, near: list[Page]) -> set[int]:
    """Indices of the header, footer and page-number lines of p, given the pages up to REACH away."""
    drop = set()
    edges = p.edges()
    near_folds = {fold(q.lines[k].text) for q in near for k in q.edges()}
    for k in edges:
        ln = p.lines[k]
        if not ln.text.strip():
            continue
        if PAGE_NO.match(ln.text) or fold(ln.text) in near_folds:
            drop.add(k)
    if not p.placed:
        return drop
    for side, k_set in (("top", p.top), ("bottom", p.bottom)):
        for k in k_set - drop:
            ln = p.lines[k]
            if _same_slot(ln, side, near):
                drop.add(k)
            elif side == "top" and not ln.bold and p.size and ln.size and ln.size <= 0.85 * p.size and len(k_set) <= 2:
                drop.add(k)
    return drop


def _same_slot(ln: Line, side: str, near: list[Page]) -> bool:
    for q in near:
        if not q.placed:
            continue
        body = _body_extent(q)
        if body is None:
            continue
        margin = max(q.pitch, 1.0) * 0.5
        if side == "top" and ln.base <= body[0] + margin:
            continue  # not above that page's body: a body line of this page
        if side == "bottom" and ln.base >= body[1] - margin:
            continue
        band = q.top if side == "top" else q.bottom
        if any(abs(q.lines[j].base - ln.base) <= 1.5 and (not ln.size or not q.lines[j].size or
                                                          abs(q.lines[j].size - ln.size) <= 0.6) for j in band):
            return True
    return False


def toc_lines(lines: list[str]) -> set[int]:
    """Indices of the entries (and their headings) of a contents or index page; empty for any
    other page. A page is one when most of its lines are entries: dot leaders and a page
    number (at least three of those, or two that are almost all of the page), or an index term
    with page numbers (at least eight)."""
    full = [k for k, t in enumerate(lines) if t.strip()]
    if len(full) < 2:
        return set()
    leader = {k for k in full if _LEADER.match(lines[k])}
    index = {k for k in full if _INDEX.match(lines[k])}
    endnum = {k for k in full if _ENDNUM.match(lines[k])}
    entries = leader | index | endnum
    if not ((len(leader) >= 3 and len(leader | endnum) >= 0.5 * len(full))
            or (len(leader) >= 2 and len(leader) >= 0.8 * len(full))  # the last page of contents
            or (len(index) >= 8 and len(index) >= 0.6 * len(full))):
        return set()
    return {k for k in full if k in entries or not _PROSE.match(lines[k].strip())}


def page_text(p: Page, drop: set[int]) -> str:
    """The page's text without the dropped lines (and contents entries), hyphenated line-end
    words joined."""
    kept = [ln.text.rstrip() for k, ln in enumerate(p.lines) if k not in drop]
    toc = toc_lines(kept)
    if toc:
        kept = [t for k, t in enumerate(kept) if k not in toc]
    text = "\n".join(kept).strip()
    text = HYPHEN_BREAK.sub("", text)
    return text.replace("\x02", "").replace("\u00ad", "").replace("\x00", "")


def clean_pages(pages: Iterable[Page]) -> Iterator[tuple[str, bool]]:
    """(clean text, whether the page has no text layer at all) for each page of a stream, in
    order (REACH pages of look-ahead)."""
    window: deque[Page] = deque()
    before: deque[Page] = deque(maxlen=REACH)
    it = iter(pages)
    done = False
    while True:
        while not done and len(window) <= REACH:
            try:
                window.append(next(it))
            except StopIteration:
                done = True
        if not window:
            return
        p = window.popleft()
        near = list(before) + list(window)[:REACH]
        yield page_text(p, running_lines(p, near)), not any(ln.text.strip() for ln in p.lines)
        before.append(p)
