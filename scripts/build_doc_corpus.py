"""A real documentation folder to index, and what indexing it got right or wrong.

Build one (Sphinx is not a dependency of semsearch: install it anywhere, e.g. a separate venv):

    python -m venv /tmp/sphinx && /tmp/sphinx/bin/pip install sphinx myst-parser
    python scripts/build_doc_corpus.py build OUT --sphinx-build /tmp/sphinx/bin/sphinx-build
        # this project's docs/ (and README.md) as a Sphinx HTML build in OUT/html, with
        # _sources/, _static/, searchindex.js, objects.inv, genindex.html, search.html
    python scripts/build_doc_corpus.py debian-python-doc OUT
        # Debian's python3.X-doc package unpacked (apt-get download + dpkg -x): the Python manual
        # as the distribution ships it, ~530 pages, _sources/, a gzipped changelog.html.gz

Index it and measure (or, without an index: `check OUT/html --structure`, every figure but
known-item, from the files, chunked with the bundled model's tokenizer, nothing embedded):

    semsearch index OUT/html --index IDX
    python scripts/build_doc_corpus.py check OUT/html --index IDX [--sample 220] [--json]

`check` reports: files and chunks in the index; chunks whose section is not a heading path of
their page (the page's h1-h6 in its main content, in document order) and how many of those are
not under the page's top heading; titles and sections with a permalink sign (¶) or a Markdown
escape (`\\_`); indexed `_sources/` copies whose rendered page is indexed too (duplicate pairs);
known-item search: each sampled page's top heading as the query, is that page the first hit (in
the first 3 pages hit), and each section's own heading (where no other section has it), is the
first hit a chunk of that section (one of the first 3); hybrid, lexical and dense. Comparisons of section paths ignore ¶, backquotes and escapes (so that an
index built by older code is measured on the same footing); the ¶ / escape counts do not.
"""
from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONF = """
project = "semsearch"
extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
myst_heading_anchors = 3
suppress_warnings = ["myst.header", "myst.xref_missing", "misc.highlighting_failure"]
html_theme = "alabaster"
"""


def build(out: Path, sphinx_build: str) -> Path:
    """docs/*.md and README.md as a Sphinx HTML build in out/html."""
    src = Path(tempfile.mkdtemp(prefix="semsearch-docsrc-"))
    try:
        for p in sorted((ROOT / "docs").glob("*.md")):
            shutil.copy(p, src / p.name)
        shutil.copy(ROOT / "README.md", src / "readme.md")
        index = src / "index.md"
        body = index.read_text(encoding="utf-8") if index.exists() else "# semsearch\n"
        pages = sorted(p.stem for p in src.glob("*.md") if p.stem != "index")
        index.write_text(body + "\n\n```{toctree}\n:maxdepth: 2\n\n" + "\n".join(pages) + "\n```\n", encoding="utf-8")
        (src / "conf.py").write_text(CONF, encoding="utf-8")
        html = out / "html"
        if html.exists():
            shutil.rmtree(html)
        subprocess.run([sphinx_build, "-q", "-b", "html", str(src), str(html)], check=True)
    finally:
        shutil.rmtree(src, ignore_errors=True)
    return html


def debian_python_doc(out: Path) -> Path:
    """Debian's python3.X-doc, unpacked: the manual's HTML folder."""
    out.mkdir(parents=True, exist_ok=True)
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    subprocess.run(["apt-get", "download", f"python{ver}-doc"], cwd=out, check=True)
    deb = next(out.glob(f"python{ver}-doc_*.deb"))
    subprocess.run(["dpkg", "-x", str(deb), str(out / "x")], check=True)
    return out / "x" / "usr" / "share" / "doc" / f"python{ver}" / "html"


# ---- the page's own heading tree ----------------------------------------------------------

_ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")


def norm(s: str) -> str:
    """A heading path compared loosely: no ¶, no backquotes, no Markdown escapes, spaces collapsed."""
    s = _ESCAPE.sub(r"\1", s).replace("\u00b6", "").replace("`", "")
    return " > ".join(" ".join(part.split()) for part in s.split(" > "))


