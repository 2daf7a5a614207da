"""Documentation folders as generators build them (Sphinx): sections from the pages' own heading
structure, no permalink marks or Markdown escapes, the generator's copies and index pages left out
by default (and said so), gzipped pages read."""
from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from lxml import html as lhtml

from semsearch.corpus.formats import extract
from semsearch.corpus.walk import GENERATED, SOURCE_COPY, THEME, walk
from semsearch.formatting import skipped_lines
from semsearch.indexing import index_corpus
from semsearch.search import Retriever

ROOT = Path(__file__).resolve().parents[1]
ESCAPE = re.compile(r"\\[!-/:-@\[-`{-~]")
PARA = ("The widget controller reads its settings once at start and keeps them for the whole run, "
        "so a change to the configuration file needs a restart of the service to take effect. ")


def sphinx_page(title: str, body: str) -> str:
    """A page as Sphinx's classic theme writes it: related bar, main body with headerlink
    anchors, sidebar with its own headings, footer."""
    def h(level: int, text: str, anchor: str) -> str:
        return f'<h{level}>{text}<a class="headerlink" href="#{anchor}" title="Link to this heading">\u00b6</a></h{level}>'

    body = re.sub(r"<h(\d) id=\"([^\"]+)\">(.*?)</h\1>", lambda m: h(int(m.group(1)), m.group(3), m.group(2)), body)
    return (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{title} \u2014 Demo 1.0 documentation</title></head><body>'
            '<div class="related" role="navigation" aria-label="Related"><h3>Navigation</h3><ul>'
            '<li><a href="genindex.html">index</a></li><li><a href="py-modindex.html">modules</a></li></ul></div>'
            f'<div class="document"><div class="documentwrapper"><div class="body" role="main">{body}</div></div>'
            '<div class="sphinxsidebar" role="navigation"><h3>Table of Contents</h3><ul><li><a href="#">Widgets</a></li></ul>'
            '<h3>This Page</h3><ul><li><a href="_sources/index.rst.txt">Show Source</a></li></ul></div></div>'
            '<div class="footer">\u00a9 Copyright 2024, Demo team. Created using Sphinx.</div></body></html>')


# A multi-line inline code span opens before later headings (trafilatura's Markdown fenced it
# mid-line and the re-parse lost every later heading), and code blocks hold comment lines
# that look like headings.
WIDGETS = sphinx_page("Widgets", (
    '<section id="widgets"><h1 id="widgets">Widgets</h1>'
    f'<p>{PARA}Compare with <code class="docutils literal notranslate"><span class="pre">object.__gt__</span></code> '
    'and the setting <code>first_line\n# not a heading\nsecond_line</code> that spans lines.</p>'
    f'<p>{PARA * 2}</p>'
    '<section id="setup"><h2 id="setup">Setting up <code class="docutils literal"><span class="pre">widget_conf</span></code></h2>'
    f'<p>{PARA * 3}</p>'
    '<div class="highlight-bash"><div class="highlight"><pre># install the widget tools\npip install widgets\n'
    '## a second comment\nwidgets --init\n</pre></div></div>'
    f'<p>{PARA}</p>'
    '<section id="calibration"><h3 id="calibration">Calibration</h3>'
    f'<p>Turn the dial of the calibration unit until the needle rests on zero. {PARA * 2}</p></section></section>'
    '<section id="usage"><h2 id="usage">Usage</h2>'
    f'<p>Call the widget with its name and a timeout in seconds. {PARA * 2}</p>'
    '<dl class="py method"><dt class="sig sig-object py" id="Widget.run"><span class="sig-name">Widget.run</span>'
    '(<em>timeout</em>)<a class="headerlink" href="#Widget.run" title="Link to this definition">\u00b6</a></dt>'
    f'<dd><p>Run the widget. {PARA}</p></dd></dl></section></section>'))

