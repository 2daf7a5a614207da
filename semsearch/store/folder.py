"""The index folder: manifest.json naming immutable segments (docs.<s>.sqlite + vectors.<s>.faiss,
with tombstones del.<s>.<g>.bin), written atomically.

Each write adds a new segment and the changed tombstones beside the published files (and may
merge segments) and publishes them by replacing manifest.json in one rename; until then readers
(and an interrupted writer's next run) see the previous generation whole. Files no manifest
names any more are removed afterwards. See semsearch/store/segments.py for the reading side.
"""
from __future__ import annotations

import datetime as dt
import fcntl
import os
import json
import threading

import numpy as np
from pathlib import Path

from semsearch.errors import IndexFormatError, IndexLocked, InputError
from semsearch.store import integrity, lexical, vecfile
from semsearch.store.files import DATA_FILE, DB_ERRORS, damaged, fsync_dir, fsync_file, manifest_stamp
from semsearch.store.docstore import DocStore, StoredFile, docs_files, open_docs
from semsearch.store.kept import StatesFile, files_of
from semsearch.store.manifest import (FORMAT_VERSION, IN_PLACE_VERSION, MANIFEST, MULTI_VEC_VERSION, PARTED_VERSION, SPREAD_VERSION,
                                      Manifest)
from semsearch.store.segments import (Segment, SegmentedDocs, SegmentedVectors, Tombstones, add_files, live_counts, live_files, open_parts,
                                      segment_entry, select_sql)
from semsearch.store.vecfile import MemoryVectors
from semsearch.store.vectors import VectorIndex

DEFAULT_INDEX = "indexes/default"


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def open_index(folder: Path, device: str = "cpu", reuse: dict | None = None,
               light: bool = False) -> tuple[Manifest, SegmentedVectors, SegmentedDocs]:
    """The manifest, vector index and (read-only) docstore of an index folder, across its
    segments; the vector indexes are searched on a GPU where device is 'cuda' (see
    resolve_index_device). `reuse`: segments already open ({Segment.key: Segment}, from
    SegmentedDocs.segments()), taken instead of opening their files again. `light` (one-shot
    readers): small flat segments are searched with numpy, without loading faiss (LIGHT_ROWS).

    A writer may publish the next generation, and remove this one's files, between the reading
    of the manifest and the opening of its files: a failure to open them while the manifest
    changed under the reader is that race, not damage, and the current generation is opened."""
    folder = Path(folder)
    for _ in range(20):
        stamp = manifest_stamp(folder)
        try:
            return _open_generation(folder, device, reuse, light)
        except (IndexFormatError, FileNotFoundError):  # a file checked or opened after the writer removed it
            if manifest_stamp(folder) == stamp:
                raise
    return _open_generation(folder, device, reuse, light)


def _open_generation(folder: Path, device: str, reuse: dict | None,
                     light: bool = False) -> tuple[Manifest, SegmentedVectors, SegmentedDocs]:
    m = Manifest.load(folder)
    parts = open_parts(folder, m, device, reuse, light)
    return m, SegmentedVectors(parts, m.index, device), SegmentedDocs(folder, parts, live_counts(m.segments))


class _BaseSegment:
    """A published segment as a writer sees it: its docstore read-only (opened when first
    needed) and its tombstones, which the writer may extend (copied on write)."""

    def __init__(self, folder: Path, entry: dict):
        self.folder, self.entry = folder, dict(entry)
        self._docs: DocStore | None = None
        self._dead: Tombstones | None = None
        self.changed = False
        self.dropped = False  # absorbed into the writer's new segment

    @property
    def docs(self) -> DocStore:
        if self._docs is None:
            for name in docs_files(self.entry):
                integrity.check_file(self.folder, name, ((self.entry.get("integrity") or {}).get("files") or {}).get(name))
            try:
                self._docs = open_docs(self.folder, self.entry)
            except DB_ERRORS as e:
                raise damaged(self.folder, self.entry["docs"], f"damaged ({e})") from e
        return self._docs

    @property
    def dead(self) -> Tombstones:
        if self._dead is None:
            name = self.entry.get("deletes")
            if name:
                integrity.check_file(self.folder, name, ((self.entry.get("integrity") or {}).get("files") or {}).get(name))
                self._dead = Tombstones.load(self.folder / name)
            else:
                self._dead = Tombstones()
        return self._dead

    def close(self) -> None:
        if self._docs is not None:
            self._docs.close()
            self._docs = None


