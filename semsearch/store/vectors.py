"""The FAISS vector index behind a small interface, so the index type can change.

Types: `flat` (exact), `ivf` (IVF-Flat: inverted lists of full vectors), `ivf-fastscan` (IVF over
4-bit product codes scanned with SIMD "fast scan", whose top candidates are re-ranked exactly
against the full vectors: several times IVF-Flat's speed at the same recall), `ivf-sq8` (IVF with
8-bit scalar-quantised vectors: ~4x less memory) and `hnsw` (graph). All hold L2-normalised vectors and
are searched by inner product (= cosine); all keep the docstore's int64 chunk ids.

GPU: where faiss has GPU support (faiss-gpu) and sees a GPU, `flat`, `ivf` and `ivf-sq8` are
built and searched on it (IVF k-means training runs there for every IVF type). The CPU index stays
the copy that is saved and edited; the GPU holds a mirror made from it when needed. HNSW and
fast-scan codes have no GPU form in faiss and stay on the CPU.
"""
from __future__ import annotations

import contextlib

import functools
import logging
import math
import threading
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from semsearch.errors import InputError
from semsearch.store.vecfile import MemoryVectors, Stacked, VectorFile, widen

log = logging.getLogger(__name__)

INDEX_TYPES = ("flat", "ivf", "ivf-fastscan", "ivf-sq8", "hnsw")
IVF_TYPES = ("ivf", "ivf-fastscan", "ivf-sq8")
GPU_TYPES = ("flat", "ivf", "ivf-sq8")  # the types faiss can clone onto a GPU
GPU_MAX_K = 2048  # faiss's GPU k-selection limit; a larger k is searched on the CPU copy
NO_REMOVE = ("hnsw", "ivf-fastscan")  # rebuilt from the docstore's vectors after a delete
AUTO_FLAT_BELOW = 50_000  # exact search of 50k x 384 takes a few ms: no reason to approximate
KNOBS = {"ivf": "nprobe", "ivf-fastscan": "nprobe", "ivf-sq8": "nprobe", "hnsw": "efSearch"}
KNOB_STEPS = {"nprobe": [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512, 1024],
              "efSearch": [16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024]}
# ivf-fastscan ranks the probed lists' 4-bit codes and re-ranks its best k_factor * k exactly. At
# 10M chunks the codes rank too coarsely for k_factor 100: recall@10 stayed at 0.937 from nprobe 128
# to 1,024, while k_factor 300 gave 0.998 at nprobe 128 (docs/benchmarks.md, "Ten million chunks").
# tune() raises k_factor along these steps where the lists probed already hold the true neighbours.
K_FACTOR_STEPS = [100, 200, 300, 500, 1000]
# A raise of k_factor that adds less recall than this ends the raises at that nprobe: each step
# re-ranks more rows from the vector file (k_factor 1,000: 10,000 a query), and on vectors whose
# codes rank no better with depth the five steps cost minutes (a 417k-chunk build: 146 s of trials).
PLATEAU = 0.002
# Recall is tuned at k = 10 (merge.build_vectors). A deeper search (hybrid asks the dense side for
# its fusion depth, 100) re-ranks k_factor candidates for each of the first REFINE_K results and
# one more for each result after them, not k_factor * k: at k_factor 100 that is 1,090 rows read
# from the vector file a query instead of 10,000, and the first 10 are found as well as at k = 10.
REFINE_K = 10
# IVF quantizers of this many lists or more are trained in two levels on the CPU
# (store/quantizer.py: 3.0 s against 37.7 s at 4,000 lists; 26 s against 708 s in a 10M build);
# smaller ones, and those trained on a GPU, by faiss's own k-means.
TWO_LEVEL_LISTS = 2048


def dot_rows(rows: np.ndarray, q: np.ndarray) -> np.ndarray:
    """rows (m, d) @ q (d,), float32, on the calling thread alone. numpy's BLAS runs a product of
    more than ~9k elements (a re-ranking's 2,000 rows of 384) on every core, and its threads spin
    for a while after it: beside the lexical half of a hybrid query (search._Beside) they took its
    core (10M chunks: hybrid p50 25.2 -> 14.5 ms, docs/benchmarks.md). faiss's kernel runs on one."""
    rows = np.ascontiguousarray(rows, np.float32)
    q = np.ascontiguousarray(q, np.float32).reshape(-1)
    if not len(rows):
        return np.zeros(0, np.float32)
    try:
        import faiss
    except ImportError:  # numpy's own loop, one thread too
        return np.einsum("ij,j->i", rows, q)
    out = np.empty(len(rows), np.float32)
    faiss.fvec_inner_products_ny(faiss.swig_ptr(out), faiss.swig_ptr(q), faiss.swig_ptr(rows), rows.shape[1], len(rows))
    return out


def refine_depth(k: int, k_factor: float, ntotal: int) -> int:
    """How many fast-scan candidates a top-k search re-ranks exactly (see REFINE_K)."""
    head = min(k, REFINE_K)
    return max(1, min(int(k_factor * head) + (k - head), max(ntotal, 1)))


def bytes_per_vector(kind: str, dim: int, hnsw_m: int = 32) -> int:
    """Approximate memory a vector costs in each index type (with its 8-byte id)."""
    # ivf-fastscan: its 4-bit codes and id; the full vectors it re-ranks with are mapped from a file
    return {"flat": 4 * dim + 8, "ivf": 4 * dim + 8, "ivf-fastscan": dim // 8 + 16, "ivf-sq8": dim + 8,
            "hnsw": 4 * dim + 8 + 2 * hnsw_m * 4}[kind]


