"""The index folder: manifest.json + vectors.<gen>.faiss + docs.<gen>.sqlite, written atomically.

Each write builds a new generation of the data files beside the current one and publishes it by
replacing manifest.json in one rename; until then readers (and an interrupted writer's next run)
see the previous generation whole. Files of other generations are removed afterwards.
"""
from __future__ import annotations

import datetime as dt
import fcntl
import os
import json
import sqlite3

import numpy as np
from pathlib import Path

from semsearch.errors import IndexFormatError, IndexLocked
from semsearch.store import integrity
from semsearch.store.files import DB_ERRORS, damaged, fsync_dir, fsync_file, manifest_stamp
from semsearch.store.docstore import DocStore
from semsearch.store.manifest import MANIFEST, Manifest
from semsearch.store.vectors import VectorIndex

DEFAULT_INDEX = "indexes/default"


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def open_index(folder: Path, device: str = "cpu") -> tuple[Manifest, VectorIndex, DocStore]:
    """The manifest, vector index and (read-only) docstore of an index folder; the vector index
    is searched on a GPU where device is 'cuda' (see resolve_index_device).

    A writer may publish the next generation, and remove this one's files, between the reading
    of the manifest and the opening of its files: a failure to open them while the manifest
    changed under the reader is that race, not damage, and the current generation is opened."""
    folder = Path(folder)
    for _ in range(20):
        stamp = manifest_stamp(folder)
        try:
            return _open_generation(folder, device)
        except (IndexFormatError, FileNotFoundError):  # a file checked or opened after the writer removed it
            if manifest_stamp(folder) == stamp:
                raise
    return _open_generation(folder, device)


def _open_generation(folder: Path, device: str) -> tuple[Manifest, VectorIndex, DocStore]:
    m = Manifest.load(folder)
    vectors = _load_vectors(folder, m, device)
    try:
        docs = DocStore(folder / m.files["docs"], readonly=True)
    except DB_ERRORS as e:
        raise damaged(folder, m.files["docs"], f"damaged ({e})") from e
    try:
        integrity.check_loaded(folder, m, vectors, docs)
    except BaseException:
        docs.close()
        raise
    return m, vectors, docs