GUIDE = sphinx_page("Installation guide", (
    '<section id="installation-guide"><h1 id="installation-guide">Installation guide</h1>'
    f'<p>Unpack the archive into a folder of its own. {PARA * 2}</p>'
    '<section id="requirements"><h2 id="requirements">Requirements</h2>'
    f'<p>A machine with two cores and four gigabytes of memory. {PARA * 2}</p></section></section>'))

CHANGELOG = sphinx_page("Changelog", (
    '<section id="changelog"><h1 id="changelog">Changelog</h1>'
    '<section id="v1"><h2 id="v1">Version 1.0</h2>'
    f'<p>The zeppelin mooring module was rewritten for the harbour release. {PARA * 2}</p></section></section>'))


def heading_paths(page: bytes) -> tuple[set[str], str]:
    """Every heading path of a page's main content (the page's own h1-h6, in order), its top."""
    tree = lhtml.fromstring(page)
    for a in tree.xpath("//a[@class='headerlink']"):
        a.drop_tree()
    main = tree.xpath("//*[@role='main']")[0]
    stack: list[tuple[int, str]] = []
    paths = set()
    for h in main.iter("h1", "h2", "h3", "h4", "h5", "h6"):
        level = int(h.tag[1])
        while stack and stack[-1][0] >= level:
            stack.pop()
        stack.append((level, " ".join(h.text_content().split())))
        paths.add(" > ".join(t for _, t in stack))
    return paths, stack[0][1] if stack else ""


