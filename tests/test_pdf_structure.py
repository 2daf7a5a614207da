"""PDFs as books and journals print them: running headers and footers (with page numbers,
alternating between odd and even pages, in a smaller type on one-page articles) stay out of
chunks, body lines that resemble them stay in, and contents pages do not outrank the sections
they list. Every PDF is written here with fpdf2."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from semsearch.corpus.formats import extract
from semsearch.indexing import index_corpus
from semsearch.search import Retriever

fpdf = pytest.importorskip("fpdf")

BOOK = "Field Guide to Coastal Lighthouses"
FOOT_EVEN, FOOT_ODD = "Coastal Heritage Series", "Second edition, revised"
TOPICS = ["lamp", "lens", "tower", "keeper", "fog signal", "gallery", "foundation", "stairs", "beacon", "radio"]


def sentence(p: int, k: int) -> str:
    t = TOPICS[(p + k) % len(TOPICS)]
    return f"On page {p} the {t} note {k} records item{p}x{k} with plain words about maintenance."


def write_book(path: Path, pages: list[list[str]], sections: list[str] | None = None, header_pt: float = 10,
               headers: bool = True) -> Path:
    """A5 pages: even headers '<page>  BOOK', odd headers '<section>  <page>' (the section changes),
    alternating footers, a rule under the header, body 10 pt with 14 pt leading."""
    pdf = fpdf.FPDF(format="A5", unit="mm")
    pdf.set_auto_page_break(False)
    for p, lines in enumerate(pages, 1):
        pdf.add_page()
        if headers:
            pdf.set_font("Helvetica", "I", header_pt)
            if p % 2 == 0:
                pdf.text(15, 14, str(p))
                pdf.text(148 - 15 - pdf.get_string_width(BOOK), 14, BOOK)
            else:
                sec = (sections or [BOOK])[(p - 1) * len(sections or [0]) // len(pages)]
                pdf.text(15, 14, sec)
                pdf.text(148 - 15 - pdf.get_string_width(str(p)), 14, str(p))
            pdf.line(15, 16, 133, 16)
            pdf.set_font("Helvetica", "", 8)
            foot = FOOT_EVEN if p % 2 == 0 else FOOT_ODD
            pdf.text((148 - pdf.get_string_width(foot)) / 2, 200, foot)
        y = 26.0
        for ln in lines:
            bold = ln.startswith("# ")
            pdf.set_font("Helvetica", "B" if bold else "", 13 if bold else 10)
            pdf.text(15, y, ln[2:] if bold else ln)
            y += 7.5 if bold else 5.0
    pdf.output(str(path))
    return path


def body_pages(n: int, lines: int = 30) -> list[list[str]]:
    return [[sentence(p, k) for k in range(lines)] for p in range(1, n + 1)]


def text_of(path: Path) -> str:
    return "".join(extract(path).blocks)


def chunks_of(root: Path, idx: Path, encoder) -> list:
    index_corpus(root, idx, encoder, progress=False)
    r = Retriever.load(idx, encoder=encoder)
    return r.search("maintenance notes", k=1000, mode="lexical")


# ---- running headers and footers ----------------------------------------------------------------

def test_alternating_headers_and_footers_with_page_numbers_are_in_no_chunk(tmp_path, fake_encoder):
    root = tmp_path / "corpus"
    root.mkdir()
    pages = body_pages(9)
    write_book(root / "guide.pdf", pages, sections=["1 The lamp room", "2 Keepers and their logs", "3 Fog signals"])
    hits = chunks_of(root, tmp_path / "idx", fake_encoder)
    assert len(hits) >= 5
    running = [BOOK, FOOT_EVEN, FOOT_ODD, "The lamp room", "Keepers and their logs", "Fog signals"]
    for h in hits:
        assert not any(s in h.text for s in running), h.text[:120]
        assert not re.search(r"^\s*\d+\s*$", h.text, re.M)  # no bare page number left either
    text = text_of(root / "guide.pdf")
    for p, lines in enumerate(pages, 1):  # no body text lost, in order
        assert all(ln in text for ln in lines), p
    assert text.index("item1x0") < text.index("item5x0") < text.index("item9x29")


def test_body_lines_that_resemble_a_header_are_kept(tmp_path):
    pages = body_pages(6, lines=20)
    pages[1][10] = BOOK  # the book's title as a line of its own, mid-page
    pages[3][12] = f"4 {BOOK}"  # what page 4's header says, in the body
    pages[2][0] = "Continued from the previous page."  # the first body line of pages 3 and 5 alike
    pages[4][0] = "Continued from the previous page."
    pages[5][19] = "Page 6"  # a last body line that is only a page reference
    for p in (2, 4):
        pages[p - 1][-1] = FOOT_EVEN  # the even footer's words as each even page's last body line
    text = text_of(write_book(tmp_path / "g.pdf", pages))
    assert text.count(BOOK) == 2 and f"4 {BOOK}" in text
    assert text.count("Continued from the previous page.") == 2
    assert text.count(FOOT_EVEN) == 2
    assert all(ln in text for lines in pages for ln in lines if ln != "Page 6")


def test_one_page_article_drops_its_smaller_running_head(tmp_path):
    head = "Journal of Reproducible Findings · Vol. 12 · Coastal engineering"
    pdf = fpdf.FPDF(format="A4", unit="mm")
    pdf.add_page()
    pdf.set_font("Helvetica", "I", 8)
    pdf.text(20, 13, head.replace("·", "-"))
    pdf.line(20, 15, 190, 15)
    pdf.set_font("Helvetica", "B", 14)
    pdf.text(20, 30, "Salt spray and the corrosion of lantern frames")
    pdf.set_font("Helvetica", "", 10.5)
    for k in range(25):
        pdf.text(20, 42 + 5 * k, sentence(1, k))
    pdf.text(105, 287, "1")
    pdf.output(str(tmp_path / "a.pdf"))
    text = text_of(tmp_path / "a.pdf")
    assert "Journal of Reproducible Findings" not in text
    assert text.startswith("Salt spray and the corrosion of lantern frames")
    assert all(sentence(1, k) in text for k in range(25)) and not text.rstrip().endswith("\n1")


def test_footnote_in_small_type_is_kept(tmp_path):
    """Small and apart at the bottom of a one-page document: a footnote, not a footer."""
    pdf = fpdf.FPDF(format="A4", unit="mm")
    pdf.add_page()
    pdf.set_font("Helvetica", "", 10.5)
    for k in range(20):
        pdf.text(20, 30 + 5 * k, sentence(1, k))
    pdf.set_font("Helvetica", "", 8)
    pdf.text(20, 270, "1 Measured at the northern pier in the winter of the survey year.")
    pdf.output(str(tmp_path / "f.pdf"))
    assert "Measured at the northern pier" in text_of(tmp_path / "f.pdf")


# ---- contents and index pages -------------------------------------------------------------------

MANUAL = {
    "Replacing the lamp": "Switch off the mains supply, let the bulb cool for ten minutes, unscrew the old "
                          "bulb with a gloved hand and fit a new halogen bulb of the same wattage.",
    "Cleaning the lens": "Wipe the Fresnel prisms with a soft cotton cloth and distilled water; never use "
                         "abrasive polish on the glass.",
    "Winding the clockwork": "Turn the crank forty times every four hours so that the weights keep the "
                             "optic rotating through the night.",
    "Testing the fog signal": "Sound the horn for five seconds each morning and listen for a clear, "
                              "steady tone across the bay.",
}


def manual_pages() -> tuple[list[list[str]], dict[str, int]]:
    """Page 1: a title; page 2: contents (dot leaders, page numbers); then a section a page."""
    where = {name: p for p, name in enumerate(MANUAL, 3)}
    toc = ["# Contents"] + [f"{k}. {name} " + ". " * 30 + f" {where[name]}" for k, name in enumerate(MANUAL, 1)]
    toc += [f"{k}.1 Safety before {name.lower()} " + ". " * 22 + f" {where[name]}" for k, name in enumerate(MANUAL, 1)]
    pages = [["# Lighthouse maintenance manual", "For the keepers of coastal lights."], toc]
    for name, body in MANUAL.items():
        words = body.split()
        pages.append([f"# {name}"] + [" ".join(words[i:i + 11]) for i in range(0, len(words), 11)]
                     + [sentence(where[name], k) for k in range(10)])
    return pages, where


def test_contents_page_entries_are_left_out_and_sections_kept(tmp_path):
    pages, where = manual_pages()
    ex = extract(write_book(tmp_path / "m.pdf", pages))
    text = "".join(ex.blocks)
    assert ". . ." not in text and "Contents" not in text and "Safety before" not in text
    for name, body in MANUAL.items():
        i = text.index(name)  # the heading, in the body, on its own page
        assert ex.marks.locate(i, i + 1)["page"] == where[name] and " ".join(body.split()[:6]) in text
    assert "For the keepers of coastal lights." in text  # the title page is no contents page


def test_pages_like_contents_but_not_are_kept(tmp_path):
    prices = [f"Spare part {k} . . . . . . . . 12.50 each" for k in range(8)]  # leaders, no page numbers
    steps = [f"Step {k} of the winding takes about {k + 2} turns and ends at mark {k + 10}" for k in range(8)]
    text = text_of(write_book(tmp_path / "p.pdf", [prices, steps], headers=False))
    assert all(ln in text for ln in prices + steps)


def test_index_page_is_left_out(tmp_path):
    index = ["# Index"] + [f"{t}, {3 + k}, {9 + k}-{11 + k}" for k, t in enumerate(TOPICS)]
    text = text_of(write_book(tmp_path / "i.pdf", body_pages(3, 12) + [index]))
    assert "fog signal, " not in text and "item3x11" in text


def test_how_to_query_finds_the_section_not_the_contents_page(tmp_path, real_encoder):
    root = tmp_path / "corpus"
    root.mkdir()
    pages, where = manual_pages()
    write_book(root / "manual.pdf", pages)
    index_corpus(root, tmp_path / "idx", real_encoder, progress=False, chunking=None)
    r = Retriever.load(tmp_path / "idx", encoder=real_encoder)
    for q, name in [("how to replace the lamp", "Replacing the lamp"), ("how do I clean the lens", "Cleaning the lens")]:
        for mode in ("hybrid", "dense", "lexical"):
            hits = r.search(q, k=5, mode=mode)
            assert hits[0].metadata["page"] <= where[name] <= hits[0].metadata.get("page_end", hits[0].metadata["page"]), (q, mode)
            assert name in hits[0].text
            assert not any(". . ." in h.text or h.metadata["page"] == 2 for h in hits), (q, mode)