def _load_vectors(folder: Path, m: Manifest, device: str = "cpu") -> VectorIndex:
    """The manifest's vector index, its data files checked first (faiss must never parse junk)."""
    integrity.check_files(folder, m)
    try:
        return VectorIndex.load(folder / m.files["vectors"], m.index.get("type", "flat"), m.index.get("params"), device)
    except (RuntimeError, MemoryError, AttributeError, TypeError, ValueError) as e:
        raise damaged(folder, m.files["vectors"], f"damaged ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from e


class IndexWriter:
    """A new generation of an index folder, published by commit(); abort() leaves the old one.

    `base` is the manifest whose data the new generation starts from (None: start empty, as for
    a new index or --rebuild). Files the current manifest names are never touched before commit.
    """

    def __init__(self, folder: Path, dim: int, base: Manifest | None = None, kind: str = "flat"):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.folder / ".lock", "w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            self._lock.close()
            raise IndexLocked(f"{folder} is being written by another semsearch process") from e
        if base is not None:  # a damaged base stops the run before anything is cleaned or written
            try:
                integrity.check_files(self.folder, base)
            except BaseException:
                self._release()
                raise
        current = _current_files(self.folder)
        self._clean(keep=current)  # leftovers of an interrupted run
        self.gen = max([_gen_of(p.name) for p in self.folder.iterdir()] + [0]) + 1
        self.docs_file = f"docs.{self.gen}.sqlite"
        self.vectors_file = f"vectors.{self.gen}.faiss"
        try:
            if base is not None:
                # The base is checked like any load; a damaged one stops here, untouched, and the
                # error offers --rebuild. Its docstore is copied through SQLite's backup API.
                m, self.vectors, docs = open_index(self.folder)
                dst = sqlite3.connect(self.folder / self.docs_file)
                try:
                    docs.db.backup(dst)
                except DB_ERRORS as e:
                    raise damaged(self.folder, m.files["docs"], f"damaged ({e})") from e
                finally:
                    docs.close()
                    dst.close()
            else:
                self.vectors = VectorIndex.create(dim, kind)
            self.docs = DocStore(self.folder / self.docs_file)
        except BaseException:
            (self.folder / self.docs_file).unlink(missing_ok=True)
            self._release()
            raise
        self.states_file = f"{self.gen}.f16"
        self._states = None  # opened on first append_states()
        self._states_rows = 0

    # ---- kept token states: append-only raw fp16 files under states/, shared by generations ----
    def append_states(self, states: np.ndarray) -> tuple[str, int, int]:
        """Append one text's token states (T, D); gives back (file, first row, T) for its chunk row."""
        if self._states is None:
            (self.folder / "states").mkdir(exist_ok=True)
            self._states = open(self.folder / "states" / self.states_file, "wb")  # truncates an interrupted run's leftover
        ref = (self.states_file, self._states_rows, int(states.shape[0]))
        self._states.write(np.ascontiguousarray(states, np.float16).tobytes())
        self._states_rows += int(states.shape[0])
        return ref

    def read_states(self, file: str, dim: int) -> np.ndarray:
        """A memory map (rows, dim) fp16 of a states file."""
        if self._states is not None and file == self.states_file:
            self._states.flush()
        return np.memmap(self.folder / "states" / file, dtype=np.float16, mode="r").reshape(-1, dim)

    def commit(self, manifest: Manifest) -> None:
        if self._states is not None:
            self._states.flush()
            os.fsync(self._states.fileno())
            self._states.close()
        used_states = self.docs.state_files()
        self.docs.write_lexical()
        self.docs.commit()
        self.docs.close()
        self.vectors.save(self.folder / self.vectors_file)
        for name in (self.docs_file, self.vectors_file):
            fsync_file(self.folder / name)
        fsync_dir(self.folder)  # the data files' names are durable before the manifest names them
        manifest.generation = self.gen
        manifest.files = {"vectors": self.vectors_file, "docs": self.docs_file}
        manifest.integrity = integrity.record(self.folder, manifest.files, self.vectors)
        manifest.updated = now()
        manifest.created = manifest.created or manifest.updated
        manifest.save(self.folder)
        self._clean(keep=set(manifest.files.values()))
        if (self.folder / "states").is_dir():
            for p in (self.folder / "states").iterdir():
                if p.name not in used_states:
                    p.unlink()
        self._release()

    def abort(self) -> None:
        try:
            self.docs.close()
        finally:
            if self._states is not None:
                self._states.close()
            for f in (self.docs_file, self.vectors_file, f"states/{self.states_file}"):
                (self.folder / f).unlink(missing_ok=True)
            self._release()

    def _release(self) -> None:
        fcntl.flock(self._lock, fcntl.LOCK_UN)
        self._lock.close()

    def _clean(self, keep: set[str]) -> None:
        """Remove data files not in `keep` (older generations, or an interrupted run's)."""
        for p in self.folder.iterdir():
            if p.name in keep or not (_gen_of(p.name) or p.name == MANIFEST + ".tmp"):
                continue
            p.unlink(missing_ok=True)


def _gen_of(name: str) -> int:
    """The generation number in a data file name such as docs.3.sqlite (0 if not one)."""
    parts = name.split(".")
    if len(parts) == 3 and parts[0] in ("docs", "vectors") and parts[1].isdigit():
        return int(parts[1])
    return 0


def _current_files(folder: Path) -> set[str]:
    """The data files the current manifest names, read leniently (any format version)."""
    try:
        raw = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        return {str(v) for v in raw.get("files", {}).values()}
    except (OSError, ValueError, AttributeError):
        return set()


def index_path(index: str | os.PathLike | None) -> Path:
    """The index folder: the argument, else $SEMSEARCH_INDEX, else ./indexes/default."""
    return Path(index or os.environ.get("SEMSEARCH_INDEX") or DEFAULT_INDEX)


def verify(folder: Path) -> list[str]:
    """Every problem found by reading every byte: full hashes, SQLite's integrity check, and the
    id sets of FAISS and SQLite compared. An empty list: the index is whole."""
    problems: list[str] = []
    folder = Path(folder)
    try:
        m, vectors, docs = open_index(folder, "cpu")
    except IndexFormatError as e:
        return [str(e)]
    try:
        for name, want in ((m.integrity or {}).get("files") or {}).items():
            if integrity.sha256(folder / name) != want.get("sha256"):
                problems.append(str(damaged(folder, name, "damaged (its sha256 does not match the manifest)")))
        try:
            status = [r[0] for r in docs.db.execute("PRAGMA integrity_check")]
            if status != ["ok"]:
                problems.append(str(damaged(folder, m.files["docs"], f"damaged (SQLite: {'; '.join(status[:3])})")))
            db_ids = np.array([r[0] for r in docs.db.execute("SELECT id FROM chunks")], np.int64)
            if integrity.ids_fingerprint(db_ids) != integrity.ids_fingerprint(integrity.faiss_ids(vectors.index)):
                problems.append(str(damaged(folder, m.files["docs"], "its chunk ids differ from the vector index's")))
        except DB_ERRORS as e:
            problems.append(str(damaged(folder, m.files["docs"], f"damaged ({e})")))
    finally:
        docs.close()
    return problems
