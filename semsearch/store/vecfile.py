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
half the pages a query's re-ranking touches, every reader given them as float32. Since format 6
an IVF fast-scan segment's file keeps its rows list by list (SPANN's and LanceDB's layout):
its magic says so (ORDERED), and the sorted ids are followed by the row of each (int32). A
query re-ranks the candidates of the few lists it probed: a few runs of rows, each read with
one pread (read_rows), not ~1,000 rows scattered over the file. Integrity
(size, fingerprint, sha256) is recorded in the manifest like every data file. Why by hand, not
`.npy`/`.npz`: numpy parses an `.npy` header with `ast.literal_eval`, which is not safe from
several threads on CPython 3.11 (python/cpython#106905), and readers open segments from many.
"""
from __future__ import annotations

import contextlib
import mmap
import os
import sys
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from semsearch.store.files import unmap_pages

MAGIC = b"SSVEC\x00\x01\x00"
MAGIC_F16 = b"SSVEC\x00\x02\x00"
HEAD = len(MAGIC) + 16
STORAGE = {"fp32": (MAGIC, "<f4"), "fp16": (MAGIC_F16, "<f2")}  # --vector-storage: magic, row type
# The same, rows in an order of their own (an IVF segment's: list by list), with the row of each
# sorted id (int32) after the ids: magic -> storage.
ORDERED = {b"SSVEC\x00\x03\x00": "fp32", b"SSVEC\x00\x04\x00": "fp16"}
_ORDERED_MAGIC = {v: k for k, v in ORDERED.items()}


_GAP = 16  # read_rows: rows this close together are read in one run (what lies between too)
_MAX_RUNS = 256  # more runs than this (~1.5 us of Python a read): gathered from the map instead
# sweeping(): a file whose rows take at most this many bytes is read whole, with one pread, into
# this process's memory for the sweep. A sweep's scattered reads cost ~2 us of Python each: the
# recall tuning of a 3,000-chunk segment made 2.1M of them (10 s) to read a 1.2 MB file.
SWEEP_IN_MEMORY = 64 << 20


_BIAS = np.float32(2.0 ** 112)  # widen(): fp16 exponent bias 15 -> float32's 127


def widen(a: np.ndarray) -> np.ndarray:
    """Rows as float32 (a new array). fp16 ones are widened by bit operations: numpy's own cast
    converts one value at a time (2.1 ms for the ~1,700 rows a query re-ranks at 3M chunks, dim
    384, on an AVX2 CPU; these integer passes take 0.7 ms, exact for every finite fp16 value,
    subnormals included: tests/test_on_disk.py). Where torch is loaded already (the encoder),
    its F16C cast does it in 0.1 ms."""
    if a.dtype != np.float16:
        return np.array(a, np.float32)
    torch = sys.modules.get("torch")
    if torch is not None and a.size >= 4096:
        own = a if a.flags.writeable and a.flags.c_contiguous else np.array(a)  # torch wants a writable array
        return torch.from_numpy(own).float().numpy()
    u = np.ascontiguousarray(a).view(np.uint16).astype(np.uint32)
    sign = u & 0x8000
    u &= 0x7FFF
    u <<= 13  # exponent and mantissa in float32's places
    out = u.view(np.float32)
    out *= _BIAS  # rebias the exponent; subnormal halves come out as the normal floats they are
    sign <<= 16
    u |= sign
    return out


def file_name(seg_id: int) -> str:
    """The vector file of segment seg_id."""
    return f"vectors.{seg_id}.vec"


def file_names(entry: dict) -> list[str]:
    """A segment entry's vector files: `vecs`, then `vecs_more` (format 10: the rolled segments'
    files a long run's merge keeps in place, each in the merged index's list order), in
    increasing id ranges. [] for a segment from before vector files."""
    return [entry["vecs"], *(entry.get("vecs_more") or ())] if entry.get("vecs") else []


def open_files(folder: Path, entry: dict) -> "VectorFile | Stacked | None":
    """A segment's vectors: its one vector file, or its files read as one (Stacked); None where
    it has none."""
    names = file_names(entry)
    if not names:
        return None
    files = [VectorFile(Path(folder) / n) for n in names]
    return files[0] if len(files) == 1 else Stacked(files)


def kept_name(name: str, seg_id: int) -> str:
    """The name of a vector file `name` rewritten in the list order of merged segment seg_id
    (keep_in_place): `vectors.<first>.<seg_id>.vec`, <first> the segment that wrote its rows."""
    return f"vectors.{name.split('.')[1]}.{seg_id}.vec"


def _vectors_at(n: int, ordered: bool = False) -> int:
    return -(-(HEAD + (12 if ordered else 8) * n) // 64) * 64


def write(path: Path, ids: np.ndarray, vectors: np.ndarray, storage: str | None = None,
          order: np.ndarray | None = None) -> None:
    """Write (sorted ids, their vectors) to path, fsynced; `storage`: fp32 (None) or fp16.
    `order`: the rows' order in the file (positions into ids: list_order()), id order if None."""
    vectors = np.asarray(vectors, np.float32)
    dim = vectors.shape[1] if vectors.ndim == 2 else 0
    if order is not None:
        write_ordered(path, ids, dim, order, lambda at: vectors[at], storage)
        return
    write_batches(path, ids, dim, [vectors] if len(vectors) else [], storage)


