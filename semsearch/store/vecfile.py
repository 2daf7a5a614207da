"""A segment's full vectors in one file, memory-mapped: the one stored copy of its vectors.

Since format 4 every segment has one (`vectors.<s>.vec`), and it is the only full copy: the
docstore's `vector` column stays empty, merges and index rebuilds read their vectors from here
(streamed, in batches, so a merge holds a constant amount of them in memory), and explain and
the framework stores gather their hits' rows from the map.

An IVF fast-scan index keeps only 4-bit codes in memory (~dim / 8 bytes a vector); the full
float32 vectors its top candidates are re-ranked against used to live inside the FAISS file too
(an `IndexRefineFlat`), read whole into memory at load: 1.5 KB a chunk at dim 384, 88% of a
1M-chunk index's memory. Here they live in `vectors.<s>.vec`, mapped read-only: a query touches
the pages of its few thousand candidates (the kernel's page cache, not this process's heap),
and opening the file reads nothing.

Layout (little-endian): MAGIC (8 bytes), n and dim (int64 each), then the n chunk ids (int64,
sorted), padding to 64 bytes, then the n x dim float32 vectors in the order of the ids; or, under
MAGIC_F16 (an index built with `--vector-storage fp16`), float16 ones: half the bytes on disk and
half the pages a query's re-ranking touches, every reader given them as float32. Integrity
(size, fingerprint, sha256) is recorded in the manifest like every data file. Why by hand, not
`.npy`/`.npz`: numpy parses an `.npy` header with `ast.literal_eval`, which is not safe from
several threads on CPython 3.11 (python/cpython#106905), and readers open segments from many.
"""
from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

MAGIC = b"SSVEC\x00\x01\x00"
MAGIC_F16 = b"SSVEC\x00\x02\x00"
HEAD = len(MAGIC) + 16
STORAGE = {"fp32": (MAGIC, "<f4"), "fp16": (MAGIC_F16, "<f2")}  # --vector-storage: magic, row type


def file_name(seg_id: int) -> str:
    """The vector file of segment seg_id."""
    return f"vectors.{seg_id}.vec"


