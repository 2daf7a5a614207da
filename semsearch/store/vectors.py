"""The FAISS vector index behind a small interface, so the index type can change.

Types: `flat` (exact), `ivf` (IVF-Flat: inverted lists of full vectors), `ivf-fastscan` (IVF over
4-bit product codes scanned with SIMD "fast scan", whose top candidates are re-ranked exactly
against the full vectors: several times IVF-Flat's speed at the same recall), `ivf-sq8` (IVF with
8-bit scalar-quantised vectors: ~4x less memory) and `hnsw` (graph). All hold L2-normalised vectors and
are searched by inner product (= cosine); all keep the docstore's int64 chunk ids.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from semsearch.errors import InputError

log = logging.getLogger(__name__)

INDEX_TYPES = ("flat", "ivf", "ivf-fastscan", "ivf-sq8", "hnsw")
IVF_TYPES = ("ivf", "ivf-fastscan", "ivf-sq8")
NO_REMOVE = ("hnsw", "ivf-fastscan")  # rebuilt from the docstore's vectors after a delete
AUTO_FLAT_BELOW = 50_000  # exact search of 50k x 384 takes a few ms: no reason to approximate
KNOBS = {"ivf": "nprobe", "ivf-fastscan": "nprobe", "ivf-sq8": "nprobe", "hnsw": "efSearch"}
KNOB_STEPS = {"nprobe": [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512, 1024],
              "efSearch": [16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024]}


def bytes_per_vector(kind: str, dim: int, hnsw_m: int = 32) -> int:
    """Approximate memory a vector costs in each index type (with its 8-byte id)."""
    return {"flat": 4 * dim + 8, "ivf": 4 * dim + 8, "ivf-fastscan": 4 * dim + dim // 8 + 16, "ivf-sq8": dim + 8,
            "hnsw": 4 * dim + 8 + 2 * hnsw_m * 4}[kind]


def choose_type(requested: str, n: int, dim: int, max_bytes_per_vector: int | None = None) -> str:
    """The index type for n vectors: exact below AUTO_FLAT_BELOW, else IVF fast scan with exact
    re-ranking (or IVF-SQ8 when a per-vector memory budget rules out full vectors)."""
    if requested != "auto":
        if requested not in INDEX_TYPES:
            raise InputError(f"unknown index type {requested!r}; valid types are: auto, {', '.join(INDEX_TYPES)}")
        return requested
    fits = lambda k: max_bytes_per_vector is None or bytes_per_vector(k, dim) <= max_bytes_per_vector  # noqa: E731
    if n < AUTO_FLAT_BELOW and fits("flat"):
        return "flat"
    for kind in ("ivf-fastscan", "ivf-sq8"):
        if fits(kind):
            return kind
    raise InputError(f"no index type fits {max_bytes_per_vector} bytes a vector (ivf-sq8 needs {bytes_per_vector('ivf-sq8', dim)})")


def default_nlist(n: int) -> int:
    # ~4·sqrt(n) lists, with at least ~39 training points per list as faiss recommends
    return max(1, min(int(4 * math.sqrt(n)), n // 39, 65536))


class VectorIndex:
    """Inner-product search over L2-normalised vectors with stable int64 ids."""

    def __init__(self, index, kind: str = "flat", params: dict[str, Any] | None = None):
        self.index = index
        self.kind = kind
        self.params = dict(params or {})
        self.dirty = False  # a removal the type cannot do in place: rebuild before saving
        self.apply_params()

    @classmethod
    def create(cls, dim: int, kind: str = "flat", params: dict[str, Any] | None = None) -> "VectorIndex":
        """An empty index; IVF types still need train()."""
        import faiss

        params = dict(params or {})
        if kind == "flat":
            index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
        elif kind in ("ivf", "ivf-sq8"):
            nlist = int(params.setdefault("nlist", 1024))
            quantizer = faiss.IndexFlatIP(dim)
            if kind == "ivf":
                index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
            else:
                index = faiss.IndexIVFScalarQuantizer(quantizer, dim, nlist, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT)
        elif kind == "ivf-fastscan":
            nlist = int(params.setdefault("nlist", 1024))
            params.setdefault("k_factor", 100)  # candidates re-ranked exactly = k_factor * k
            m = dim // 4 if dim % 4 == 0 else dim // 2 if dim % 2 == 0 else dim  # 4-bit codes of 4-d sub-vectors
            inner = faiss.index_factory(dim, f"IVF{nlist},PQ{m}x4fs,RFlat", faiss.METRIC_INNER_PRODUCT)
            index = faiss.IndexIDMap2(inner)
        elif kind == "hnsw":
            m = int(params.setdefault("M", 32))
            inner = faiss.IndexHNSWFlat(dim, m, faiss.METRIC_INNER_PRODUCT)
            inner.hnsw.efConstruction = int(params.setdefault("efConstruction", 80))
            index = faiss.IndexIDMap2(inner)
        else:
            raise InputError(f"unknown index type {kind!r}; valid types are: {', '.join(INDEX_TYPES)}")
        return cls(index, kind, params)

    @classmethod
    def build(cls, dim: int, kind: str, batches: Iterator[tuple[np.ndarray, np.ndarray]], n: int,
              params: dict[str, Any] | None = None, train_sample: int = 200_000, seed: int = 0) -> "VectorIndex":
        """An index of kind over all (ids, vectors) batches; IVF types train on a sample first."""
        params = dict(params or {})
        if kind in IVF_TYPES:
            params.setdefault("nlist", default_nlist(n))
        vi = cls.create(dim, kind, params)
        batches = list(batches) if kind in IVF_TYPES else batches
        if kind in IVF_TYPES:
            all_n = sum(len(ids) for ids, _ in batches)
            rng = np.random.default_rng(seed)
            take = np.sort(rng.choice(all_n, min(train_sample, all_n), replace=False))
            sample = np.concatenate([v for _, v in batches])[take]
            vi.train(sample)
        for ids, vecs in batches:
            vi.add(ids, vecs)
        vi.apply_params()
        return vi

    def train(self, sample: np.ndarray) -> None:
        import faiss

        ivf = faiss.extract_index_ivf(self.index)
        ivf.cp.seed = 1234
        self.index.train(np.ascontiguousarray(sample, np.float32))

    def apply_params(self) -> None:
        """Set the search knob (nprobe / efSearch) from params."""
        import faiss

        if self.kind in IVF_TYPES and "nprobe" in self.params:
            faiss.extract_index_ivf(self.index).nprobe = int(self.params["nprobe"])
        if self.kind == "ivf-fastscan" and "k_factor" in self.params:
            faiss.downcast_index(self.index.index).k_factor = float(self.params["k_factor"])
        if self.kind == "hnsw" and "efSearch" in self.params:
            faiss.downcast_index(self.index.index).hnsw.efSearch = int(self.params["efSearch"])

    def set_knob(self, value: int) -> None:
        self.params[KNOBS[self.kind]] = int(value)
        self.apply_params()

    @classmethod
    def load(cls, path: Path, kind: str = "flat", params: dict[str, Any] | None = None) -> "VectorIndex":
        import faiss

        return cls(faiss.read_index(str(path)), kind, params)

    def save(self, path: Path) -> None:
        import faiss

        faiss.write_index(self.index, str(path))

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    @property
    def nbytes(self) -> int:
        """Serialized size: what the index costs in memory, roughly."""
        import faiss

        return int(faiss.serialize_index(self.index).size)

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        if len(ids):
            self.index.add_with_ids(np.ascontiguousarray(vectors, np.float32), np.ascontiguousarray(ids, np.int64))

    def remove(self, ids: np.ndarray) -> None:
        import faiss

        if not len(ids):
            return
        if self.kind in NO_REMOVE:  # HNSW graphs and refine indexes cannot drop vectors: rebuild later
            self.dirty = True
            return
        self.index.remove_ids(faiss.IDSelectorBatch(np.ascontiguousarray(ids, np.int64)))

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores (n, k), ids (n, k)); rows may hold fewer than k hits, padded with id -1."""
        import faiss

        q = np.ascontiguousarray(queries, np.float32)
        if len(q) > 4 or self.ntotal > 100_000:
            return self.index.search(q, min(k, max(self.ntotal, 1)))
        # A query on a small index takes ~1 ms: run it on one thread, or faiss's OpenMP workers keep
        # spinning afterwards and slow the encoder's threads on the next query (measured: 20 -> 11
        # ms a query on SciFact). Large indexes keep every thread: their search is the cost.
        threads = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(1)
        try:
            return self.index.search(q, min(k, max(self.ntotal, 1)))
        finally:
            faiss.omp_set_num_threads(threads)


