"""Walk a corpus folder: the files to read, and the ones skipped with the reason."""
from __future__ import annotations

import hashlib
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from semsearch.corpus.readers import SUPPORTED_EXTS
from semsearch.errors import InputError


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

    def skip(self, path: Path, reason: str) -> None:
        self.skipped[reason] += 1
        self.examples.setdefault(reason, str(path))


def is_binary(path: Path) -> bool:
    """True for files whose first 8 KiB hold a NUL byte (what git and grep also take as binary)."""
    with open(path, "rb") as fh:
        return b"\0" in fh.read(8192)


def walk(root: Path) -> WalkResult:
    """Every supported, non-hidden, non-binary file under root (or root itself), sorted by path."""
    root = Path(root)
    if not root.exists():
        raise InputError(f"corpus path {str(root)!r} does not exist")
    res = WalkResult()
    root = root.resolve()
    candidates = [root] if root.is_file() else _tree(root, res)
    for p in candidates:
        if p.suffix.lower() not in SUPPORTED_EXTS:
            res.skip(p, f"unsupported type ({p.suffix or 'no extension'})")
            continue
        try:
            st = p.stat()
            if p.suffix.lower() != ".parquet" and is_binary(p):
                res.skip(p, "binary")
                continue
        except OSError as e:
            res.skip(p, f"unreadable ({e.strerror})")
            continue
        res.files.append(SourceFile(p, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
    return res


def _tree(root: Path, res: WalkResult) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for d in [d for d in dirnames if d.startswith(".")]:
            res.skip(Path(dirpath) / d, "hidden")
            dirnames.remove(d)
        dirnames.sort()
        for f in sorted(filenames):
            p = Path(dirpath) / f
            if f.startswith("."):
                res.skip(p, "hidden")
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
