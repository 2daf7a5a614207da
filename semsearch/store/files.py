"""The index folder's files at the lowest level: naming, opening SQLite safely, durable writes,
and the messages that name a damaged file. Every other module of the store builds on this one."""
from __future__ import annotations

import os
import re
import threading
import sqlite3
import urllib.parse
from pathlib import Path

from semsearch.errors import IndexFormatError
from typing import Any

DB_ERRORS = (sqlite3.Error, UnicodeDecodeError)  # a damaged TEXT value fails to decode
DATA_FILE = re.compile(r"(docs|vectors)\.[0-9]{1,18}\.(sqlite|faiss|vec)|vectors\.[0-9]{1,18}\.[0-9]{1,18}\.vec"
                       r"|(del\.[0-9]{1,18}|lexical)\.[0-9]{1,18}\.bin")


def remedy(folder: Path) -> str:
    return f"rebuild it with `semsearch index CORPUS --index {folder} --rebuild`"


def damaged(folder: Path, name: str, what: str) -> IndexFormatError:
    return IndexFormatError(f"{Path(folder) / name}: {what}; {remedy(folder)}")


def sqlite_uri(path: Path, readonly: bool = True) -> str:
    """A `file:` URI for path with every special character (#, ?, %, spaces, unicode) quoted."""
    quoted = urllib.parse.quote(str(Path(path).resolve()), safe="/")
    return f"file:{quoted}" + ("?mode=ro" if readonly else "")


def connect_readonly(path: Path, **kw) -> sqlite3.Connection:
    """A read-only connection that never creates a file (a missing file is an error)."""
    return sqlite3.connect(sqlite_uri(path), uri=True, **kw)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(folder: Path) -> None:
    """Make renames and new files in folder durable (a power loss, not only a crash)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return  # platforms without directory file descriptors
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def manifest_stamp(folder: Path) -> tuple[int, int, int] | None:
    """(inode, size, mtime) of manifest.json: changes whenever a writer publishes a generation."""
    try:
        st = os.stat(Path(folder) / "manifest.json")
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class Memo:
    """Values computed once per key and kept (for what is derived from immutable data files);
    safe from many threads: a key is built once however many ask at once."""

    def __init__(self):
        self._values: dict[Any, Any] = {}
        self._lock = threading.Lock()

    def __call__(self, key: Any, build):
        try:
            return self._values[key]
        except KeyError:
            pass
        with self._lock:
            if key not in self._values:
                self._values[key] = build()
            return self._values[key]


def unmap_pages(m) -> None:
    """Drop this process's mapping of the pages of the read-only map `m` that it has touched
    (madvise DONTNEED; None, or a platform without it: nothing). They stay in the page cache, and
    a later read faults them back in; for a file that never changes it finds the same bytes, so
    readers in other threads are unaffected. What a sweep over a whole file calls as it goes:
    otherwise the file ends up resident in the process, counted in its RSS."""
    import mmap

    if m is not None and hasattr(m, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        m.madvise(mmap.MADV_DONTNEED)
