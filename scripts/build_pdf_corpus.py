"""A PDF test corpus as manuals and journals are printed, and what search makes of it.

    python scripts/build_pdf_corpus.py build --out data/pdf-corpus [--beir ../shared/data/beir/scifact] [--outline]
    python scripts/build_pdf_corpus.py measure --out data/pdf-corpus [--index-root indexes/pdfc] [--only manual]

`build` renders with fpdf2 (pip install 'semsearch[bench]'), deterministically:
- manual/manual.pdf: this project's own docs (README.md and docs/*.md at a pinned git revision,
  `--rev`) as a book: a title page, table-of-contents pages (dot leaders, page numbers), one
  chapter a file. Running headers alternate like a LaTeX book: even pages "<page>  semsearch
  reference manual", odd pages "<current section>  <page>" (its text changes with the section);
  footers alternate too ("semsearch reference manual" / "revision <rev>"); a chapter's first
  page has no header and a centred page number. Body 10 pt, header 10 pt italic.
- journal/journal.pdf (with --beir): SciFact abstracts set one after another as a journal issue,
  a contents page, even headers "<page>  Journal of Reproducible Findings · Vol. 12", odd headers
  the short title of the article at the top of the page, then the page number; footers.
- truth.json: every page's body lines as drawn, the header and footer lines drawn, the TOC
  pages, the sections with their pages.

`measure` indexes both PDFs with the bundled model (fp32, flat index) and reports: the share of
chunks that start with, or contain, a running header or footer line; for a how-to question per
manual section ("how to <heading>"), the rank of the first TOC page and of the section's own
pages; and for 10-word passages taken from body pages, how often the top hit's page is the
passage's page (dense, lexical, hybrid). Writes measure.json beside truth.json.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FONT_DIRS = [Path("/usr/share/fonts/truetype/dejavu"), Path("/usr/share/fonts/dejavu")]
REV = "7696ef9"  # the docs the manual figures in docs/formats.md were measured on
TITLE = "semsearch reference manual"
JOURNAL = "Journal of Reproducible Findings"


def _fonts(pdf) -> bool:
    d = next((d for d in FONT_DIRS if (d / "DejaVuSerif.ttf").exists()), None)
    if d is None:
        return False
    pdf.add_font("serif", "", str(d / "DejaVuSerif.ttf"))
    pdf.add_font("serif", "B", str(d / "DejaVuSerif-Bold.ttf"))
    pdf.add_font("serif", "I", str(d / "DejaVuSerif-Italic.ttf"))
    pdf.add_font("mono", "", str(d / "DejaVuSansMono.ttf"))
    return True


class Book:
    """Pages laid out line by line, so that every body line's page is known exactly."""

    def __init__(self, fmt, margins: tuple[float, float, float, float], body_pt: float, head_pt: float,
                 header, footer, outline: bool = False, title: str = ""):
        from fpdf import FPDF

        self.pdf = FPDF(format=fmt, unit="mm")
        self.outline = outline  # bookmarks for the headings given a level, and the title in the document's info
        if outline and title:
            self.pdf.set_title(title)
        self.pdf.set_auto_page_break(False)
        self.pdf.set_compression(True)
        self.unicode = _fonts(self.pdf)
        self.serif, self.mono = ("serif", "mono") if self.unicode else ("Times", "Courier")
        self.left, self.top, self.right, self.bottom = margins
        self.body_pt, self.head_pt = body_pt, head_pt
        self.header, self.footer = header, footer  # (page, state) -> (left, right) text or None
        self.lead = body_pt * 0.3528 * 1.3
        self.y = 0.0
        self.pages: dict[int, list[str]] = {}  # page -> body lines as drawn
        self.edges: dict[int, list[str]] = {}  # page -> header / footer lines as drawn
        self.state: dict = {"plain": False, "section": ""}
        self.new_page()

    @property
    def width(self) -> float:
        return self.pdf.w - self.left - self.right

    def t(self, s: str) -> str:
        return s if self.unicode else s.encode("latin-1", "replace").decode("latin-1")

    def new_page(self, plain: bool = False) -> None:
        pdf = self.pdf
        pdf.add_page()
        p = pdf.page_no()
        self.pages[p], self.edges[p] = [], []
        self.state["plain"] = plain
        head = None if plain else self.header(p, self.state)
        if head:
            pdf.set_font(self.serif, "I", self.head_pt)
            self._edge(head, self.top - 9)
            pdf.line(self.left, self.top - 7, pdf.w - self.right, self.top - 7)
        foot = self.footer(p, self.state)
        if foot:
            pdf.set_font(self.serif, "", self.head_pt - 1)
            self._edge(foot, pdf.h - self.bottom + 9)
        self.y = self.top

    def _edge(self, parts: tuple[str, str, str], y: float) -> None:
        left, centre, right = (self.t(s) for s in parts)
        pdf = self.pdf
        if left:
            pdf.text(self.left, y, left)
        if centre:
            pdf.text((pdf.w - pdf.get_string_width(centre)) / 2, y, centre)
        if right:
            pdf.text(pdf.w - self.right - pdf.get_string_width(right), y, right)
        self.edges[pdf.page_no()].append(" ".join(s for s in (left, centre, right) if s))

    def room(self, h: float) -> None:
        if self.y + h > self.pdf.h - self.bottom:
            self.new_page()

    def paragraph(self, text: str, style: str = "", size: float | None = None, mono: bool = False,
                  gap: float = 0.5) -> None:
        pdf = self.pdf
        size = size or self.body_pt
        pdf.set_font(self.mono if mono else self.serif, style, size)
        lead = size * 0.3528 * 1.3
        from fpdf.enums import MethodReturnValue

        lines = pdf.multi_cell(self.width, lead, self.t(text), dry_run=True, output=MethodReturnValue.LINES,
                               new_x="LMARGIN", new_y="NEXT") if text.strip() else []
        for ln in lines:
            self.room(lead)
            pdf.text(self.left, self.y + lead * 0.8, ln)
            self.pages[pdf.page_no()].append(ln)
            self.y += lead
        self.y += self.lead * gap

    def heading(self, text: str, size: float, level: int | None = None) -> int:
        self.room(self.lead * 4)  # not the last line of a page
        self.y += self.lead * 0.5
        page = self.pdf.page_no()
        if self.outline and level is not None:
            self.pdf.start_section(self.t(text), level, strict=False)
        self.paragraph(text, "B", size, gap=0.3)
        return page

    def output(self, path: Path) -> int:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.pdf.output(str(path))
        return self.pdf.page_no()