def _vectors_at(n: int) -> int:
    return -(-(HEAD + 8 * n) // 64) * 64


def write(path: Path, ids: np.ndarray, vectors: np.ndarray, storage: str | None = None) -> None:
    """Write (sorted ids, their vectors) to path, fsynced; `storage`: fp32 (None) or fp16."""
    vectors = np.asarray(vectors, np.float32)
    dim = vectors.shape[1] if vectors.ndim == 2 else 0
    write_batches(path, ids, dim, [vectors] if len(vectors) else [], storage)


def write_batches(path: Path, ids: np.ndarray, dim: int, batches: Iterable[np.ndarray], storage: str | None = None) -> None:
    """Write a vector file whose (sorted) ids are known and whose rows come in batches, in id
    order: memory bounded by one batch however large the file (a merge of segments). fsynced.
    `storage`: the rows' type, fp32 (None) or fp16."""
    magic, row = STORAGE[storage or "fp32"]
    ids = np.ascontiguousarray(ids, "<i8")
    n = len(ids)
    if n > 1 and not (np.diff(ids) > 0).all():
        raise ValueError("a vector file needs sorted unique ids, one per vector")
    head = magic + np.array([n, dim if n else 0], "<i8").tobytes()
    rows = 0
    with open(path, "wb") as fh:
        fh.write(head)
        fh.write(ids.tobytes())
        fh.write(b"\0" * (_vectors_at(n) - HEAD - 8 * n))
        for b in batches:
            b = np.ascontiguousarray(b, row)
            if len(b) and (b.ndim != 2 or b.shape[1] != dim):
                raise ValueError(f"vectors of dimension {b.shape[-1]} for a file of dimension {dim}")
            fh.write(b.tobytes())
            rows += len(b)
        if rows != n:
            raise ValueError(f"{rows} vectors written for {n} ids")
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
        kind = next((k for k, (magic, _) in STORAGE.items() if raw is not None and raw[: len(magic)] == magic), None)
        if kind is None:
            raise ValueError(f"{self.path.name}: not a vector file")
        row = np.dtype(STORAGE[kind][1])
        n, dim = (int(x) for x in np.frombuffer(raw, "<i8", 2, len(MAGIC)))
        if n < 0 or dim < 0 or size != _vectors_at(n) + row.itemsize * n * dim:
            raise ValueError(f"{self.path.name}: truncated or damaged (size {size})")
        if hasattr(raw, "madvise") and hasattr(mmap, "MADV_RANDOM"):
            raw.madvise(mmap.MADV_RANDOM)  # a query reads scattered rows: no read-ahead around them
        self.ids = np.frombuffer(raw, "<i8", n, HEAD)
        self.matrix = np.frombuffer(raw, row, n * dim, _vectors_at(n)).reshape(n, dim)  # float32 or float16
        self.dim = dim
        self.storage = kind
        # Consecutive ids (a segment written in one go, or merged without gaps): an id's row is its
        # offset from the first, found without a binary search through the ids (~1 ms a query at
        # 3M chunks for the ~1,700 candidates a re-ranking looks up).
        self._first = int(self.ids[0]) if n and int(self.ids[-1]) - int(self.ids[0]) == n - 1 else None

    def __len__(self) -> int:
        return len(self.ids)

    def rows(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row of each id, held): held is False for ids the file does not have."""
        ids = np.asarray(ids, np.int64)
        if not len(self.ids):
            return np.zeros(len(ids), np.int64), np.zeros(len(ids), bool)
        first = getattr(self, "_first", None)
        if first is not None:
            at = ids - first
            held = (at >= 0) & (at < len(self.ids))
            return at.clip(0, len(self.ids) - 1), held
        at = np.searchsorted(self.ids, ids).clip(0, len(self.ids) - 1)
        return at, self.ids[at] == ids

    def get(self, ids: np.ndarray) -> np.ndarray | None:
        """The vectors of ids (every id must be held; None where one is not)."""
        at, held = self.rows(ids)
        if not held.all():
            return None
        return np.asarray(self.matrix[at], np.float32)

    def found(self, ids) -> tuple[np.ndarray, np.ndarray]:
        """(the given ids this file holds, sorted and unique; their vectors)."""
        ids = np.unique(np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids, np.int64))
        at, held = self.rows(ids)
        at = np.sort(at[held])  # rows in file order: the pages read in order
        return self.ids[at].copy(), np.asarray(self.matrix[at], np.float32)

    def iter(self, batch: int = 8192, keep=None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(ids, vectors) in id order, in batches (copies: nothing of the map outlives a batch);
        `keep(ids) -> bool mask`: only the rows it keeps."""
        for at in range(0, len(self.ids), batch):
            ids, vecs = self.ids[at : at + batch], self.matrix[at : at + batch]
            if keep is not None:
                m = keep(ids)
                if not m.all():
                    ids, vecs = ids[m], vecs[m]
            if len(ids):
                yield ids.copy(), np.array(vecs, np.float32)

    def sample(self, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(ids, vectors) of n rows drawn without replacement (all where n >= the count), in id order."""
        rng = np.random.default_rng(seed)
        at = np.sort(rng.choice(len(self.ids), min(n, len(self.ids)), replace=False)) if len(self.ids) else np.zeros(0, np.int64)
        return self.ids[at].copy(), np.asarray(self.matrix[at], np.float32)


class MemoryVectors:
    """The same interface over arrays in memory: a segment being written, before its file exists."""

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

    def set(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Replace the vectors of ids it holds (re-pooling)."""
        have, mat = self.arrays()
        at, held = self.rows(ids)
        if not held.all():
            raise KeyError("set() of vectors not held")
        mat = mat.copy()
        mat[at] = np.asarray(vectors, np.float32)
        self._sorted = (have, mat)
        self._ids, self._vecs = [have], [mat]

    def remove(self, ids: np.ndarray) -> None:
        have, mat = self.arrays()
        keep = ~np.isin(have, np.asarray(ids, np.int64))
        if not keep.all():
            self._sorted = (have[keep], mat[keep])
            self._ids, self._vecs = [self._sorted[0]], [self._sorted[1]]

    storage = "fp32"
    rows = VectorFile.rows
    get = VectorFile.get
    found = VectorFile.found
    iter = VectorFile.iter
    sample = VectorFile.sample
