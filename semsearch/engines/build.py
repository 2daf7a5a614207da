"""The driver's side of an engine run: decide which files to embed, run the engine, then fill
the docstore and the vector index from the staged shards in file order (so chunk ids are those
the local engine gives), checking that every chunk of every file arrived exactly once."""
from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

import numpy as np

from semsearch import errors
from semsearch.engines.register import drop_file, drop_gone, same_stat
from semsearch.engines.spec import FileJob, spec_for
from semsearch.engines.work import NONE
from semsearch.errors import SemsearchError
from semsearch.store.docstore import ChunkRow
from semsearch.store.folder import now
from semsearch.store.kept import TOKEN_COLS
from semsearch.store.partition import chunk_parts, part_of

log = logging.getLogger(__name__)

STAGING = ".staging-"


class EngineError(SemsearchError):
    """An engine run whose shards miss or contradict a file's chunks."""


def update_with_engine(writer, files, root: Path, encoder, chunking, read, report, keep_states: bool, engine,
                       vectors=None, partitions: int = 1) -> dict:
    """indexing._update through an engine: the engine reads, chunks and encodes the files into
    staged shards; the driver registers each file in walk order (so file and chunk ids are those
    the local engine gives), and the engine's workers write the new chunks as segments, one a
    group of shards, in parallel (store/newsegment.py); the driver then only publishes them with
    the tombstones of what they replace. In an index partitioned by document (`partitions` > 1) each
    segment holds one partition's files: the workers write the partitions side by side, and the
    commit has nothing to split. Gives back the engine's figures."""
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
            statuses, groups = _statuses(shards)
            lost = sorted(set(by_seq) - set(statuses))
            if lost:
                raise EngineError(f"the {engine.name} engine returned nothing for {len(lost)} file(s), e.g. {by_seq[lost[0]].path}")
            tasks = _register(writer, by_seq, stored, statuses, groups, report, encoder, keep_states, vectors, partitions)
            t_seg = time.perf_counter()
            entries = _write_segments(engine, tasks)
            writer.add_segments(entries)
            figures["segments_written"] = len(entries)
            figures["segment_seconds"] = round(time.perf_counter() - t_seg, 2)
            figures["build_seconds"] = round(time.perf_counter() - t, 2)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        close = getattr(engine, "close", None)
        if close is not None:
            close()
    drop_gone(writer, stored, {str(f.path) for f in files}, root, report)  # files under this corpus root that are gone
    return figures


def _statuses(shards: list[Path]) -> tuple[dict[int, dict], list[tuple[list[Path], set[int]]]]:
    """Each file's status row ({seq: status}) and the groups of shards whose seq ranges overlap
    (with their seqs), read from the shards' small columns only."""
    import pyarrow.parquet as pq

    statuses: dict[int, dict] = {}
    ranges = []
    for p in shards:
        t = pq.read_table(p, columns=["seq", "doc", "status", "hash", "info", "documents", "chunks"])
        seq = t.column("seq").to_numpy()
        if not len(seq):
            continue
        ranges.append((int(seq.min()), int(seq.max()), p, set(seq.tolist())))
        doc = t.column("doc").to_numpy()
        cols = {c: t.column(c).to_pylist() for c in ("status", "hash", "info", "documents", "chunks")}
        for i in np.flatnonzero(doc == NONE).tolist():
            s = int(seq[i])
            if s in statuses:  # a retried write staged it twice: one is kept
                continue
            statuses[s] = {k: cols[k][i] for k in cols}
    ranges.sort(key=lambda r: r[:2])
    groups: list[tuple[list[Path], set[int]]] = []
    hi = -1
    for lo, top, p, seqs in ranges:
        if groups and lo <= hi:
            groups[-1][0].append(p)
            groups[-1][1].update(seqs)
        else:
            groups.append(([p], set(seqs)))
        hi = max(hi, top)
    return statuses, groups


