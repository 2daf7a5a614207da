"""The SQLite docstore: source files, their chunks, texts, offsets and metadata
(and, in segments written before format 4, their vectors)."""
from __future__ import annotations

import json
import os
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from semsearch.errors import IndexFormatError
from semsearch.store.files import Memo, connect_readonly, remedy
from semsearch.store import lexical

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    path TEXT UNIQUE NOT NULL,      -- absolute path: the identity of a source
    hash TEXT NOT NULL,             -- sha256 of the bytes
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL DEFAULT 0,  -- with the inode: a restored mtime cannot hide an edit
    inode INTEGER NOT NULL DEFAULT 0,
    documents INTEGER NOT NULL,
    indexed_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- the FAISS id; never reused
    file_id INTEGER NOT NULL REFERENCES files(id) ON DELETE CASCADE,
    row INTEGER,                    -- 1-based row / record for tabular files, NULL otherwise
    ord INTEGER NOT NULL,           -- chunk number within its document
    start INTEGER NOT NULL,         -- character offsets in the document text
    end INTEGER NOT NULL,
    line INTEGER,                   -- 1-based line of `start` for whole-file documents
    text TEXT NOT NULL,
    metadata TEXT,                  -- JSON object
    vector BLOB,                    -- before format 4: float32 (dim,); since, NULL (vectors.<s>.vec holds them)
    state_file TEXT,                -- with --keep-states: token states in states/<file>, fp16 (state_len, D)
    state_off INTEGER,              -- first token's row in that file
    state_len INTEGER,
    lex BLOB,                       -- before format 5: lexical terms, sorted 64-bit term hashes + counts
    lex_len INTEGER                 -- (store/lexical/) and their number; since, NULL (lexical.<s>.bin holds them)
);
CREATE INDEX IF NOT EXISTS chunks_file ON chunks(file_id);
"""


@dataclass
class ChunkRow:
    file_id: int
    row: int | None
    ord: int
    start: int
    end: int
    line: int | None
    text: str
    metadata: dict[str, Any]
    state: tuple[str, int, int] | None = None  # (file, first row, tokens) of kept token states
    context: str = ""  # what the chunk is also searched by, not shown (its page and section titles)

    @property
    def lexical_text(self) -> str:
        """The text BM25 indexes for this chunk: its context, then its text."""
        return f"{self.context}\n{self.text}" if self.context else self.text


@dataclass
class StoredFile:
    id: int
    path: str
    hash: str
    size: int
    mtime_ns: int
    documents: int
    ctime_ns: int = 0
    inode: int = 0


class DocStore:
    """One generation's docstore. A writer's holds one connection; a reader's opens one read-only
    connection per thread that uses it (SQLite's own advice for concurrent readers: no thread
    waits on another's statement), and no Python function is ever registered on them, so no
    thread inside SQLite can wait for the interpreter's lock while another holds it."""

    def __init__(self, path: Path, readonly: bool = False, unpublished: bool = False):
        """`unpublished`: a new segment's file, which no manifest names until the writer has
        fsynced it: SQLite's own journal and syncs would only slow it down."""
        self.path = Path(path)
        self.readonly = readonly
        self._memo = Memo()
        # A writer's chunks' lexical terms until write_lexical(): (chunk id, term blob, length)
        self.terms: list[tuple[int, bytes, int]] = []
        if readonly:
            # The first connection also keeps this generation readable after a writer publishes
            # the next one and removes these files: a thread that can no longer open the path
            # shares it (SQLite serialises its statements; nothing else is shared).
            self._anchor = connect_readonly(self.path, check_same_thread=False)  # by quoted URI: '#', '?', '%' in paths
            self._anchor.execute("PRAGMA foreign_keys = ON")
            self._local = threading.local()
            self._conns: list[sqlite3.Connection] = [self._anchor]
            self._conns_lock = threading.Lock()
        else:
            self._anchor = sqlite3.connect(self.path)
            if unpublished:
                self._anchor.execute("PRAGMA journal_mode = OFF")
                self._anchor.execute("PRAGMA synchronous = OFF")
            self._anchor.executescript(SCHEMA)
            lexical.add_columns(self._anchor)  # a docstore from before lexical search gets its terms
            cols = {r[1] for r in self._anchor.execute("PRAGMA table_info(files)")}
            for col in ("ctime_ns", "inode"):  # docstores written before these columns
                if col not in cols:
                    self._anchor.execute(f"ALTER TABLE files ADD COLUMN {col} INTEGER NOT NULL DEFAULT 0")
            self._anchor.execute("PRAGMA foreign_keys = ON")

    @property
    def db(self) -> sqlite3.Connection:
        """This thread's connection (a writer's store has one)."""
        if not self.readonly:
            return self._anchor
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = connect_readonly(self.path, check_same_thread=False)
                conn.execute("PRAGMA foreign_keys = ON")
                with self._conns_lock:
                    self._conns.append(conn)
            except sqlite3.Error:  # the writer removed this generation's file: share the first connection
                conn = self._anchor
            self._local.conn = conn
        return conn

    def memo(self, key: Any, build):
        """build() computed once per docstore (one generation: its data never change) and kept;
        for in-memory forms of its columns (metadata filters). Safe from many threads."""
        return self._memo(key, build)

    def close(self) -> None:
        if not self.readonly:
            self._anchor.close()
            return
        with self._conns_lock:
            conns, self._conns = self._conns, []
        for c in conns:
            c.close()

    def commit(self) -> None:
        self.db.commit()

    # ---- files ---------------------------------------------------------------------------
    def files(self) -> dict[str, StoredFile]:
        rows = self.db.execute("SELECT id, path, hash, size, mtime_ns, documents, ctime_ns, inode FROM files")
        return {r[1]: self.stored_file(r) for r in rows}

    def stored_file(self, r: tuple) -> StoredFile:
        """A files row (id, path, hash, size, mtime_ns, documents, ctime_ns, inode), checked: damage
        inside the database that its page checks cannot see (a zeroed path) is an IndexFormatError."""
        if not (isinstance(r[1], str) and isinstance(r[2], str) and all(type(x) is int for x in (r[0], *r[3:]))):
            raise IndexFormatError(f"{self.path}: damaged (a file record holds {str(r)[:80]}); {remedy(self.path.parent)}")
        return StoredFile(*r)

    def add_file(self, path: str, hash: str, size: int, mtime_ns: int, now: str, ctime_ns: int = 0, inode: int = 0) -> int:
        cur = self.db.execute(
            "INSERT INTO files (path, hash, size, mtime_ns, documents, indexed_at, ctime_ns, inode) VALUES (?, ?, ?, ?, 0, ?, ?, ?)",
            (path, hash, size, mtime_ns, now, ctime_ns, inode),
        )
        return int(cur.lastrowid)

    def set_documents(self, file_id: int, documents: int) -> None:
        self.db.execute("UPDATE files SET documents = ? WHERE id = ?", (documents, file_id))

    def touch_file(self, file_id: int, size: int, mtime_ns: int, ctime_ns: int = 0, inode: int = 0) -> None:
        self.db.execute("UPDATE files SET size = ?, mtime_ns = ?, ctime_ns = ?, inode = ? WHERE id = ?",
                        (size, mtime_ns, ctime_ns, inode, file_id))

    def remove_file(self, file_id: int) -> np.ndarray:
        """Delete a file and its chunks; gives back the removed chunk ids."""
        ids = np.array([r[0] for r in self.db.execute("SELECT id FROM chunks WHERE file_id = ?", (file_id,))], np.int64)
        self.db.execute("DELETE FROM chunks WHERE file_id = ?", (file_id,))
        self.db.execute("DELETE FROM files WHERE id = ?", (file_id,))
        return ids

    # ---- chunks --------------------------------------------------------------------------
    def add_chunks(self, rows: list[ChunkRow]) -> np.ndarray:
        """Insert chunks; gives back their new ids (n,). Their vectors go to the segment's vector
        file (store/vecfile.py) and their lexical terms to its posting file at commit
        (write_lexical), not here: one stored copy of each."""
        if not rows:
            return np.zeros(0, np.int64)
        # The ids AUTOINCREMENT would give, given up front so that one executemany inserts the
        # batch (a statement a row cost ~25 us of Python at 200k chunks); SQLite then moves the
        # table's sequence past them, as it does for its own.
        seq, top = self.db.execute("SELECT (SELECT seq FROM sqlite_sequence WHERE name = 'chunks'),"
                                   " (SELECT max(id) FROM chunks)").fetchone()
        first = max(seq or 0, top or 0) + 1
        ids = np.arange(first, first + len(rows), dtype=np.int64)
        dumps = json.JSONEncoder(ensure_ascii=False).encode
        self.db.executemany(
            "INSERT INTO chunks (id, file_id, row, ord, start, end, line, text, metadata,"
            " state_file, state_off, state_len) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(cid, r.file_id, r.row, r.ord, r.start, r.end, r.line, r.text, dumps(r.metadata) if r.metadata else None,
              *(r.state or (None, None, None))) for cid, r in zip(ids.tolist(), rows)],
        )
        self.terms.extend((cid, blob, n) for cid, (blob, n) in
                          zip(ids.tolist(), lexical.encode_terms_many([r.lexical_text for r in rows])))
        return ids

    def get_chunks(self, ids: Iterable[int]) -> dict[int, dict[str, Any]]:
        """Chunk records (with their file's path) by id."""
        ids = [int(i) for i in ids]
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        try:
            rows = self.db.execute(
                "SELECT c.id, f.path, c.row, c.ord, c.start, c.end, c.line, c.text, c.metadata"
                f" FROM chunks c JOIN files f ON f.id = c.file_id WHERE c.id IN ({marks})",
                ids,
            ).fetchall()
        except (sqlite3.DatabaseError, UnicodeDecodeError) as e:  # a damaged page that the load-time checks did not read
            raise IndexFormatError(f"{self.path}: damaged ({e}); {remedy(self.path.parent)}") from e
        out = {}
        for cid, path, row, ord_, start, end, line, text, meta in rows:
            try:
                metadata = json.loads(meta) if meta else {}
            except (ValueError, TypeError, RecursionError) as e:
                raise IndexFormatError(f"{self.path}: damaged (metadata of chunk {cid}: {e}); {remedy(self.path.parent)}") from e
            out[cid] = dict(id=cid, path=path, row=row, chunk=ord_, start=start, end=end, line=line,
                            text=text, metadata=metadata)
        return out

    def get_vectors(self, ids: Iterable[int]) -> tuple[np.ndarray, np.ndarray]:
        """(ids (n,), vectors (n, d)) of the given chunk ids that exist, in id order (a segment
        written before format 4; see store/segments.py Segment.vectors_of)."""
        ids = sorted({int(i) for i in ids})
        found_ids: list[int] = []
        blobs: list[bytes] = []
        try:
            for at in range(0, len(ids), 30_000):  # SQLite's variable limit
                part = ids[at : at + 30_000]
                marks = ",".join("?" * len(part))
                for cid, blob in self.db.execute(f"SELECT id, vector FROM chunks WHERE id IN ({marks}) ORDER BY id", part):
                    found_ids.append(cid)
                    blobs.append(blob)
            if not blobs:
                return np.zeros(0, np.int64), np.zeros((0, 0), np.float32)
            return np.array(found_ids, np.int64), np.frombuffer(b"".join(blobs), np.float32).reshape(len(blobs), -1)
        except (sqlite3.DatabaseError, ValueError, TypeError) as e:  # a damaged page or vector the load checks did not read
            raise IndexFormatError(f"{self.path}: damaged ({e}); {remedy(self.path.parent)}") from e

    def lexical(self) -> "lexical.LexicalIndex | None":
        """The BM25 index of these chunks (None for a docstore from before lexical search)."""
        try:
            return lexical.load(self.db)
        except (sqlite3.DatabaseError, UnicodeDecodeError, ValueError, IndexError, TypeError) as e:
            raise IndexFormatError(f"{self.path}: damaged lexical index ({e}); {remedy(self.path.parent)}") from e

    def write_lexical(self, carried=()) -> int:
        """Write the segment's posting file beside this docstore (`lexical.<s>.bin`, memory-mapped
        by readers; at commit) from the terms of the chunks added (those still here), the terms
        older docstores' rows carry in their `lex` column, and the live rows of `carried` posting
        sets [(postings, deleted ids)]: the segments a merge or a re-pooling write took in whole
        (lexical.write_segment_file). Gives back the row count."""
        alive = np.array([r[0] for r in self.db.execute("SELECT id FROM chunks ORDER BY id")], np.int64)
        rows = [(i, b, n) for i, b, n in self.db.execute("SELECT id, lex, lex_len FROM chunks WHERE lex IS NOT NULL")]
        stored = len(rows)
        if self.terms:
            mine = np.array([t[0] for t in self.terms], np.int64)
            held = alive[np.searchsorted(alive, mine).clip(0, max(len(alive) - 1, 0))] == mine if len(alive) else np.zeros(len(mine), bool)
            rows += [t for t, h in zip(self.terms, held.tolist()) if h]
        n = lexical.write_segment_file(self.path.parent / lexical.file_name(self.path.name),
                                       np.array([r[0] for r in rows], np.int64), [r[1] for r in rows],
                                       np.array([r[2] or 0 for r in rows], np.float32), carried)
        self.terms = []
        self.db.execute("DROP TABLE IF EXISTS lexical")  # a merged segment's copy of an older layout
        if stored:
            # rows of an older docstore brought their terms: the posting file holds them now (once,
            # when a merge or re-pooling write takes such a segment in; VACUUM gives the space back)
            self.db.execute("UPDATE chunks SET lex = NULL, lex_len = NULL WHERE lex IS NOT NULL")
            self.db.commit()
            self.db.execute("VACUUM")
        return n

    def iter_vectors(self, batch: int = 8192, keep=None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(ids (n,), vectors (n, d)) in batches (a segment written before format 4); `keep(ids)
        -> bool mask` selects (a batch it keeps nothing of is skipped)."""
        cur = self.db.execute("SELECT id, vector FROM chunks ORDER BY id")
        while rows := cur.fetchmany(batch):
            ids = np.array([r[0] for r in rows], np.int64)
            bad = [r[0] for r in rows if not isinstance(r[1], bytes) or len(r[1]) != len(rows[0][1] or b"") or not r[1]]
            if bad:  # damage inside the database that its page checks cannot see
                raise IndexFormatError(f"{self.path}: damaged (chunk {bad[0]} has no valid vector); {remedy(self.path.parent)}")
            vecs = np.stack([np.frombuffer(r[1], np.float32) for r in rows])
            m = keep(ids) if keep is not None else None
            if m is None or m.all():
                yield ids, vecs
            elif m.any():
                yield ids[m], vecs[m]

    def iter_states_refs(self, batch: int = 4096) -> Iterator[list[tuple[int, str | None, int, int]]]:
        """[(chunk id, state file, first row, tokens)] in batches, for re-pooling."""
        cur = self.db.execute("SELECT id, state_file, state_off, state_len FROM chunks ORDER BY id")
        while rows := cur.fetchmany(batch):
            yield rows

    def state_files(self) -> set[str]:
        return {r[0] for r in self.db.execute("SELECT DISTINCT state_file FROM chunks WHERE state_file IS NOT NULL")}

    # ---- columns for metadata filters (read once per generation; see semsearch/filters.py) ----
    def chunk_files(self) -> tuple[np.ndarray, np.ndarray]:
        """(chunk ids (n,), their file ids (n,)), in chunk id order."""
        a = self._read_pairs("SELECT id, file_id FROM chunks ORDER BY id")
        return a[:, 0].copy(), a[:, 1].copy()

    def metadata_values(self, key_path: str) -> tuple[np.ndarray, list[Any]]:
        """(chunk ids, values) of the chunks whose metadata has the field at the JSON path
        `key_path` (as SQLite's json_extract gives it: str, int, float; true/false as 1/0)."""
        try:
            rows = self.db.execute("SELECT id, v FROM (SELECT id, json_extract(metadata, ?) AS v FROM chunks"
                                   " WHERE metadata IS NOT NULL) WHERE v IS NOT NULL ORDER BY id", (key_path,)).fetchall()
        except sqlite3.DatabaseError as e:
            raise IndexFormatError(f"{self.path}: damaged ({e}); {remedy(self.path.parent)}") from e
        return np.fromiter((r[0] for r in rows), np.int64, len(rows)), [r[1] for r in rows]

    def metadata_keys(self) -> frozenset[str]:
        """The top-level metadata field names of this docstore's chunks."""
        try:
            rows = self.db.execute("SELECT DISTINCT j.key FROM chunks, json_each(chunks.metadata) AS j"
                                   " WHERE chunks.metadata IS NOT NULL AND json_type(chunks.metadata) = 'object'").fetchall()
        except sqlite3.DatabaseError as e:
            raise IndexFormatError(f"{self.path}: damaged ({e}); {remedy(self.path.parent)}") from e
        return frozenset(r[0] for r in rows)

    def files_matching(self, globs: list[str]) -> np.ndarray:
        """Ids of the files whose path matches any of the SQLite GLOB patterns."""
        where = " OR ".join("path GLOB ?" for _ in globs) or "0"
        return np.array([r[0] for r in self.db.execute(f"SELECT id FROM files WHERE {where}", globs)], np.int64)

    def _read_pairs(self, sql: str) -> np.ndarray:
        try:
            rows = self.db.execute(sql).fetchall()
        except sqlite3.DatabaseError as e:
            raise IndexFormatError(f"{self.path}: damaged ({e}); {remedy(self.path.parent)}") from e
        return np.array(rows, np.int64).reshape(len(rows), 2)

    def counts(self) -> dict[str, int]:
        files, docs = self.db.execute("SELECT COUNT(*), COALESCE(SUM(documents), 0) FROM files").fetchone()
        chunks = self.db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
        return {"files": files, "documents": docs, "chunks": chunks}


# ---- a segment over several docstores ------------------------------------------------------------
# A long build publishes a segment every ~250k chunks as it goes, and its end merges them into one
# segment: one vector index and one posting file. Copying their docstores into a new one too cost
# the build its largest file again beside the old ones (14 GB at 10M chunks, 54-80 s: the disk
# peak of 2.1x the index, docs/benchmarks.md). Since format 8 the merged segment keeps them where
# they are: its entry names the first as `docs` and the others as `docs_more`, each holding a
# range of chunk ids after the one before, and every file's chunks inside one of them (a long run
# rolls segments between files). SQLite would read them as one database through ATTACH and a
# view, but attaches at most 10 (a 10M build writes 40); DocStores gives the reads segments make.
def docs_files(entry: dict) -> list[str]:
    """The docstore files of a segment's manifest entry, in chunk id order."""
    return [entry["docs"], *(entry.get("docs_more") or ())]


def open_docs(folder: Path, entry: dict) -> "DocStore | DocStores":
    """A published segment's docstore(s), read-only. Several are kept open for the next caller
    after close() (up to KEPT_OPEN idle ones, by their files' identities): every write reads the
    published segments' files, and opening 40 SQLite files (a 10M-chunk build's) cost it ~1 ms
    each, over the whole budget of a one-document write."""
    names = docs_files(entry)
    if len(names) == 1:
        return DocStore(Path(folder) / names[0], readonly=True)
    paths = [Path(folder) / n for n in names]
    key = tuple((str(p), st.st_ino, st.st_size, st.st_mtime_ns) for p in paths for st in (p.stat(),))
    with _OPEN_LOCK:
        got = _OPEN.pop(key, None)
        if got is None:
            got = DocStores(paths)
            got._key = key
        _OPEN[key] = got  # newest last
        got._users += 1
        idle = [k for k, v in _OPEN.items() if v._users == 0]
        for k in idle[: max(0, len(idle) - KEPT_OPEN)]:
            _OPEN.pop(k).members_close()
    return _Handle(got)


class _Handle:
    """One opener's use of shared DocStores: its reads go through; close() releases it once."""

    def __init__(self, shared: "DocStores"):
        self._shared, self._closed = shared, False

    def __getattr__(self, name: str):
        return getattr(self._shared, name)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._shared.close()


KEPT_OPEN = 4
_OPEN: dict[tuple, "DocStores"] = {}
_OPEN_LOCK = threading.Lock()


class _Chained:
    """The rows of one statement run on several connections in turn, as one cursor gives them."""

    def __init__(self, cursors: Iterator[sqlite3.Cursor]):
        self._rows = (row for cur in cursors for row in cur)

    def __iter__(self):
        return self._rows

    def fetchone(self):
        return next(self._rows, None)

    def fetchall(self) -> list:
        return list(self._rows)

    def fetchmany(self, size: int) -> list:
        out = []
        for row in self._rows:
            out.append(row)
            if len(out) >= size:
                break
        return out


class _ChainedDB:
    """execute() over every member docstore's connection, in chunk id order: a statement whose
    rows are per chunk or per file (not an aggregate) reads as over one database."""

    def __init__(self, stores: list[DocStore]):
        self._stores = stores

    def execute(self, sql: str, params=()) -> _Chained:
        return _Chained(s.db.execute(sql, params) for s in self._stores)


class DocStores:
    """Several read-only docstores of one segment (format 8, see above) with DocStore's read
    interface: lookups by chunk id go to the member whose id range holds them."""

    readonly = True

    def __init__(self, paths: list[Path]):
        self.members: list[DocStore] = []
        try:
            for p in paths:
                self.members.append(DocStore(p, readonly=True))
        except BaseException:
            self.members_close()
            raise
        self.path = self.members[0].path  # for messages
        self.db = _ChainedDB(self.members)
        self._memo = Memo()
        self._key: tuple | None = None  # kept open for the next caller (open_docs)
        self._users = 0

    def _firsts(self) -> tuple[np.ndarray, np.ndarray]:
        """(the members holding chunks, the first chunk id of each): read once, when first routed
        (one primary-key lookup a member; `SELECT MIN(id), MAX(id)` would scan every row)."""
        def read():
            firsts = [m.db.execute("SELECT id FROM chunks ORDER BY id LIMIT 1").fetchone() for m in self.members]
            held = [j for j, r in enumerate(firsts) if r is not None]  # (a member may hold only empty files)
            return np.array(held, np.int64), np.array([firsts[j][0] for j in held], np.int64)

        return self._memo("firsts", read)

    def memo(self, key: Any, build):
        return self._memo(key, build)

    def close(self) -> None:
        """Closed, or left open for the next open_docs() of the same files (closed when more
        than KEPT_OPEN are idle)."""
        if self._key is not None:
            with _OPEN_LOCK:
                self._users -= 1
                if self._users or not self._replaced():
                    return
                if _OPEN.get(self._key) is self:
                    del _OPEN[self._key]
        self.members_close()

    def _replaced(self) -> bool:
        """Whether a file of these was removed or replaced since it was opened (`compact`, a
        rebuild): kept open, its disk space would not be given back until the process ends."""
        for path, ino, *_ in self._key or ():
            try:
                if os.stat(path).st_ino != ino:
                    return True
            except OSError:
                return True
        return False

    def members_close(self) -> None:
        for m in self.members:
            m.close()

    def _route(self, ids: Iterable[int]) -> list[tuple[DocStore, list[int]]]:
        ids = sorted({int(i) for i in ids})
        held, lo = self._firsts()
        at = np.searchsorted(lo, np.array(ids, np.int64), "right") - 1
        out: dict[int, list[int]] = {}
        for i, j in zip(ids, at.tolist()):
            if j >= 0:
                out.setdefault(int(held[j]), []).append(i)
        return [(self.members[j], part) for j, part in sorted(out.items())]

    def files(self) -> dict[str, StoredFile]:
        out: dict[str, StoredFile] = {}
        for m in self.members:
            out.update(m.files())
        return out

    def stored_file(self, r: tuple) -> StoredFile:
        return self.members[0].stored_file(r)

    def get_chunks(self, ids: Iterable[int]) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for m, part in self._route(ids):
            out.update(m.get_chunks(part))
        return out

    def get_vectors(self, ids: Iterable[int]) -> tuple[np.ndarray, np.ndarray]:
        raise IndexFormatError(f"{self.path}: a segment of several docstores keeps its vectors in its vector file")

    def lexical(self):
        return None  # (its posting file holds its terms: since format 5)

    def iter_states_refs(self, batch: int = 4096) -> Iterator[list[tuple[int, str | None, int, int]]]:
        for m in self.members:
            yield from m.iter_states_refs(batch)

    def state_files(self) -> set[str]:
        return set().union(*(m.state_files() for m in self.members))

    def chunk_files(self) -> tuple[np.ndarray, np.ndarray]:
        got = [m.chunk_files() for m in self.members]
        return np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got])

    def metadata_values(self, key_path: str) -> tuple[np.ndarray, list[Any]]:
        got = [m.metadata_values(key_path) for m in self.members]
        return np.concatenate([g[0] for g in got]), [v for g in got for v in g[1]]

    def metadata_keys(self) -> frozenset[str]:
        return frozenset().union(*(m.metadata_keys() for m in self.members))

    def files_matching(self, globs: list[str]) -> np.ndarray:
        return np.concatenate([m.files_matching(globs) for m in self.members])

    def counts(self) -> dict[str, int]:
        got = [m.counts() for m in self.members]
        return {k: sum(g[k] for g in got) for k in got[0]}
