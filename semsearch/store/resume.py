"""Vectors embedded by a run that did not finish, so the next run does not embed them again.

An index run publishes nothing until its commit, so an interrupted run (Ctrl-C, kill, power
loss) leaves the previous index whole, and would lose all its embedding work. Each batch of
vectors is therefore also written, as it is made, to `resume.sqlite` in the index folder, keyed
by a hash of the chunk text and the encoder's identity; the next run takes vectors from it
before encoding, and a successful commit deletes it. It is a cache: damaged or foreign, it is
dropped and rebuilt, never trusted over the encoder.
"""
from __future__ import annotations

import hashlib
import itertools
import logging
import os
import sqlite3
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

NAME = "resume.sqlite"


def encoder_key(encoder) -> str:
    head = (getattr(encoder, "head_info", None) or {}).get("fingerprint", "")
    return f"{encoder.fingerprint}|{encoder.pooling}|{head}|{encoder.max_length}|{encoder.out_dim}"


class ResumeCache:
    """The vectors of a run, a row a batch: the batch's keys (16-byte hashes, joined) and its
    vectors (float32, joined), appended as the run writes the batch. A row per vector (a keyed
    B-tree insert of 1.5 KB each) cost the build's writing thread ~23 s a million chunks, and
    clearing it at each published segment ~1.2 s more (docs/benchmarks.md); a batch row is one
    append. Look-ups go through a map of key -> (row, place) in memory: the rows of an earlier
    run, read when this run first looks (16 bytes a chunk read), and this run's own as they are
    put; a vector found is read alone from its row (SQLite's incremental blob I/O)."""

    def __init__(self, folder: Path, key: str):
        self.path = Path(folder) / NAME
        self.key = key
        self.reused = 0  # chunks whose vectors an earlier, interrupted run had embedded
        # Each row records the run that wrote it: a text this run embedded and then met again (a
        # duplicate chunk) is not work resumed from an interrupted run.
        self.run = os.urandom(8).hex()
        self._db: sqlite3.Connection | None = None  # opened at the first batch: a run that embeds nothing leaves no file
        self._where: dict[bytes, tuple[int, int, bool]] = {}  # key -> (row, place, an earlier run's), set as it opens

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            db = None
            try:
                db = self._open()
                where = self._read_keys(db)
            except sqlite3.Error as e:  # damaged: start a fresh one
                log.warning("%s: dropped a damaged resume cache (%s)", self.path, e)
                if db is not None:
                    db.close()
                self.path.unlink(missing_ok=True)
                db, where = self._open(), {}
            self._db, self._where = db, where
        return self._db

    def _open(self) -> sqlite3.Connection:
        # The indexer's encoding thread encodes through this cache, and the run's thread forgets
        # and closes it: one at a time (indexing._Updating waits for the batch in the thread first).
        db = sqlite3.connect(self.path, check_same_thread=False)
        db.execute("PRAGMA synchronous = OFF")  # a cache: a torn write only costs re-embedding
        db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT NOT NULL)")
        db.execute("DROP TABLE IF EXISTS vectors")  # a cache of the row-a-vector layout: re-embedding is the cost
        db.execute("CREATE TABLE IF NOT EXISTS batches (id INTEGER PRIMARY KEY, n INTEGER NOT NULL, dim INTEGER NOT NULL,"
                   " keys BLOB NOT NULL, vecs BLOB NOT NULL, run TEXT NOT NULL)")
        row = db.execute("SELECT key FROM meta").fetchone()
        if row is None or row[0] != self.key:  # another model or pooling: useless
            db.execute("DELETE FROM batches")
            db.execute("DELETE FROM meta")
            db.execute("INSERT INTO meta VALUES (?)", (self.key,))
        db.commit()
        return db

    def _read_keys(self, db: sqlite3.Connection) -> dict[bytes, tuple[int, int, bool]]:
        where: dict[bytes, tuple[int, int, bool]] = {}
        for rid, n, keys, run in db.execute("SELECT id, n, keys, run FROM batches ORDER BY id"):
            if len(keys) != 16 * n:
                continue  # not a row this layout wrote whole
            for i in range(n):
                where[keys[16 * i : 16 * i + 16]] = (rid, i, run != self.run)
        return where

    @staticmethod
    def _h(text: str) -> bytes:
        return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()

    def encode(self, encoder, texts: list[str]) -> np.ndarray:
        """Vectors (n, d) for texts: from the cache where they are, else encoded and cached."""
        out, new = self.encode_deferred(encoder, texts, self.keys(texts))
        self.put(new)
        return out

    def keys(self, texts: list[str]) -> list[bytes]:
        """The cache's keys of texts (hashes): computed where the caller has time (the build's
        thread), not in the encoding thread, which a GPU waits on."""
        return [self._h(t) for t in texts]

    def put(self, new: list[tuple[bytes, np.ndarray]]) -> None:
        """Cache the vectors encode_deferred encoded: the build calls this as it writes their batch,
        in its own thread, so that the encoding thread goes on to the next batch meanwhile (a crash
        in between costs that batch's encoding on resume, no more)."""
        if not new:
            return
        vecs = np.ascontiguousarray(np.stack([v for _, v in new]), np.float32)
        try:
            db = self.db
            cur = db.execute("INSERT INTO batches (n, dim, keys, vecs, run) VALUES (?, ?, ?, ?, ?)",
                             (len(new), vecs.shape[1], b"".join(h for h, _ in new), vecs.tobytes(), self.run))
            db.commit()
        except sqlite3.Error as e:
            log.warning("%s: could not write the resume cache (%s)", self.path, e)
            return
        for i, (h, _) in enumerate(new):
            self._where[h] = (cur.lastrowid, i, False)

    def encode_deferred(self, encoder, texts: list[str], keys: list[bytes]) -> tuple[np.ndarray, list[tuple[bytes, np.ndarray]]]:
        """Vectors (n, d) for texts (with their keys): from the cache where they are, else encoded;
        and the (key, vector) pairs encoded, for put()."""
        found, earlier = self._found(keys, encoder.out_dim)
        todo = [i for i, h in enumerate(keys) if h not in found]
        out = np.empty((len(texts), encoder.out_dim), np.float32)
        encoded: list[tuple[bytes, np.ndarray]] = []
        if todo:
            new = encoder.encode([texts[i] for i in todo], progress=False)
            out[todo] = new
            encoded = [(keys[i], v) for i, v in zip(todo, new)]
        for i, h in enumerate(keys):
            if h in found:
                out[i] = found[h]
        self.reused += sum(1 for h in keys if h in found and h in earlier)
        return out, encoded

    def _found(self, keys: list[bytes], dim: int) -> tuple[dict[bytes, np.ndarray], set[bytes]]:
        """The cached vectors of `keys` ({key: vector}), and which of them an earlier run wrote."""
        found: dict[bytes, np.ndarray] = {}
        earlier: set[bytes] = set()
        try:
            db = self.db  # (an earlier run's keys are read as it opens)
            hits = sorted((*self._where[h][:2], h) for h in set(keys) if h in self._where)
            width = 4 * dim
            for rid, group in itertools.groupby(hits, key=lambda hit: hit[0]):
                with db.blobopen("batches", "vecs", rid, readonly=True) as blob:
                    for _, i, h in group:
                        blob.seek(i * width)
                        got = blob.read(width)
                        if len(got) == width:  # (a row of another width: the key names the encoder's, so none)
                            found[h] = np.frombuffer(got, np.float32)
                            if self._where[h][2]:
                                earlier.add(h)
        except sqlite3.Error as e:
            log.warning("%s: resume cache unreadable (%s); encoding everything", self.path, e)
            return {}, set()
        return found, earlier

    def forget(self) -> None:
        """Drop every cached vector: the run published the files they belong to (a long run's
        segment), so a run resumed after it skips those files. Without this the cache grew by
        ~2 KB a chunk for the whole run (20 GB at 10M chunks); now it holds one segment's worth.
        The file goes (the next batch starts a new one): a DELETE of a segment's rows cost ~1.2 s."""
        if self._db is None:
            return
        self.drop()
        self._where = {}

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def drop(self) -> None:
        """Delete the cache (the run it served was published)."""
        self.close()
        self.path.unlink(missing_ok=True)
        for extra in ("-journal", "-wal", "-shm"):
            Path(str(self.path) + extra).unlink(missing_ok=True)