def _register(writer, by_seq, stored, statuses, groups, report, encoder, keep_states, vectors, partitions: int = 1) -> list[dict]:
    """Each file's status applied in walk order, as indexing._update does (touch, skip, error,
    replace); the indexed files get their file and chunk ids; gives back one segment task a
    group of shards that holds indexed files (one a partition of them, where `partitions` > 1)."""
    indexed = [s for s in sorted(statuses) if statuses[s]["status"] == "indexed"]
    next_file, next_chunk = writer.reserve(len(indexed), sum(int(statuses[s]["chunks"]) for s in indexed))
    records: dict[int, dict] = {}
    for seq in sorted(statuses):
        status, f = statuses[seq], by_seq[seq]
        old = stored.get(str(f.path))
        kind = status["status"]
        if kind == "error":
            name, _, msg = status["info"].partition(": ")
            cls = getattr(errors, name, None)
            raise (cls if isinstance(cls, type) and issubclass(cls, SemsearchError) else errors.CorpusError)(msg)
        if kind == "same":
            writer.docs.touch_file(old.id, f.size, f.mtime_ns, f.ctime_ns, f.inode)
            report.unchanged += 1
            continue
        if kind == "skip":
            log.warning("skipped %s: %s", f.path, status["info"])
            reason = status["info"].split(" (")[0]
            report.skipped[reason] = report.skipped.get(reason, 0) + 1
            if old is not None:
                drop_file(writer, old, report)
            continue
        if old is not None:
            writer.docs.remove_file(old.id)
            report.updated += 1
        else:
            report.added += 1
        records[seq] = {"id": next_file, "first_chunk": next_chunk, "path": str(f.path), "hash": status["hash"],
                        "size": f.size, "mtime_ns": f.mtime_ns, "ctime_ns": f.ctime_ns, "inode": f.inode,
                        "documents": int(status["documents"]), "chunks": int(status["chunks"]), "indexed_at": now()}
        next_file += 1
        next_chunk += int(status["chunks"])
        report.documents += int(status["documents"])
        report.chunks += int(status["chunks"])
    base = writer.base.index if writer.base is not None else {}
    requested = (vectors.index_type if vectors is not None else "auto")
    if requested == "auto" and base.get("forced"):
        requested = base.get("type", "auto")
    target = vectors.target_recall if vectors is not None else 0.95
    storage = (vectors.storage if vectors is not None else None) or base.get("storage")
    tasks = []
    for paths, seqs in groups:
        mine = {seq: records[seq] for seq in sorted(seqs) if seq in records}
        if not mine:
            continue
        # (a file's records may fall in any partition: each partition's task reads the group and
        # keeps its own; one whose partition holds nothing writes nothing)
        for part in (range(partitions) if partitions > 1 else [None]):
            tasks.append({"folder": str(writer.folder), "seg_id": writer.segment_id(), "dim": encoder.out_dim,
                          "state_dim": encoder.dim if keep_states else None, "shards": [str(p) for p in paths],
                          "files": mine, "requested": requested, "target": target, "storage": storage,
                          "part": part, "parts": partitions})
    return tasks


class _Route:
    """Which of a group's chunks are one partition's (store/partition.py: a document's partition
    is its file's, or its record's), and the documents each file it holds counts there."""

    def __init__(self, files: dict[int, dict], part: int, n: int):
        self.files, self.part, self.n = files, part, n
        self.home = {seq: part_of(rec["path"], n) for seq, rec in files.items()}
        self.rows: dict[int, tuple[set, set]] = {}  # seq: (its records with chunks, those here)
        self.here: set[int] = set()  # files with a chunk here

    def keep(self, seq: int, rows: list) -> np.ndarray:
        """Whether each of a file's chunks is this partition's."""
        at = np.array([-1 if r.row is None else int(r.row) for r in rows], np.int64)
        parts = chunk_parts([self.files[seq]["path"]], np.array([self.home[seq]], np.int64), np.zeros(len(rows), np.int64),
                            at, self.n)
        mine = parts == self.part
        self.rows[seq] = (set(at[at >= 0].tolist()), set(at[mine & (at >= 0)].tolist()))
        if mine.any():
            self.here.add(seq)
        return mine

    def settle(self, db) -> None:
        """The file rows as this partition holds them: a file with no chunk here goes unless
        this is its home; each counts its records here (its home those with no chunk too)."""
        gone, counts = [], []
        for seq, rec in self.files.items():
            home = self.home[seq] == self.part
            if seq not in self.here and not home:
                gone.append((rec["id"],))
                continue
            every, here = self.rows.get(seq, (set(), set()))
            counts.append((len(here) + (int(rec["documents"]) - len(every) if home else 0), rec["id"]))
        db.executemany("DELETE FROM files WHERE id = ?", gone)
        db.executemany("UPDATE files SET documents = ? WHERE id = ?", counts)


