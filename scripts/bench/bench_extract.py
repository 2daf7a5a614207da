"""Extraction speed and fidelity of the PDF and HTML readers against the alternatives, same run.

    python scripts/bench/bench_extract.py data/scifact-rendered [--files 300]

Reads the documents scripts/render_scifact.py wrote (pdf/, html/, corpus.jsonl) and reports, per
extractor: pages (files) per second, and word recall / precision of the extracted text against
the source record (title + text; lower-cased word multisets): recall counts lost or broken words
(hyphenation, columns), precision counts added words (running headers, navigation, banners).
PDF: pypdfium2 raw text, pypdf raw text, and semsearch's PDF reader (pypdfium2 + header /
footer removal + de-hyphenation). HTML: selectolax body text, and semsearch's HTML reader
(trafilatura main content). Needs 'semsearch[bench]' (pypdf, selectolax).
"""
from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter
from pathlib import Path


def wordbag(text: str) -> Counter:
    return Counter(re.findall(r"[^\W_]+", text.lower()))


def fidelity(extracted: str, source: str) -> tuple[float, float]:
    e, s = wordbag(extracted), wordbag(source)
    common = sum((e & s).values())
    return common / max(sum(s.values()), 1), common / max(sum(e.values()), 1)


def pdfium_raw(path: Path) -> tuple[str, int]:
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument(str(path))
    out = []
    for i in range(len(pdf)):
        page = pdf[i]
        tp = page.get_textpage()
        out.append(tp.get_text_bounded())
        tp.close()
        page.close()
    n = len(pdf)
    pdf.close()
    return "\n".join(out), n


def pypdf_raw(path: Path) -> tuple[str, int]:
    import pypdf

    r = pypdf.PdfReader(str(path))
    return "\n".join(p.extract_text() or "" for p in r.pages), len(r.pages)


def semsearch_pdf(path: Path) -> tuple[str, int]:
    from semsearch.corpus.formats import extract

    ex = extract(path)
    return "".join(ex.blocks), ex.marks.pages or 0


def selectolax_body(path: Path) -> tuple[str, int]:
    from selectolax.lexbor import LexborHTMLParser as HTMLParser

    tree = HTMLParser(path.read_bytes())
    for node in tree.css("script, style"):
        node.decompose()
    return (tree.body.text(separator=" ") if tree.body else ""), 1


def semsearch_html(path: Path) -> tuple[str, int]:
    from semsearch.corpus.formats import extract

    return "".join(extract(path).blocks), 1


def run(name: str, fn, files: list[Path], sources: dict[str, str]) -> dict:
    t0 = time.perf_counter()
    pages, rec, prec = 0, [], []
    for f in files:
        text, n = fn(f)
        pages += n
        r, p = fidelity(text, sources[f.stem])
        rec.append(r)
        prec.append(p)
    dt = time.perf_counter() - t0
    return {"extractor": name, "files": len(files), "pages": pages, "seconds": round(dt, 2),
            "pages_per_s": round(pages / dt, 1), "word_recall": round(100 * sum(rec) / len(rec), 2),
            "word_precision": round(100 * sum(prec) / len(prec), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rendered", type=Path)
    ap.add_argument("--files", type=int, default=300, help="files of each kind (the first N by name)")
    args = ap.parse_args()
    sources = {}
    with open(args.rendered / "corpus.jsonl", encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            sources[r["_id"]] = f"{r.get('title', '')} {r.get('text', '')}"
    pdfs = sorted((args.rendered / "pdf").glob("*.pdf"))[: args.files]
    pages = sorted((args.rendered / "html").glob("*.html"))[: args.files]
    rows = []
    for name, fn in (("pypdfium2 (raw text)", pdfium_raw), ("pypdf (raw text)", pypdf_raw), ("semsearch PDF reader", semsearch_pdf)):
        rows.append({"format": "pdf", **run(name, fn, pdfs, sources)})
    for name, fn in (("selectolax (body text)", selectolax_body), ("semsearch HTML reader", semsearch_html)):
        rows.append({"format": "html", **run(name, fn, pages, sources)})
    keys = list(rows[0])
    widths = [max(len(k), *(len(str(r[k])) for r in rows)) for k in keys]
    print("  ".join(k.ljust(w) for k, w in zip(keys, widths)))
    for r in rows:
        print("  ".join(str(r[k]).ljust(w) for k, w in zip(keys, widths)))


if __name__ == "__main__":
    main()
