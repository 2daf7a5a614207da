"""The driver's side of an engine run: decide which files to embed, run the engine, then fill
the docstore and the vector index from the staged shards in file order (so chunk ids are those
the local engine gives), checking that every chunk of every file arrived exactly once."""
from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Iterator

import numpy as np

from semsearch import errors
from semsearch.engines.register import drop_file, drop_gone, replace_file, same_stat
from semsearch.engines.spec import FileJob, spec_for
from semsearch.engines.work import NONE
from semsearch.errors import SemsearchError
from semsearch.store.docstore import ChunkRow

log = logging.getLogger(__name__)

STAGING = ".staging-"


class EngineError(SemsearchError):
    """An engine run whose shards miss or contradict a file's chunks."""


def update_with_engine(writer, files, root: Path, encoder, chunking, read, report, keep_states: bool, engine) -> dict:
    """indexing._update through an engine and staged shards; gives back the engine's figures."""
    store = writer.docs
    stored = store.files()
    by_seq = {}
    jobs: list[FileJob] = []
    for seq, f in enumerate(files):
        old = stored.get(str(f.path))
        if old is not None and same_stat(old, f):
            report.unchanged += 1  # same size, times and inode: trust it without hashing (as the local engine does)
            continue
        by_seq[seq] = f
        jobs.append(FileJob(seq, str(f.path), old.hash if old else None))
    for p in writer.folder.glob(STAGING + "*"):  # an interrupted run's (the writer holds the lock)
        shutil.rmtree(p, ignore_errors=True)
    staging = writer.folder / f"{STAGING}{writer.gen}"
    figures: dict = {"engine": engine.name, "files": len(jobs)}
    try:
        if jobs:
            figures.update(engine.run(jobs, spec_for(encoder, chunking, read, keep_states), staging))
            t = time.perf_counter()
            shards = sorted((staging / "shards").glob("*.parquet"))
            figures["staged_bytes"] = sum(p.stat().st_size for p in shards)
            seen_seqs = set()
            for seq, status, rows, vecs, states in _files_in_order(shards, encoder.out_dim, encoder.dim):
                seen_seqs.add(seq)
                _apply(writer, by_seq[seq], stored.get(str(by_seq[seq].path)), status, rows, vecs, states, report)
            lost = sorted(set(by_seq) - seen_seqs)
            if lost:
                raise EngineError(f"the {engine.name} engine returned nothing for {len(lost)} file(s), e.g. {by_seq[lost[0]].path}")
            figures["build_seconds"] = round(time.perf_counter() - t, 2)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    drop_gone(writer, stored, {str(f.path) for f in files}, root, report)  # files under this corpus root that are gone
    return figures


def _apply(writer, f, old, status: dict, rows: list[ChunkRow], vecs: np.ndarray, states, report) -> None:
    """One file's result into the docstore and vector index, as indexing._update does it."""
    store = writer.docs
    kind = status["status"]
    if kind == "error":
        name, _, msg = status["info"].partition(": ")
        cls = getattr(errors, name, None)
        raise (cls if isinstance(cls, type) and issubclass(cls, SemsearchError) else errors.CorpusError)(msg)
    if kind == "same":
        store.touch_file(old.id, f.size, f.mtime_ns, f.ctime_ns, f.inode)
        report.unchanged += 1
        return
    if kind == "skip":
        log.warning("skipped %s: %s", f.path, status["info"])
        reason = status["info"].split(" (")[0]
        report.skipped[reason] = report.skipped.get(reason, 0) + 1
        if old is not None:
            drop_file(writer, old, report)
        return
    file_id = replace_file(writer, f, old, status["hash"], report)
    for r in rows:
        r.file_id = file_id
    if states is not None:
        for r, st in zip(rows, states):
            r.state = writer.append_states(st)
    if rows:
        writer.vectors.add(store.add_chunks(rows, vecs), vecs)
    store.set_documents(file_id, status["documents"])
    report.documents += status["documents"]
    report.chunks += len(rows)


def _files_in_order(shards: list[Path], dim: int, state_dim: int) -> Iterator[tuple[int, dict, list[ChunkRow], np.ndarray, list | None]]:
    """(seq, status row, chunk rows, vectors (n, dim), states or None) per file, in seq order.

    Shards whose seq ranges overlap are read together (with ordered execution, each shard is its
    own group, so memory holds one shard at a time); rows are sorted by (seq, doc, ord), and a
    row staged twice (a retried write) is kept once."""
    import pyarrow.parquet as pq

    ranges = []
    for p in shards:
        seq = pq.read_table(p, columns=["seq"]).column("seq").to_numpy()
        if len(seq):
            ranges.append((int(seq.min()), int(seq.max()), p))
    ranges.sort()
    group: list[Path] = []
    hi = -1
    for lo, top, p in ranges + [(None, None, None)]:
        if group and (lo is None or lo > hi):
            yield from _group_files(group, dim, state_dim)
            group, hi = [], -1
        if p is not None:
            group.append(p)
            hi = max(hi, top)


def _group_files(paths: list[Path], dim: int, state_dim: int):
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pa.concat_tables([pq.read_table(p) for p in paths])
    seq, doc, ord_ = (t.column(c).to_numpy() for c in ("seq", "doc", "ord"))
    order = np.lexsort((ord_, doc, seq))
    keys = np.stack([seq[order], doc[order], ord_[order]], 1)
    first = np.ones(len(order), bool)
    first[1:] = (keys[1:] != keys[:-1]).any(1)
    if not first.all():
        log.warning("%d row(s) were staged twice (a retried write); each is kept once", int((~first).sum()))
    order = order[first]
    cols = {c: t.column(c).take(order).to_pylist() for c in t.column_names if c not in ("seq", "doc", "ord")}
    seq, doc, ord_ = seq[order], doc[order], ord_[order]
    bounds = np.flatnonzero(np.diff(seq)) + 1
    for a, b in zip(np.r_[0, bounds], np.r_[bounds, len(seq)]):
        chunk_idx = [i for i in range(a, b) if doc[i] != NONE]
        status_idx = [i for i in range(a, b) if doc[i] == NONE]
        if len(status_idx) != 1:
            raise EngineError(f"file #{seq[a]}: {len(status_idx)} status rows staged")
        s = status_idx[0]
        status = {k: cols[k][s] for k in ("status", "hash", "info", "documents", "chunks")}
        if status["status"] == "indexed" and status["chunks"] != len(chunk_idx):
            raise EngineError(f"file #{seq[a]}: {len(chunk_idx)} chunk(s) staged, its reader made {status['chunks']}")
        rows = [ChunkRow(0, None if cols["row"][i] == NONE else cols["row"][i], int(ord_[i]), cols["start"][i], cols["end"][i],
                         None if cols["line"][i] == NONE else cols["line"][i], cols["text"][i],
                         json.loads(cols["metadata"][i]) if cols["metadata"][i] else {}) for i in chunk_idx]
        vecs = np.frombuffer(b"".join(cols["vector"][i] for i in chunk_idx), np.float32).reshape(len(chunk_idx), dim)
        states = None
        if chunk_idx and cols["state"][chunk_idx[0]]:
            states = [np.frombuffer(cols["state"][i], np.float16).reshape(-1, state_dim) for i in chunk_idx]
        yield int(seq[a]), status, rows, vecs, states