def _toc(book: Book, title: str, entries: list[tuple[int, str, int]], per_page: int) -> list[int]:
    """Contents pages: one entry a line, dot leaders to a right-aligned page number."""
    pdf, pages = book.pdf, []
    for k in range(0, max(len(entries), 1), per_page):
        book.new_page(plain=True)
        pages.append(pdf.page_no())
        if k == 0:
            book.heading(title, 16)
        for level, name, page in entries[k:k + per_page]:
            size = book.body_pt if level == 1 else book.body_pt - 0.5
            pdf.set_font(book.serif, "B" if level == 1 else "", size)
            x = book.left + (0 if level == 1 else 6)
            name = book.t(name)
            num = str(page)
            room = book.width - (x - book.left) - pdf.get_string_width(num) - 4
            while pdf.get_string_width(name) > room - 8:
                name = name[:-2].rstrip() + "…" if book.unicode else name[:-4] + "..."
            dots = " ."
            n = int((room - pdf.get_string_width(name) - 2) / pdf.get_string_width(dots))
            line = f"{name} {dots * n}".rstrip()
            book.room(book.lead)
            pdf.text(x, book.y + book.lead * 0.8, line)
            pdf.text(pdf.w - book.right - pdf.get_string_width(num), book.y + book.lead * 0.8, num)
            book.pages[pdf.page_no()].append(f"{line} {num}")
            book.y += book.lead * (1.15 if level == 1 else 1.0)
    return pages


# ---- the manual -----------------------------------------------------------------------------

def _docs(rev: str) -> list[tuple[str, str]]:
    names = ["README.md"] + sorted(
        subprocess.run(["git", "ls-tree", "--name-only", rev, "docs/"], cwd=REPO, check=True, capture_output=True,
                       text=True).stdout.split())
    return [(n, subprocess.run(["git", "show", f"{rev}:{n}"], cwd=REPO, check=True, capture_output=True,
                               text=True).stdout) for n in names if n.endswith(".md")]