def recall_at(approx_ids: np.ndarray, exact_ids: np.ndarray) -> float:
    """Mean fraction of each exact top-k list that the approximate list found."""
    hits = [len(set(a[a >= 0]) & set(e[e >= 0])) / max(int((e >= 0).sum()), 1) for a, e in zip(approx_ids, exact_ids)]
    return float(np.mean(hits)) if hits else 1.0


def exact_knn(queries: np.ndarray, batches: Iterator[tuple[np.ndarray, np.ndarray]], k: int,
              self_ids: np.ndarray | None = None) -> np.ndarray:
    """Exact top-k ids (n, k) of queries over streamed (ids, vectors) batches, by inner product;
    a query's own id (self_ids[i]) is left out."""
    nq = len(queries)
    best_s = np.full((nq, k), -np.inf, np.float32)
    best_i = np.full((nq, k), -1, np.int64)
    for ids, vecs in batches:
        s = queries @ vecs.T  # (nq, b)
        if self_ids is not None:
            s[self_ids[:, None] == ids[None, :]] = -np.inf
        cs = np.concatenate([best_s, s], 1)
        ci = np.concatenate([best_i, np.broadcast_to(ids, s.shape)], 1)
        top = np.argpartition(-cs, min(k, cs.shape[1] - 1), axis=1)[:, :k]
        best_s = np.take_along_axis(cs, top, 1)
        best_i = np.take_along_axis(ci, top, 1)
    order = np.argsort(-best_s, axis=1)
    return np.take_along_axis(np.where(np.isfinite(best_s), best_i, -1), order, 1)


