"""Partitions of an index by document: `semsearch index --shards N`.

Each file (a corpus file, or an API document: the pseudo-file `api:<id>`) belongs to partition
hash(path) mod N, a stable hash, so every chunk of a document is in one partition and a partition
is a complete index of its documents, as an Elasticsearch shard is of the documents routed to it.
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
from pathlib import Path
from typing import Any

import numpy as np

from semsearch.store.docstore import docs_files
from semsearch.store.segments import Tombstones


def part_of(path: str, n: int) -> int:
    """The partition of the document stored at docstore path `path` among n: stable across
    processes, machines and Python versions (blake2b, not hash())."""
    if n <= 1:
        return 0
    digest = hashlib.blake2b(path.encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % n


def entry_parts(folder: Path, entry: dict[str, Any], n: int) -> tuple[dict[int, tuple[np.ndarray, np.ndarray]], Tombstones]:
    """{partition: (its live file ids, its live chunk ids)} of a segment, and its tombstones."""
    dead = Tombstones.load(Path(folder) / entry["deletes"]) if entry.get("deletes") else Tombstones()
    files, rows = [], []
    for name in docs_files(entry):  # (format 8: several, in increasing id ranges)
        db = sqlite3.connect(f"file:{Path(folder) / name}?mode=ro", uri=True)
        try:
            files += db.execute("SELECT id, path FROM files ORDER BY id").fetchall()
            rows += db.execute("SELECT id, file_id FROM chunks ORDER BY id").fetchall()
        finally:
            db.close()
    chunks = np.array(rows, np.int64).reshape(-1, 2)
    fids = np.array([f for f, _ in files], np.int64)
    fparts = np.array([part_of(p, n) for _, p in files], np.int64)
    live_f = ~np.isin(fids, dead.files)
    cparts = fparts[np.searchsorted(fids, chunks[:, 1]).clip(0, max(len(fids) - 1, 0))] if len(fids) else np.zeros(0, np.int64)
    live_c = ~np.isin(chunks[:, 0], dead.chunks)
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for p in sorted(set(fparts[live_f].tolist()) | set(cparts[live_c].tolist())):
        out[p] = (fids[live_f & (fparts == p)], chunks[live_c & (cparts == p), 0])
    return out, dead


def without_others(dead: Tombstones, parts: dict[int, tuple[np.ndarray, np.ndarray]], keep: int) -> Tombstones:
    """The segment's tombstones plus every file and chunk of the partitions other than `keep`."""
    others = [v for p, v in parts.items() if p != keep]
    files = np.concatenate([dead.files] + [f for f, _ in others]) if others else dead.files
    chunks = np.concatenate([dead.chunks] + [c for _, c in others]) if others else dead.chunks
    return Tombstones(np.unique(chunks), np.unique(files), dead.stats)


def order(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries by partition, each partition's in id order (segments without a partition, of a
    write published before its split, last)."""
    return sorted(entries, key=lambda e: (e.get("part") is None, e.get("part") or 0, e.get("min_id") is None, e.get("min_id") or 0))