def build_segment(task: dict) -> dict | None:
    """One segment from a group of staged shards, with the ids the driver assigned: run by an
    engine's worker (a Ray task) or in this process. Checks every file's chunks arrived once.
    None: the task's partition holds nothing of the group (its files are removed again)."""
    from semsearch.store.newsegment import write_segment

    files: dict[int, dict] = {int(k): v for k, v in task["files"].items()}
    got: dict[int, int] = {}
    part = task.get("part")
    route = _Route(files, int(part), int(task["parts"])) if part is not None else None

    def chunks():
        for seq, _status, rows, vecs, states in _group_files([Path(p) for p in task["shards"]], task["dim"],
                                                            task["state_dim"] or 1):
            rec = files.get(seq)
            if rec is None:
                continue
            got[seq] = len(rows)
            mine = route.keep(seq, rows) if route is not None else None
            for j, (r, v) in enumerate(zip(rows, vecs)):
                if mine is None or mine[j]:
                    yield rec["first_chunk"] + j, rec["id"], r, v, states[j] if states is not None else None

    entry = write_segment(Path(task["folder"]), task["seg_id"], task["dim"], list(files.values()), chunks(),
                          task["requested"], task["target"], task["state_dim"], storage=task.get("storage"),
                          settle=route.settle if route is not None else None,
                          part=(int(part), int(task["parts"])) if part is not None else None)
    short = [s for s, rec in files.items() if got.get(s) != rec["chunks"]]
    if short:
        raise EngineError(f"file #{short[0]}: {got.get(short[0], 0)} chunk(s) staged, its reader made {files[short[0]]['chunks']}")
    if entry["live"] == 0 and entry["files"] == 0 and not entry.get("guests"):
        for name in [*((entry.get("integrity") or {}).get("files") or {}), *(entry.get("states") or [])]:
            (Path(task["folder"]) / name).unlink(missing_ok=True)
        return None
    return entry


def _write_segments(engine, tasks: list[dict]) -> list[dict]:
    """The engine's workers write the segments (in parallel where it has workers), else this process."""
    write = getattr(engine, "write_segments", None)
    got = list(write(build_segment, tasks)) if write is not None else [build_segment(t) for t in tasks]
    return [e for e in got if e is not None]


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
                         json.loads(cols["metadata"][i]) if cols["metadata"][i] else {},
                         context=cols["context"][i] or "" if "context" in cols else "") for i in chunk_idx]
        vecs = np.frombuffer(b"".join(cols["vector"][i] for i in chunk_idx), np.float32).reshape(len(chunk_idx), dim)
        states = None
        if chunk_idx and cols["state"][chunk_idx[0]]:
            states = [np.frombuffer(cols["state"][i], np.float16).reshape(-1, state_dim) for i in chunk_idx]
            if "tokens" in cols:  # (a shard staged before token tables were kept has none)
                states = [(st, np.frombuffer(cols["tokens"][i], np.int32).reshape(-1, TOKEN_COLS)) for st, i in zip(states, chunk_idx)]
        yield int(seq[a]), status, rows, vecs, states
