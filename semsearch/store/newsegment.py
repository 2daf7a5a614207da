"""Writing a whole segment away from the index's writer: for engine workers (Ray tasks), which
turn their staged rows into a finished segment (docstore, lexical postings, vector index, kept
states) with ids the driver assigned, so the driver only publishes the manifest.

The segment's files are fsynced; nothing names them until the driver's manifest does, so a
worker that dies leaves files the next writer removes.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from semsearch.store import lexical, vecfile
from semsearch.store.docstore import DocStore
from semsearch.store.files import fsync_file
from semsearch.store.kept import StatesFile
from semsearch.store.segments import segment_entry
from semsearch.store.vecfile import VectorFile
from semsearch.store.vectors import VectorIndex


def write_segment(folder: Path, seg_id: int, dim: int, files: list[dict[str, Any]],
                  chunks: Iterable[tuple[int, int, Any, np.ndarray, Any]], requested: str = "auto",
                  target_recall: float = 0.95, state_dim: int | None = None, params: dict | None = None,
                  storage: str | None = None, settle: Callable[[Any], None] | None = None,
                  part: tuple[int, int] | None = None) -> dict[str, Any]:
    """Write segment `seg_id` into `folder`: `files` are file records with their ids (id, path,
    hash, size, mtime_ns, ctime_ns, inode, documents, indexed_at); `chunks` yields (chunk id,
    file id, ChunkRow, vector, token states (T, D) or (token states, token table (T, 3)) or None) in id order.
    `settle(db)`: what to change in the file rows once the chunks are in; `part`: the partition
    (of how many) the segment holds. Gives back its manifest entry."""
    from semsearch.store.merge import build_vectors, order_by_lists

    folder = Path(folder)
    docs_file, vectors_file = f"docs.{seg_id}.sqlite", f"vectors.{seg_id}.faiss"
    kept = StatesFile(folder, f"{seg_id}.f16")
    store = DocStore(folder / docs_file, unpublished=True)  # fsynced before a manifest names it
    vi = VectorIndex.create(dim, "flat")
    try:
        db = store.db
        db.executemany("INSERT INTO files (id, path, hash, size, mtime_ns, ctime_ns, inode, documents, indexed_at)"
                       " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       [(f["id"], f["path"], f["hash"], f["size"], f["mtime_ns"], f["ctime_ns"], f["inode"], f["documents"],
                         f["indexed_at"]) for f in files])
        ids, vecs, texts = _insert_chunks(db, chunks, kept)
        if settle is not None:
            settle(db)
        store.terms.extend((cid, *t) for cid, t in zip(ids, lexical.encode_terms_many(texts)))  # to its posting file
        held = np.array(ids, np.int64)
        matrix = np.stack(vecs) if vecs else np.zeros((0, dim), np.float32)
        vi.add(held, matrix)
        order = np.argsort(held, kind="stable")
        vecfile.write(folder / vecfile.file_name(seg_id), held[order], matrix[order], storage)
        del vecs, matrix
        vf = VectorFile(folder / vecfile.file_name(seg_id))
        vi, index = build_vectors(vf, dim, requested, store.counts()["chunks"], target_recall, params=params, current=vi)
        order_by_lists(folder / vecfile.file_name(seg_id), vi)
        store.write_lexical()
        store.commit()
        kept.finish()
        vi.save(folder / vectors_file, vectors_elsewhere=True)
        for name in (docs_file, vectors_file):
            fsync_file(folder / name)
        entry = segment_entry(folder, seg_id, store, vi, index, [kept.name] if kept.opened else [])
        if part is not None:
            from semsearch.store import partition

            partition.tag(entry, store.db, *part)
        return entry
    finally:
        store.close()
        kept.close()


def _insert_chunks(db, chunks, kept: StatesFile) -> tuple[list[int], list[np.ndarray], list[str]]:
    """The chunks' rows into the docstore (their token states to the states file): gives back
    their ids, vectors and the texts BM25 indexes."""
    ids: list[int] = []
    vecs: list[np.ndarray] = []
    inserts, texts = [], []
    for cid, file_id, r, v, st in chunks:
        ref = (None, None, None)
        if st is not None:  # token states, or (token states, token table)
            ref = kept.append(*st) if isinstance(st, tuple) else kept.append(st)
        inserts.append((int(cid), int(file_id), r.row, r.ord, r.start, r.end, r.line, r.text,
                        json.dumps(r.metadata, ensure_ascii=False) if r.metadata else None, *ref))
        texts.append(r.lexical_text)
        ids.append(int(cid))
        vecs.append(np.asarray(v, np.float32))
    db.executemany("INSERT INTO chunks (id, file_id, row, ord, start, end, line, text, metadata, state_file,"
                   " state_off, state_len) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", inserts)
    return ids, vecs, texts