def heading_tree(path: Path) -> tuple[set[str], str | None]:
    """(every heading path of the page, normalised; its top heading) from the HTML itself:
    h1-h6 of the main content (Sphinx's role=main, else <main>, <article>, <body>)."""
    from lxml import html as lhtml

    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    tree = lhtml.fromstring(data)
    for a in tree.xpath("//a[contains(concat(' ', normalize-space(@class), ' '), ' headerlink ')]"):
        a.drop_tree()
    main = (tree.xpath("//*[@role='main']") or tree.xpath("//main") or tree.xpath("//article") or tree.xpath("//body") or [tree])[0]
    stack: list[tuple[int, str]] = []
    paths, top = set(), None
    for h in main.iter("h1", "h2", "h3", "h4", "h5", "h6"):
        text = norm(" ".join(h.text_content().split()))
        if not text:
            continue
        level = int(h.tag[1])
        while stack and stack[-1][0] >= level:
            stack.pop()
        stack.append((level, text))
        paths.add(" > ".join(t for _, t in stack))
        top = top or (text if level == 1 else None)
    return paths, top


def source_page(rel: str) -> str | None:
    """The rendered page a `_sources/` copy stands for (`_sources/a/b.rst.txt` -> `a/b.html`)."""
    if "_sources/" not in rel:
        return None
    base, _, inner = rel.partition("_sources/")
    for suf in (".txt", ".rst", ".md"):
        inner = inner[: -len(suf)] if inner.endswith(suf) else inner
    return base + inner + ".html"


def check(html: Path, index: Path, sample: int, seed: int) -> dict:
    from semsearch import Retriever

    html = html.resolve()
    r = Retriever.load(index)
    chunks: dict[str, list[dict]] = {}
    for _, meta, path in r.docs.select("c.metadata, f.path"):
        chunks.setdefault(path, []).append(json.loads(meta) if meta else {})
    rels = {p: Path(p).resolve().relative_to(html).as_posix() for p in chunks if Path(p).resolve().is_relative_to(html)}
    out: dict = {"files": len(chunks), "chunks": sum(map(len, chunks.values())), "pages": 0,
                 "outside_tree": 0, "outside_tree_pages": 0, "not_under_top": 0,
                 "pilcrow": 0, "escapes": 0, "sections": 0}
    tops: dict[str, str] = {}
    for path, metas in chunks.items():
        if not path.endswith((".html", ".htm", ".html.gz")):
            for m in metas:
                for f in ("title", "section"):
                    v = m.get(f) or ""
                    out["pilcrow"] += "\u00b6" in v
                    out["escapes"] += bool(_ESCAPE.search(v))
            continue
        out["pages"] += 1
        tree, top = heading_tree(Path(path))
        if top:
            tops[path] = top
        bad = 0
        for m in metas:
            for f in ("title", "section"):
                v = m.get(f) or ""
                out["pilcrow"] += "\u00b6" in v
                out["escapes"] += bool(_ESCAPE.search(v))
            sec = m.get("section")
            if sec is None:
                continue
            out["sections"] += 1
            if norm(sec) not in tree:
                bad += 1
                out["not_under_top"] += bool(top) and not norm(sec).startswith(top)
        out["outside_tree"] += bad
        out["outside_tree_pages"] += bad > 0
    indexed = set(rels.values())
    out["duplicate_pairs"] = sum(1 for rel in indexed if (pg := source_page(rel)) and (pg in indexed or pg + ".gz" in indexed))
    # known-item: a page's top heading as the query finds that page first (in its first 3 pages)?
    rng = random.Random(seed)
    pages = sorted(tops)
    picked = rng.sample(pages, min(sample, len(pages)))
    for mode in ("hybrid", "lexical", "dense"):
        hits = r.search_batch([tops[p] for p in picked], k=30, mode=mode)
        firsts = [list(dict.fromkeys(h.path for h in row))[:3] for row in hits]
        out[f"known_item_{mode}"] = round(100 * sum(bool(f) and f[0] == p for p, f in zip(picked, firsts)) / max(len(picked), 1), 1)
        out[f"known_item_top3_{mode}"] = round(100 * sum(p in f for p, f in zip(picked, firsts)) / max(len(picked), 1), 1)
    out["known_item_queries"] = len(picked)
    out.update(section_known_item(r, chunks, sample, seed))
    return out


