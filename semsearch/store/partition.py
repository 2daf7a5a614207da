"""Partitions of an index by document: `semsearch index --shards N`.

A document is routed to partition hash(key) mod N, a stable hash of its key: a whole-file
document's key is its path (a corpus file, or an API document: the pseudo-file `api:<id>`); a
record of a file of records (a JSONL line, a CSV or Parquet row: its chunks carry `row`) is a
document of its own, keyed by path and row, so a corpus of a few huge JSONL files spreads as
evenly as one of many small files (the unit of Elasticsearch's routing is the document too). Every
chunk of a document is in one partition, and a partition is a complete index of its documents.

A file whose records fall in several partitions has its file row in each of them (its chunks'
path and metadata are read beside them) and in its home partition, hash(path) mod N, always: the
home row is the one that counts the file (`files` of a segment entry counts home rows), and
`documents` of each row is the records counted there (those with chunks there; the home also
counts the file's records that made no chunk), so the index's counts are an unpartitioned
index's. Deleting or replacing such a file tombstones it in every segment that holds it
(store/folder.py WriteStore). Such an index is format 9 (store/manifest.py): an older writer would
delete it from one partition only.

Each segment holds one partition's documents and says which (`part` in its manifest entry); a
shard server owns whole partitions (shards.assign), so N shards hold about 1/N of the chunks each
whatever the index's number of segments.

Writes stay as they are: a write's new segment holds whatever documents it wrote. At commit a
segment that holds documents of several partitions is split: for each of its partitions the
existing merge copies it with tombstones that name the other partitions' files and chunks
(store/merge.py skips tombstoned rows in the docstore, the vector file and the posting file), so
no new copying code exists. Chunk ids do not change, so after a split a partition's segments hold
ids interleaved with the other partitions' (segments.py finds a chunk's segment by each
partition's id ranges, then by the segment's sorted ids). The merge policy then runs within each
partition, so merging never undoes the split.
"""
from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from semsearch.store.docstore import docs_files
from semsearch.store.segments import Tombstones, partitioned