def choose_type(requested: str, n: int, dim: int, max_bytes_per_vector: int | None = None) -> str:
    """The index type for n vectors: exact below AUTO_FLAT_BELOW, else IVF fast scan with exact
    re-ranking from its mapped vector file (in memory: 4-bit codes, dim / 8 bytes a vector); under a
    per-vector memory budget too small for flat, fast scan as well."""
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


@functools.lru_cache(maxsize=1)
def faiss_gpus() -> int:
    """How many GPUs faiss can use here: 0 with faiss-cpu, or with faiss-gpu and no GPU."""
    import faiss

    from semsearch.store.faiss_info import check_distributions

    check_distributions()  # warns (once) when faiss-cpu and a GPU faiss are both installed

    if not hasattr(faiss, "StandardGpuResources"):
        return 0
    try:
        return int(faiss.get_num_gpus())  # 0 where the CUDA runtime finds no device
    except RuntimeError:  # some builds raise instead: behave as if there were no GPU
        log.warning("faiss has GPU support but could not count GPUs; vector search stays on the CPU")
        return 0


def resolve_index_device(device: str = "auto") -> str:
    """'cuda' where the request allows a GPU ('auto' or 'cuda') and faiss can use one, else 'cpu'.

    A GPU that torch sees but faiss-cpu cannot use is not an error: the encoder still runs on
    it, and the vector index on the CPU."""
    if device not in ("auto", "cpu", "cuda"):
        raise InputError(f"unknown device {device!r}; valid devices are: auto, cpu, cuda")
    if device == "cpu" or faiss_gpus() == 0:
        if device == "cuda":
            log.info("faiss here has no GPU support (install faiss-gpu): the vector index runs on the CPU")
        return "cpu"
    return "cuda"


@functools.lru_cache(maxsize=1)
def _gpu_resources():
    import faiss

    return faiss.StandardGpuResources()  # one per process: it holds the GPU's scratch memory


_GPU_LOCK = threading.RLock()  # GPU indexes sharing one StandardGpuResources must not run concurrently


def _to_gpu(index):
    """A GPU copy of a CPU faiss index, with faiss's own GPU kernels: builds with NVIDIA cuVS
    default to it, and cuVS has no IVF scalar quantiser."""
    import faiss

    opts = faiss.GpuClonerOptions()
    if hasattr(opts, "use_cuvs"):
        opts.use_cuvs = False
    return faiss.index_cpu_to_gpu(_gpu_resources(), 0, index, opts)