class WriteStore:
    """A writer's view of the index: the published segments (minus what this write deletes) and
    the new segment it is filling. Writes go to the new segment; deleting a published chunk
    records it in that segment's tombstones."""

    def __init__(self, writer: "IndexWriter"):
        self.w = writer

    @property
    def new(self) -> DocStore:
        return self.w.new_docs

    @property
    def db(self):
        return self.w.new_docs.db

    def _live_base(self) -> list[_BaseSegment]:
        return [b for b in self.w.base_segments if not b.dropped]

    def files(self) -> dict[str, StoredFile]:
        out: dict[str, StoredFile] = {}
        for b in self._live_base():
            add_files(out, live_files(b.docs, b.dead))
        return add_files(out, self.new.files())

    def find_files(self, paths: list[str]) -> dict[str, StoredFile]:
        """{path: stored file} of the given paths that a live file has (an index lookup a segment)."""
        out: dict[str, StoredFile] = {}
        for b in self._live_base():
            add_files(out, live_files(b.docs, b.dead, paths))
        return add_files(out, live_files(self.new, Tombstones(), paths))

    def _owners(self, file_id: int) -> list[_BaseSegment | None]:
        """The segments holding a live file id (None: the new segment). A file of records in an
        index partitioned by document may be held by several, one a partition (store/partition.py)."""
        if self.new.db.execute("SELECT 1 FROM files WHERE id = ?", (file_id,)).fetchone():
            return [None]
        out = [b for b in self._live_base()
               if b.docs.db.execute("SELECT 1 FROM files WHERE id = ?", (file_id,)).fetchone() and
               not (len(b.dead.files) and np.isin(file_id, b.dead.files))]
        if not out:
            raise KeyError(file_id)
        return out

    def add_file(self, *a, **kw) -> int:
        return self.new.add_file(*a, **kw)

    def set_documents(self, file_id: int, documents: int) -> None:
        self.new.set_documents(file_id, documents)

    def touch_file(self, file_id: int, size: int, mtime_ns: int, ctime_ns: int = 0, inode: int = 0) -> None:
        for b in self._owners(file_id):
            if b is None:
                self.new.touch_file(file_id, size, mtime_ns, ctime_ns, inode)
                continue
            b.dead.stats[int(file_id)] = (int(size), int(mtime_ns), int(ctime_ns), int(inode))
            b.changed = True

    def remove_file(self, file_id: int) -> np.ndarray:
        """Delete a file and its chunks, from every segment holding it; gives back the removed chunk ids."""
        from semsearch.store.partition import is_home

        got = []
        for b in self._owners(file_id):
            if b is None:
                ids = self.new.remove_file(file_id)
                self.w.new_vecs.remove(ids)
                return ids
            ids = np.array([r[0] for r in b.docs.db.execute("SELECT id FROM chunks WHERE file_id = ?", (int(file_id),))], np.int64)
            docs, path = b.docs.db.execute("SELECT documents, path FROM files WHERE id = ?", (int(file_id),)).fetchone()
            b._dead = b.dead.with_deleted(ids, int(file_id))
            b.changed = True
            e = b.entry
            e["live"], e["documents"] = e["live"] - len(ids), e["documents"] - int(docs)
            e["files"] -= int(is_home(e, path))  # (counted by its home partition only)
            got.append(ids)
        return np.concatenate(got)

    def add_chunks(self, rows, vectors) -> np.ndarray:
        """Add chunks to the new segment (their vectors go to its vector file at commit)."""
        vectors = np.asarray(vectors, np.float32)
        if len(rows) != len(vectors):
            raise ValueError(f"{len(rows)} chunks with {len(vectors)} vectors")
        ids = self.new.add_chunks(rows)
        self.w.new_vecs.add(ids, vectors)
        return ids

    def counts(self) -> dict[str, int]:
        base = live_counts([b.entry for b in self._live_base()])
        new = self.new.counts()
        return {k: base[k] + new[k] for k in base}

    def select(self, columns: str, where: str = "", params: tuple = ()):
        """(chunk id, *columns) of every live chunk (see SegmentedDocs.select)."""
        sql = select_sql(columns, where)
        for b in self._live_base():
            dead = set(b.dead.chunks.tolist())
            for row in b.docs.db.execute(sql, params):
                if row[0] not in dead:
                    yield row
        yield from self.new.db.execute(sql, params)

    # the new segment's own rows (vector index builds, re-pooling)
    @property
    def new_vectors(self) -> MemoryVectors:
        """The new segment's vectors (written to its vector file at commit)."""
        return self.w.new_vecs

    def iter_vectors(self, batch: int = 8192):
        return self.w.new_vecs.iter(batch)

    def iter_states_refs(self, batch: int = 4096):
        return self.new.iter_states_refs(batch)

    def set_vectors(self, ids, vectors) -> None:
        self.w.new_vecs.set(ids, vectors)

    def get_vectors(self, ids):
        return self.w.new_vecs.found(ids)


