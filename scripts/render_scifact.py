"""Render a BEIR corpus (SciFact) into the documents people actually have: PDFs and web pages.

    python scripts/render_scifact.py ../shared/data/beir/scifact --out data/scifact-rendered \
        [--max-queries 300 --max-docs 2000]

Writes, for each document (the subset `semsearch eval --max-queries/--max-docs` evaluates, or all):
- pdf/<doc id>.pdf: A4, a running header (journal and short title) and a page-number footer
  on every page, justified text with words hyphenated at line ends, the title in bold; every
  other document in two columns. Words are placed one by one, as many producers place them.
- html/<doc id>.html: the document inside a page with a navigation bar, a sidebar of links, a
  cookie banner and a footer; half of the pages in HTML5 landmarks (nav, aside, footer), half
  in <div> soup with only class names to tell them apart.
- corpus.jsonl: the same documents as records (_id, title, text), to index for comparison.

Needs fpdf2 (pip install 'semsearch[bench]'). Then index each and compare (docs/formats.md):
    semsearch index OUT/corpus.jsonl --index indexes/sf-jsonl --text-column title,text
    semsearch index OUT/pdf --index indexes/sf-pdf
    semsearch eval DATASET --index indexes/sf-pdf --mode dense,hybrid [--max-queries ... --max-docs ...]
"""
from __future__ import annotations

import argparse
import hashlib
import html
import json
import re
import sys
import time
from pathlib import Path

A4_W, A4_H = 210.0, 297.0
MARGIN, TOP, BOTTOM = 20.0, 22.0, 20.0
GUTTER = 8.0
FONT_SIZE, LEADING = 10.5, 5.0
FONTS = [Path("/usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf"), Path("/usr/share/fonts/dejavu/DejaVuSerif.ttf")]


