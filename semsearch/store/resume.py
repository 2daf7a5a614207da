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
    def __init__(self, folder: Path, key: str):
        self.path = Path(folder) / NAME
        self.key = key
        self.reused = 0  # chunks whose vectors an earlier, interrupted run had embedded
        # Each row records the run that wrote it: a text this run embedded and then met again (a
        # duplicate chunk) is not work resumed from an interrupted run.
        self.run = os.urandom(8).hex()
        self._db: sqlite3.Connection | None = None  # opened at the first batch: a run that embeds nothing leaves no file

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            try:
                self._db = self._open()
            except sqlite3.Error as e:  # damaged: start a fresh one
                log.warning("%s: dropped a damaged resume cache (%s)", self.path, e)
                self.path.unlink(missing_ok=True)
                self._db = self._open()
        return self._db

    def _open(self) -> sqlite3.Connection:
        # The indexer's encoding thread encodes through this cache, and the run's thread forgets
        # and closes it: one at a time (indexing._Updating waits for the batch in the thread first).
        db = sqlite3.connect(self.path, check_same_thread=False)
        db.execute("PRAGMA synchronous = OFF")  # a cache: a torn write only costs re-embedding
        db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT NOT NULL)")
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'vectors'").fetchone() and \
                "run" not in {r[1] for r in db.execute("PRAGMA table_info(vectors)")}:
            db.execute("DROP TABLE vectors")  # a cache from before runs were recorded: re-embedding is the cost
        db.execute("CREATE TABLE IF NOT EXISTS vectors (h BLOB PRIMARY KEY, v BLOB NOT NULL, run TEXT)")
        row = db.execute("SELECT key FROM meta").fetchone()
        if row is None or row[0] != self.key:  # another model or pooling: useless
            db.execute("DELETE FROM vectors")
            db.execute("DELETE FROM meta")
            db.execute("INSERT INTO meta VALUES (?)", (self.key,))
        db.commit()
        return db

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
        try:
            self.db.executemany("INSERT OR REPLACE INTO vectors VALUES (?, ?, ?)",
                                [(h, np.ascontiguousarray(v, np.float32).tobytes(), self.run) for h, v in new])
            self.db.commit()
        except sqlite3.Error as e:
            log.warning("%s: could not write the resume cache (%s)", self.path, e)

    def encode_deferred(self, encoder, texts: list[str], keys: list[bytes]) -> tuple[np.ndarray, list[tuple[bytes, np.ndarray]]]:
        """Vectors (n, d) for texts (with their keys): from the cache where they are, else encoded;
        and the (key, vector) pairs encoded, for put()."""
        found: dict[bytes, np.ndarray] = {}
        earlier: set[bytes] = set()  # found, and written by another run
        try:
            for i in range(0, len(keys), 500):
                part = keys[i : i + 500]
                rows = self.db.execute(f"SELECT h, v, run FROM vectors WHERE h IN ({','.join('?' * len(part))})", part)
                for h, v, run in rows:
                    found[h] = np.frombuffer(v, np.float32)
                    if run != self.run:
                        earlier.add(h)
        except sqlite3.Error as e:
            log.warning("%s: resume cache unreadable (%s); encoding everything", self.path, e)
            found, earlier = {}, set()
        found = {h: v for h, v in found.items() if v.shape == (encoder.out_dim,)}
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

    def forget(self) -> None:
        """Drop every cached vector: the run published the files they belong to (a long run's
        segment), so a run resumed after it skips those files. Without this the cache grew by
        ~2 KB a chunk for the whole run (20 GB at 10M chunks); now it holds one segment's worth
        (SQLite reuses the freed pages)."""
        if self._db is None:
            return
        try:
            self._db.execute("DELETE FROM vectors")
            self._db.commit()
        except sqlite3.Error as e:
            log.warning("%s: could not clear the resume cache (%s)", self.path, e)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()

    def drop(self) -> None:
        """Delete the cache (the run it served was published)."""
        self.close()
        self.path.unlink(missing_ok=True)
        for extra in ("-journal", "-wal", "-shm"):
            Path(str(self.path) + extra).unlink(missing_ok=True)
