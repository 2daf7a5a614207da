"""An HTML page as text with its headings, taken from the page's structure.

trafilatura picks the main content (navigation, sidebars and footers dropped) as a small XML
tree (`head`, `p`, `list`/`item`, `table`/`row`/`cell`, `code`, `quote`, `hi`, `lb`). Its
Markdown rendering of that tree escapes punctuation (`object.\\_\\_gt\\_\\_`) and fences any code
element that holds a line break, even one inside a paragraph; re-parsing that Markdown for
headings then took the rest of a page for code (its real headings lost) or took comment lines
of later code blocks for headings. Here the tree is rendered directly: each heading's offset in
the text is known as it is written, code spans stay inline, and nothing is escaped.

Permalink anchors (Sphinx and MkDocs `<a class="headerlink">¶</a>`, anchors whose only text is a
pilcrow or section sign) are removed from the page before extraction: they are not content, and
they ended up in every title and section path of a generated manual.
"""
from __future__ import annotations

import gzip
import re
from dataclasses import dataclass, field
from pathlib import Path

from semsearch.errors import CorpusError, InputError

PERMALINK_SIGNS = {"\u00b6", "\u00a7", "#", "\U0001f517"}  # what a permalink anchor shows: ¶ § # 🔗
PERMALINK_CLASSES = {"headerlink", "anchorjs-link", "hash-link", "header-anchor", "anchor-link"}
MAX_GZ_BYTES = 256 << 20  # a compressed page larger than this once inflated is refused (a gzip bomb)

_WS = re.compile(r"\s+")
_LEVEL = re.compile(r"h([1-6])$")
_INLINE_CODE_TAGS = {"hi", "ref", "del", "span", "sub", "sup"}
_BLOCK_TAGS = {"head", "p", "list", "item", "table", "row", "cell", "code", "quote", "div", "section", "body", "main", "article"}


@dataclass
class Heading:
    offset: int  # where the heading's line starts in the text
    level: int  # 1-6, from h1-h6
    text: str  # plain text: no markup, no permalink sign


@dataclass
class HtmlDoc:
    text: str
    title: str | None
    headings: list[Heading] = field(default_factory=list)


def page_bytes(path: Path) -> bytes:
    """A page's bytes; a gzipped page (`changelog.html.gz`, as Linux distributions ship manuals)
    is inflated, up to MAX_GZ_BYTES."""
    if path.suffix.lower() != ".gz":
        return path.read_bytes()
    try:
        with gzip.open(path, "rb") as fh:
            data = fh.read(MAX_GZ_BYTES + 1)
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise CorpusError(f"{path}: not a readable gzip file ({e})") from e
    if len(data) > MAX_GZ_BYTES:
        raise CorpusError(f"{path}: over {MAX_GZ_BYTES >> 20} MiB once decompressed")
    return data


def is_gz_page(path: Path) -> bool:
    """`x.html.gz`, `x.htm.gz`, `x.xhtml.gz`: a gzipped page (other .gz files are not read)."""
    return path.suffix.lower() == ".gz" and Path(path.stem).suffix.lower() in {".html", ".htm", ".xhtml"}


def clean_heading(text: str) -> str:
    """A heading or title as plain text: whitespace collapsed, permalink signs at its end gone."""
    text = _WS.sub(" ", text).strip()
    while text and text[-1] in "\u00b6\u00a7":
        text = text[:-1].rstrip()
    return text


def strip_permalinks(tree) -> int:
    """Remove permalink anchors from a parsed page (their tail text kept); gives their number."""
    found = []
    for a in tree.iter("a"):
        classes = set((a.get("class") or "").split())
        shown = "".join(a.itertext()).strip()
        href = a.get("href") or ""
        if classes & PERMALINK_CLASSES or (href.startswith("#") and shown in PERMALINK_SIGNS):
            found.append(a)
    for a in found:
        parent = a.getparent()
        if parent is None:
            continue
        tail = a.tail or ""
        prev = a.getprevious()
        if prev is not None:
            prev.tail = (prev.tail or "") + tail
        else:
            parent.text = (parent.text or "") + tail
        parent.remove(a)
    return len(found)


