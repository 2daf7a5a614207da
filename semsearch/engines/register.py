"""Registering a file's result in the docstore and vector index: the step every engine shares
(the streaming local path in indexing.py and the shards driver in engines/build.py)."""
from __future__ import annotations

from pathlib import Path

from semsearch.store.folder import now


def same_stat(old, f) -> bool:
    """Whether a stored file's size, mtime, ctime and inode all match (0: not recorded): trust
    it without hashing, as git does."""
    return (old.size == f.size and old.mtime_ns == f.mtime_ns and old.ctime_ns == f.ctime_ns and old.inode == f.inode
            and old.ctime_ns != 0)


def replace_file(writer, f, old, digest: str, report) -> int:
    """Register file f (a walked file) with hash `digest` in place of its stored version `old`
    (None: new), counting it as added or updated; gives back its new file id."""
    store = writer.docs
    if old is not None:
        writer.vectors.remove(store.remove_file(old.id))
        report.updated += 1
    else:
        report.added += 1
    return store.add_file(str(f.path), digest, f.size, f.mtime_ns, now(), f.ctime_ns, f.inode)


def drop_file(writer, old, report) -> None:
    """Remove a stored file and its chunks (its source is gone, or no longer readable)."""
    writer.vectors.remove(writer.docs.remove_file(old.id))
    report.removed += 1


def drop_gone(writer, stored: dict, seen: set[str], root: Path, report) -> None:
    """Remove the stored files under corpus folder `root` that the walk no longer found."""
    prefix = str(root) if root.is_dir() else None
    for key, old in stored.items():
        if key not in seen and prefix is not None and key.startswith(prefix.rstrip("/") + "/"):
            drop_file(writer, old, report)