def default_nlist(n: int) -> int:
    # ~4·sqrt(n) lists, with at least ~39 training points per list as faiss recommends
    return max(1, min(int(4 * math.sqrt(n)), n // 39, 65536))


class MatrixIndex:
    """A flat segment's vectors searched exactly from its vector file, outside a faiss index.

    Since format 6 this is how every flat segment is searched: its vector file is the one
    stored copy of its vectors, and its faiss file holds none (it used to hold its own float32
    copy: 1.5 KB a chunk on disk beside the vector file, in memory once opened). fp32 rows are
    searched in the map itself (page cache, nothing read at open); fp16 ones are widened to
    float32 in memory on first use. `use_faiss`: scan with faiss's brute-force kernel (one
    OpenMP thread for small scans, as VectorIndex does); without it numpy, for one-shot
    processes (`semsearch query`): importing faiss costs ~40 ms of a ~0.3 s query process
    (2 cores), more than scanning a few thousand vectors. Segments of older formats, whose faiss
    file holds the vectors, read them from there (VectorIndex), or from the docstore in one-shot
    processes. Read-only; the search half of VectorIndex."""

    kind = "flat"
    device = "cpu"
    params: dict[str, Any] = {}

    def __init__(self, ids: np.ndarray, matrix: np.ndarray, use_faiss: bool = False):
        self.ids = np.asarray(ids, np.int64)  # sorted
        self._raw = matrix
        self._matrix = matrix if matrix.dtype == np.float32 and matrix.flags.c_contiguous else None
        self._lock = threading.Lock()
        self.use_faiss = use_faiss

    @property
    def matrix(self) -> np.ndarray:
        """The rows as C-contiguous float32 (fp16 rows widened once, on first use)."""
        if self._matrix is None:
            with self._lock:
                if self._matrix is None:
                    self._matrix = widen(self._raw)
        return self._matrix

    @property
    def ntotal(self) -> int:
        return len(self.ids)

    @property
    def d(self) -> int:
        return self._raw.shape[1]

    def _top(self, q: np.ndarray, k: int, rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        m, ids = (self.matrix, self.ids) if rows is None else (self.matrix[rows], self.ids[rows])
        k_ = min(k, max(self.ntotal, 1))
        scores = np.full((len(q), k_), -np.inf, np.float32)
        out = np.full((len(q), k_), -1, np.int64)
        if not len(ids):
            return scores, out
        q = np.ascontiguousarray(q, np.float32)
        n = min(k_, len(ids))
        if self.use_faiss:
            import faiss

            with one_omp_thread() if len(q) <= 4 and len(ids) <= 100_000 else contextlib.nullcontext():
                s, at = faiss.knn(q, m, n, metric=faiss.METRIC_INNER_PRODUCT)
            scores[:, :n], out[:, :n] = s, np.where(at >= 0, ids[at.clip(0)], -1)
            return scores, out
        s = q @ m.T
        for r in range(len(q)):
            cand = np.argpartition(-s[r], n - 1)[:n] if n < len(ids) else np.arange(len(ids))
            order = cand[np.lexsort((ids[cand], -s[r, cand]))]  # best first, ties: lower id
            scores[r, :n], out[r, :n] = s[r, order], ids[order]
        return scores, out

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self._top(queries, k, None)

    def search_filtered(self, queries: np.ndarray, k: int, allowed, share: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """search() over the allowed ids: sorted ids, or an object with a boolean `mask` over ids
        (exact: `share` is VectorIndex.search_filtered's, and changes nothing here)."""
        if hasattr(allowed, "mask"):
            inside = self.ids < len(allowed.mask)
            ok = np.zeros(len(self.ids), bool)
            ok[inside] = allowed.mask[self.ids[inside]]
        else:
            ok = np.isin(self.ids, np.asarray(allowed, np.int64))
        return self._top(queries, k, np.flatnonzero(ok))

    def reconstruct(self, ids: np.ndarray) -> np.ndarray | None:
        ids = np.asarray(ids, np.int64)
        at = np.searchsorted(self.ids, ids).clip(0, max(len(self.ids) - 1, 0))
        if len(ids) and (not len(self.ids) or not np.array_equal(self.ids[at], ids)):
            return None  # an id it does not hold: the caller reads the docstore
        return np.asarray(self._raw[at], np.float32) if len(ids) else np.zeros((0, self.d), np.float32)


class VectorIndex:
    """Inner-product search over L2-normalised vectors with stable int64 ids."""

    def __init__(self, index, kind: str = "flat", params: dict[str, Any] | None = None, device: str = "cpu"):
        self._cpu = index
        self.kind = kind
        self.params = dict(params or {})
        self.dirty = False  # a removal the type cannot do in place: rebuild before saving
        # 'cuda' only for types faiss can hold on a GPU, and where it can; else the CPU.
        self.device = "cuda" if device == "cuda" and kind in GPU_TYPES and faiss_gpus() > 0 else "cpu"
        self._gpu = None  # the GPU mirror, made on first use
        self.built_on = "cpu"  # where build() did its work, for the manifest
        self._cpu_stale = False  # vectors were added to the GPU mirror only: copy back before CPU use
        # ivf-fastscan's full vectors for exact re-ranking, outside faiss (store/vecfile.py): in
        # memory while the index is built, mapped from `vectors.<s>.vec` once saved. None for the
        # other types, and for fast-scan indexes of format 2, whose faiss file holds them (RFlat).
        self.refine = None
        self.apply_params()

    @property
    def index(self):
        """The CPU faiss index (the copy that is saved and edited)."""
        if self._cpu_stale:
            import faiss

            with _GPU_LOCK:
                if self._cpu_stale:
                    self._cpu = faiss.index_gpu_to_cpu(self._gpu)
                    self._cpu_stale = False
        return self._cpu

    def _searcher(self):
        """The faiss index to search: the GPU mirror where this index lives on a GPU. Where the
        copy to the GPU fails (out of memory, say), the index stays on the CPU, with a warning."""
        if self.device != "cuda":
            return self.index
        with _GPU_LOCK:
            if self._gpu is None:
                try:
                    self._gpu = _to_gpu(self.index)
                except RuntimeError as e:
                    log.warning("could not copy the %s index to the GPU (%s); searching it on the CPU", self.kind, e)
                    self.device = "cpu"
                    return self.index
                self.apply_params()
            return self._gpu

    @classmethod
    def create(cls, dim: int, kind: str = "flat", params: dict[str, Any] | None = None, device: str = "cpu") -> "VectorIndex":
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
            params["refine"] = "file"  # the full vectors go to a mapped file, not into faiss
            index = faiss.index_factory(dim, f"IVF{nlist},PQ{m}x4fs", faiss.METRIC_INNER_PRODUCT)
        elif kind == "hnsw":
            m = int(params.setdefault("M", 32))
            inner = faiss.IndexHNSWFlat(dim, m, faiss.METRIC_INNER_PRODUCT)
            inner.hnsw.efConstruction = int(params.setdefault("efConstruction", 80))
            index = faiss.IndexIDMap2(inner)
        else:
            raise InputError(f"unknown index type {kind!r}; valid types are: {', '.join(INDEX_TYPES)}")
        vi = cls(index, kind, params, device)
        if vi.external_refine:
            vi.refine = MemoryVectors(dim)
        return vi

    def lists(self) -> list[np.ndarray] | None:
        """The ids of each inverted list, list by list (IVF types; None for the others): the
        order an ivf-fastscan segment's vector file keeps its rows in (store/vecfile.py)."""
        import faiss

        if self.kind not in IVF_TYPES:
            return None
        inv = faiss.extract_index_ivf(self.index).invlists
        return [faiss.rev_swig_ptr(inv.get_ids(lst), inv.list_size(lst)).astype(np.int64)
                for lst in range(inv.nlist) if inv.list_size(lst)]

    @property
    def external_refine(self) -> bool:
        """Whether the full vectors for re-ranking live outside faiss (see self.refine)."""
        return self.kind == "ivf-fastscan" and self.params.get("refine") == "file"

    @classmethod
    def build(cls, dim: int, kind: str, batches, n: int,
              params: dict[str, Any] | None = None, train_sample: int = 200_000, seed: int = 0,
              device: str = "cpu") -> "VectorIndex":
        """An index of kind over all vectors of `batches`; IVF types train on a sample first.
        `batches`: an iterator of (ids, vectors), or a vector store (store/vecfile.py: a mapped
        file or rows in memory), which is read in batches and sampled in place, so a build holds
        the index and one batch, not every vector (an iterator is listed first for IVF types). An
        ivf-fastscan index re-ranks against the store it was built from.
        On device 'cuda' the vectors are added on the GPU and copied back to the CPU once."""
        params = dict(params or {})
        on_gpu = device == "cuda" and faiss_gpus() > 0
        if not isinstance(batches, (VectorFile, MemoryVectors, Stacked)) and (kind in IVF_TYPES or on_gpu or kind == "ivf-fastscan"):
            got = list(batches)
            store = MemoryVectors(dim)
            for ids, vecs in got:
                store.add(ids, vecs)
            batches = store
        if on_gpu:
            try:
                return cls._build(dim, kind, batches, n, params, train_sample, seed, "cuda")
            except RuntimeError as e:  # out of GPU memory, say: the CPU can still do it
                log.warning("building the %s index on the GPU failed (%s); building it on the CPU", kind, e)
        return cls._build(dim, kind, batches, n, params, train_sample, seed, "cpu")

    @classmethod
    def _build(cls, dim: int, kind: str, batches, n: int, params: dict[str, Any], train_sample: int, seed: int,
               device: str) -> "VectorIndex":
        store = batches if isinstance(batches, (VectorFile, MemoryVectors, Stacked)) else None
        vi = cls.trained(dim, kind, n, store, params, train_sample, seed, device)
        return vi.fill(store if store is not None else batches)

    @classmethod
    def trained(cls, dim: int, kind: str, n: int, store, params: dict[str, Any] | None = None,
                train_sample: int = 200_000, seed: int = 0, device: str = "cpu") -> "VectorIndex":
        """An empty index of kind for n vectors, its IVF quantizer trained on a sample of `store`
        (anything with sample(m, seed) -> (ids, vectors): a vector file, rows in memory, or
        several files, vecfile.Sampled). fill() adds the vectors."""
        params = dict(params or {})
        if kind in IVF_TYPES:
            params.setdefault("nlist", default_nlist(n))
        vi = cls.create(dim, kind, params, device)
        if kind in IVF_TYPES:  # at least the ~39 points a list faiss's k-means asks for (1.6 M at 40k lists)
            need = max(train_sample, 39 * int(vi.params.get("nlist", 1)))
            vi.train(store.sample(need, seed)[1], gpu=device == "cuda")
        if device == "cuda" and kind in IVF_TYPES:
            vi.built_on = "cpu, k-means on cuda"  # fill() says "cuda" where the vectors go there too
        return vi

    def empty_copy(self) -> "VectorIndex":
        """A copy of this trained, empty index (its quantizer and codebooks), to fill with other
        vectors: each partition of a partitioned build fills one (indexing.train_ahead)."""
        import faiss

        if self.ntotal:
            raise ValueError("only an empty index is copied")
        vi = type(self)(faiss.clone_index(self.index), self.kind, dict(self.params), self.device)
        if vi.external_refine:
            vi.refine = MemoryVectors(self.index.d)
        return vi

    def fill(self, batches, after: int | None = None) -> "VectorIndex":
        """Add every vector of `batches` (an iterator of (ids, vectors), or a vector store, read in
        batches) to this trained index; an ivf-fastscan index re-ranks against the store itself.
        `after`: of a store, only the vectors of ids above it (those up to it are in already)."""
        store = batches if isinstance(batches, (VectorFile, MemoryVectors, Stacked)) else None
        if after is not None and store is None:
            raise ValueError("fill(after=...) reads a vector store")
        if store is not None and self.external_refine:
            self.refine = store  # re-ranking reads the store itself: no second copy
        if self.device == "cuda":
            self._searcher()  # adds go to the GPU mirror (or the CPU, where the copy failed)
        if self.device == "cuda":
            self.built_on = "cuda"
        keep = None if after is None else (lambda ids: ids > after)
        for ids, vecs in (store.iter(65536, keep) if store is not None else batches):
            self.add(ids, vecs, refine=store is None)
        self.apply_params()
        return self

    def train(self, sample: np.ndarray, gpu: bool = False) -> None:
        """Train the IVF coarse quantizer (k-means on a GPU where gpu is true)."""
        import faiss

        ivf = faiss.extract_index_ivf(self.index)
        ivf.cp.seed = 1234
        if not gpu and ivf.nlist >= TWO_LEVEL_LISTS and len(sample) >= ivf.nlist:
            from semsearch.store.quantizer import two_level

            # the quantizer holding nlist centroids, faiss's train() trains only the codes
            ivf.quantizer.add(two_level(sample, ivf.nlist))
            self.index.train(np.ascontiguousarray(sample, np.float32))
            self._gpu = None
            return
        # k-means assignment on the GPU, with the quantizer's own metric. faiss keeps only a raw
        # pointer to clustering_index: this local keeps the GPU index alive while it trains.
        on_gpu = _to_gpu(faiss.IndexFlatIP(ivf.d)) if gpu else None
        ivf.clustering_index = on_gpu
        try:
            self.index.train(np.ascontiguousarray(sample, np.float32))
        finally:
            ivf.clustering_index = None
            del on_gpu
        self._gpu = None

    def apply_params(self) -> None:
        """Set the search knob (nprobe / efSearch) from params, on the CPU index and its GPU mirror."""
        import faiss

        if self.kind in IVF_TYPES and "nprobe" in self.params:
            faiss.extract_index_ivf(self._cpu).nprobe = int(self.params["nprobe"])
            if self._gpu is not None:
                faiss.GpuParameterSpace().set_index_parameter(self._gpu, "nprobe", int(self.params["nprobe"]))
        if self.kind == "ivf-fastscan" and "k_factor" in self.params and not self.external_refine:
            faiss.downcast_index(self._cpu.index).k_factor = float(self.params["k_factor"])
        if self.kind == "hnsw" and "efSearch" in self.params:
            faiss.downcast_index(self._cpu.index).hnsw.efSearch = int(self.params["efSearch"])

    def set_knob(self, value: int) -> None:
        self.params[KNOBS[self.kind]] = int(value)
        self.apply_params()

    @classmethod
    def load(cls, path: Path, kind: str = "flat", params: dict[str, Any] | None = None, device: str = "cpu",
             refine: VectorFile | None = None) -> "VectorIndex":
        """The index saved at path; an ivf-fastscan one re-ranks against `refine` (the segment's
        vector file, opened by the caller) or the vector file beside path."""
        import faiss

        vi = cls(faiss.read_index(str(path)), kind, params, device)
        if vi.external_refine:
            vi.refine = refine if refine is not None else VectorFile(Path(path).with_suffix(".vec"))
        return vi

    def save(self, path: Path, vectors_elsewhere: bool = False) -> None:
        """Write the faiss file. The full vectors (ivf-fastscan's re-ranking rows too) are the
        segment's vector file, written by the segment's writer (store/vecfile.py).
        `vectors_elsewhere` (a segment's writer, since format 6): a flat index is written
        without its vectors, which only the vector file keeps (its segment entry says so, and
        it is searched from that file: MatrixIndex)."""
        import faiss

        if vectors_elsewhere and self.kind == "flat":
            faiss.write_index(faiss.IndexIDMap2(faiss.IndexFlatIP(self.d)), str(path))
            return
        faiss.write_index(self.index, str(path))

    @property
    def d(self) -> int:
        return int(self.index.d)

    @property
    def ntotal(self) -> int:
        return int((self._gpu if self._cpu_stale else self._cpu).ntotal)

    @property
    def nbytes(self) -> int:
        """Serialized size: what the index costs in memory, roughly."""
        import faiss

        return int(faiss.serialize_index(self.index).size)

    def add(self, ids: np.ndarray, vectors: np.ndarray, refine: bool = True) -> None:
        """Add vectors; `refine`: to the re-ranking rows too (False: they are there already)."""
        if not len(ids):
            return
        vectors, ids = np.ascontiguousarray(vectors, np.float32), np.ascontiguousarray(ids, np.int64)
        if self.refine is not None and refine:
            self.refine.add(ids, vectors)
        with _GPU_LOCK:
            if self._gpu is not None:  # add on the GPU; the CPU copy is taken from it when next needed
                self._gpu.add_with_ids(vectors, ids)
                self._cpu_stale = True
                return
        self._cpu.add_with_ids(vectors, ids)

    def remove(self, ids: np.ndarray) -> None:
        import faiss

        if not len(ids):
            return
        if self.kind in NO_REMOVE:  # HNSW graphs and refine indexes cannot drop vectors: rebuild later
            self.dirty = True
            return
        with _GPU_LOCK:
            self.index.remove_ids(faiss.IDSelectorBatch(np.ascontiguousarray(ids, np.int64)))
            self._gpu = None  # removed on the CPU copy: the mirror is made again when next searched

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores (n, k), ids (n, k)); rows may hold fewer than k hits, padded with id -1."""

        q = np.ascontiguousarray(queries, np.float32)
        if self.refine is not None:
            kk = refine_depth(k, self.params.get("k_factor", 1), self.ntotal)
            return self._rerank(q, self._plain_search(q, kk)[1], k)
        return self._plain_search(q, k)

    def _plain_search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self.device == "cuda" and k <= GPU_MAX_K:
            with _GPU_LOCK:
                searcher = self._searcher()
                if self.device == "cuda":
                    return searcher.search(q, min(k, max(self.ntotal, 1)))
        if len(q) > 4 or self.scanned() > 100_000:
            return self.index.search(q, min(k, max(self.ntotal, 1)))
        # A query that scans little takes ~1 ms: run it on one thread, or faiss's OpenMP workers keep
        # spinning afterwards and slow the encoder's threads on the next query (measured: 20 -> 11
        # ms a query on SciFact), and the re-ranking's numpy right after it (10M chunks, nprobe 4:
        # dense p50 16.1 -> 7.7 ms on 2 cores). Searches that scan much keep every thread.
        with one_omp_thread():
            return self.index.search(q, min(k, max(self.ntotal, 1)))

    def scanned(self) -> float:
        """About how many stored vectors (or codes) one query scans: an IVF index's probed share
        of them, a flat one's all, a graph's a few hundred."""
        if self.kind in IVF_TYPES:
            return self.ntotal * min(1.0, int(self.params.get("nprobe", 1)) / max(int(self.params.get("nlist", 1)), 1))
        if self.kind == "hnsw":
            return 0.0
        return float(self.ntotal)

    def reconstruct(self, ids: np.ndarray) -> np.ndarray | None:
        """The stored vectors (n, d) of the given ids, for the types that keep full vectors behind
        an id map (flat, hnsw, ivf-fastscan's refine store); None for the others (the docstore
        has them). Every id must be in the index."""
        if self.refine is not None:
            return self.refine.get(np.asarray(ids, np.int64)) if len(ids) else np.zeros((0, self.refine.dim), np.float32)
        if self.kind not in ("flat", "hnsw", "ivf-fastscan"):
            return None
        index = self.index
        try:
            return index.reconstruct_batch(np.ascontiguousarray(ids, np.int64)) if len(ids) else np.zeros((0, index.d), np.float32)
        except RuntimeError:  # an id faiss does not hold: let the caller read the docstore
            return None

    def search_filtered(self, queries: np.ndarray, k: int, allowed, share: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """search() over only the allowed ids, through a faiss ID selector on the CPU index
        (GPU indexes take selectors only in part). `allowed`: sorted ids, or an object with a
        `bitmap` (bit i of byte i // 8: id i) and a length, as semsearch.filters.Selection is: a
        bitmap costs one bit test per candidate, where a batch of ids is first hashed into a set.
        `share`: the share of this index's vectors `allowed` lets through; an IVF index probes
        nprobe / share of its lists (at most all), so that the probed lists hold about as many
        allowed vectors as an unfiltered search's do (at 1M chunks in 3 partitions, tuned to one
        list, a filter passing 10% otherwise found too few and fell back to exact search:
        docs/scale-out.md). Approximate types may find fewer than k."""
        import faiss

        q = np.ascontiguousarray(queries, np.float32)
        if hasattr(allowed, "bitmap"):
            bits = allowed.bitmap
            sel = faiss.IDSelectorBitmap(bits)
        else:
            sel = faiss.IDSelectorBatch(np.ascontiguousarray(allowed, np.int64))
        index = self.index
        nprobe = int(self.params.get("nprobe", 1))
        if self.kind in IVF_TYPES and 0 < share < 1:
            nprobe = min(int(self.params.get("nlist", nprobe)), int(math.ceil(nprobe / share)))
        if self.kind == "flat":
            params = faiss.SearchParameters(sel=sel)  # the IDMap wrapper translates it to its rows
        elif self.kind in ("ivf", "ivf-sq8") or self.external_refine:
            params = faiss.SearchParametersIVF(sel=sel, nprobe=nprobe)
        elif self.kind == "ivf-fastscan":
            # IDMap2(RefineFlat(IVF fast scan)): the wrapper translates only the top-level selector,
            # so the IVF's own selector is given one that maps its rows to ids itself.
            inner = faiss.SearchParametersIVF(sel=faiss.IDSelectorTranslated(index.id_map, sel), nprobe=nprobe)
            params = faiss.IndexRefineSearchParameters(k_factor=float(self.params.get("k_factor", 1)), base_index_params=inner)
        elif self.kind == "hnsw":
            params = faiss.SearchParametersHNSW(sel=sel, efSearch=int(self.params.get("efSearch", 16)))
        else:
            raise InputError(f"unknown index type {self.kind!r}")
        k = max(1, min(k, len(allowed)))
        kk = refine_depth(k, self.params.get("k_factor", 1), self.ntotal) if self.refine is not None else k
        if len(q) > 4:
            got = index.search(q, kk, params=params)
        else:
            # A few queries with a selector on one thread: faiss then splits the probed lists over its
            # OpenMP workers, whose barrier costs more than the work (ivf-fastscan, 100k chunks, 60%
            # passing, 2 busy cores: 20 ms a query against 0.27 ms on one thread; scripts/bench/bench_filters.py).
            with one_omp_thread():
                got = index.search(q, kk, params=params)
        return self._rerank(q, got[1], k) if self.refine is not None else got

    def _rerank(self, q: np.ndarray, cand: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Each query's candidates (ids (n, K), -1 padded) scored exactly against their full vectors
        (read from the mapped file: only these rows' pages; in an IVF segment's file, written list
        by list, those of the few lists probed), best k first (ties: lower id)."""
        scores = np.full((len(q), k), -np.inf, np.float32)
        out = np.full((len(q), k), -1, np.int64)
        for r in range(len(q)):
            ids = cand[r][cand[r] >= 0]
            if not len(ids):
                continue
            got = self.refine.get_file_order(ids)  # rows in file order: the pages read in order
            if got is None:
                raise RuntimeError("the vector file lacks ids the index holds")
            ids, vecs = got
            s = dot_rows(vecs, q[r])
            m = min(k, len(ids))
            top = np.argpartition(-s, m - 1)[:m] if m < len(ids) else np.arange(len(ids))
            order = top[np.lexsort((ids[top], -s[top]))]
            scores[r, :m], out[r, :m] = s[order], ids[order]
        return scores, out


@contextlib.contextmanager
def one_omp_thread():
    """faiss on one OpenMP thread inside the block. OpenMP's thread count is a setting of the
    calling thread, so other threads' searches keep theirs."""
    import faiss

    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(threads)


def recalls(approx_ids: np.ndarray, exact_ids: np.ndarray) -> np.ndarray:
    """Each query's fraction of its exact top-k list (-1 padded) that the approximate list found."""
    return np.array([len(set(a[a >= 0]) & set(e[e >= 0])) / max(int((e >= 0).sum()), 1)
                     for a, e in zip(approx_ids, exact_ids)], np.float64)


def recall_at(approx_ids: np.ndarray, exact_ids: np.ndarray) -> float:
    """Mean fraction of each exact top-k list that the approximate list found."""
    got = recalls(approx_ids, exact_ids)
    return float(got.mean()) if len(got) else 1.0


def exact_knn(queries: np.ndarray, batches: Iterator[tuple[np.ndarray, np.ndarray]], k: int,
              self_ids: np.ndarray | None = None) -> np.ndarray:
    """Exact top-k ids (n, k) of queries over streamed (ids, vectors) batches, by inner product;
    a query's own id (self_ids[i]) is left out.

    Each batch goes through faiss's exact kernel (BLAS, then a heap per query) for its top k+1,
    and only those are merged: the numpy version (the whole queries x batch score matrix, its
    ids broadcast beside it, argpartition over both) spent 13.8-15.4 s of a 1M-chunk merge's
    recall tuning, most of it moving those matrices rather than multiplying."""
    import faiss

    q = np.ascontiguousarray(queries, np.float32)
    nq = len(q)
    best_s = np.full((nq, k), -np.inf, np.float32)
    best_i = np.full((nq, k), -1, np.int64)
    for ids, vecs in batches:
        if not len(ids):
            continue
        got_s, at = faiss.knn(q, np.ascontiguousarray(vecs, np.float32), min(k + (self_ids is not None), len(ids)),
                              metric=faiss.METRIC_INNER_PRODUCT)
        got_i = np.where(at >= 0, np.asarray(ids, np.int64)[np.maximum(at, 0)], -1)
        got_s = np.where(at >= 0, got_s, -np.inf)
        if self_ids is not None:
            got_s[got_i == self_ids[:, None]] = -np.inf
        cs = np.concatenate([best_s, got_s], 1)
        ci = np.concatenate([best_i, got_i], 1)
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
    """Set the cheapest search knobs whose recall@k against exact_ids meets target; gives back
    {knob, value, recall, lower, target, queries} (fast scan: and k_factor). Where none does, the
    largest setting tried is kept. With self_ids (corpus vectors used as queries), each query's
    own vector is not counted.

    A setting meets the target when the lower end of recall's one-sided 95% confidence interval
    over the queries does (`lower`), not their mean: a tuner stopping at the first mean above the
    target leaves the index below it about half the time (10M chunks: 0.956 on the tuner's 500
    queries, 0.948 on 200 others).

    Fast scan (re-ranked from a vector file) has two knobs: a true neighbour is found when its list
    is probed (nprobe) and its codes rank it among the k_factor * k candidates re-ranked. Both
    cost: SCAN_COST a code scanned, RERANK_COST a row re-ranked. For each nprobe, from the
    smallest whose probed lists hold `target` of the true neighbours, k_factor goes up its steps
    (K_FACTOR_STEPS) until the target is met or the codes already rank every probed neighbour;
    the cheapest setting that meets it is kept, and no nprobe is tried that cannot beat it."""
    if vi.kind == "flat":
        return {"recall": 1.0, "target": target, "k": k, "queries": len(queries)}
    knob = KNOBS[vi.kind]
    steps = nprobe_steps(int(vi.params["nlist"])) if knob == "nprobe" else list(KNOB_STEPS[knob])
    if vi.external_refine:
        best = _tune_fast_scan(vi, queries, exact_ids, k, target, self_ids, steps)
    else:
        prev = None
        for value in steps:
            best = _trial(vi, queries, exact_ids, k, target, self_ids, value)
            if best["lower"] >= target:
                break
            if prev is not None and value > KNOB_STEPS[knob][-1] and best["recall"] - prev < PLATEAU:
                break  # past the usual steps a probe costs a large share of a full scan: not for nothing
            prev = best["recall"]
    vi.set_knob(best["value"])
    if "k_factor" in best:
        vi.params["k_factor"] = best["k_factor"]
    if best["lower"] < target:
        log.warning("%s: recall@%d %.3f (at least %.3f) is below the target %.2f even at %s=%d", vi.kind, k,
                    best["recall"], best["lower"], target, knob, best["value"])
    return best


def nprobe_steps(nlist: int) -> list[int]:
    """The nprobe values the tuner tries: KNOB_STEPS's up to nlist, then, where nlist is larger
    than the last of them, doubling up to every list. Vectors without cluster structure (the
    real model's vectors of the synthetic benchmark corpus: median cosine 0.92, the 10th and
    11th neighbours 1.5e-4 apart) scatter a query's neighbours over many lists: a 417k-chunk build
    of them (2,583 lists) reached recall@10 0.775 with 1,024 lists probed, and stopped there. Past
    KNOB_STEPS's last, the tuner goes on only while recall grows (PLATEAU)."""
    steps = [s for s in KNOB_STEPS["nprobe"] if s <= nlist]
    last = steps[-1] if steps else 0
    while last * 2 < nlist:
        last *= 2
        steps.append(last)
    return steps + [nlist] if not steps or steps[-1] != nlist else steps


# What one query's fast-scan search costs, in units of one code scanned: measured on a 1M-chunk
# index (fp16 rows in list order, 250 vectors a list; Intel Xeon, one query at a time): nprobe
# 8 -> 32 at 1,000 rows re-ranked added 0.61 ms for 6,000 more codes (~0.1 us each), 500 -> 1,000
# rows re-ranked at nprobe 2 -> 4 added 0.79 ms (~1.6 us each). So a re-ranked row costs ~16 codes:
# at 10M chunks (790 a list), one process, in turns: nprobe 4 with k_factor 300 (3,000 rows re-ranked)
# 10.1-10.3 ms p50, nprobe 8 with 200 (2,000) 5.1-5.6 ms, 16 with 100 (1,000) 3.0-3.5 (docs/benchmarks.md).
SCAN_COST, RERANK_COST = 1.0, 16.0


def _fast_scan_cost(vi: VectorIndex, nprobe: int, k_factor: int, k: int) -> float:
    scanned = vi.ntotal * min(1.0, nprobe / max(int(vi.params["nlist"]), 1))
    return SCAN_COST * scanned + RERANK_COST * min(refine_depth(k, k_factor, vi.ntotal), scanned)


def _tune_fast_scan(vi: VectorIndex, queries: np.ndarray, exact_ids: np.ndarray, k: int, target: float,
                    self_ids: np.ndarray | None, steps: list[int]) -> dict[str, Any]:
    lists = _neighbour_lists(vi, exact_ids)
    best, best_cost, last = None, np.inf, None
    for i, nprobe in enumerate(steps):
        if _fast_scan_cost(vi, nprobe, K_FACTOR_STEPS[0], k) >= best_cost:
            break  # every later setting scans more than the best one costs
        share = _probed_share(vi, queries, exact_ids, nprobe, lists)
        if share < target and i + 1 < len(steps):
            continue  # no k_factor finds neighbours whose lists are not probed
        prev = None
        for factor in K_FACTOR_STEPS:
            if _fast_scan_cost(vi, nprobe, factor, k) >= best_cost:
                break
            last = _trial(vi, queries, exact_ids, k, target, self_ids, nprobe, factor)
            if last["lower"] >= target:
                best, best_cost = last, _fast_scan_cost(vi, nprobe, factor, k)
                break
            if last["recall"] >= share - 1e-3:
                break  # the codes rank every probed neighbour already: a larger k_factor finds no more
            if prev is not None and last["recall"] - prev < PLATEAU:
                break  # the last raise found next to nothing more: the rest of the steps cost more for as little
            prev = last["recall"]
    return best or last


def _trial(vi: VectorIndex, queries: np.ndarray, exact_ids: np.ndarray, k: int, target: float,
           self_ids: np.ndarray | None, value: int, k_factor: int | None = None) -> dict[str, Any]:
    """Search the queries at one setting: its recall@k (mean) and the lower end of its one-sided
    95% confidence interval (`lower`)."""
    if k_factor is not None:
        vi.params["k_factor"] = k_factor
    vi.set_knob(value)
    per_query = recalls(_search_excluding(vi, queries, k, self_ids), exact_ids)
    mean = float(per_query.mean()) if len(per_query) else 1.0
    spread = float(per_query.std(ddof=1)) / np.sqrt(len(per_query)) if len(per_query) > 1 else 0.0
    out = {"knob": KNOBS[vi.kind], "value": value, "recall": round(mean, 4), "lower": round(float(mean - 1.645 * spread), 4),
           "target": target, "k": k, "queries": len(queries)}
    if k_factor is not None:
        out["k_factor"] = k_factor
    return out


def _neighbour_lists(vi: VectorIndex, exact_ids: np.ndarray) -> dict[int, int]:
    """Each exact neighbour's list: the quantizer's nearest centroid to its stored vector (how it
    was added, up to the rounding of fp16 storage)."""
    import faiss

    uniq = np.unique(exact_ids[exact_ids >= 0])
    vecs = vi.reconstruct(uniq) if len(uniq) else None
    if vecs is None:
        return {}
    _, lists = faiss.extract_index_ivf(vi.index).quantizer.search(np.ascontiguousarray(vecs, np.float32), 1)
    return dict(zip(uniq.tolist(), lists[:, 0].tolist()))


def _probed_share(vi: VectorIndex, queries: np.ndarray, exact_ids: np.ndarray, nprobe: int,
                  lists: dict[int, int] | None = None) -> float:
    """The share of the exact neighbours (exact_ids, -1 padded) that lie in the nprobe lists a
    search probes: the recall an IVF search reaches at this nprobe when every probed vector is
    ranked exactly. `lists`: each neighbour's list (_neighbour_lists), found here if not given."""
    import faiss

    list_of = _neighbour_lists(vi, exact_ids) if lists is None else lists
    if not list_of:
        return 1.0
    _, probed = faiss.extract_index_ivf(vi.index).quantizer.search(np.ascontiguousarray(queries, np.float32), nprobe)
    hits = []
    for row, lst in zip(exact_ids, probed):
        row = row[row >= 0]
        if len(row):
            inside = set(lst.tolist())
            hits.append(sum(list_of[int(x)] in inside for x in row) / len(row))
    return float(np.mean(hits)) if hits else 1.0