# trafilatura drops a block whose text is a line such as "Email", "PDF", "Print" or "Twitter"
# (share buttons: trafilatura.utils.RE_FILTER); a manual's section headed "email" (the module)
# lost its heading, and its subsections were filed under the section before it. A heading's text
# gets this private-use character at its end before extraction, so no such line matches; _Writer
# takes it out of everything it writes.
_KEEP = "\ue000"


def keep_headings(tree) -> None:
    """Mark every h1-h6 of a parsed page so that trafilatura's share-button filter keeps it."""
    for h in tree.iter("h1", "h2", "h3", "h4", "h5", "h6"):
        if len(h):  # the text up to its first child is what the filter reads (or that child's tail)
            h.text = (h.text or "") + _KEEP
        else:
            h.text = (h.text or "").rstrip() + _KEEP


def read_html(data: bytes, path: Path | str | None = None) -> HtmlDoc:
    """The main content of a page as text (headings as `#` lines, code blocks fenced, list items
    and table rows a line each), its title, and its headings with their offsets. The bytes are
    decoded as the page declares (meta charset), else by detection."""
    try:
        import trafilatura
        from trafilatura.metadata import extract_metadata
        from trafilatura.utils import load_html
    except ImportError as e:  # lxml_html_clean left out by an old pip (see pyproject.toml)
        raise InputError(f"{path}: HTML needs a package that is not installed ({e}); "
                         "run `pip install lxml_html_clean` (or `pip install -U pip` and reinstall semsearch)") from e

    tree = load_html(data)
    if tree is None:
        raise CorpusError(f"{path}: not a readable HTML page")
    strip_permalinks(tree)
    meta = extract_metadata(tree)
    keep_headings(tree)
    title = clean_heading(meta.title or "") or None if meta is not None else None
    doc = trafilatura.bare_extraction(tree, include_formatting=True, include_tables=True, include_comments=False,
                                      include_links=False, include_images=False, with_metadata=False)
    body = getattr(doc, "body", None) if doc is not None else None
    out = _Writer()
    if body is not None:
        out.blocks(body)
    text = out.text()
    if not text:  # nothing the extractor takes for content (a bare list, a tiny page): all its text
        root = tree.find(".//body")
        text = " ".join((root if root is not None else tree).itertext()).replace(_KEEP, "")
        text = re.sub(r"[ \t]*\n\s*", "\n", re.sub(r"[ \t]+", " ", text)).strip()
        return HtmlDoc(text, title)
    if title is None:
        title = next((h.text for h in out.headings if h.level == 1), None)
    return HtmlDoc(text, title, out.headings)