def list_order(ids: np.ndarray, lists: Iterable[np.ndarray]) -> np.ndarray:
    """The positions into sorted `ids` of an IVF index's ids, list by list (ids ascending within
    a list): the row order that keeps each list's vectors together on disk."""
    parts = [np.sort(np.asarray(x, np.int64)) for x in lists]
    flat = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    ids = np.asarray(ids, np.int64)
    at = np.searchsorted(ids, flat).clip(0, max(len(ids) - 1, 0))
    if len(flat) != len(ids) or (len(ids) and not np.array_equal(ids[at], flat)) or len(np.unique(at)) != len(ids):
        raise ValueError("the index's lists do not hold each id of the vector file once")
    return at


def write_ordered(path: Path, ids: np.ndarray, dim: int, order: np.ndarray, rows_at, storage: str | None = None,
                  batch: int = 65536) -> None:
    """Write a vector file whose rows follow `order` (positions into the sorted ids; a
    permutation): the rows at order[r:r + batch] come from rows_at(positions), in batches, so
    memory holds one batch. fsynced."""
    row = STORAGE[storage or "fp32"][1]
    ids = np.ascontiguousarray(ids, "<i8")
    order = np.asarray(order, np.int64)
    n = len(ids)
    if n > 1 and not (np.diff(ids) > 0).all():
        raise ValueError("a vector file needs sorted unique ids, one per vector")
    if len(order) != n or (n and not np.array_equal(np.sort(order), np.arange(n))):
        raise ValueError("the row order is not a permutation of the ids")
    row_of = np.empty(n, "<i4")
    row_of[order] = np.arange(n, dtype=np.int32)
    with open(path, "wb") as fh:
        fh.write(_ORDERED_MAGIC[storage or "fp32"] + np.array([n, dim if n else 0], "<i8").tobytes())
        fh.write(ids.tobytes())
        fh.write(row_of.tobytes())
        fh.write(b"\0" * (_vectors_at(n, True) - HEAD - 12 * n))
        for at in range(0, n, batch):
            pos = order[at : at + batch]
            b = np.ascontiguousarray(rows_at(pos), row)
            if b.shape != (len(pos), dim):
                raise ValueError(f"{b.shape} rows for {len(pos)} positions of dimension {dim}")
            fh.write(b.tobytes())
        fh.flush()
        os.fsync(fh.fileno())


def reorder(path: Path, lists: Iterable[np.ndarray]) -> "VectorFile":
    """Rewrite the vector file at path with its rows list by list (list_order), through a
    temporary file renamed over it (fsynced); gives back the new file, opened. The old map stays
    valid for whoever still holds it."""
    old = VectorFile(path)
    order = list_order(old.ids, lists)
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    # Positions ascending within each batch read the old file in its order (one forward sweep a
    # batch); the rows go out in `order`.
    def rows_at(pos: np.ndarray) -> np.ndarray:  # a batch's rows lie all over the old file: read, not mapped
        return old.at_positions(pos, sweep=True)

    write_ordered(tmp, old.ids, old.dim, order, rows_at, old.storage)
    os.replace(tmp, path)
    return VectorFile(path)


def in_order(vf: "VectorFile", order: np.ndarray) -> bool:
    """Whether vf keeps its rows in `order` (positions into its sorted ids, as list_order())."""
    return vf.ordered and len(order) == len(vf) and bool(np.array_equal(vf._row_of[order], np.arange(len(vf))))


