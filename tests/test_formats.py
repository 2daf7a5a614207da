"""PDF, HTML, Word and Markdown: extraction, pages and sections in hits, section-aware chunking,
file selection, and the bad cases (encrypted, scanned, damaged, empty, huge). Every document
is generated here; nothing is downloaded."""
from __future__ import annotations

import json
import re
import shutil
import tracemalloc
from pathlib import Path

import pytest

from semsearch.corpus import ChunkSettings, ReadOptions, chunk_text, read_documents, walk
from semsearch.corpus.formats import Marks, extract, extract_text, markdown_blocks
from semsearch.corpus.streaming import chunk_stream
from semsearch.errors import CorpusError
from semsearch.indexing import index_corpus
from semsearch.search import Retriever


def words(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in re.finditer(r"\w+", text)]


# ---- a minimal PDF writer (Helvetica text, one line a Tj), enough for PDFium to read -------

def make_pdf(path: Path, pages: list[list[str]], title: str | None = None, outline: list[tuple[str, int]] | None = None,
             drawing_only: bool = False) -> Path:
    objs: list[bytes] = []

    def add(body: str | bytes) -> int:
        objs.append(body.encode("latin-1") if isinstance(body, str) else body)
        return len(objs)

    catalog = add("")  # filled in below
    pages_id = add("")
    font = add("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    kids = []
    for lines in pages:
        if drawing_only:
            stream = "0.5 g 72 72 400 600 re f"
        else:
            esc = [ln.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") for ln in lines]
            stream = "BT /F1 11 Tf 14 TL 72 770 Td " + " ".join(f"({ln}) Tj T*" for ln in esc) + " ET"
        content = add(f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream")
        kids.append(add(f"<< /Type /Page /Parent {pages_id} 0 R /MediaBox [0 0 595 842] "
                        f"/Resources << /Font << /F1 {font} 0 R >> >> /Contents {content} 0 R >>"))
    objs[pages_id - 1] = f"<< /Type /Pages /Kids [{' '.join(f'{k} 0 R' for k in kids)}] /Count {len(kids)} >>".encode()
    extra = ""
    if outline:
        first = len(objs) + 2
        root = add("")
        items = []
        for i, (name, page) in enumerate(outline):
            links = f" /Prev {first + i - 1} 0 R" if i else ""
            links += f" /Next {first + i + 1} 0 R" if i + 1 < len(outline) else ""
            items.append(add(f"<< /Title ({name}) /Parent {root} 0 R /Dest [{kids[page - 1]} 0 R /Fit]{links} >>"))
        objs[root - 1] = f"<< /Type /Outlines /First {items[0]} 0 R /Last {items[-1]} 0 R /Count {len(items)} >>".encode()
        extra = f" /Outlines {root} 0 R"
    objs[catalog - 1] = f"<< /Type /Catalog /Pages {pages_id} 0 R{extra} >>".encode()
    info = add(f"<< /Title ({title}) >>") if title else None
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objs, 1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objs) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    out += f"trailer\n<< /Size {len(objs) + 1} /Root {catalog} 0 R{f' /Info {info} 0 R' if info else ''} >>\nstartxref\n{xref}\n%%EOF\n".encode()
    path.write_bytes(bytes(out))
    return path


def report_pages(n: int, lines_per_page: int = 12) -> list[list[str]]:
    """Pages with a running header, a page-number footer and body text naming their page."""
    pages = []
    themes = ["harvest", "shipping", "pensions", "payroll", "research", "outlook", "audit"]
    for p in range(1, n + 1):
        body = [f"Page {p} on {themes[p % 7]} {themes[k % 7]}: topic{p} in plain words, line {k}." for k in range(lines_per_page)]
        pages.append(["Annual Report 2023  Acme Corporation"] + body + [str(p)])
    return pages


# ---- PDF --------------------------------------------------------------------------------

def test_pdf_pages_title_and_running_header_footer_removed(tmp_path):
    p = make_pdf(tmp_path / "report.pdf", report_pages(3), title="Acme annual report")
    text, meta = extract_text(p)
    assert meta == {"title": "Acme annual report", "pages": 3}
    assert "Annual Report 2023" not in text  # the running header, on every page
    assert not re.search(r"^\s*\d+\s*$", text, re.M)  # the page-number footers
    assert text.index("topic1") < text.index("topic2") < text.index("topic3")


def test_pdf_hyphenated_line_ends_are_joined(tmp_path):
    p = make_pdf(tmp_path / "h.pdf", [["The committee considered the inter-", "national standard at length."]])
    text, _ = extract_text(p)
    assert "international standard" in text


def test_pdf_word_hyphenated_across_a_page_break_is_joined_and_page_starts_are_exact(tmp_path):
    pages = report_pages(2)
    pages[0][-2] = "and the last line ends with a hyphen-"
    pages[1][1] = "ated word on the next page."
    ex = extract(make_pdf(tmp_path / "x.pdf", pages))
    text = "".join(ex.blocks)
    assert "hyphenated word" in text
    start2 = ex.marks.page_starts[1]
    assert text[start2:].startswith("hyphenated") and ex.marks.locate(start2, start2 + 5)["page"] == 2


def test_pdf_outline_gives_sections(tmp_path):
    p = make_pdf(tmp_path / "o.pdf", report_pages(3), outline=[("Introduction", 1), ("Results", 3)])
    ex = extract(p)
    text = "".join(ex.blocks)
    i = text.index("topic3")
    assert ex.marks.locate(i, i + 1) == {"page": 3, "section": "Results"}
    assert ex.marks.locate(0, 1)["section"] == "Introduction"


def test_pdf_encrypted_is_a_clear_error(tmp_path):
    pypdf = pytest.importorskip("pypdf")
    plain = make_pdf(tmp_path / "plain.pdf", report_pages(1))
    w = pypdf.PdfWriter(clone_from=str(plain))
    w.encrypt("secret", algorithm="RC4-128")
    w.write(tmp_path / "locked.pdf")
    with pytest.raises(CorpusError, match=r"locked\.pdf: encrypted PDF: needs a password"):
        extract(tmp_path / "locked.pdf")


def test_pdf_without_text_layer_says_scanned(tmp_path):
    p = make_pdf(tmp_path / "scan.pdf", [[], [], []], drawing_only=True)
    with pytest.raises(CorpusError, match=r"scan\.pdf: no text layer: 3 pages, scanned\?"):
        "".join(extract(p).blocks)


@pytest.mark.skipif(shutil.which("tesseract") is None, reason="OCR of scanned pages is not built in (it would need the Tesseract binary, not found here)")
def test_ocr_of_scanned_pages():
    pytest.skip("OCR of scanned pages is not implemented yet; scanned PDFs are reported as 'no text layer'")


@pytest.mark.parametrize("data, why", [
    (b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog", "damaged PDF"),
    (b"this is not a PDF at all", "damaged PDF"),
])
def test_pdf_damaged_is_a_clear_error(tmp_path, data, why):
    p = tmp_path / "bad.pdf"
    p.write_bytes(data)
    with pytest.raises(CorpusError, match=rf"bad\.pdf: {why}"):
        extract(p)


def test_pdf_truncated_is_a_clear_error(tmp_path):
    good = make_pdf(tmp_path / "good.pdf", report_pages(2)).read_bytes()
    (tmp_path / "cut.pdf").write_bytes(good[: len(good) // 3])
    with pytest.raises(CorpusError, match=r"cut\.pdf: (damaged PDF|no text layer)"):
        "".join(extract(tmp_path / "cut.pdf").blocks)


def test_pdf_with_zero_pages_is_a_clear_error(tmp_path):
    p = make_pdf(tmp_path / "empty.pdf", [])
    with pytest.raises(CorpusError, match=r"empty\.pdf: (PDF has no pages|damaged PDF)"):
        extract(p)


def test_a_damaged_pdf_after_an_encrypted_one_is_still_damaged(tmp_path):
    """PDFium keeps its last error across files: a zero-page or damaged PDF read after an
    encrypted one was reported as "encrypted PDF: needs a password" (found in CI, where the
    two tests met in one worker). The file's own bytes decide now."""
    pypdf = pytest.importorskip("pypdf")
    w = pypdf.PdfWriter(clone_from=str(make_pdf(tmp_path / "plain.pdf", report_pages(1))))
    w.encrypt("secret", algorithm="RC4-128")
    w.write(tmp_path / "locked.pdf")
    make_pdf(tmp_path / "empty.pdf", [])
    (tmp_path / "bad.pdf").write_bytes(b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog")
    for name, why in (("empty.pdf", "(PDF has no pages|damaged PDF)"), ("bad.pdf", "damaged PDF")):
        with pytest.raises(CorpusError, match=r"locked\.pdf: encrypted PDF: needs a password"):
            extract(tmp_path / "locked.pdf")
        with pytest.raises(CorpusError, match=rf"{name.replace('.', '[.]')}: {why}"):
            extract(tmp_path / name)


def test_pdf_of_1000_pages_streams_in_flat_memory(tmp_path, fake_encoder):
    """The extracted text (over 2 MB) is read with under half of it held at once (traced peak
    after a warm-up: ~0.3 MB, whatever the page count; tracemalloc makes the run 4x slower, so
    1,000 pages with a bound of 1 MB rather than 2,000 pages with 3 MB)."""
    n = 1000
    p = make_pdf(tmp_path / "big.pdf", report_pages(n, lines_per_page=40))
    warm = make_pdf(tmp_path / "warm.pdf", report_pages(2, lines_per_page=40))
    list(chunk_stream(extract(warm).blocks, fake_encoder.token_offsets, ChunkSettings(window=200, overlap=20)))
    seen = []  # (the reader's imports and compiled patterns, made once by the warm-up, are not traced)
    tracemalloc.start()
    try:
        ex = extract(p, on_bytes=seen.append)
        chunks = 0
        last_page = 0
        for c, _ in chunk_stream(ex.blocks, fake_encoder.token_offsets, ChunkSettings(window=200, overlap=20), ex.marks.boundaries):
            chunks += 1
            page = ex.marks.locate(c.start, c.end)["page"]
            assert page >= last_page
            last_page = page
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    text_chars = ex.marks.page_starts[-1]
    assert last_page == n and len(ex.marks.page_starts) == n and chunks > n
    assert text_chars > 2_000_000  # over 2 MB of extracted text ...
    assert peak < 1_000_000  # ... read with well under half of that held at once
    assert sum(seen) == p.stat().st_size and len(seen) == n  # progress advances page by page


# ---- HTML -------------------------------------------------------------------------------

def page_html(charset: str = "utf-8") -> str:
    para = ("Caf\u00e9 owners in the old town reported that the \u201cnew\u201d pricing increased turnover, "
            "and the survey of two hundred shops confirmed a steady rise over three years. ")
    return (f'<!DOCTYPE html><html><head><meta charset="{charset}"><title>Pricing study | Example News</title></head><body>'
            '<div class="cookie-banner">We use cookies to improve your experience. Accept all cookies or manage preferences.</div>'
            '<nav><ul><li><a href="/">Home</a></li><li><a href="/a">About us</a></li><li><a href="/n">Latest news</a></li></ul></nav>'
            '<aside class="sidebar"><h3>Related</h3><ul><li><a href="/x">Other story one</a></li><li><a href="/y">Other story two</a></li></ul></aside>'
            f'<main><article><h1>Pricing study</h1><h2>Background</h2><p>{para * 2}</p><h2>Methods</h2><h3>Survey</h3><p>{para}</p>'
            f'<p>{para}</p></article></main><footer>Copyright 2024 Example News. All rights reserved. Privacy policy.</footer></body></html>')


def test_html_main_content_without_boilerplate_and_with_sections(tmp_path):
    p = tmp_path / "page.html"
    p.write_text(page_html(), encoding="utf-8")
    ex = extract(p)
    text = "".join(ex.blocks)
    for junk in ("cookies", "About us", "Other story", "All rights reserved"):
        assert junk not in text
    assert "survey of two hundred shops" in text
    assert ex.marks.title == "Pricing study"
    i = text.index("Survey")
    assert ex.marks.locate(i, i + 10)["section"] == "Pricing study > Methods > Survey"


@pytest.mark.parametrize("charset", ["windows-1252", "iso-8859-1"])
def test_html_in_a_legacy_encoding_is_decoded_as_declared(tmp_path, charset):
    p = tmp_path / "old.htm"
    p.write_bytes(page_html(charset).encode("cp1252"))
    text, meta = extract_text(p)
    assert "Caf\u00e9 owners" in text
    if charset == "windows-1252":
        assert "\u201cnew\u201d" in text  # bytes 0x93 / 0x94: curly quotes in windows-1252


# ---- Word -------------------------------------------------------------------------------

def test_docx_headings_paragraphs_tables_and_title(tmp_path):
    docx = pytest.importorskip("docx")
    d = docx.Document()
    d.core_properties.title = "Field manual"
    d.add_heading("Setup", level=1)
    d.add_paragraph("Unpack the kit and check every part against the list.")
    d.add_heading("Calibration", level=2)
    d.add_paragraph("Turn the dial until the needle rests on zero.")
    t = d.add_table(rows=2, cols=2)
    t.cell(0, 0).text, t.cell(0, 1).text = "part", "count"
    t.cell(1, 0).text, t.cell(1, 1).text = "screw", "12"
    d.save(tmp_path / "manual.docx")
    ex = extract(tmp_path / "manual.docx")
    text = "".join(ex.blocks)
    assert ex.marks.title == "Field manual"
    assert "| screw | 12 |" in text
    i = text.index("needle")
    assert ex.marks.locate(i, i + 5)["section"] == "Setup > Calibration"


def test_docx_that_is_not_a_zip_is_a_clear_error(tmp_path):
    p = tmp_path / "broken.docx"
    p.write_bytes(b"not a zip at all")
    with pytest.raises(CorpusError, match=r"broken\.docx: not a readable Word document"):
        extract(p)


# ---- Markdown and section-aware chunking --------------------------------------------------

def test_markdown_sections_ignore_code_fences_and_read_setext():
    md = ("Guide\n=====\n\nIntro.\n\n## Install\n\nRun it.\n\n```sh\n# not a heading\n```\n\n"
          "### From source\n\nBuild it.\n\nUsage\n-----\n\nCall it.\n")
    marks = Marks()
    text = "".join(markdown_blocks(iter([md[:30], md[30:]]), marks))
    assert text == md
    path = lambda s: marks.locate(text.index(s), text.index(s) + 1)["section"]  # noqa: E731
    assert path("Intro") == "Guide"
    assert path("not a heading") == "Guide > Install"
    assert path("Build it") == "Guide > Install > From source"
    assert path("Call it") == "Guide > Usage"
    assert marks.title == "Guide"
    assert marks.locate(text.index("## Install"), len(text))["section"] == "Guide > Install"
    two = "# Top\n\n## Sub\n\nBody.\n"
    m2 = Marks()
    "".join(markdown_blocks(iter([two]), m2))
    assert m2.locate(0, len(two))["section"] == "Top > Sub"  # a chunk opening with headings is in the last
    assert m2.locate(2, len(two))["section"] == "Top > Sub"  # (a tokenizer that drops '#')


def test_a_chunk_does_not_glue_the_end_of_a_section_to_the_next():
    a = " ".join(f"alpha{i}" for i in range(70))
    b = " ".join(f"beta{i}" for i in range(70))
    text = f"# A\n\n{a}\n\n# B\n\n{b}\n"
    s = ChunkSettings(window=100, overlap=10)
    plain = list(chunk_text(text, words, s))
    assert any("alpha69" in c.text and "beta0" in c.text for c in plain)  # without boundaries: glued
    cut = list(chunk_text(text, words, s, [0, text.index("# B")]))
    assert not any("alpha" in c.text and "beta" in c.text for c in cut)
    assert cut[1].text.startswith("B\n\nbeta0")
    for c in cut:
        assert text[c.start:c.end] == c.text  # offsets stay exact
    assert {w for c in cut for w in re.findall(r"\w+", c.text)} == set(re.findall(r"\w+", text))  # nothing lost


def test_a_boundary_early_in_a_window_does_not_cut_it():
    a = " ".join(f"alpha{i}" for i in range(10))
    b = " ".join(f"beta{i}" for i in range(300))
    text = f"{a}\n# B\n{b}"
    chunks = list(chunk_text(text, words, ChunkSettings(window=100, overlap=10), [text.index("# B")]))
    assert chunks[0].n_tokens == 100  # a short first section is kept with what follows


def test_streamed_chunks_equal_whole_text_chunks_with_boundaries():
    parts = []
    for k in range(40):
        parts.append(f"## Part {k}\n\n" + " ".join(f"w{k}x{i}" for i in range((k * 37) % 150 + 5)) + "\n\n")
    text = "".join(parts)
    s = ChunkSettings(window=64, overlap=8)
    marks = Marks()
    blocks = [text[i:i + 500] for i in range(0, len(text), 500)]
    streamed = [c for c, _ in chunk_stream(markdown_blocks(iter(blocks), marks), words, s, marks.boundaries)]
    whole = list(chunk_text(text, words, s, marks.boundaries))
    assert [(c.start, c.end, c.text) for c in streamed] == [(c.start, c.end, c.text) for c in whole]


# ---- choosing files -----------------------------------------------------------------------

def site(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    for rel in ["index.html", "guide/intro.html", "_sources/index.txt", "_sources/guide/intro.txt", "_static/searchindex.json",
                "_static/app.js", "notes.md", "drafts/wip.md"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    return root


def test_include_and_exclude_globs(tmp_path):
    root = site(tmp_path)
    names = lambda res: [f.path.relative_to(root).as_posix() for f in res.files]  # noqa: E731
    assert names(walk(root, include=["*.html"])) == ["index.html", "guide/intro.html"]
    res = walk(root, exclude=["_sources/", "_static/", "drafts"])
    assert names(res) == ["index.html", "notes.md", "guide/intro.html"]
    assert res.skipped["excluded (--exclude)"] == 3  # three folders, not entered
    assert names(walk(root, include=["*.md"], exclude=["drafts/**"])) == ["notes.md"]


def test_ignore_file_in_the_corpus_root(tmp_path):
    root = site(tmp_path)
    (root / ".semsearchignore").write_text("# a site's build output\n_sources/\n_static/\n*.md\n!notes.md\n")
    res = walk(root)
    assert [f.path.relative_to(root).as_posix() for f in res.files] == ["index.html", "notes.md", "guide/intro.html"]
    assert res.skipped["ignored (.semsearchignore)"] == 3


# ---- indexing end to end ------------------------------------------------------------------

def test_index_pdf_html_docx_hits_carry_page_section_title(tmp_path, real_encoder):
    docx = pytest.importorskip("docx")
    root = tmp_path / "corpus"
    root.mkdir()
    pages = report_pages(6, lines_per_page=40)
    pages[4][20] = "The turbine blades were inspected for corrosion after the winter storms."
    make_pdf(root / "report.pdf", pages, title="Acme annual report")
    (root / "page.html").write_text(page_html(), encoding="utf-8")
    d = docx.Document()
    d.add_heading("Maintenance", level=1)
    d.add_heading("Boilers", level=2)
    d.add_paragraph("Descale the boiler every spring with a mild acid solution.")
    d.save(root / "manual.docx")
    (root / "_static").mkdir()
    (root / "_static" / "settings.json").write_text('{"theme": "dark", "version": 3}')
    rep = index_corpus(root, tmp_path / "idx", real_encoder, progress=False)
    assert rep.added == 3 and rep.skipped == {"not a JSON corpus": 1}
    assert any("settings.json" in s for s in rep.skipped_files)
    r = Retriever.load(tmp_path / "idx", encoder=real_encoder)
    hit = r.search("turbine blades inspected for corrosion after the winter storms", k=1, where="path:*.pdf")[0]
    page = hit.metadata["page"]
    assert page <= 5 <= hit.metadata.get("page_end", page) and hit.metadata["title"] == "Acme annual report"
    assert "turbine blades" in hit.text and hit.location.endswith(f"report.pdf p. {page}")
    assert all(h.metadata["page"] <= 2 for h in r.search("turbine blade corrosion", k=5, where="page<=2"))
    hit = r.search("descaling a boiler", k=1, mode="dense")[0]
    assert hit.source.endswith("manual.docx") and hit.metadata["section"] == "Maintenance > Boilers"
    hit = r.search("shop pricing survey", k=1, mode="dense")[0]
    assert hit.source.endswith("page.html") and hit.metadata["section"].startswith("Pricing study")
    assert hit.to_dict()["metadata"]["title"] == "Pricing study"


def test_bad_pdf_stops_the_run_naming_it_and_leaves_the_old_index(tmp_path, fake_encoder):
    root = tmp_path / "corpus"
    root.mkdir()
    make_pdf(root / "good.pdf", report_pages(2))
    idx = tmp_path / "idx"
    index_corpus(root, idx, fake_encoder, progress=False)
    before = json.loads((idx / "manifest.json").read_text())
    make_pdf(root / "scan.pdf", [[], []], drawing_only=True)
    (root / "zz-new.md").write_text("# New\n\nA new note.\n")
    with pytest.raises(CorpusError, match=r"scan\.pdf: no text layer: 2 pages, scanned\?"):
        index_corpus(root, idx, fake_encoder, progress=False)
    assert json.loads((idx / "manifest.json").read_text()) == before
    rep = index_corpus(root, idx, fake_encoder, progress=False, read=ReadOptions(skip_errors=True))
    assert rep.added == 1 and rep.skipped == {"unreadable or malformed": 1}
    assert any("scan.pdf: no text layer" in s for s in rep.skipped_files)


def test_index_include_exclude_through_python(tmp_path, fake_encoder):
    root = site(tmp_path)
    (root / "index.html").write_text(page_html())
    (root / "guide" / "intro.html").write_text(page_html())
    rep = index_corpus(root, tmp_path / "idx", fake_encoder, progress=False, include=["*.html"])
    assert rep.added == 2 and rep.skipped["not included (--include)"] == 6
    rep = index_corpus(root, tmp_path / "idx", fake_encoder, progress=False, include=["*.html"], exclude=["guide/"])
    assert rep.removed == 1 and rep.totals["files"] == 1


def test_read_documents_gives_a_pdf_as_one_document(tmp_path):
    p = make_pdf(tmp_path / "r.pdf", report_pages(2), title="T")
    docs = list(read_documents(p, ReadOptions()))
    assert len(docs) == 1 and docs[0].metadata == {"title": "T", "pages": 2} and "topic2" in docs[0].text