def _md_blocks(text: str):
    """(kind, level, text) of a Markdown file: headings, paragraphs, code lines, table rows."""
    para: list[str] = []
    fence = False
    for raw in text.splitlines() + [""]:
        line = raw.rstrip()
        if line.startswith("```"):
            if para:
                yield "p", 0, " ".join(para)
                para = []
            fence = not fence
            continue
        if fence:
            yield "code", 0, line
            continue
        m = re.match(r"(#{1,4}) (.+)", line)
        if m or not line.strip() or line.startswith("|") or line.startswith("    "):
            if para:
                yield "p", 0, " ".join(para)
                para = []
            if m:
                yield "h", len(m.group(1)), re.sub(r"[`*]", "", m.group(2)).strip()
            elif line.startswith("|") and not re.match(r"^\|[-| :]+\|$", line):
                yield "row", 0, " ".join(c.strip() for c in line.strip("|").split("|"))
            elif line.startswith("    "):
                yield "code", 0, line.strip()
            continue
        para.append(re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", line.strip()).replace("**", "").replace("`", ""))


def render_manual(out: Path, rev: str, outline: bool = False) -> dict:
    docs = _docs(rev)

    def header(p, st):
        return (str(p), "", TITLE) if p % 2 == 0 else (st["section"], "", str(p))

    def footer(p, st):
        if st["plain"]:
            return ("", str(p), "")
        return (TITLE, "", "") if p % 2 == 0 else ("", "", f"revision {rev}")

    def layout(toc_entries: list | None, toc_pages: int):
        book = Book((176, 250), (18, 24, 18, 22), 10, 10, header, footer, outline, TITLE.capitalize())
        book.state["plain"] = True
        book.pages[1], book.edges[1] = [], []
        book.y = 90
        book.paragraph(TITLE.capitalize(), "B", 22)
        book.paragraph(f"Built from the project's documentation at revision {rev}.", "I")
        entries: list[tuple[int, str, int]] = []
        toc = _toc(book, "Contents", toc_entries or [(1, "x", 1)] * toc_pages * 30, 30)
        sections: list[dict] = []
        for ci, (name, text) in enumerate(docs, 1):
            book.state["section"] = ""
            chapter_started = False
            for kind, level, s in _md_blocks(text):
                if kind == "h" and level == 1 and not chapter_started:
                    book.new_page(plain=True)
                    book.state["section"] = f"{ci}. {s}"
                    page = book.heading(f"Chapter {ci}. {s}", 16, 0)
                    entries.append((1, f"{ci}. {s}", page))
                    sections.append({"title": s, "chapter": ci, "level": 1, "page": page, "file": name})
                    chapter_started = True
                elif kind == "h":
                    if not chapter_started:
                        book.new_page(plain=True)
                        chapter_started = True
                    page = book.heading(s, 13 if level <= 2 else 11, level - 1 if level <= 3 else None)
                    book.state["section"] = f"{ci}. {s}" if level <= 2 else book.state["section"]
                    if level <= 3:
                        entries.append((2, s, page))
                        sections.append({"title": s, "chapter": ci, "level": level, "page": page, "file": name})
                elif kind == "p":
                    if not chapter_started:
                        book.new_page(plain=True)
                        chapter_started = True
                    book.paragraph(s)
                elif kind in ("code", "row"):
                    book.paragraph(s or " ", mono=True, size=8.5, gap=0.0)
        return book, entries, toc, sections

    book, entries, toc, sections = layout(None, 1)
    n_toc = -(-len(entries) // 30)
    book, entries2, toc, sections = layout(None, n_toc)  # page numbers with the TOC's real length
    book, entries3, toc, sections = layout(entries2, n_toc)
    assert entries3 == entries2, "TOC page numbers moved"
    for s, nxt in zip(sections, sections[1:] + [None]):
        s["end_page"] = max(s["page"], (nxt["page"] if nxt else book.pdf.page_no()))
    n = book.output(out / "manual" / "manual.pdf")
    return {"file": "manual/manual.pdf", "pages": n, "toc_pages": toc, "sections": sections,
            "body": {str(p): v for p, v in book.pages.items()}, "edges": {str(p): v for p, v in book.edges.items()}}


# ---- the journal issue ------------------------------------------------------------------------

def render_journal(out: Path, beir: Path, n_docs: int, outline: bool = False) -> dict:
    docs = []
    with open(beir / "corpus.jsonl", encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            if len(r.get("text", "").split()) >= 120:
                docs.append(r)
            if len(docs) >= n_docs:
                break

    def short(t):
        return t if len(t) < 55 else t[:52].rsplit(" ", 1)[0] + " ..."

    def header(p, st):
        return (str(p), "", f"{JOURNAL} · Vol. 12" if st.get("u") else f"{JOURNAL} - Vol. 12") if p % 2 == 0 \
            else (short(st["section"]), "", str(p))

    def footer(p, st):
        return ("", f"Reproducible Findings Publishing, {2024}. Open access (CC BY 4.0).", "")

    def layout(toc_entries, toc_pages):
        book = Book("A4", (22, 26, 22, 24), 10.5, 8, header, footer, outline, f"{JOURNAL}, Volume 12")
        book.state["u"] = book.unicode
        book.state["plain"] = True
        book.pages[1], book.edges[1] = [], []
        book.y = 80
        book.paragraph(f"{JOURNAL}, Volume 12", "B", 20)
        toc = _toc(book, "Contents of this issue", toc_entries or [(2, "x", 1)] * toc_pages * 40, 40)
        book.new_page()
        entries, articles = [], []
        for d in docs:
            title = " ".join(d["title"].split())
            book.state["section"] = title
            page = book.heading(title, 13, 0)
            entries.append((2, title, page))
            sents = re.split(r"(?<=[.!?])\s+(?=[A-Z])", " ".join(d["text"].split()))
            for k in range(0, len(sents), 3):
                book.paragraph(" ".join(sents[k:k + 3]))
            articles.append({"id": d["_id"], "title": title, "page": page, "end_page": book.pdf.page_no()})
            book.y += book.lead
        return book, entries, toc, articles

    book, entries, toc, arts = layout(None, 1)
    n_toc = -(-len(entries) // 40)
    book, entries2, toc, arts = layout(None, n_toc)
    book, entries3, toc, arts = layout(entries2, n_toc)
    assert entries3 == entries2, "TOC page numbers moved"
    n = book.output(out / "journal" / "journal.pdf")
    return {"file": "journal/journal.pdf", "pages": n, "toc_pages": toc, "sections": arts,
            "body": {str(p): v for p, v in book.pages.items()}, "edges": {str(p): v for p, v in book.edges.items()}}


def build(args) -> None:
    t0 = time.perf_counter()
    truth = {"rev": args.rev, "outline": args.outline, "docs": [render_manual(args.out, args.rev, args.outline)]}
    if args.beir:
        truth["docs"].append(render_journal(args.out, args.beir, args.journal_docs, args.outline))
    (args.out / "truth.json").write_text(json.dumps(truth, ensure_ascii=False, indent=1), encoding="utf-8")
    print(json.dumps({d["file"]: {"pages": d["pages"], "toc_pages": d["toc_pages"]} for d in truth["docs"]}
                     | {"seconds": round(time.perf_counter() - t0, 1)}))


# ---- measuring ----------------------------------------------------------------------------------

def _fold(s: str) -> str:
    return re.sub(r"\d+", "#", " ".join(s.split())).lower()


def _words(s: str) -> list[str]:
    return re.findall(r"\w+", s.lower())


def passages(doc: dict, n: int, rng: random.Random) -> list[tuple[str, int]]:
    """10-word passages from body pages (not TOC), each occurring once in the document."""
    body = {int(p): _words(" ".join(v)) for p, v in doc["body"].items() if int(p) not in doc["toc_pages"]}
    all_text = " " + " ".join(" ".join(body[p]) for p in sorted(body)) + " "
    out = []
    pages = [p for p in sorted(body) if len(body[p]) >= 40]
    while len(out) < n and pages:
        p = rng.choice(pages)
        w = body[p]
        k = rng.randrange(0, len(w) - 10)
        q = " ".join(w[k:k + 10])
        if all_text.count(" " + q + " ") == 1:
            out.append((q, p))
    return out


def measure(args) -> None:
    import numpy as np

    from semsearch.encoder import Encoder
    from semsearch.indexing import index_corpus
    from semsearch.search import Retriever

    truth = json.loads((args.out / "truth.json").read_text(encoding="utf-8"))
    enc = Encoder(precision="fp32", device="cpu")
    rng = random.Random(7)
    report: dict = {}
    for doc in truth["docs"]:
        name = doc["file"].split("/")[0]
        if args.only and name not in args.only:
            continue
        idx = args.index_root / name
        t0 = time.perf_counter()
        index_corpus(args.out / name, idx, enc, progress=False, rebuild=True)  # under 50,000 chunks: exact search
        r = Retriever.load(idx, encoder=enc)
        chunks = _chunks(idx)
        edges = {_fold(e) for v in doc["edges"].values() for e in v if not re.fullmatch(r"\d+", e.strip())}
        starts = sum(any(_fold(c[:120]).startswith(e) for e in edges) for c in chunks)
        contains = sum(any(e in _fold(c) for e in edges) for c in chunks)
        rep = {"pages": doc["pages"], "chunks": len(chunks), "index_s": round(time.perf_counter() - t0, 1),
               "chunks_starting_with_header_or_footer": starts, "chunks_containing_header_or_footer": contains}
        toc = set(doc["toc_pages"])

        def pages_of(h):
            return set(range(h.metadata["page"], h.metadata.get("page_end", h.metadata["page"]) + 1))

        if name == "manual":
            qs = [s for s in doc["sections"] if s["level"] >= 2]
            toc_ranks, sec_ranks = [], []
            for s, hits in zip(qs, r.search_batch([f"how to {s['title'].lower()}" for s in qs], k=10)):
                want = set(range(s["page"], s["end_page"] + 1))
                toc_ranks.append(next((i for i, h in enumerate(hits, 1) if pages_of(h) & toc), None))
                sec_ranks.append(next((i for i, h in enumerate(hits, 1) if pages_of(h) & want), None))
            rep["howto"] = {"questions": len(qs),
                            "toc_top1": sum(t == 1 for t in toc_ranks),
                            "toc_in_top10": sum(t is not None for t in toc_ranks),
                            "toc_above_section": sum(t is not None and (s is None or t < s) for t, s in zip(toc_ranks, sec_ranks)),
                            "section_top1": sum(s == 1 for s in sec_ranks),
                            "section_mrr10": round(float(np.mean([1 / s if s else 0 for s in sec_ranks])), 3)}
        ps = passages(doc, args.passages, rng)
        rep["passages"] = {"n": len(ps)}
        runs = [(m, m, {}) for m in ("dense", "lexical", "hybrid")]
        for setting in args.hybrid or []:  # other fusions, e.g. dbsf:0.5
            f, _, a = setting.partition(":")
            runs.append((f"hybrid {setting}", "hybrid", {"fusion": f, **({"alpha": float(a)} if a else {})}))
        for label, mode, kw in runs:
            res = r.search_batch([q for q, _ in ps], k=1, mode=mode, **kw)
            exact = sum(bool(h) and h[0].metadata["page"] == p for (q, p), h in zip(ps, res))
            cover = sum(bool(h) and p in pages_of(h[0]) for (q, p), h in zip(ps, res))
            rep["passages"][label] = {"page_exact_top1": round(100 * exact / len(ps), 1),
                                      "page_within_hit_top1": round(100 * cover / len(ps), 1)}
        report[name] = rep
        print(json.dumps({name: rep}), flush=True)
    (args.out / "measure.json").write_text(json.dumps(report, indent=1), encoding="utf-8")


def _chunks(idx: Path) -> list[str]:
    import sqlite3

    texts = []
    for db in sorted(idx.rglob("*.sqlite*")):
        if db.suffix in (".sqlite", ".sqlite3") or db.name.endswith(".sqlite"):
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            try:
                texts += [t for (t,) in con.execute("SELECT text FROM chunks")]
            except sqlite3.Error:
                pass
            con.close()
    return texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", type=Path, default=Path("data/pdf-corpus"))
    b.add_argument("--rev", default=REV, help="git revision of the docs the manual is made of")
    b.add_argument("--beir", type=Path, default=None, help="a BEIR SciFact folder: also render the journal issue")
    b.add_argument("--journal-docs", type=int, default=150)
    b.add_argument("--outline", action="store_true",
                   help="give the PDFs bookmarks (chapters and sections; articles) and a title, as LaTeX builds have")
    m = sub.add_parser("measure")
    m.add_argument("--out", type=Path, default=Path("data/pdf-corpus"))
    m.add_argument("--index-root", type=Path, default=Path("indexes/pdf-corpus"))
    m.add_argument("--passages", type=int, default=300)
    m.add_argument("--only", action="append", help="measure only this document (manual, journal); repeatable")
    m.add_argument("--hybrid", action="append", metavar="FUSION[:ALPHA]",
                   help="passages also by hybrid with this fusion (convex, rrf, dbsf) and weight; repeatable")
    args = ap.parse_args()
    build(args) if args.cmd == "build" else measure(args)


if __name__ == "__main__":
    sys.exit(main())
