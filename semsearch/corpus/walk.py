"""Walk a corpus folder: the files to read, and the ones skipped with the reason."""
from __future__ import annotations

import hashlib
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from typing import Iterable

from semsearch.corpus.formats import BINARY_EXTS
from semsearch.corpus.readers import SUPPORTED_EXTS
from semsearch.errors import InputError

IGNORE_FILE = ".semsearchignore"  # in the corpus root, gitignore syntax


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
        candidates = _tree(root, res, *specs, ignore_name=ignore_file)
    for p in candidates:
        if p.suffix.lower() not in SUPPORTED_EXTS:
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


def _tree(root: Path, res: WalkResult, include=None, exclude=None, ignore=None, ignore_name=None) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
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
            else:
                out.append(p)
    return out


def file_hash(path: Path) -> str:
    """sha256 of a file's bytes: the identity used to re-embed only what changed."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