def _search_excluding(vi: VectorIndex, queries: np.ndarray, k: int, self_ids: np.ndarray | None) -> np.ndarray:
    if self_ids is None:
        return vi.search(queries, k)[1]
    _, ids = vi.search(queries, k + 1)
    out = np.full((len(ids), k), -1, np.int64)
    for r, (row, me) in enumerate(zip(ids, self_ids)):
        kept = row[row != me][:k]
        out[r, : len(kept)] = kept
    return out


def tune(vi: VectorIndex, queries: np.ndarray, exact_ids: np.ndarray, k: int, target: float,
         self_ids: np.ndarray | None = None) -> dict[str, Any]:
    """Set the cheapest search knob whose recall@k against exact_ids meets target; gives back
    {knob, value, recall, target, queries}. Where none does, the largest setting tried is kept.
    With self_ids (corpus vectors used as queries), each query's own vector is not counted."""
    if vi.kind == "flat":
        return {"recall": 1.0, "target": target, "k": k, "queries": len(queries)}
    knob = KNOBS[vi.kind]
    steps = list(KNOB_STEPS[knob])
    if knob == "nprobe":
        steps = [s for s in steps if s <= vi.params["nlist"]] or [vi.params["nlist"]]
    best = None
    for value in steps:
        vi.set_knob(value)
        r = recall_at(_search_excluding(vi, queries, k, self_ids), exact_ids)
        best = {"knob": knob, "value": value, "recall": round(r, 4), "target": target, "k": k, "queries": len(queries)}
        if r >= target:
            break
    if best["recall"] < target:
        log.warning("%s: recall@%d %.3f is below the target %.2f even at %s=%d", vi.kind, k, best["recall"], target, knob, best["value"])
    return best