def load_docs(beir: Path, max_queries: int | None, max_docs: int | None) -> list[dict]:
    from semsearch.eval import load_beir

    data = load_beir(beir, "test")
    if max_queries or max_docs:
        data = data.subset(max_queries, max_docs)
    keep = set(data.doc_ids)
    docs = []
    with open(beir / "corpus.jsonl", encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            if r["_id"] in keep:
                docs.append({"_id": r["_id"], "title": r.get("title", ""), "text": r.get("text", "")})
    return docs


# ---- PDF ----------------------------------------------------------------------------------

class Layout:
    def __init__(self, font: Path | None):
        from fpdf import FPDF

        self.FPDF = FPDF
        self.font = font

    def new(self, header: str):
        pdf = self.FPDF(format="A4", unit="mm")
        pdf.set_auto_page_break(False)
        pdf.set_compression(True)
        if self.font:
            pdf.add_font("body", "", str(self.font))
            bold = self.font.with_name(self.font.stem + "-Bold.ttf")
            pdf.add_font("body", "B", str(bold if bold.exists() else self.font))
            pdf.add_font("body", "I", str(self.font))
            pdf._family = "body"
        else:
            pdf._family = "Helvetica"
        pdf._header_text = header
        return pdf

    def text(self, s: str) -> str:
        return s if self.font else s.encode("latin-1", "replace").decode("latin-1")


def _page(pdf, lay: Layout) -> None:
    pdf.add_page()
    pdf.set_font(pdf._family, "I", 8)
    pdf.text(MARGIN, 13, lay.text(pdf._header_text))
    pdf.line(MARGIN, 15, A4_W - MARGIN, 15)
    num = str(pdf.page_no())
    pdf.set_font(pdf._family, "", 9)
    pdf.text((A4_W - pdf.get_string_width(num)) / 2, A4_H - 10, num)
    pdf.set_font(pdf._family, "", FONT_SIZE)


def _hyphenate(pdf, word: str, room: float) -> tuple[str, str] | None:
    """Split a word so that its head and a hyphen fit in `room` (both parts 3+ letters)."""
    if len(word) < 7 or not word.isalpha():
        return None
    for cut in range(len(word) - 3, 2, -1):
        if pdf.get_string_width(word[:cut] + "-") <= room:
            return word[:cut] + "-", word[cut:]
    return None


def _lines(pdf, words: list[str], width: float) -> list[tuple[list[str], bool]]:
    """Greedy lines of words (the last of a paragraph not justified), hyphenating to fill."""
    space = pdf.get_string_width(" ")
    lines, cur, w = [], [], 0.0
    words = list(words)
    while words:
        word = words.pop(0)
        ww = pdf.get_string_width(word)
        need = ww + (space if cur else 0.0)
        if w + need <= width or not cur:
            cur.append(word)
            w += need
            continue
        split = _hyphenate(pdf, word, width - w - space)
        if split:
            cur.append(split[0])
            words.insert(0, split[1])
        else:
            words.insert(0, word)
        lines.append((cur, True))
        cur, w = [], 0.0
    if cur:
        lines.append((cur, False))
    return lines


def _draw_line(pdf, words: list[str], x: float, y: float, width: float, justify: bool) -> None:
    widths = [pdf.get_string_width(w) for w in words]
    gap = pdf.get_string_width(" ")
    if justify and len(words) > 1:
        gap = (width - sum(widths)) / (len(words) - 1)
    for word, ww in zip(words, widths):
        pdf.text(x, y, word)
        x += ww + gap


def render_pdf(doc: dict, out: Path, lay: Layout, columns: int) -> int:
    title = lay.text(" ".join(doc["title"].split()))
    short = title if len(title) < 60 else title[:57].rsplit(" ", 1)[0] + " ..."
    pdf = lay.new(f"Journal of Reproducible Findings  ·  {short}" if lay.font else f"Journal of Reproducible Findings - {short}")
    _page(pdf, lay)
    full_w = A4_W - 2 * MARGIN
    y = TOP + 6
    pdf.set_font(pdf._family, "B", 14)
    for words, _ in _lines(pdf, title.split(), full_w):
        pdf.text(MARGIN, y, " ".join(words))
        y += 6.5
    y += 4
    pdf.set_font(pdf._family, "", FONT_SIZE)
    col_w = (full_w - GUTTER * (columns - 1)) / columns
    paragraphs = [p for p in re.split(r"(?<=[.!?])\s+(?=[A-Z])", lay.text(doc["text"])) if p.strip()]
    # about three sentences a paragraph
    paras = [" ".join(paragraphs[i:i + 3]) for i in range(0, len(paragraphs), 3)] or [""]
    lines: list[tuple[list[str], bool] | None] = []
    for p in paras:
        lines += _lines(pdf, p.split(), col_w)
        lines.append(None)  # paragraph gap
    col, top = 0, y
    for item in lines:
        if y > A4_H - BOTTOM - 5:
            col += 1
            y = top
            if col >= columns:
                _page(pdf, lay)
                col, top, y = 0, TOP + 4, TOP + 4
        if item is None:
            y += LEADING * 0.6
            continue
        words, justify = item
        _draw_line(pdf, words, MARGIN + col * (col_w + GUTTER), y, col_w, justify)
        y += LEADING
    pdf.set_title(title)
    pdf.output(str(out))
    return pdf.page_no()


# ---- HTML ---------------------------------------------------------------------------------

NAV = ["Home", "Journals", "Topics", "Authors", "Submit a paper", "About us", "Contact"]
SIDE = ["Most read this week", "Editors' picks: cardiology", "Open access policy", "Related: gene expression atlas",
        "Conference calendar 2024", "Subscribe to the newsletter", "Data availability statement"]
COOKIE = ("We use cookies and similar technologies to personalise content, measure traffic and improve your "
          "experience. By clicking Accept all you consent to our use of cookies. Manage preferences")
FOOTER = ("Copyright 2024 Reproducible Findings Publishing. All rights reserved. Terms of use. Privacy policy. "
          "Accessibility. Follow us on social media.")


def render_html(doc: dict, semantic: bool) -> str:
    e = html.escape
    sentences = [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", doc["text"]) if s.strip()]
    body = "\n".join(f"<p>{e(' '.join(sentences[i:i + 3]))}</p>" for i in range(0, len(sentences), 3))
    nav = "".join(f'<li><a href="/{i}">{e(n)}</a></li>' for i, n in enumerate(NAV))
    side = "".join(f'<li><a href="/s/{i}">{e(n)}</a></li>' for i, n in enumerate(SIDE))
    head = f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{e(doc["title"])} | Reproducible Findings</title></head><body>'
    if semantic:
        return (f'{head}\n<div class="cookie-banner" role="dialog"><p>{COOKIE}</p><button>Accept all</button></div>\n'
                f'<header><nav><ul>{nav}</ul></nav></header>\n'
                f'<aside class="sidebar"><h3>More from the journal</h3><ul>{side}</ul></aside>\n'
                f'<main><article><h1>{e(doc["title"])}</h1>\n<h2>Abstract</h2>\n{body}\n</article></main>\n'
                f'<footer><p>{FOOTER}</p></footer>\n</body></html>\n')
    return (f'{head}\n<div id="consent" class="gdpr-notice"><div>{COOKIE}</div><span class="btn">Accept all</span></div>\n'
            f'<div class="topbar"><div class="menu"><ul>{nav}</ul></div></div>\n'
            f'<div class="wrapper"><div class="col-left widget-links"><div class="widget-title">More from the journal</div><ul>{side}</ul></div>\n'
            f'<div class="col-main"><div class="post"><div class="post-title"><h1>{e(doc["title"])}</h1></div>\n'
            f'<div class="post-body"><h2>Abstract</h2>\n{body}\n</div></div></div></div>\n'
            f'<div class="site-footer"><div>{FOOTER}</div></div>\n</body></html>\n')


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("beir", type=Path)
    ap.add_argument("--out", type=Path, default=Path("data/scifact-rendered"))
    ap.add_argument("--max-queries", type=int, default=None)
    ap.add_argument("--max-docs", type=int, default=None)
    ap.add_argument("--only", choices=["pdf", "html"], default=None)
    args = ap.parse_args()
    docs = load_docs(args.beir, args.max_queries, args.max_docs)
    font = next((f for f in FONTS if f.exists()), None)
    if font is None:
        print("no DejaVu font found: rendering in Helvetica (Latin-1 only; other characters become '?')", file=sys.stderr)
    lay = Layout(font)
    (args.out / "pdf").mkdir(parents=True, exist_ok=True)
    (args.out / "html").mkdir(parents=True, exist_ok=True)
    with open(args.out / "corpus.jsonl", "w", encoding="utf-8") as fh:
        for d in docs:
            fh.write(json.dumps(d, ensure_ascii=False) + "\n")
    t0, pages, cols2 = time.perf_counter(), 0, 0
    for i, d in enumerate(docs):
        odd = int(hashlib.sha1(d["_id"].encode()).hexdigest(), 16) % 2  # two columns for half, by id
        if args.only != "html":
            pages += render_pdf(d, args.out / "pdf" / f"{d['_id']}.pdf", lay, 2 if odd else 1)
            cols2 += odd
        if args.only != "pdf":
            (args.out / "html" / f"{d['_id']}.html").write_text(render_html(d, semantic=not odd), encoding="utf-8")
        if (i + 1) % 500 == 0:
            print(f"{i + 1}/{len(docs)} documents, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    print(json.dumps({"documents": len(docs), "pdf_pages": pages, "two_column": cols2, "font": font.name if font else "Helvetica",
                      "seconds": round(time.perf_counter() - t0, 1), "out": str(args.out)}))


if __name__ == "__main__":
    main()
