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
import re
import sqlite3
import urllib.parse
from pathlib import Path
from typing import Any

import numpy as np

from semsearch.errors import IndexFormatError

DB_ERRORS = (sqlite3.Error, UnicodeDecodeError)  # a damaged TEXT value fails to decode
EDGE = 1 << 20  # bytes hashed at each end of a file by the cheap fingerprint
DATA_FILE = re.compile(r"(docs|vectors)\.[0-9]{1,18}\.(sqlite|faiss)")
_ID_MIX = np.uint64(0x9E3779B97F4A7C15)


def remedy(folder: Path) -> str:
    return f"rebuild it with `semsearch index CORPUS --index {folder} --rebuild`"


def damaged(folder: Path, name: str, what: str) -> IndexFormatError:
    return IndexFormatError(f"{Path(folder) / name}: {what}; {remedy(folder)}")


# ---- opening SQLite ----------------------------------------------------------------------------
def sqlite_uri(path: Path, readonly: bool = True) -> str:
    """A `file:` URI for path with every special character (#, ?, %, spaces, unicode) quoted."""
    quoted = urllib.parse.quote(str(Path(path).resolve()), safe="/")
    return f"file:{quoted}" + ("?mode=ro" if readonly else "")


def connect_readonly(path: Path, **kw) -> sqlite3.Connection:
    """A read-only connection that never creates a file (a missing file is an error)."""
    return sqlite3.connect(sqlite_uri(path), uri=True, **kw)


# ---- the manifest's own shape ------------------------------------------------------------------
_TYPES: dict[str, type | tuple[type, ...]] = {
    "model": str, "model_fingerprint": str, "backend": str, "pooling": str, "dim": int, "max_length": int,
    "precision": str, "chunking": dict, "counts": dict, "index": dict, "files": dict, "generation": int,
    "head": (dict, type(None)), "states": (dict, type(None)), "model_files": dict, "last_run": dict,
    "integrity": (dict, type(None)), "created": str, "updated": str, "metric": str, "normalized": bool,
}


def check_manifest(raw: Any, path: Path) -> None:
    """Refuse a manifest whose fields have the wrong types, or whose file names are not plain
    data-file names inside the folder (a crafted '../other/x' or absolute path would be read)."""
    folder = Path(path).parent
    if not isinstance(raw, dict):
        raise damaged(folder, path.name, "damaged manifest (not a JSON object)")
    for key, typ in _TYPES.items():
        if key in raw and (not isinstance(raw[key], typ) or (typ is int and isinstance(raw[key], bool))):
            raise damaged(folder, path.name, f"damaged manifest ({key!r} is {type(raw[key]).__name__})")
    for key, need in (("chunking", {"window", "overlap"}), ("counts", {"files", "documents", "chunks"})):
        if key in raw and not need <= set(raw[key]):
            raise damaged(folder, path.name, f"damaged manifest ({key} lacks {', '.join(sorted(need - set(raw[key])))})")
        for k, v in raw.get(key, {}).items():
            if not isinstance(v, int) or isinstance(v, bool):
                raise damaged(folder, path.name, f"damaged manifest ({key}.{k} is not an integer)")
    index, head, states = raw.get("index", {}), raw.get("head"), raw.get("states")
    if not isinstance(index.get("params", {}), dict):
        raise damaged(folder, path.name, "damaged manifest (index.params is not an object)")
    if head is not None and not (isinstance(head.get("path"), str) and isinstance(head.get("fingerprint"), str)):
        raise damaged(folder, path.name, "damaged manifest (head needs a path and a fingerprint)")
    if states is not None and not (states.get("dtype") == "float16" and isinstance(states.get("dim"), int)
                                   and not isinstance(states.get("dim"), bool) and states["dim"] > 0):
        raise damaged(folder, path.name, "damaged manifest (states needs dtype float16 and a dim)")
    files = raw.get("files", {})
    if set(files) != {"vectors", "docs"}:
        raise damaged(folder, path.name, f"damaged manifest (files {sorted(files)}, expected docs and vectors)")
    for role, name in files.items():
        if role not in ("vectors", "docs") or not isinstance(name, str) or not DATA_FILE.fullmatch(name) \
                or not name.startswith(role + ".") or name.endswith(".sqlite") != (role == "docs"):
            raise damaged(folder, path.name, f"damaged manifest (file {role!r} is {name!r}, not a data file of this folder)")
    rec = raw.get("integrity")
    if rec is not None:
        recs = rec.get("files")
        if not isinstance(recs, dict) or not all(
                isinstance(v, dict) and _is_int(v.get("size")) and isinstance(v.get("fingerprint"), str)
                and isinstance(v.get("sha256"), str) for v in recs.values()) \
                or not _is_int(rec.get("ntotal")) or not isinstance(rec.get("ids"), str) \
                or not set(recs) <= set(raw.get("files", {}).values()):
            raise damaged(folder, path.name, "damaged manifest (integrity records)")
    if raw.get("dim", 1) < 1 or raw.get("max_length", 3) < 3:
        raise damaged(folder, path.name, "damaged manifest (dim or max_length out of range)")
    if raw.get("index", {}).get("type", "flat") not in ("flat", "ivf", "ivf-fastscan", "ivf-sq8", "hnsw"):
        raise damaged(folder, path.name, f"damaged manifest (unknown index type {raw['index'].get('type')!r})")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


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


