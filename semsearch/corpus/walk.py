"""Walk a corpus folder: the files to read, and the ones skipped with the reason."""
from __future__ import annotations

import hashlib
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from typing import Iterable

from semsearch.corpus.formats import BINARY_EXTS, GZ_EXTS, HTML_EXTS
from semsearch.corpus.readers import SUPPORTED_EXTS
from semsearch.errors import InputError

IGNORE_FILE = ".semsearchignore"  # in the corpus root, gitignore syntax

# A documentation build folder (Sphinx: `_sources/`, `searchindex.js` or `objects.inv` beside the
# pages; MkDocs: `search/search_index.json` beside `sitemap.xml`) also holds copies of every
# page's source and the generator's own search and index pages. Indexed with the pages they
# doubled every hit. Left out by default (reasons below, all "excluded": the summary counts them
# and lists them after what could not be read); an --include naming them takes them back.
SPHINX_MARKERS = ("_sources", "searchindex.js", "objects.inv")
SOURCE_COPY = "excluded (doc build: source copy of a rendered page)"
GENERATED = "excluded (doc build: search or index page)"
THEME = "excluded (doc build: theme and script files)"
ARTEFACT_NAMES = ("_sources", "_static", "searchindex", "search_index", "objects.inv", "genindex", "modindex",
                  "search.html", "404.html")
_SOURCE_SUFFIXES = (".rst", ".md", ".txt", ".ipynb", ".markdown")


@dataclass
class SourceFile:
    path: Path  # absolute
    size: int
    mtime_ns: int
    ctime_ns: int = 0  # changes on every write, even when mtime is restored (cp -p, rsync -t, tar)
    inode: int = 0


@dataclass
class WalkResult:
    files: list[SourceFile] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)  # reason -> count
    examples: dict[str, str] = field(default_factory=dict)  # reason -> one path
    skipped_paths: list[tuple[str, str]] = field(default_factory=list)  # (path, reason), every one

    def skip(self, path: Path, reason: str) -> None:
        self.skipped[reason] += 1
        self.examples.setdefault(reason, str(path))
        self.skipped_paths.append((str(path), reason))


def is_binary(path: Path) -> bool:
    """True for files whose first 8 KiB hold a NUL byte (what git and grep also take as binary)."""
    with open(path, "rb") as fh:
        return b"\0" in fh.read(8192)


@dataclass
class Selection:
    """Which files of a folder to take: --include / --exclude globs and the root's ignore file,
    all in gitignore syntax relative to the corpus root (`*.html` at any depth, `docs/**/*.html`,
    `/build/` only at the top; a later `!pattern` in the ignore file takes a file back)."""

    include: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    ignore_file: str | None = IGNORE_FILE

    def compile(self, root: Path):
        import pathspec

        def spec(lines: Iterable[str], what: str):
            try:
                return pathspec.GitIgnoreSpec.from_lines(list(lines))
            except Exception as e:  # noqa: BLE001 - pathspec raises several types for a bad pattern
                raise InputError(f"bad pattern in {what}: {e}") from e

        ignore = None
        if self.ignore_file and (root / self.ignore_file).is_file():
            try:
                ignore = spec((root / self.ignore_file).read_text(encoding="utf-8-sig").splitlines(), str(root / self.ignore_file))
            except (OSError, UnicodeDecodeError) as e:
                raise InputError(f"cannot read {root / self.ignore_file}: {e}") from e
        inc = spec(self.include, "--include") if self.include else None
        exc = spec(self.exclude, "--exclude") if self.exclude else None
        return inc, exc, ignore


