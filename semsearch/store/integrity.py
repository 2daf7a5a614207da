"""Integrity of an index folder: what the manifest records of its data files, and the checks.

At commit the manifest records, for each data file, its size, a cheap fingerprint (sha256 of the
size, the first and the last MiB: the whole file below 2 MiB) and its full sha256, plus the
number of vectors and a fingerprint of their id set. Every load checks sizes, fingerprints,
counts and the id set (milliseconds); `semsearch info --verify` also hashes every byte and runs
SQLite's integrity check. Every failure is an IndexFormatError naming the file and the remedy.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from semsearch.errors import IndexFormatError  # noqa: F401
from semsearch.store.files import DB_ERRORS, damaged

EDGE = 1 << 20  # bytes hashed at each end of a file by the cheap fingerprint
_ID_MIX = np.uint64(0x9E3779B97F4A7C15)


# ---- fingerprints ------------------------------------------------------------------------------
def fingerprint(path: Path) -> str:
    """sha256 of (size, first MiB, last MiB): every byte of a file below 2 MiB."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        h.update(str(size).encode() + b"\0")
        h.update(fh.read(EDGE))
        if size > EDGE:
            fh.seek(max(EDGE, size - EDGE))
            h.update(fh.read(EDGE))
    return h.hexdigest()[:32]


def sha256(path: Path) -> str:
    """sha256 of a file's bytes (the corpus walker's hash; imported here, not at module load,
    to keep the corpus readers off the query start-up path)."""
    from semsearch.corpus.walk import file_hash

    return file_hash(path)


def ids_fingerprint(ids: np.ndarray) -> str:
    """An order-free fingerprint of a set of int64 ids (count, wrapped sum and xor of mixed ids)."""
    mixed = np.ascontiguousarray(ids, np.int64).view(np.uint64) * _ID_MIX
    s = int(mixed.sum(dtype=np.uint64)) if len(mixed) else 0
    x = int(np.bitwise_xor.reduce(mixed)) if len(mixed) else 0
    return f"{len(mixed)}:{s:016x}:{x:016x}"


def faiss_ids(index) -> np.ndarray:
    """Every id held by a faiss index (IDMap types: the id map; IVF types: the inverted lists)."""
    import faiss

    idx = faiss.downcast_index(index)
    if hasattr(idx, "id_map"):
        return faiss.vector_to_array(idx.id_map).astype(np.int64, copy=False)
    try:
        ivf = faiss.extract_index_ivf(idx)
    except RuntimeError:
        return np.arange(idx.ntotal, dtype=np.int64)  # sequential ids (no id map)
    inv, parts = ivf.invlists, []
    for lst in range(inv.nlist):
        n = inv.list_size(lst)
        if n:
            parts.append(faiss.rev_swig_ptr(inv.get_ids(lst), n).astype(np.int64).copy())
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def vector_ids(vectors) -> np.ndarray:
    """Every id a segment's vector index holds: a MatrixIndex's (its vector file's, no faiss),
    else the faiss index's."""
    return vectors.ids if hasattr(type(vectors), "matrix") else faiss_ids(vectors.index)  # the class: no widening of fp16 rows


# ---- record at commit, check at load -----------------------------------------------------------
def file_record(path: Path) -> dict[str, Any]:
    return {"size": path.stat().st_size, "fingerprint": fingerprint(path), "sha256": sha256(path)}


def record(folder: Path, names: list[str], vectors) -> dict[str, Any]:
    """A segment's `integrity` entry for its freshly written (and fsynced) data files."""
    out: dict[str, Any] = {"files": {}, "ntotal": int(vectors.ntotal), "ids": ids_fingerprint(faiss_ids(vectors.index))}
    for name in names:
        out["files"][name] = file_record(Path(folder) / name)
    return out


_CHECKED: dict[tuple, str] = {}  # (path, size, mtime_ns, inode, ctime_ns) -> fingerprint found: data files never change


def check_file(folder: Path, name: str, want: dict | None) -> None:
    """Before anything parses it: a data file exists with its recorded size and fingerprint.
    A file this process has checked already, unchanged since (same size, times and inode), is
    not hashed again: published data files are immutable, and a write opens every segment."""
    p = Path(folder) / name
    try:
        st = p.stat()
    except OSError:
        st = None
    if st is None or not p.is_file():
        raise damaged(folder, name, "missing")
    if want is None:
        return  # written before integrity records (still checked by counts)
    if st.st_size != want.get("size"):
        raise damaged(folder, name, f"damaged (size {st.st_size}, the manifest records {want.get('size')})")
    key = (str(p), st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
    found = _CHECKED.get(key)
    if found is None:
        found = fingerprint(p)
        if len(_CHECKED) > 4096:
            _CHECKED.clear()
        _CHECKED[key] = found
    if found != want.get("fingerprint"):
        raise damaged(folder, name, "damaged, or copied from another index (its bytes do not match the manifest)")


def check_segment_files(folder: Path, entry: dict) -> None:
    """Each data file of a segment exists with its recorded size and fingerprint."""
    rec = (entry.get("integrity") or {}).get("files") or {}
    for role in ("vectors", "vecs", "docs", "postings", "deletes"):
        name = entry.get(role)
        if name:
            check_file(folder, name, rec.get(name))
    for name in entry.get("docs_more") or ():  # (format 8: docstores kept in place by a run's merge)
        check_file(folder, name, rec.get(name))
    for name in entry.get("vecs_more") or ():  # (format 10: vector files kept in place by a run's merge)
        check_file(folder, name, rec.get(name))


def check_files(folder: Path, m) -> None:
    """Every segment's data files (see check_segment_files)."""
    for entry in m.segments:
        check_segment_files(folder, entry)


def check_segment_loaded(folder: Path, entry: dict, vectors, docs) -> None:
    """Agreement of a loaded segment: its vector count against the manifest; where its docstore
    and vector files have no integrity records (written before them), also its id set and the
    docstore's chunk count. Those two read O(N) (every IVF list's ids; SQLite counts by walking a
    whole index: 21 ms warm and 0.45 s cold at 3M chunks), and with records they add nothing that
    check_segment_files() has not already checked: the files' sizes and fingerprints were taken
    after the commit wrote them with those counts and ids, and any write to a SQLite file changes
    its header (within the fingerprint). Damage in the middle of a file larger than 2 MiB is
    `semsearch info --verify`'s to find, as it was for the bytes these checks never read."""
    rec = entry.get("integrity") or {}
    n = vectors.ntotal
    want = rec.get("ntotal", entry.get("rows"))
    if n != want:
        raise damaged(folder, entry["vectors"], f"holds {n} vectors, the manifest records {want}")
    files = rec.get("files") or {}
    if entry["docs"] in files and entry["vectors"] in files and (not entry.get("vecs") or entry["vecs"] in files):
        return
    if "ids" in rec and ids_fingerprint(vector_ids(vectors)) != rec["ids"]:
        raise damaged(folder, entry["vectors"], "its ids do not match the manifest (damaged, or from another index)")
    try:
        chunks = docs.counts()["chunks"]
    except DB_ERRORS as e:
        raise damaged(folder, entry["docs"], f"damaged ({e})") from e
    if chunks != n:
        raise damaged(folder, entry["docs"], f"holds {chunks} chunks but the vector index {n}")