def read_whole(vf: "VectorFile") -> tuple[np.ndarray, np.ndarray]:
    """(ids, rows) of every row of vf in the order it stores them, read with one forward sweep
    into this process's memory (rows float16 or float32, as stored)."""
    rows = vf._read_all()
    if vf._row_of is None:
        return vf.ids.copy(), rows
    id_of_row = np.empty(len(vf), np.int64)
    id_of_row[vf._row_of] = vf.ids
    return id_of_row, rows


def rewrite(vf: "VectorFile", rows: np.ndarray, path: Path, order: np.ndarray) -> None:
    """Write vf's rows (`rows`: read_whole()'s, in vf's order) to a new file at path with its
    rows in `order` (positions into vf's sorted ids), in vf's storage; fsynced."""
    if vf._row_of is None:  # id order: position p is row p
        def rows_at(pos: np.ndarray) -> np.ndarray:
            return rows[pos]
    else:
        at_row = np.asarray(vf._row_of, np.int64)

        def rows_at(pos: np.ndarray) -> np.ndarray:
            return rows[at_row[pos]]
    write_ordered(path, vf.ids, vf.dim, order, rows_at, vf.storage)


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
    """A vector file opened read-only through mmap: `ids` (n,) sorted is a view of the map;
    get() gathers rows by id, `matrix` (n, dim) is the rows in id order (a view where the file
    keeps them in id order)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        fh = open(self.path, "rb", buffering=0)  # kept open for pread (read_rows), closed with this object
        try:
            size = os.fstat(fh.fileno()).st_size
            if size < HEAD:
                raise ValueError(f"{self.path.name}: not a vector file (too short)")
            self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_RANDOM)  # reads of runs of rows: no read-ahead
        except BaseException:
            fh.close()
            raise
        self._fh = fh
        raw = self._map
        magic = bytes(raw[: len(MAGIC)]) if raw is not None else b""
        kind = next((k for k, (m, _) in STORAGE.items() if magic == m), None)
        self.ordered = kind is None and magic in ORDERED
        kind = ORDERED[magic] if self.ordered else kind
        if kind is None:
            raise ValueError(f"{self.path.name}: not a vector file")
        row = np.dtype(STORAGE[kind][1])
        n, dim = (int(x) for x in np.frombuffer(raw, "<i8", 2, len(MAGIC)))
        if n < 0 or dim < 0 or size != _vectors_at(n, self.ordered) + row.itemsize * n * dim:
            raise ValueError(f"{self.path.name}: truncated or damaged (size {size})")
        if hasattr(raw, "madvise") and hasattr(mmap, "MADV_RANDOM"):
            raw.madvise(mmap.MADV_RANDOM)  # a query reads scattered rows: no read-ahead around them
        self.ids = np.frombuffer(raw, "<i8", n, HEAD)
        # the row of each sorted id, where the rows have an order of their own (None: id order)
        self._row_of = np.frombuffer(raw, "<i4", n, HEAD + 8 * n) if self.ordered else None
        self._rows = np.frombuffer(raw, row, n * dim, _vectors_at(n, self.ordered)).reshape(n, dim)  # float32 or float16
        self.dim = dim
        self.storage = kind
        # Consecutive ids (a segment written in one go, or merged without gaps): an id's position
        # is its offset from the first, found without a binary search through the ids (~1 ms a
        # query at 3M chunks for the ~1,700 candidates a re-ranking looks up).
        self._first = int(self.ids[0]) if n and int(self.ids[-1]) - int(self.ids[0]) == n - 1 else None

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def matrix(self) -> np.ndarray:
        """The rows in id order (float32 or float16): a view of the map, or a copy gathered
        from a file whose rows have an order of their own."""
        return self._rows if self._row_of is None else self._rows[self._row_of]

    def _pos(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(position of each id among the sorted ids, held)."""
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

    def rows(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row of each id in the file, held): held is False for ids the file does not have."""
        at, held = self._pos(ids)
        return (at if self._row_of is None else self._row_of[at].astype(np.int64)), held

    def at_positions(self, pos: np.ndarray, sweep: bool = False) -> np.ndarray:
        """The float32 vectors of the ids at these positions (in the order given), the rows read
        in file order; `sweep`: see read_rows."""
        rows = np.asarray(pos, np.int64) if self._row_of is None else self._row_of[pos].astype(np.int64)
        order = np.argsort(rows, kind="stable")
        out = np.empty((len(rows), self.dim), np.float32)
        out[order] = self.read_rows(rows[order], sweep)
        return out

    def get(self, ids: np.ndarray) -> np.ndarray | None:
        """The vectors of ids (every id must be held; None where one is not)."""
        at, held = self._pos(ids)
        if not held.all():
            return None
        return self.at_positions(at)

    def get_file_order(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """(the ids, their vectors), both in the file's row order (the pages read in order):
        what a re-ranking needs, without putting the rows back in the order asked. None where an
        id is not held."""
        rows, held = self.rows(ids)
        if not held.all():
            return None
        order = np.argsort(rows, kind="stable")
        return np.asarray(ids, np.int64)[order], self.read_rows(rows[order])

    def read_rows(self, rows: np.ndarray, sweep: bool = False) -> np.ndarray:
        """The float32 vectors of these rows (sorted). Where they fall in a few runs (a
        re-ranking's candidates in a file kept list by list: the lists it probed), each run is
        read with one pread into this process's buffer, not through the map. Why: the page
        cache may hold a file in large folios (ext4 and XFS on Linux 6.x, for a file just
        written or read in sequence), and a fault on a mapped page maps its whole folio, up to
        2 MB, into the process: on a 1M-chunk index ~3 MB of the vector file became resident a
        query, where its candidates' rows are ~0.5 MB (docs/benchmarks.md). A pread copies only
        the bytes asked for, whatever the page cache holds. A few scattered rows (the lexical
        hits whose cosine a hybrid query needs) are read one pread each; many (an id-ordered
        file's candidates) are gathered from the map.

        `sweep`: rows scattered over the whole file, a batch of a sweep that reads all or much of
        it (a build's training sample, its rewrite in list order): every run is read with pread,
        however many (~1.5 us each: a few seconds for 1M rows), and only runs of consecutive rows
        are joined, so the buffer holds the rows asked for and nothing between. Gathered from the
        map, such a batch faults in nearly every folio of the file: at 1M chunks the rewrite's
        batches held 1.5 GB of the vector file mapped at once, and at 10M they would hold ~15 GB
        (page cache, but counted in the build's RSS; docs/benchmarks.md)."""
        rows = np.asarray(rows, np.int64)
        held = getattr(self, "_held", None)
        if held is not None:  # a small file read whole for a sweep (sweeping())
            return widen(held[rows])
        sweep = sweep or getattr(self, "_sweeping", False)
        fh = getattr(self, "_fh", None)
        if fh is None or len(rows) < 2 or not hasattr(os, "preadv"):  # (no preadv: macOS before 11)
            return widen(self._rows[rows])
        cuts = np.flatnonzero(np.diff(rows) > (1 if sweep else _GAP)) + 1
        starts, ends = rows[np.r_[0, cuts]], rows[np.r_[cuts - 1, len(rows) - 1]] + 1
        if len(starts) > _MAX_RUNS and not sweep:
            return widen(self._rows[rows])
        width = self._rows.dtype.itemsize * self.dim
        buf = np.empty((int((ends - starts).sum()), self.dim), self._rows.dtype)
        view, at, first = memoryview(buf).cast("B"), 0, _vectors_at(len(self.ids), self.ordered)
        for a, b in zip(starts.tolist(), ends.tolist()):
            want = (b - a) * width
            if os.preadv(fh.fileno(), [view[at : at + want]], first + a * width) != want:
                raise ValueError(f"{self.path.name}: truncated (a read of rows {a}-{b} came short)")
            at += want
        offs = np.r_[0, np.cumsum(ends - starts)[:-1]]
        run = np.searchsorted(starts, rows, "right") - 1
        if len(rows) == len(buf):  # every row of its runs (a re-ranking of whole lists): buf itself
            return widen(buf)
        return widen(buf[offs[run] + rows - starts[run]])

    def found(self, ids) -> tuple[np.ndarray, np.ndarray]:
        """(the given ids this file holds, sorted and unique; their vectors)."""
        ids = np.unique(np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids, np.int64))
        at, held = self._pos(ids)
        at = at[held]  # ascending, as the ids are
        return self.ids[at].copy(), self.at_positions(at)

    def iter(self, batch: int = 8192, keep=None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(ids, vectors) in id order, in batches (copies: nothing of the map outlives a batch);
        `keep(ids) -> bool mask`: only the rows it keeps. A file whose rows have an order of
        their own is read one forward sweep a batch. The pages a batch read are let go of before
        it is handed on (release())."""
        for at in range(0, len(self.ids), batch):
            ids = self.ids[at : at + batch]
            m = keep(ids) if keep is not None else None
            if m is not None and m.all():
                m = None
            if self._row_of is None:  # id order: a slice of the map
                vecs = self._rows[at : at + batch]
                ids, vecs = (ids, vecs) if m is None else (ids[m], vecs[m])
                got = (ids.copy(), np.array(vecs, np.float32) if vecs.dtype == np.float32 else widen(vecs)) if len(ids) else None
            else:
                pos = np.arange(at, at + len(ids)) if m is None else np.flatnonzero(m) + at
                got = (self.ids[pos].copy(), self.at_positions(pos, sweep=True)) if len(pos) else None
            self.release()
            if got is not None:
                yield got

    def iter_stored(self, batch: int = 65536) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(ids, vectors) of every row in the order the file stores them, in batches: one forward
        read, for a scan whose order does not matter (exact search's ground truth, which read a
        file kept list by list in id order, a scattered read a batch: half of `semsearch tune`'s
        time at 1M chunks). The pages a batch read are let go of before it is handed on."""
        if self._row_of is None:
            yield from self.iter(batch)
            return
        id_of_row = np.empty(len(self.ids), np.int64)
        id_of_row[self._row_of] = self.ids
        for at in range(0, len(self.ids), batch):
            rows = np.arange(at, min(at + batch, len(self.ids)))
            got = id_of_row[rows], self.read_rows(rows, sweep=True)
            self.release()
            yield got

    def sample(self, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(ids, vectors) of n rows drawn without replacement (all where n >= the count), in id order."""
        rng = np.random.default_rng(seed)
        at = np.sort(rng.choice(len(self.ids), min(n, len(self.ids)), replace=False)) if len(self.ids) else np.zeros(0, np.int64)
        out = self.ids[at].copy(), self.at_positions(at, sweep=True)
        self.release()  # the pages of the ids it looked at
        return out

    @contextlib.contextmanager
    def sweeping(self):
        """Within the block every read of this object is a sweep (read_rows), and its pages are
        let go of at the end: for a build that searches a file no reader has yet (the recall
        tuning of a new segment re-ranks 500 queries' candidates against it, which gathered from
        the map held the whole file mapped: 0.77 GB at 1M chunks). Not for a file readers share."""
        before, held = getattr(self, "_sweeping", False), getattr(self, "_held", None)
        self._sweeping = True
        if (held is None and self._rows.nbytes <= SWEEP_IN_MEMORY and getattr(self, "_fh", None) is not None
                and hasattr(os, "preadv")):
            self._held = self._read_all()
        try:
            yield self
        finally:
            self._sweeping, self._held = before, held
            self.release()

    def _read_all(self) -> np.ndarray:
        """Every row of the file (in file order), read with one pread into a private buffer."""
        buf = np.empty(self._rows.shape, self._rows.dtype)
        if not buf.size:  # (a segment with files but no chunk: a partition's home rows only)
            return buf
        view = memoryview(buf).cast("B")
        first = _vectors_at(len(self.ids), self.ordered)
        at = 0
        while at < len(view):  # (a read may return less than asked for)
            got = os.preadv(self._fh.fileno(), [view[at:]], first + at)
            if not got:
                raise ValueError(f"{self.path.name}: truncated (rows end before the header says)")
            at += got
        return buf

    def release(self) -> None:
        """Unmap the pages of the file this process has touched (madvise DONTNEED on the map):
        they stay in the page cache, and a later read faults them back in. A sweep over the
        whole file (a merge's copy, the IVF build's training sample and fill, the rewrite in
        list order, the recall tuning) otherwise leaves all of it resident in the process: at
        1M chunks the final merge of a build held 0.77-1.5 GB of mapped vector pages beside its
        heap, and a 10M one would hold 7.7-15 GB. Harmless to a reader in another thread: the
        file never changes, so its next read of a page finds the same bytes."""
        unmap_pages(self._map)


class Sampled:
    """Several vector files sampled as one, each giving its share of a sample by its size: the
    published segments of a long run, on which its vector index's quantizer is trained while the
    run goes on (indexing._Run). Only what VectorIndex.trained() asks of a store."""

    def __init__(self, files: list[VectorFile]):
        self.files = files

    def __len__(self) -> int:
        return sum(len(f) for f in self.files)

    def sample(self, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        total = len(self)
        shares = [len(f) * min(n, total) // max(total, 1) for f in self.files]
        got = [f.sample(m, seed + i) for i, (f, m) in enumerate(zip(self.files, shares)) if m]
        if not got:
            return np.zeros(0, np.int64), np.zeros((0, self.files[0].dim if self.files else 0), np.float32)
        return np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got])


class Stacked:
    """Several vector files of increasing id ranges, every row of each, read as one store in id
    order: the segments a long run published, which the merge at its end indexes, and then the
    merged segment's own vectors (format 10: those files kept in place, each in the merged
    index's list order; store/keepvecs.py), which its re-ranking reads a file at a time. What
    VectorIndex.build/fill/tune/search, the merge and a segment's readers ask of a store."""

    def __init__(self, files: list[VectorFile]):
        if not files:
            raise ValueError("Stacked needs at least one vector file")
        self.files = files
        self.ids = np.concatenate([f.ids for f in files])
        if len(self.ids) > 1 and not (np.diff(self.ids) > 0).all():
            raise ValueError("stacked vector files must hold increasing id ranges")
        self._starts = np.cumsum([0] + [len(f) for f in files[:-1]]).astype(np.int64)
        self.dim, self.storage = files[0].dim, files[0].storage
        n = len(self.ids)  # consecutive ids: positions by offset, as VectorFile (no search through 10M ids a query)
        self._first = int(self.ids[0]) if n and int(self.ids[-1]) - int(self.ids[0]) == n - 1 else None

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def ordered(self) -> bool:
        return all(f.ordered for f in self.files)

    @property
    def matrix(self) -> np.ndarray:
        return np.concatenate([f.matrix for f in self.files])

    def bounds(self, j: int) -> tuple[int, int]:
        """The positions (into `ids`) of file j's ids."""
        a = int(self._starts[j])
        return a, a + len(self.files[j])

    def replace(self, j: int, vf: VectorFile) -> None:
        """File j replaced by vf, which holds the same ids (its rows in another order): the old
        one is let go of here."""
        if not np.array_equal(vf.ids, self.files[j].ids):
            raise ValueError(f"{vf.path.name} does not hold the ids of {self.files[j].path.name}")
        self.files[j] = vf

    def found(self, ids) -> tuple[np.ndarray, np.ndarray]:
        ids = np.unique(np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids, np.int64))
        at, held = self._pos(ids)
        at = at[held]
        return self.ids[at].copy(), self.at_positions(at)

    def at_positions(self, pos: np.ndarray, sweep: bool = False) -> np.ndarray:
        pos = np.asarray(pos, np.int64)
        if not (sweep or getattr(self, "_sweeping", False)):  # a query's rows: one pass over the files
            perm, key = self._keys(pos)
            out = np.empty((len(pos), self.dim), np.float32)
            out[perm] = self._read_keys(key)
            return out
        order = np.argsort(pos, kind="stable")
        at = pos[order]
        cuts = np.searchsorted(at, self._starts[1:]).tolist() + [len(at)]  # each file's share of the sorted positions
        out = np.empty((len(pos), self.dim), np.float32)
        sweep = sweep or getattr(self, "_sweeping", False)
        a = 0
        for j, b in enumerate(cuts):
            if b > a:
                out[order[a:b]] = self.files[j].at_positions(at[a:b] - self._starts[j], sweep)
            a = b
        return out

    def _pos(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ids = np.asarray(ids, np.int64)
        if self._first is not None:
            at = ids - self._first
            held = (at >= 0) & (at < len(self.ids))
            return at.clip(0, len(self.ids) - 1), held
        at = np.searchsorted(self.ids, ids).clip(0, max(len(self.ids) - 1, 0))
        return at, self.ids[at] == ids if len(self.ids) else np.zeros(len(ids), bool)

    def get(self, ids: np.ndarray) -> np.ndarray | None:
        at, held = self._pos(ids)
        return self.at_positions(at) if held.all() else None

    def get_file_order(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """VectorFile.get_file_order over the files: a re-ranking's candidates (those of the few
        lists it probed, a short run of rows in each file) sorted by file and row, and every run
        read with one pread, in one pass over all the files (a pass per file cost ~5x the
        re-ranking at 10M chunks in 40 files: docs/benchmarks.md)."""
        at, held = self._pos(ids)
        if not held.all():
            return None
        perm, key = self._keys(at)
        return np.asarray(ids, np.int64)[perm], self._read_keys(key)

    def _keys(self, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(perm, key): the positions `at` sorted by file and row within it, as keys (file << 32
        | row), and the index into `at` of each."""
        order = np.argsort(at, kind="stable")
        at = at[order]
        cuts = np.searchsorted(at, self._starts[1:]).tolist() + [len(at)]
        key = np.empty(len(at), np.int64)
        a = 0
        for j, b in enumerate(cuts):
            if b > a:
                f, local = self.files[j], at[a:b] - self._starts[j]
                key[a:b] = (local if f._row_of is None else f._row_of[local].astype(np.int64)) + (j << 32)
            a = b
        by_row = np.argsort(key, kind="stable")
        return order[by_row], key[by_row]

    def _read_keys(self, key: np.ndarray) -> np.ndarray:
        """The float32 rows at sorted keys (file << 32 | row), each run of close rows of one file
        read with one pread (VectorFile.read_rows' runs, across files)."""
        if (not len(key) or not hasattr(os, "preadv") or any(getattr(f, "_fh", None) is None for f in self.files)
                or len({f._rows.dtype for f in self.files}) > 1):
            return self._gather(key)
        cuts = np.flatnonzero(np.diff(key) > _GAP) + 1  # (a new file is a jump of 2^32)
        starts, ends = key[np.r_[0, cuts]], key[np.r_[cuts - 1, len(key) - 1]] + 1
        width = self.files[0]._rows.dtype.itemsize * self.dim
        buf = np.empty((int((ends - starts).sum()), self.dim), self.files[0]._rows.dtype)
        view, at = memoryview(buf).cast("B"), 0
        firsts = [_vectors_at(len(f.ids), f.ordered) for f in self.files]
        for a, b in zip(starts.tolist(), ends.tolist()):
            j, r = a >> 32, a & 0xFFFFFFFF
            want = (b - a) * width
            if os.preadv(self.files[j]._fh.fileno(), [view[at : at + want]], firsts[j] + r * width) != want:
                raise ValueError(f"{self.files[j].path.name}: truncated (a read of rows {r}-{r + b - a} came short)")
            at += want
        offs = np.r_[0, np.cumsum(ends - starts)[:-1]]
        run = np.searchsorted(starts, key, "right") - 1
        return widen(buf if len(key) == len(buf) else buf[offs[run] + key - starts[run]])

    def _gather(self, key: np.ndarray) -> np.ndarray:
        out = np.empty((len(key), self.dim), np.float32)
        for j in np.unique(key >> 32).tolist():
            m = (key >> 32) == j
            out[m] = widen(self.files[j]._rows[key[m] & 0xFFFFFFFF])
        return out

    def iter(self, batch: int = 8192, keep=None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for f in self.files:
            yield from f.iter(batch, keep)

    def iter_stored(self, batch: int = 65536) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for f in self.files:
            yield from f.iter_stored(batch)

    def sample(self, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(seed)
        at = np.sort(rng.choice(len(self.ids), min(n, len(self.ids)), replace=False)) if len(self.ids) else np.zeros(0, np.int64)
        out = self.ids[at].copy(), self.at_positions(at, sweep=True)
        self.release()
        return out

    @contextlib.contextmanager
    def sweeping(self):
        with contextlib.ExitStack() as stack:
            for f in self.files:
                stack.enter_context(f.sweeping())
            yield self

    def release(self) -> None:
        for f in self.files:
            f.release()


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
            if len(ids) > 1 and not (ids[1:] > ids[:-1]).all():  # (a build adds them in id order: no copy)
                order = np.argsort(ids, kind="stable")
                ids, vecs = ids[order], vecs[order]
            self._sorted = (ids, vecs)
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
    ordered = False
    _row_of = None

    def release(self) -> None:
        """Nothing to let go of: the rows are in memory, not mapped."""

    @property
    def _rows(self) -> np.ndarray:
        return self.arrays()[1]

    _pos = VectorFile._pos
    rows = VectorFile.rows
    at_positions = VectorFile.at_positions
    get = VectorFile.get
    get_file_order = VectorFile.get_file_order
    read_rows = VectorFile.read_rows
    found = VectorFile.found
    iter = VectorFile.iter
    sample = VectorFile.sample
    sweeping = VectorFile.sweeping