_WRITER_LOCKS: dict[str, threading.Lock] = {}
_WRITER_LOCKS_LOCK = threading.Lock()


def writer_lock(folder: str | os.PathLike) -> threading.Lock:
    """One lock per index folder in this process, for everything that writes it (the HTTP and MCP
    servers, the framework stores, `watch`): the index's own file lock refuses a second writer
    (IndexLocked) rather than waiting, so writers of one process queue here, each reading the
    manifest it builds on only once it holds this lock."""
    key = os.path.realpath(folder)
    with _WRITER_LOCKS_LOCK:
        return _WRITER_LOCKS.setdefault(key, threading.Lock())


class IndexWriter:
    """The next generation of an index folder, published by commit(); abort() leaves the old one.

    `base` is the manifest the new generation starts from (None: start empty, as for a new index
    or --rebuild). New chunks go to one new segment; deletions of published chunks are recorded
    as tombstones; commit() may merge segments (semsearch/store/merge.py). Published files are
    never touched: a write costs what it changes.
    """

    def __init__(self, folder: Path, dim: int, base: Manifest | None = None, kind: str = "flat"):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.dim = dim
        self._lock = open(self.folder / ".lock", "w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            self._lock.close()
            raise IndexLocked(f"{folder} is being written by another semsearch process") from e
        self.base = base
        self.base_segments = [_BaseSegment(self.folder, e) for e in (base.segments if base is not None else [])]
        try:
            current = _current_files(self.folder)
            self._clean(keep=current)  # leftovers of an interrupted run
            self.gen = max([_gen_of(p.name) for p in self.folder.iterdir()] + [base.generation if base else 0,
                           int((base.next_ids or {}).get("segment", 0)) - 1 if base else 0]) + 1
            self.next_ids = self._next_ids()
            self.seg_id = self.gen
            self.docs_file = f"docs.{self.seg_id}.sqlite"
            self.vectors_file = f"vectors.{self.seg_id}.faiss"
            self.new_docs = DocStore(self.folder / self.docs_file, unpublished=True)  # fsynced at commit
            self.new_docs.db.executemany("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)",
                                         [("chunks", self.next_ids["chunk"] - 1), ("files", self.next_ids["file"] - 1)])
        except BaseException:
            (self.folder / f"docs.{getattr(self, 'seg_id', 0)}.sqlite").unlink(missing_ok=True)
            self._close_base()
            self._release()
            raise
        self.docs = WriteStore(self)
        self.new_vecs = MemoryVectors(dim)  # the new segment's vectors: its vector file at commit
        self.vectors = VectorIndex.create(dim, kind)
        self.index_entry: dict | None = None  # the new segment's vector index entry (finalize_vectors)
        self.states_file = f"{self.gen}.f16"
        self._states = StatesFile(self.folder, self.states_file)  # opened on the first append_states()
        self.carried: list = []  # posting sets of the segments absorb() took in (lexical.write_segment_file)
        self.extra: list[dict] = []  # segments written elsewhere (engine workers), published with this write
        self._next_segment = self.seg_id + 1
        try:
            if any(not b.entry.get("lexical") and not lexical.has_terms(b.docs.db) for b in self.base_segments):
                # A docstore from before lexical search: its chunks move to the new segment, which
                # gets their lexical terms (once; nothing is re-encoded).
                self.absorb()
                lexical.add_columns(self.new_docs.db, missing_only=True)
        except BaseException:
            self.abort()
            raise

    def _next_ids(self) -> dict[str, int]:
        ids = dict((self.base.next_ids or {}) if self.base else {})
        if "chunk" not in ids or "file" not in ids:  # a format-1 index: its docstore's sequences
            chunk = file = 1
            for b in self.base_segments:
                for name, seq in b.docs.db.execute("SELECT name, seq FROM sqlite_sequence"):
                    if name == "chunks":
                        chunk = max(chunk, int(seq) + 1)
                    elif name == "files":
                        file = max(file, int(seq) + 1)
            ids = {"chunk": chunk, "file": file}
        return {"chunk": int(ids["chunk"]), "file": int(ids["file"])}

    # ---- kept token states: append-only raw fp16 files under states/, shared by generations ----
    def append_states(self, states: np.ndarray, tokens: np.ndarray | None = None) -> tuple[str, int, int]:
        """Append one text's token states (T, D) and its token table (T, 3: id, start, end, as
        Encoder.token_table gives); gives back (file, first row, T) for its chunk row."""
        return self._states.append(states, tokens)

    def read_states(self, file: str, dim: int) -> np.ndarray:
        """A memory map (rows, dim) fp16 of a states file."""
        if file == self.states_file:
            self._states.flush()
        return np.memmap(self.folder / "states" / file, dtype=np.float16, mode="r").reshape(-1, dim)

    def reserve(self, files: int, chunks: int) -> tuple[int, int]:
        """Ids for `files` files and `chunks` chunks that a segment written elsewhere will hold
        (write_segment); gives back (first file id, first chunk id). Chunks the new segment gets
        afterwards take ids after them."""
        f0 = max(self.next_ids["file"], _seq(self.new_docs, "files") + 1)
        c0 = max(self.next_ids["chunk"], _seq(self.new_docs, "chunks") + 1)
        self.next_ids = {"file": f0 + files, "chunk": c0 + chunks}
        self.new_docs.db.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'files'", (f0 + files - 1,))
        self.new_docs.db.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'chunks'", (c0 + chunks - 1,))
        return f0, c0

    def segment_id(self) -> int:
        """A new segment id, for a segment written elsewhere in this write."""
        self._next_segment += 1
        return self._next_segment - 1

    def add_segments(self, entries: list[dict]) -> None:
        """Publish segments written elsewhere (write_segment) with this write."""
        self.extra += entries

    def absorb(self) -> None:
        """Copy every live chunk and file of the published segments into the new segment (same
        ids) and drop those segments: for a write that changes every vector (re-pooling)."""
        from semsearch.store.merge import copy_live, live_vectors

        if self.new_docs.counts()["chunks"] or self.new_docs.counts()["files"]:
            raise RuntimeError("absorb() must come before any new chunk")

        moved = [b for b in self.base_segments if not b.dropped]
        for b in moved:
            postings = b.entry.get("postings")
            for name in docs_files(b.entry):
                copy_live(self.new_docs.db, self.folder / name, b.dead, terms=not postings)
            if postings:  # its lexical rows are taken from its posting file at commit, not analysed again
                self.carried.append((lexical.open_file(self.folder / postings), b.dead.chunks))
            b.dropped = True
        self.vectors = VectorIndex.create(self.dim, "flat")
        for ids, vecs in live_vectors(self.folder, [b.entry for b in moved])[1]:
            self.new_vecs.add(ids, vecs)
            self.vectors.add(ids, vecs)

    def commit(self, manifest: Manifest, merge: str = "auto", rolled: bool = False, trained=None) -> None:
        """Publish: the new segment, changed tombstones, merges ('auto': as the merge policy asks;
        'all': every segment into one; 'run': first the segments a long run published as it went
        (`rolled` ones, the tail of the list) with this one, then as 'auto'; 'none'), then
        manifest.json in one rename. `rolled`: this commit is one of those. `manifest`
        carries the settings; its segments, counts, ids and generation are filled here, and its
        `index` entry is taken as the new segment's (finalize_vectors). `trained`: for 'run', a
        vector index whose quantizer the run trained ahead (merge.build_vectors)."""
        from semsearch.store import merge as merge_

        self._states.finish()
        new_counts = self.new_docs.counts()
        new_states = sorted(self.new_docs.state_files())
        next_chunk = max([self.next_ids["chunk"], _seq(self.new_docs, "chunks") + 1] + [e["max_id"] + 1 for e in self.extra if e["max_id"] is not None])
        next_file = max(self.next_ids["file"], _seq(self.new_docs, "files") + 1)
        entries = self._kept_entries()
        seg_index = dict(manifest.index or {"type": "flat"})
        tail: list[dict] = list(self.extra)
        new_entry = self._write_new_segment(new_counts, new_states, seg_index, rolled)
        if new_entry is not None:
            tail.append(new_entry)
        # Segments hold increasing id ranges in list order: the new ones sort by their first id.
        entries += sorted(tail, key=lambda e: (e["min_id"] is None, e["min_id"] or 0))
        next_segment = self._next_segment
        shards = int(getattr(manifest, "shards", 1) or 1)
        if merge != "none" and shards > 1:  # partitioned by document (store/partition.py)
            entries, next_segment = merge_.apply_parted(self.folder, entries, self.dim, manifest, next_segment, shards,
                                                        everything=merge == "all", tail=self._run_tail(entries) if merge == "run" else 0,
                                                        trained=trained if merge == "run" else None)
        elif merge != "none":
            entries, next_segment = merge_.apply(self.folder, entries, self.dim, manifest, next_segment,
                                                 everything=merge == "all", tail=self._run_tail(entries) if merge == "run" else 0,
                                                 trained=trained if merge == "run" else None)
        fsync_dir(self.folder)  # the data files' names are durable before the manifest names them
        manifest.segments = entries
        manifest.next_ids = {"chunk": next_chunk, "file": next_file, "segment": next_segment}
        manifest.generation = self.gen
        manifest.counts = live_counts(entries)
        manifest.index = merge_.summary(entries, seg_index)
        manifest.updated = now()
        manifest.created = manifest.created or manifest.updated
        manifest.format_version = (MULTI_VEC_VERSION if any(e.get("vecs_more") or _kept_vecs(e) for e in entries)
                                   else SPREAD_VERSION if shards > 1 and any(e.get("guests") for e in entries)
                                   else IN_PLACE_VERSION if any(e.get("docs_more") for e in entries)
                                   else PARTED_VERSION if shards > 1 else FORMAT_VERSION)
        manifest.save(self.folder)
        self._close_base()
        self._clean(keep=manifest.data_files())
        self._clean_states(entries)
        self._release()

    def _kept_entries(self) -> list[dict]:
        """The entries of the published segments this write keeps, a changed one with its new
        tombstones written (durably) and recorded; a segment whose every chunk and file is
        deleted goes."""
        entries: list[dict] = []
        for b in self.base_segments:
            if b.dropped:
                continue
            e = b.entry
            if b.changed:
                if e["live"] <= 0 and e["files"] <= 0:
                    continue  # everything in it is deleted: the segment goes
                name = f"del.{e['id']}.{self.gen}.bin"
                b.dead.save(self.folder / name)
                fsync_file(self.folder / name)
                rec = dict((e.get("integrity") or {"files": {}, "ntotal": e["rows"]}))
                files = {k: v for k, v in (rec.get("files") or {}).items() if k != e.get("deletes")}
                files[name] = integrity.file_record(self.folder / name)
                rec["files"] = files
                e["deletes"], e["integrity"] = name, rec
            entries.append(e)
        return entries

    def _write_new_segment(self, new_counts: dict, new_states: list[str], seg_index: dict, rolled: bool) -> dict | None:
        """Write the new segment's files (its docstore with its lexical terms, full vectors and
        vector index), durably, and close its docstore; gives back its entry, None where it is
        empty."""
        if new_counts["chunks"] or new_counts["files"]:
            if len(self.new_vecs) != new_counts["chunks"]:
                raise RuntimeError(f"the new segment holds {new_counts['chunks']} chunks but {len(self.new_vecs)} vectors")
            self.new_docs.write_lexical(self.carried)
            self.new_docs.commit()
            ids, vecs = self.new_vecs.arrays()
            # a fast-scan segment's rows list by list (store/merge.py: order_by_lists)
            order = vecfile.list_order(ids, self.vectors.lists()) if self.vectors.external_refine and len(ids) else None
            vecfile.write(self.folder / vecfile.file_name(self.seg_id), ids, vecs, seg_index.get("storage"), order)
            del ids, vecs
            self.vectors.save(self.folder / self.vectors_file, vectors_elsewhere=True)
            for name in (self.docs_file, self.vectors_file):
                fsync_file(self.folder / name)
            entry = segment_entry(self.folder, self.seg_id, self.new_docs, self.vectors,
                                  {k: v for k, v in seg_index.items() if k not in ("forced", "requested")}, new_states,
                                  rolled=rolled)
            self.new_docs.close()
            return entry
        self.new_docs.close()
        return None

    def _run_tail(self, entries: list[dict]) -> int:
        """How many segments end the list that a long run published as it went (rolled), this
        write's new one included: what merge 'run' merges first."""
        tail = 0
        while tail < len(entries) and (entries[-1 - tail].get("rolled") or entries[-1 - tail]["id"] == self.seg_id):
            tail += 1
        return tail

    def _clean_states(self, entries: list[dict]) -> None:
        states = self.folder / "states"
        if not states.is_dir():
            return
        used: set[str] = set()
        for e in entries:
            if "states" in e:
                used |= set(e["states"])
            else:  # a format-1 segment: ask its docstore
                try:
                    store = DocStore(self.folder / e["docs"], readonly=True)
                    used |= store.state_files()
                    store.close()
                except DB_ERRORS:
                    return  # keep everything rather than guess
        used = files_of(used)
        for p in states.iterdir():
            if p.name not in used:
                p.unlink()

    def abort(self) -> None:
        try:
            self.new_docs.close()
        finally:
            self._states.unlink()
            self._close_base()
            for f in (self.docs_file, self.vectors_file, self.vectors_file.replace(".faiss", ".vec"), f"lexical.{self.seg_id}.bin"):
                (self.folder / f).unlink(missing_ok=True)
            for e in self.extra:
                for f in [*docs_files(e), e["vectors"]] + [e[k] for k in ("vecs", "postings") if e.get(k)] + [f"states/{s}" for s in sorted(files_of(e.get("states", [])))]:
                    (self.folder / f).unlink(missing_ok=True)
            self._release()

    def _close_base(self) -> None:
        for b in self.base_segments:
            b.close()

    def _release(self) -> None:
        fcntl.flock(self._lock, fcntl.LOCK_UN)
        self._lock.close()

    def _clean(self, keep: set[str]) -> None:
        """Remove data files not in `keep` (older generations, or an interrupted run's)."""
        for p in self.folder.iterdir():
            # data files, the manifest's and a vector file's rewrite (vecfile.reorder) left by a crash
            stray = p.name == MANIFEST + ".tmp" or (p.name.endswith(".tmp") and bool(_gen_of(p.name[:-4])))
            if p.name in keep or not (_gen_of(p.name) or stray):
                continue
            p.unlink(missing_ok=True)


def _kept_vecs(e: dict) -> bool:
    """Whether a segment's vector file is one a merge rewrote in place (format 10: keepvecs)."""
    return bool(e.get("vecs")) and e["vecs"] != f"vectors.{e['id']}.vec"


def _seq(store: DocStore, table: str) -> int:
    row = store.db.execute("SELECT seq FROM sqlite_sequence WHERE name = ?", (table,)).fetchone()
    return int(row[0]) if row else 0


def _gen_of(name: str) -> int:
    """The largest number in a data file name such as docs.3.sqlite or del.3.7.bin (0 if not one)."""
    if not DATA_FILE.fullmatch(name):
        return 0
    return max(int(x) for x in name.split(".")[1:] if x.isdigit())


def _current_files(folder: Path) -> set[str]:
    """The data files the current manifest names, read leniently (any format version)."""
    try:
        raw = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    if not isinstance(raw, dict):
        return set()
    files, segments = raw.get("files"), raw.get("segments")
    names = {str(v) for v in files.values()} if isinstance(files, dict) else set()
    for s in segments if isinstance(segments, list) else []:
        if isinstance(s, dict):
            names |= {str(s.get(k)) for k in ("docs", "vectors", "vecs", "postings", "deletes") if s.get(k)}
            for key in ("docs_more", "vecs_more"):
                more = s.get(key)
                names |= {str(v) for v in more} if isinstance(more, list) else set()
    return names


def index_path(index: str | os.PathLike | None) -> Path:
    """The index folder: the argument, else $SEMSEARCH_INDEX, else ./indexes/default."""
    return Path(index or os.environ.get("SEMSEARCH_INDEX") or DEFAULT_INDEX)


def verify(folder: Path) -> list[str]:
    """Every problem found by reading every byte: full hashes, SQLite's integrity check, and the
    id sets of FAISS and SQLite compared, segment by segment. An empty list: the index is whole."""
    problems: list[str] = []
    folder = Path(folder)
    try:
        m, vectors, docs = open_index(folder, "cpu")
    except IndexFormatError as e:
        return [str(e)]
    try:
        for p in docs.parts:
            e = p.entry
            for name, want in ((e.get("integrity") or {}).get("files") or {}).items():
                if integrity.sha256(folder / name) != want.get("sha256"):
                    problems.append(str(damaged(folder, name, "damaged (its sha256 does not match the manifest)")))
            db = p.segment.docs.db
            try:
                status = [r[0] for r in db.execute("PRAGMA integrity_check")]  # (one "ok" a docstore)
                if set(status) != {"ok"}:
                    problems.append(str(damaged(folder, e["docs"], f"damaged (SQLite: {'; '.join(status[:3])})")))
                db_ids = np.array([r[0] for r in db.execute("SELECT id FROM chunks")], np.int64)
                if integrity.ids_fingerprint(db_ids) != integrity.ids_fingerprint(integrity.vector_ids(p.segment.vectors)):
                    problems.append(str(damaged(folder, e["docs"], "its chunk ids differ from the vector index's")))
                if len(p.dead.chunks) and not np.isin(p.dead.chunks, db_ids).all():
                    problems.append(str(damaged(folder, e["deletes"], "it deletes chunks its segment does not hold")))
            except DB_ERRORS as ex:
                problems.append(str(damaged(folder, e["docs"], f"damaged ({ex})")))
    finally:
        docs.close()
    return problems


def compact(folder: Path, shards: int | None = None) -> dict:
    """Merge every segment of an index into one without its deleted chunks, as one new generation
    (what the merge policy does piecemeal, done at once; a lone segment of an older format or
    another vector storage is rewritten); gives back the segment and chunk counts before and after.
    A partitioned index (store/partition.py) ends with one segment a partition; `shards`:
    partition the index into this many (re-partition one that is partitioned otherwise; 1: an
    index partitioned no more), each new partition one merge of the segments' rows that fall
    in it (store/merge.py apply_parted)."""
    import dataclasses
    import time

    t0 = time.perf_counter()
    folder = Path(folder)
    base = Manifest.load(folder)
    if shards is not None and shards < 1:
        raise InputError(f"--shards must be at least 1, got {shards}")
    before = {"segments": len(base.segments), "rows": sum(e["rows"] for e in base.segments)}
    n = int(base.shards if shards is None else shards)
    writer = IndexWriter(folder, base.dim, base)
    try:
        if n != base.shards:  # every segment split anew (or merged whole, for 1)
            for b in writer.base_segments:
                b.entry = {k: v for k, v in b.entry.items() if k not in ("part", "parts", "guests")}
        writer.commit(dataclasses.replace(base, index=dict(base.index), shards=n), merge="all")
    except BaseException:
        writer.abort()
        raise
    m = Manifest.load(folder)
    return {"segments_before": before["segments"], "rows_before": before["rows"], "segments": len(m.segments),
            "chunks": m.counts["chunks"], "generation": m.generation, "shards": m.shards,
            "seconds": round(time.perf_counter() - t0, 3)}


def tune(folder: Path, target: float = 0.95, sample: int = 500, k: int = 10) -> dict:
    """Tune the search knobs of an index's approximate segments again, to recall@k `target`
    against exact search, as the build does (merge.build_vectors: `sample` of each segment's own
    vectors as queries, each one's own vector left out), and publish them as a new generation:
    only the manifest changes, no data file is written. For an index built with another
    --target-recall, or one built before the tuner knew a knob (fast scan's k_factor).
    Gives back the segments tuned, with their knobs and recall before and after."""
    import dataclasses
    import time

    from semsearch.store.merge import tune_segment

    if not 0 < target <= 1:
        raise InputError(f"--target-recall must be in (0, 1], got {target}")
    t0 = time.perf_counter()
    folder = Path(folder)
    base = Manifest.load(folder)
    writer = IndexWriter(folder, base.dim, base)
    tuned = []
    try:
        for b in writer.base_segments:
            entry = b.entry
            if (entry.get("index") or {}).get("type", "flat") == "flat" or not entry.get("rows"):
                continue
            seg = Segment(folder, entry)
            try:
                if seg.vecs is None:
                    raise InputError(f"{folder}: segment {entry['id']} keeps its vectors in an older format; "
                                     "run `semsearch compact` first, then tune")
                before = {"params": dict(entry["index"].get("params") or {}), "recall": entry["index"].get("recall")}
                recall = tune_segment(seg.vectors, seg.vecs, target, k, sample)
            finally:
                seg.close()
            entry["index"] = {**entry["index"], "params": dict(seg.vectors.params), "recall": recall}
            tuned.append({"segment": entry["id"], "rows": entry["rows"], "before": before,
                          "after": {"params": entry["index"]["params"], "recall": recall}})
        if not tuned:
            writer.abort()
        else:
            writer.commit(dataclasses.replace(base, index=dict(base.index)), merge="none")
    except BaseException:
        writer.abort()
        raise
    return {"segments": tuned, "target": target, "seconds": round(time.perf_counter() - t0, 2)}