class _Writer:
    """Renders trafilatura's content tree: blocks separated by a blank line, list items and
    table rows by a newline; the offset of each heading recorded as it is written."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.size = 0
        self.last_kind: str | None = None
        self.headings: list[Heading] = []

    def text(self) -> str:
        return "".join(self.parts)

    def emit(self, s: str, kind: str = "p") -> int:
        s = s.replace(_KEEP, "").strip("\n")
        if not s.strip():
            return -1
        if self.parts:
            sep = "\n" if kind == self.last_kind and kind in ("item", "row") else "\n\n"
            self.parts.append(sep)
            self.size += len(sep)
        at = self.size
        self.parts.append(s)
        self.size += len(s)
        self.last_kind = kind
        return at

    # -- block level --------------------------------------------------------------------------

    def blocks(self, el, depth: int = 0) -> None:
        """The children of a container, as blocks; loose text between them as paragraphs."""
        run: list[str] = [_flat(el.text)]
        for child in el:
            if self._is_block(child):
                self.emit(_line(run))
                run = []
                self.block(child, depth)
            else:
                run.append(self.inline(child))
            run.append(_flat(child.tail))
        self.emit(_line(run))

    def block(self, el, depth: int) -> None:
        tag = el.tag
        if tag == "head":
            text = clean_heading(self.inline(el, code_marks=False).replace(_KEEP, ""))
            m = _LEVEL.match(el.get("rend") or "")
            level = int(m.group(1)) if m else 2
            at = self.emit("#" * level + " " + text, "head") if text else -1
            if at >= 0:
                self.headings.append(Heading(at, level, text))
        elif tag == "code":
            code = _code_text(el).strip("\n")
            fence = "```"
            while fence in code:
                fence += "`"
            self.emit(f"{fence}\n{code}\n{fence}", "code")
        elif tag == "list":
            for item in el:
                if item.tag == "item":
                    self.item(item, el.get("rend") or "", depth)
                else:
                    self.block(item, depth) if self._is_block(item) else self.emit(_line([self.inline(item)]), "item")
        elif tag == "table":
            for row in el.iter("row"):
                cells = [_line([self.inline(c, flat=True)]) for c in row if c.tag == "cell"]
                if any(cells):
                    self.emit("| " + " | ".join(cells) + " |", "row")
        elif tag == "p":
            self.emit(_line([self.inline(el)]))
        else:  # quote, div and other containers
            self.blocks(el, depth)

    def item(self, el, rend: str, depth: int) -> None:
        """A list item: its own text a line (bulleted in a bullet list), its blocks after it."""
        marker = "" if (el.get("rend") or "").startswith(("dt", "dd")) or rend == "dl" else "- "
        first = True

        def flush(run: list[str]) -> None:
            nonlocal first
            line = _line(run)
            if line:
                self.emit("  " * depth + marker + line if first else line, "item" if first else "p")
            first = False

        run: list[str] = [_flat(el.text)]
        for child in el:
            if self._is_block(child):
                flush(run)
                run = []
                self.block(child, depth + 1)
            else:
                run.append(self.inline(child))
            run.append(_flat(child.tail))
        flush(run)

    def _is_block(self, el) -> bool:
        if el.tag == "code":  # a code element holding a line break is a block, unless inside a paragraph
            return "\n" in "".join(el.itertext()).strip("\n") or el.find(".//lb") is not None
        return el.tag in _BLOCK_TAGS

    # -- inline -------------------------------------------------------------------------------

    def inline(self, el, code_marks: bool = True, flat: bool = False) -> str:
        """An element's text on one line (or a few, at <br>): markup gone, inline code in
        backquotes (multi-line code inside a paragraph joined onto one line)."""
        if el.tag == "lb":
            return " " if flat else "\n"
        if el.tag in ("graphic",):
            return ""
        if el.tag == "code":
            code = _WS.sub(" ", "".join(el.itertext())).strip()
            return f"`{code}`" if code_marks and code and "`" not in code else code
        parts = [_flat(el.text)]
        for child in el:
            parts.append(self.inline(child, code_marks, flat))
            parts.append(_flat(child.tail))
        s = "".join(parts)
        if el.tag in ("p", "item", "cell", "head", "quote", "list", "row", "table", "div"):
            s = f" {s} "  # a block flattened into a line keeps a space on either side
        return s


def _code_text(el) -> str:
    """A code block's text with <lb/> as line breaks."""
    parts = [el.text or ""]
    for child in el:
        parts.append("\n" if child.tag == "lb" else _code_text(child))
        parts.append(child.tail or "")
    return "".join(parts)


def _flat(s: str | None) -> str:
    """Source text as a browser lays it out: a run of whitespace (line breaks too) is one space."""
    return _WS.sub(" ", s) if s else ""


def _line(run: list[str]) -> str:
    """Inline pieces (whitespace already flattened) as text; the line breaks left are <br>s."""
    s = "".join(run)
    return "\n".join(" ".join(ln.split()) for ln in s.split("\n") if ln.strip())