def doc_build(root: Path) -> Path:
    """A Sphinx build folder: pages, their _sources/ copies, theme files, search and index pages,
    a gzipped page, and one source copy whose page is not there."""
    files = {
        "index.html": WIDGETS, "guide/install.html": GUIDE,
        "_sources/index.rst.txt": "Widgets\n=======\n\n" + PARA, "_sources/guide/install.rst.txt": "Installation guide\n" + PARA,
        "_sources/whatsnew/changelog.rst.txt": "Changelog\n" + PARA, "_sources/orphan.rst.txt": "Orphan notes\n" + PARA,
        "_static/doctools.js": "var x = 1;", "_static/glossary.json": json.dumps({"widget": "a small gadget " * 5}),
        "_static/notes.txt": "theme notes", "searchindex.js": "Search.setIndex({})", "objects.inv": "# Sphinx inventory",
        "genindex.html": sphinx_page("Index", "<h1 id='index'>Index</h1><p>A | B</p>"),
        "genindex-A.html": sphinx_page("Index A", "<h1 id='index'>Index A</h1><p>A</p>"),
        "py-modindex.html": sphinx_page("Modules", "<h1 id='m'>Python Module Index</h1><p>widgets</p>"),
        "search.html": sphinx_page("Search", "<h1 id='s'>Search</h1><p>Please activate JavaScript.</p>"),
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    (root / "whatsnew").mkdir()
    (root / "whatsnew" / "changelog.html.gz").write_bytes(gzip.compress(CHANGELOG.encode("utf-8")))
    (root / "whatsnew" / "notes.txt.gz").write_bytes(gzip.compress(b"not a page"))
    return root


def check_chunks(index: Path, root: Path, encoder, text_too: bool = True) -> int:
    """Every chunk of every page: its section a heading path of its page, under the page's top
    heading; no permalink sign or Markdown escape in title, section (and, with text_too, text).
    Gives the number of chunks checked."""
    r = Retriever.load(index, encoder=encoder)
    n = 0
    trees: dict[str, tuple[set[str], str]] = {}
    for _, meta, path, text in r.docs.select("c.metadata, f.path, c.text"):
        if not path.endswith((".html", ".html.gz")):
            continue
        if path not in trees:
            data = Path(path).read_bytes()
            trees[path] = heading_paths(gzip.decompress(data) if path.endswith(".gz") else data)
        tree, top = trees[path]
        m = json.loads(meta) if meta else {}
        sec, title = m.get("section"), m.get("title") or ""
        assert sec is None or (sec in tree and sec.split(" > ")[0] == top), (path, sec)
        for v in (title, sec or ""):
            assert "\u00b6" not in v and not ESCAPE.search(v) and "`" not in v, (path, v)
        assert not text_too or ("\u00b6" not in text and "\\_" not in text), (path, text[:200])
        n += 1
    return n


def test_sections_come_from_the_page_structure_not_a_markdown_reparse(tmp_path):
    p = tmp_path / "widgets.html"
    p.write_text(WIDGETS, encoding="utf-8")
    ex = extract(p)
    text = "".join(ex.blocks)
    tree, top = heading_paths(WIDGETS.encode())
    assert ex.marks.title == "Widgets" and top == "Widgets"
    assert ex.marks.paths == ["Widgets", "Widgets > Setting up widget_conf", "Widgets > Setting up widget_conf > Calibration",
                              "Widgets > Usage"]
    assert set(ex.marks.paths) <= tree
    # the later headings are found after the multi-line inline code, and at the right places
    for off, path in zip(ex.marks.headings, ex.marks.paths):
        assert text[off:].startswith("#" * (path.count(" > ") + 1) + " " + path.split(" > ")[-1])
    i = text.index("Turn the dial")
    assert ex.marks.locate(i, i + 20)["section"] == "Widgets > Setting up widget_conf > Calibration"
    i = text.index("Run the widget")
    assert ex.marks.locate(i, i + 20)["section"] == "Widgets > Usage"
    # comment lines of code blocks are code, not sections; the inline code stays on its line
    j = text.index("# install the widget tools")
    assert ex.marks.locate(j, j + 10)["section"] == "Widgets > Setting up widget_conf"
    assert "`first_line # not a heading second_line`" in text and "```\n# install the widget tools\n" in text
    # no permalink marks, no Markdown escapes, no navigation or sidebar headings
    assert "\u00b6" not in text and "object.__gt__" in text and "\\_" not in text
    for junk in ("Table of Contents", "This Page", "Created using Sphinx"):
        assert junk not in text
    assert "Widget.run(timeout)" in text


def test_headings_named_like_share_buttons_are_kept(tmp_path):
    # trafilatura drops a line reading "Email", "PDF" or "Print" (share buttons): a manual's
    # sections on the email module or on printing lost their headings, and their subsections
    # were filed under the section before them
    page = sphinx_page("Modules", (
        '<section id="modules"><h1 id="modules">Modules</h1>'
        f'<section id="decimal"><h2 id="decimal">decimal</h2><p>{PARA}</p></section>'
        '<section id="email"><span id="new-email"></span><h2 id="email">email</h2>'
        f'<section id="policy"><h3 id="policy">Policy Framework</h3><p>The policy object of the mail package. {PARA}</p></section></section>'
        f'<section id="pdf"><h2 id="pdf">PDF</h2><p>Pages are written as portable documents. {PARA}</p></section>'
        f'<section id="print"><h2 id="print"><code>print</code></h2><p>Write text to the console. {PARA}</p></section></section>'))
    p = tmp_path / "modules.html"
    p.write_text(page, encoding="utf-8")
    ex = extract(p)
    text = "".join(ex.blocks)
    tree, _ = heading_paths(page.encode())
    assert ex.marks.paths == ["Modules", "Modules > decimal", "Modules > email", "Modules > email > Policy Framework",
                              "Modules > PDF", "Modules > print"]
    assert set(ex.marks.paths) <= tree
    i = text.index("The policy object")
    assert ex.marks.locate(i, i + 10)["section"] == "Modules > email > Policy Framework"
    i = text.index("Pages are written")
    assert ex.marks.locate(i, i + 10)["section"] == "Modules > PDF"
    assert "\ue000" not in text and "## email\n" in text


def test_a_doc_build_is_indexed_once_with_what_was_left_out_said(tmp_path, fake_encoder):
    root = doc_build(tmp_path / "html")
    rep = index_corpus(root, tmp_path / "idx", fake_encoder, progress=False)
    r = Retriever.load(tmp_path / "idx", encoder=fake_encoder)
    indexed = sorted(Path(p).relative_to(root).as_posix() for _, p in r.docs.select("f.path"))
    assert sorted(set(indexed)) == ["_sources/orphan.rst.txt", "guide/install.html", "index.html", "whatsnew/changelog.html.gz"]
    assert rep.skipped[SOURCE_COPY] == 3  # the copies of index, install and the gzipped changelog
    assert rep.skipped[GENERATED] == 6  # searchindex.js, objects.inv, genindex, genindex-A, py-modindex, search
    assert rep.skipped[THEME] == 3
    assert rep.skipped["unsupported type (.gz)"] == 1  # a .gz that is not a page
    lines = "\n".join(skipped_lines(rep, shown=100))
    assert f"skipped 3 file(s): {SOURCE_COPY}" in lines and "_sources/index.rst.txt" in lines
    assert f"skipped 6 file(s): {GENERATED}" in lines and "genindex-A.html" in lines
    # the gzipped page is read, with its sections
    hit = r.search("zeppelin mooring module harbour release", k=1, mode="lexical")[0]
    assert hit.source.endswith("changelog.html.gz") and hit.metadata["section"] == "Changelog > Version 1.0"
    assert check_chunks(tmp_path / "idx", root, fake_encoder) >= 6


def test_an_include_that_names_the_artefacts_takes_them_back(tmp_path, fake_encoder):
    root = doc_build(tmp_path / "html")
    res = walk(root, include=["*.html", "_sources/"])
    names = {f.path.relative_to(root).as_posix() for f in res.files}
    assert {"_sources/index.rst.txt", "_sources/guide/install.rst.txt", "index.html"} <= names
    assert "genindex.html" not in names and res.skipped[GENERATED] == 4  # *.html does not name them
    res = walk(root, include=["*.html"])
    assert not any(n.startswith("_sources/") for n in (f.path.relative_to(root).as_posix() for f in res.files))
    assert "genindex.html" in {f.path.name for f in walk(root, include=["genindex*.html"]).files}
    # a user's own --exclude still wins and is reported as theirs
    res = walk(root, exclude=["_sources/"])
    assert res.skipped["excluded (--exclude)"] == 1 and SOURCE_COPY not in res.skipped


def test_a_folder_that_is_not_a_doc_build_loses_nothing(tmp_path):
    root = tmp_path / "notes"
    for rel in ["_static/b.txt", "genindex.html", "search.html", "objects/inv.txt"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("<p>" + PARA + "</p>" if rel.endswith(".html") else PARA)
    # pages named like a generator's, but no _sources/, searchindex.js or objects.inv beside them
    res = walk(root)
    assert len(res.files) == 4 and not any(r.startswith("excluded") for r in res.skipped)


def test_titles_and_sections_of_a_built_sphinx_manual(tmp_path, fake_encoder):
    """This project's docs built by Sphinx (when a sphinx-build is at hand: $SPHINX_BUILD or on
    PATH), indexed as a folder: every chunk's section in its page's heading tree, no ¶ or escape,
    no source copy indexed."""
    sphinx = os.environ.get("SPHINX_BUILD") or shutil.which("sphinx-build")
    if not sphinx:
        pytest.skip("no sphinx-build (set SPHINX_BUILD, e.g. a venv with sphinx and myst-parser)")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_doc_corpus.py"), "build", str(tmp_path / "out"),
                          "--sphinx-build", sphinx], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"Sphinx build failed (myst-parser missing?): {out.stderr[-300:]}")
    html = tmp_path / "out" / "html"
    rep = index_corpus(html, tmp_path / "idx", fake_encoder, progress=False)
    pages = {p.relative_to(html).as_posix() for p in html.rglob("*.html")} - {"genindex.html", "search.html"}
    r = Retriever.load(tmp_path / "idx", encoder=fake_encoder)
    indexed = {Path(p).relative_to(html).as_posix() for _, p in r.docs.select("f.path")}
    assert indexed == pages and rep.skipped[SOURCE_COPY] == len(pages)
    # (text not checked for ¶: docs/formats.md writes one as content)
    assert check_chunks(tmp_path / "idx", html, fake_encoder, text_too=False) > 3 * len(pages)
