"""A segment's full vectors in one file, memory-mapped: what exact re-ranking reads.

An IVF fast-scan index keeps only 4-bit codes in memory (~dim / 8 bytes a vector); the full
float32 vectors its top candidates are re-ranked against used to live inside the FAISS file too
(an `IndexRefineFlat`), read whole into memory at load: 1.5 KB a chunk at dim 384, 88% of a
1M-chunk index's memory. Here they live in `vectors.<s>.vec`, mapped read-only: a query touches
the pages of its few thousand candidates (the kernel's page cache, not this process's heap),
and opening the file reads nothing.

Layout (little-endian): MAGIC (8 bytes), n and dim (int64 each), then the n chunk ids (int64,
sorted), padding to 64 bytes, then the n x dim float32 vectors in the order of the ids. Integrity
(size, fingerprint, sha256) is recorded in the manifest like every data file. Why by hand, not
`.npy`/`.npz`: numpy parses an `.npy` header with `ast.literal_eval`, which is not safe from
several threads on CPython 3.11 (python/cpython#106905), and readers open segments from many.
"""
from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

MAGIC = b"SSVEC\x00\x01\x00"
HEAD = len(MAGIC) + 16


def _vectors_at(n: int) -> int:
    return -(-(HEAD + 8 * n) // 64) * 64


def write(path: Path, ids: np.ndarray, vectors: np.ndarray) -> None:
    """Write (sorted ids, their vectors) to path, fsynced."""
    ids = np.ascontiguousarray(ids, "<i8")
    vectors = np.ascontiguousarray(vectors, "<f4")
    n, dim = vectors.shape if vectors.ndim == 2 else (0, 0)
    if len(ids) != n or (n > 1 and not (np.diff(ids) > 0).all()):
        raise ValueError("a vector file needs sorted unique ids, one per vector")
    head = MAGIC + np.array([n, dim], "<i8").tobytes()
    with open(path, "wb") as fh:
        fh.write(head)
        fh.write(ids.tobytes())
        fh.write(b"\0" * (_vectors_at(n) - HEAD - 8 * n))
        fh.write(vectors.tobytes())
        fh.flush()
        os.fsync(fh.fileno())


class VectorFile:
    """A vector file opened read-only through mmap: `ids` (n,) sorted and `matrix` (n, dim)
    are views of the map; get() gathers rows by id."""

    def __init__(self, path: Path):
        self.path = Path(path)
        with open(self.path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < HEAD:
                raise ValueError(f"{self.path.name}: not a vector file (too short)")
            self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        raw = self._map
        if raw is None or raw[: len(MAGIC)] != MAGIC:
            raise ValueError(f"{self.path.name}: not a vector file")
        n, dim = (int(x) for x in np.frombuffer(raw, "<i8", 2, len(MAGIC)))
        if n < 0 or dim < 0 or size != _vectors_at(n) + 4 * n * dim:
            raise ValueError(f"{self.path.name}: truncated or damaged (size {size})")
        if hasattr(raw, "madvise") and hasattr(mmap, "MADV_RANDOM"):
            raw.madvise(mmap.MADV_RANDOM)  # a query reads scattered rows: no read-ahead around them
        self.ids = np.frombuffer(raw, "<i8", n, HEAD)
        self.matrix = np.frombuffer(raw, "<f4", n * dim, _vectors_at(n)).reshape(n, dim)
        self.dim = dim

    def __len__(self) -> int:
        return len(self.ids)

    def rows(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row of each id, held): held is False for ids the file does not have."""
        ids = np.asarray(ids, np.int64)
        if not len(self.ids):
            return np.zeros(len(ids), np.int64), np.zeros(len(ids), bool)
        at = np.searchsorted(self.ids, ids).clip(0, len(self.ids) - 1)
        return at, self.ids[at] == ids

    def get(self, ids: np.ndarray) -> np.ndarray | None:
        """The vectors of ids (every id must be held; None where one is not)."""
        at, held = self.rows(ids)
        if not held.all():
            return None
        return np.asarray(self.matrix[at], np.float32)


class MemoryVectors:
    """The same interface over arrays in memory: an index being built, before its file exists."""

    def __init__(self, dim: int):
        self.dim = dim
        self._ids: list[np.ndarray] = []
        self._vecs: list[np.ndarray] = []
        self._sorted: tuple[np.ndarray, np.ndarray] | None = None

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        self._ids.append(np.asarray(ids, np.int64).copy())
        self._vecs.append(np.asarray(vectors, np.float32).copy())
        self._sorted = None

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self._sorted is None:
            ids = np.concatenate(self._ids) if self._ids else np.zeros(0, np.int64)
            vecs = np.concatenate(self._vecs) if self._vecs else np.zeros((0, self.dim), np.float32)
            order = np.argsort(ids, kind="stable")
            self._sorted = (ids[order], vecs[order])
            self._ids, self._vecs = [self._sorted[0]], [self._sorted[1]]
        return self._sorted

    @property
    def ids(self) -> np.ndarray:
        return self.arrays()[0]

    @property
    def matrix(self) -> np.ndarray:
        return self.arrays()[1]

    def __len__(self) -> int:
        return len(self.ids)

    rows = VectorFile.rows
    get = VectorFile.get