# ---- durable writes ----------------------------------------------------------------------------
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


# ---- record at commit, check at load -----------------------------------------------------------
def record(folder: Path, files: dict[str, str], vectors) -> dict[str, Any]:
    """The manifest's `integrity` entry for freshly written (and fsynced) data files."""
    out: dict[str, Any] = {"files": {}, "ntotal": int(vectors.ntotal), "ids": ids_fingerprint(faiss_ids(vectors.index))}
    for name in files.values():
        p = Path(folder) / name
        out["files"][name] = {"size": p.stat().st_size, "fingerprint": fingerprint(p), "sha256": sha256(p)}
    return out


def check_files(folder: Path, m) -> None:
    """Before anything parses them: each data file exists with its recorded size and fingerprint."""
    folder = Path(folder)
    rec = (getattr(m, "integrity", None) or {}).get("files", {})
    for role in ("vectors", "docs"):
        name = m.files.get(role)
        if name is None:
            raise damaged(folder, "manifest.json", f"damaged manifest (no {role} file)")
        p = folder / name
        if not p.is_file():
            raise damaged(folder, name, "missing")
        want = rec.get(name)
        if want is None:
            continue  # written before integrity records (still checked by counts below)
        size = p.stat().st_size
        if size != want.get("size"):
            raise damaged(folder, name, f"damaged (size {size}, the manifest records {want.get('size')})")
        if fingerprint(p) != want.get("fingerprint"):
            raise damaged(folder, name, "damaged, or copied from another index (its bytes do not match the manifest)")


def check_loaded(folder: Path, m, vectors, docs) -> None:
    """Cheap agreement of the loaded parts: vector count and id set against the manifest, and
    the docstore's chunk count against both."""
    rec = getattr(m, "integrity", None) or {}
    n = vectors.ntotal
    want = rec.get("ntotal", m.counts.get("chunks"))
    if n != want:
        raise damaged(folder, m.files["vectors"], f"holds {n} vectors, the manifest records {want}")
    if "ids" in rec and ids_fingerprint(faiss_ids(vectors.index)) != rec["ids"]:
        raise damaged(folder, m.files["vectors"], "its ids do not match the manifest (damaged, or from another index)")
    try:
        chunks = docs.db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
    except DB_ERRORS as e:
        raise damaged(folder, m.files["docs"], f"damaged ({e})") from e
    if chunks != n:
        raise damaged(folder, m.files["docs"], f"holds {chunks} chunks but the vector index {n}")


def verify(folder: Path) -> list[str]:
    """Every problem found by reading every byte: full hashes, SQLite's integrity check, and the
    id sets of FAISS and SQLite compared. An empty list: the index is whole."""
    from semsearch.store.folder import open_index

    problems: list[str] = []
    folder = Path(folder)
    try:
        m, vectors, docs = open_index(folder, "cpu")
    except IndexFormatError as e:
        return [str(e)]
    try:
        for name, want in ((m.integrity or {}).get("files") or {}).items():
            if sha256(folder / name) != want.get("sha256"):
                problems.append(str(damaged(folder, name, "damaged (its sha256 does not match the manifest)")))
        try:
            status = [r[0] for r in docs.db.execute("PRAGMA integrity_check")]
            if status != ["ok"]:
                problems.append(str(damaged(folder, m.files["docs"], f"damaged (SQLite: {'; '.join(status[:3])})")))
            db_ids = np.array([r[0] for r in docs.db.execute("SELECT id FROM chunks")], np.int64)
            if ids_fingerprint(db_ids) != ids_fingerprint(faiss_ids(vectors.index)):
                problems.append(str(damaged(folder, m.files["docs"], "its chunk ids differ from the vector index's")))
        except DB_ERRORS as e:
            problems.append(str(damaged(folder, m.files["docs"], f"damaged ({e})")))
    finally:
        docs.close()
    return problems


def manifest_stamp(folder: Path) -> tuple[int, int, int] | None:
    """(inode, size, mtime) of manifest.json: changes whenever a writer publishes a generation."""
    try:
        st = os.stat(Path(folder) / "manifest.json")
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)