def walk(root: Path, include: Iterable[str] = (), exclude: Iterable[str] = (), ignore_file: str | None = IGNORE_FILE) -> WalkResult:
    """Every supported, non-hidden, non-binary file under root (or root itself), sorted by path.
    In a folder, `include` globs (any of) choose files, `exclude` globs and the ignore file in
    the root (`.semsearchignore`, gitignore syntax) leave files out; a named file is always read."""
    root = Path(root)
    if not root.exists():
        raise InputError(f"corpus path {str(root)!r} does not exist")
    res = WalkResult()
    root = root.resolve()
    if root.is_file():
        candidates = [root]
    else:
        specs = Selection(list(include), list(exclude), ignore_file).compile(root)
        named = [g for g in include if any(n in g for n in ARTEFACT_NAMES)]
        keep = Selection(named, ignore_file=None).compile(root)[0] if named else None
        candidates = _tree(root, res, *specs, ignore_name=ignore_file, keep_artefacts=keep)
    for p in candidates:
        if p.suffix.lower() not in SUPPORTED_EXTS or (p.suffix.lower() in GZ_EXTS and Path(p.stem).suffix.lower() not in HTML_EXTS):
            res.skip(p, f"unsupported type ({p.suffix or 'no extension'})")
            continue
        try:
            st = p.stat()
            if p.suffix.lower() not in BINARY_EXTS | {".parquet"} and is_binary(p):
                res.skip(p, "binary")
                continue
        except OSError as e:
            res.skip(p, f"unreadable ({e.strerror})")
            continue
        res.files.append(SourceFile(p, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
    return res


def _tree(root: Path, res: WalkResult, include=None, exclude=None, ignore=None, ignore_name=None,
          keep_artefacts=None) -> list[Path]:
    out = []
    builds: list[tuple[str, str]] = []  # (folder relative to root, "sphinx" | "mkdocs") of doc builds met
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        kind = _build_kind(dirnames, filenames, Path(dirpath))
        if kind:
            builds.append((rel_dir, kind))
        for d in sorted(dirnames):
            if d.startswith("."):
                res.skip(Path(dirpath) / d, "hidden")
                dirnames.remove(d)
            elif ignore is not None and ignore.match_file(rel_dir + d + "/"):
                res.skip(Path(dirpath) / d, f"ignored ({ignore_name})")
                dirnames.remove(d)
            elif exclude is not None and exclude.match_file(rel_dir + d + "/"):
                res.skip(Path(dirpath) / d, "excluded (--exclude)")
                dirnames.remove(d)
        dirnames.sort()
        for f in sorted(filenames):
            p = Path(dirpath) / f
            rel = rel_dir + f
            if f.startswith("."):
                res.skip(p, "hidden")
            elif ignore is not None and ignore.match_file(rel):
                res.skip(p, f"ignored ({ignore_name})")
            elif exclude is not None and exclude.match_file(rel):
                res.skip(p, "excluded (--exclude)")
            elif include is not None and not include.match_file(rel):
                res.skip(p, "not included (--include)")
            elif not p.is_file():
                res.skip(p, "not a regular file")
            elif (why := _artefact(root, rel, builds)) and not (keep_artefacts is not None and keep_artefacts.match_file(rel)):
                res.skip(p, why)
            else:
                out.append(p)
    return out


def _build_kind(dirnames: list[str], filenames: list[str], folder: Path) -> str | None:
    """'sphinx' or 'mkdocs' where a folder is the root of a documentation build with its pages."""
    pages = any(f.lower().endswith((".html", ".html.gz")) for f in filenames)
    if pages and ("_sources" in dirnames or "searchindex.js" in filenames or "objects.inv" in filenames):
        return "sphinx"
    if pages and "sitemap.xml" in filenames and (folder / "search" / "search_index.json").is_file():
        return "mkdocs"
    return None


def _artefact(root: Path, rel: str, builds: list[tuple[str, str]]) -> str | None:
    """The reason a file of a documentation build is left out by default, or None."""
    for base, kind in reversed(builds):  # the innermost build folder holding the file
        if not rel.startswith(base):
            continue
        inner = rel[len(base):]
        top, _, rest = inner.partition("/")
        name = inner.rsplit("/", 1)[-1].lower()
        if kind == "mkdocs":
            if inner == "search/search_index.json" or inner in ("404.html", "sitemap.xml"):
                return GENERATED
            return None
        if top == "_sources" and rest:
            return SOURCE_COPY if _page_of_source(root / base, rest) else None
        if top == "_static" and rest:
            return THEME
        if inner in ("searchindex.js", "objects.inv", "search.html") or (
                "/" not in inner and name.startswith("genindex") and name.endswith(".html")) or (
                "/" not in inner and name.endswith("modindex.html")):
            return GENERATED
        return None
    return None


def _page_of_source(build: Path, rel: str) -> bool:
    """Whether `_sources/<rel>` (Sphinx's copy of a page's source: `intro.rst.txt`, or `intro.txt`
    from older versions) has its rendered page (`intro.html`, or `intro.html.gz`) in the build."""
    stem = rel
    for _ in range(2):  # intro.rst.txt -> intro.rst -> intro
        for suf in _SOURCE_SUFFIXES:
            if stem.lower().endswith(suf):
                stem = stem[: -len(suf)]
                break
        for ext in (".html", ".html.gz", ".htm"):
            if (build / (stem + ext)).is_file():
                return True
    return False


def file_hash(path: Path) -> str:
    """sha256 of a file's bytes: the identity used to re-embed only what changed."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