def section_known_item(r, chunks: dict[str, list[dict]], sample: int, seed: int) -> dict:
    """Known-item search by section: a section's own heading (its path's last part, where no
    other section of the corpus has that heading) as the query; is the first hit a chunk of that
    section (or of one under it) of that page? Only sections below a page's top heading."""
    heads: dict[str, list[tuple[str, str]]] = {}
    for path, metas in chunks.items():
        for sec in dict.fromkeys(m.get("section") for m in metas if m.get("section")):
            parts = norm(sec).split(" > ")
            if len(parts) >= 2:
                heads.setdefault(parts[-1].lower(), []).append((path, norm(sec)))
    items = sorted((h, v[0]) for h, v in heads.items() if len(v) == 1 and len({p for p, _ in v}) == 1)
    picked = random.Random(seed).sample(items, min(sample, len(items)))
    out: dict = {"section_queries": len(picked)}
    for mode in ("hybrid", "lexical", "dense"):
        hits = r.search_batch([h for h, _ in picked], k=3, mode=mode)

        def here(h, path, sec):
            s = norm(h.metadata.get("section") or "")
            return h.path == path and (s == sec or s.startswith(sec + " > "))

        out[f"section_top1_{mode}"] = round(100 * sum(bool(row) and here(row[0], *t) for (_, t), row in zip(picked, hits)) / max(len(picked), 1), 1)
        out[f"section_top3_{mode}"] = round(100 * sum(any(here(h, *t) for h in row) for (_, t), row in zip(picked, hits)) / max(len(picked), 1), 1)
    return out


def structure(html: Path) -> dict:
    """The same figures without an index or embeddings (no known-item): the folder walked with
    the default selection, each file extracted and chunked with the bundled model's tokenizer."""
    from semsearch.corpus.chunking import ChunkSettings
    from semsearch.corpus.readers import ReadOptions
    from semsearch.corpus.walk import walk
    from semsearch.encoder import Encoder
    from semsearch.engines.chunks import file_chunks

    enc = Encoder(precision="fp32", device="cpu")
    settings = ChunkSettings(window=enc.max_length - 2)
    html = html.resolve()
    found = walk(html)
    out: dict = {"files": 0, "chunks": 0, "pages": 0, "outside_tree": 0, "outside_tree_pages": 0, "not_under_top": 0,
                 "pilcrow": 0, "escapes": 0, "skipped": dict(found.skipped)}
    indexed = set()
    for f in found.files:
        try:
            metas = [r.metadata for _, rows in file_chunks(f.path, enc.token_offsets, settings, ReadOptions()) for r in rows]
        except Exception as e:  # noqa: BLE001 - a file the reader refuses: counted apart
            out.setdefault("unreadable", []).append(f"{f.path.name}: {e}")
            continue
        rel = f.path.relative_to(html).as_posix()
        indexed.add(rel)
        out["files"] += 1
        out["chunks"] += len(metas)
        is_page = rel.endswith((".html", ".htm", ".html.gz"))
        tree, top = heading_tree(f.path) if is_page else (set(), None)
        out["pages"] += is_page
        bad = 0
        for m in metas:
            for k in ("title", "section"):
                v = m.get(k) or ""
                out["pilcrow"] += "\u00b6" in v
                out["escapes"] += bool(_ESCAPE.search(v))
            sec = m.get("section")
            if is_page and sec is not None and norm(sec) not in tree:
                bad += 1
                out["not_under_top"] += bool(top) and not norm(sec).startswith(top)
        out["outside_tree"] += bad
        out["outside_tree_pages"] += bad > 0
    out["duplicate_pairs"] = sum(1 for rel in indexed if (pg := source_page(rel)) and (pg in indexed or pg + ".gz" in indexed))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="this project's docs as a Sphinx HTML build in OUT/html")
    b.add_argument("out", type=Path)
    b.add_argument("--sphinx-build", default="sphinx-build")
    d = sub.add_parser("debian-python-doc", help="Debian's python3.X-doc package unpacked into OUT")
    d.add_argument("out", type=Path)
    c = sub.add_parser("check", help="figures of an index built from a documentation folder")
    c.add_argument("html", type=Path)
    c.add_argument("--index", type=Path, help="an index built from the folder (else: --structure)")
    c.add_argument("--structure", action="store_true", help="figures without an index: no embedding, no known-item")
    c.add_argument("--sample", type=int, default=220)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.cmd == "build":
        print(build(a.out, a.sphinx_build))
    elif a.cmd == "debian-python-doc":
        print(debian_python_doc(a.out))
    else:
        if a.structure or a.index is None:
            res = structure(a.html)
        else:
            res = check(a.html, a.index, a.sample, a.seed)
        print(json.dumps(res, indent=2) if a.json else "\n".join(f"{k}: {v}" for k, v in res.items()))


if __name__ == "__main__":
    main()