def part_of(path: str, n: int) -> int:
    """The partition of the document stored at docstore path `path` among n: stable across
    processes, machines and Python versions (blake2b, not hash())."""
    if n <= 1:
        return 0
    digest = hashlib.blake2b(path.encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % n


def key_of(path: str, row: int | None) -> str:
    """The routing key of a document: its file's path, or path and row for a record of a file of
    records (a NUL cannot occur in a path)."""
    return path if row is None else f"{path}\x00{row}"


def chunk_parts(paths: list[str], homes: np.ndarray, file_at: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    """The partition of each chunk: its file's (`homes[file_at]`), or its record's where its row
    (`rows`, -1 for none) is set; one hash a record, not a chunk."""
    out = homes[file_at].astype(np.int64) if len(file_at) else np.zeros(0, np.int64)
    rec = np.flatnonzero(rows >= 0)
    if len(rec) and n > 1:
        pairs, inverse = np.unique(np.stack([file_at[rec], rows[rec]], 1), axis=0, return_inverse=True)
        got = np.array([part_of(key_of(paths[f], int(r)), n) for f, r in pairs.tolist()], np.int64)
        out[rec] = got[inverse.reshape(-1)]
    return out


@dataclass
class Share:
    """One partition's part of a segment: its live file ids (a file with records here, or at
    home here), its live chunk ids, and the documents each of those files counts here."""

    files: np.ndarray
    chunks: np.ndarray
    documents: dict[int, int] = field(default_factory=dict)


def shares(paths: list[str], documents: np.ndarray, homes: np.ndarray, file_at: np.ndarray, rows: np.ndarray,
           parts: np.ndarray, fids: np.ndarray, chunk_ids: np.ndarray) -> dict[int, Share]:
    """{partition: Share} of live files (`paths`, their `documents`, `homes`, ids `fids`) and live
    chunks (`file_at`: their file's position, `rows`, `parts`, ids `chunk_ids`). A file's
    documents at a partition are its records with chunks there, plus, at home, those with none
    anywhere (so each file's shares add up to its documents)."""
    rec = rows >= 0
    seen = np.unique(np.stack([file_at[rec], rows[rec], parts[rec]], 1), axis=0) if rec.any() else np.zeros((0, 3), np.int64)
    per_file = np.bincount(seen[:, 0], minlength=len(fids)) if len(fids) else np.zeros(0, np.int64)
    here = {}  # (file position, partition): records there
    for (f, p), c in zip(*np.unique(seen[:, [0, 2]], axis=0, return_counts=True)):
        here[int(f), int(p)] = int(c)
    out: dict[int, Share] = {}
    for p in sorted(set(homes.tolist()) | set(parts.tolist())):
        with_rows = np.unique(file_at[parts == p])
        mine = np.union1d(with_rows, np.flatnonzero(homes == p))
        docs = {int(fids[f]): here.get((int(f), p), 0) + (int(documents[f]) - int(per_file[f]) if homes[f] == p else 0)
                for f in mine.tolist()}
        out[p] = Share(fids[mine], chunk_ids[parts == p], docs)
    return out


def entry_parts(folder: Path, entry: dict[str, Any], n: int) -> tuple[dict[int, Share], Tombstones]:
    """{partition: Share} of a segment's live files and chunks, and its tombstones."""
    dead = Tombstones.load(Path(folder) / entry["deletes"]) if entry.get("deletes") else Tombstones()
    files, rows = [], []
    for name in docs_files(entry):  # (format 8: several, in increasing id ranges)
        db = sqlite3.connect(f"file:{Path(folder) / name}?mode=ro", uri=True)
        try:
            files += db.execute("SELECT id, path, documents FROM files ORDER BY id").fetchall()
            rows += db.execute("SELECT id, file_id, COALESCE(row, -1) FROM chunks ORDER BY id").fetchall()
        finally:
            db.close()
    chunks = np.array(rows, np.int64).reshape(-1, 3)
    live_f = ~np.isin(np.array([f[0] for f in files], np.int64), dead.files)
    files = [f for f, live in zip(files, live_f) if live]
    chunks = chunks[~np.isin(chunks[:, 0], dead.chunks)]
    fids = np.array([f[0] for f in files], np.int64)
    paths = [f[1] for f in files]
    homes = np.array([part_of(p, n) for p in paths], np.int64)
    file_at = np.searchsorted(fids, chunks[:, 1]).clip(0, max(len(fids) - 1, 0))
    if len(chunks) and not np.array_equal(fids[file_at] if len(fids) else chunks[:0, 1], chunks[:, 1]):
        raise ValueError(f"segment {entry['id']}: a live chunk of a deleted or unknown file")  # (never: files go with their chunks)
    parts = chunk_parts(paths, homes, file_at, chunks[:, 2], n)
    docs = np.array([int(f[2] or 0) for f in files], np.int64)
    return shares(paths, docs, homes, file_at, chunks[:, 2], parts, fids, chunks[:, 0]), dead


def without_others(dead: Tombstones, parts: dict[int, Share], keep: int) -> Tombstones:
    """The segment's tombstones plus every file and chunk that is not partition `keep`'s (a file
    with records in `keep` too stays); with the documents each kept file counts there."""
    mine = parts[keep]
    every = np.unique(np.concatenate([s.files for s in parts.values()])) if parts else np.zeros(0, np.int64)
    others = [s.chunks for p, s in parts.items() if p != keep]
    files = np.concatenate([dead.files, np.setdiff1d(every, mine.files)])
    chunks = np.concatenate([dead.chunks] + others)
    return Tombstones(np.unique(chunks), np.unique(files), dead.stats, documents=mine.documents)


def home_files(db: sqlite3.Connection, part: int, n: int) -> tuple[int, int]:
    """(files at home in partition `part` of n, files held there for their records only) of a
    partition segment's docstore."""
    home = guests = 0
    for (path,) in db.execute("SELECT path FROM files"):
        if part_of(path, n) == part:
            home += 1
        else:
            guests += 1
    return home, guests


def tag(entry: dict[str, Any], db: sqlite3.Connection, part: int, n: int) -> dict[str, Any]:
    """A partition segment's entry: its partition, its files counted at home only, and how many
    files it holds for their records only (`guests`: such an index is format 9)."""
    home, guests = home_files(db, part, n)
    entry.update(part=part, parts=n, files=home)
    entry.pop("guests", None)
    if guests:
        entry["guests"] = guests
    return entry


def is_home(entry: dict[str, Any], path: str) -> bool:
    """Whether a segment counts the file at `path` (its home partition's, or unpartitioned)."""
    return not partitioned(entry) or part_of(path, int(entry["parts"])) == int(entry["part"])


def order(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries by partition, each partition's in id order (segments without a partition, of a
    write published before its split, last)."""
    return sorted(entries, key=lambda e: (e.get("part") is None, e.get("part") or 0, e.get("min_id") is None, e.get("min_id") or 0))
