"""Retriever: the one object a RAG pipeline needs — search(query, k) -> list[Hit]."""
from __future__ import annotations

import copy
import functools
import os
import threading
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from semsearch import filters, fusion as fusion_
from semsearch.errors import InputError, SettingsMismatch
from semsearch.limits import blank
from semsearch.querycheck import warn_truncated
from semsearch.store.folder import index_path, open_index
from semsearch.store.files import manifest_stamp
from semsearch.store.vectors import dot_rows

EXACT_BELOW = 4096  # a filter allowing fewer chunks is scored exactly from the stored vectors
_REFRESH = threading.Lock()  # one reopen at a time


@dataclass
class Hit:
    """One search result. `score` is what the ranking used: the cosine similarity of query and
    chunk in [-1, 1] (mode dense), its BM25 score (lexical), or the fused score (hybrid: convex
    fusion in [0, 1], or RRF); `dense_score` and `lexical_score` carry both parts."""

    rank: int
    score: float
    text: str
    source: str  # the source file, relative to the working directory where it can be
    path: str  # the source file, absolute
    start: int  # character offsets of the chunk in its document
    end: int
    row: int | None = None  # 1-based row / record for tabular files
    line: int | None = None  # 1-based line of the chunk's start for text files
    chunk: int = 0  # chunk number within its document
    id: int = 0  # the chunk's id in the index
    metadata: dict[str, Any] = field(default_factory=dict)
    mode: str = "dense"  # how it was found: dense, lexical or hybrid
    dense_score: float | None = None  # cosine similarity (hybrid and dense)
    lexical_score: float | None = None  # BM25 score, >= 0 (hybrid and lexical; 0: no query term occurs)
    explanation: dict[str, Any] | None = None  # why it matched, with explain=True (see semsearch/explain.py)

    @property
    def location(self) -> str:
        """'path:line' for text files, 'path row N' for tabular ones, 'path p. N' for PDF pages."""
        if self.row is not None:
            return f"{self.source} row {self.row}"
        if self.line is None and isinstance((self.metadata or {}).get("page"), int):
            return f"{self.source} p. {self.metadata['page']}"
        return f"{self.source}:{self.line}" if self.line else self.source

    def to_dict(self) -> dict[str, Any]:
        """The hit as plain data (JSON-ready), with its location. The metadata is a copy; the
        explanation is the hit's own (built for this hit alone, thousands of small records a
        hit: copying them cost ten times what explaining does)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["metadata"] = copy.deepcopy(self.metadata)
        d["location"] = self.location
        return d


_LATER = threading.Lock()  # one deferred explanation finished at a time


def _get_explanation(self) -> dict[str, Any] | None:
    """Why it matched, with explain=True (see semsearch/explain.py). Every number is worked out
    by the search; the per-token and per-word records (hundreds of small dicts a hit) are built
    on first access, once, so a caller that reads no explanation (or only some) pays for none."""
    d = self.__dict__
    if d.get("_later") is not None:
        with _LATER:
            later = d.get("_later")
            if later is not None:
                later()
                d["_later"] = None
    return d.get("_explanation")


def _set_explanation(self, value: dict[str, Any] | None) -> None:
    self.__dict__["_later"] = None
    self.__dict__["_explanation"] = value


def _defer_explanation(self, value: dict[str, Any], finish) -> None:
    """Set an explanation whose records `finish()` fills in on first access (explain.explain_hits)."""
    self.__dict__["_explanation"] = value
    self.__dict__["_later"] = finish


def _hit_state(self) -> dict[str, Any]:
    _get_explanation(self)  # finished before the hit is copied or pickled
    d = dict(self.__dict__)
    d.pop("_later", None)
    return d


# Set after the class: the dataclass keeps `explanation` a field (in __init__, repr, ==, to_dict),
# and the property behind it finishes a deferred explanation on first reading.
Hit.explanation = property(_get_explanation, _set_explanation)  # type: ignore[assignment]
Hit.defer_explanation = _defer_explanation  # type: ignore[attr-defined]
Hit.__getstate__ = _hit_state  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=65536)
def _display(path: str) -> str:
    try:
        rel = os.path.relpath(path)
        return path if rel.startswith("..") else rel
    except ValueError:
        return path


class Retriever:
    """Search an index folder. Queries are encoded with the index's own model and pooling."""

    def __init__(self, folder: Path, manifest, vectors, docs, encoder, stamp=None):
        """`stamp`: manifest.json's stamp taken *before* `manifest` was read (files.manifest_stamp).
        A stamp taken after could belong to a generation published in between, which the
        Retriever would then count as seen and never open; without one, the first search
        checks the folder's generation against the manifest's."""
        self.folder = Path(folder)
        self._gen = _Generation(manifest, vectors, docs)
        self.encoder = encoder
        self.auto_refresh = True  # search() picks up a new generation (one stat of manifest.json a call)
        self._stamp = stamp

    @classmethod
    def load(
        cls,
        index: str | os.PathLike | None = None,
        model: str | None = None,
        pooling: str | None = None,
        device: str = "auto",
        encoder=None,
        fast_start: bool = False,
    ) -> "Retriever":
        """Open an index folder (default: $SEMSEARCH_INDEX or ./indexes/default) for searching.

        `model` and `pooling`, when given, must match the index's; they are checks, not overrides.
        `fast_start` encodes queries with a torch-free numpy copy of the encoder (for one-shot
        processes: no 1.5-3 s torch import), and searches small flat segments with numpy (no
        faiss import); otherwise the torch encoder (faster per query, in bf16 on CPUs that have
        AMX) is used. `device` places the encoder and, where faiss has GPU
        support, the vector index ('auto': a GPU where there is one).
        """
        from semsearch.store.vectors import resolve_index_device

        folder = index_path(index)
        stamp = manifest_stamp(folder)  # before the manifest is read: see __init__
        # A one-shot process searches the index on the CPU unless told otherwise: starting CUDA
        # and copying the index to the GPU costs seconds, a CPU search milliseconds.
        m, vectors, docs = open_index(folder, resolve_index_device("cpu" if fast_start and device == "auto" else device),
                                      light=fast_start)
        if pooling is not None and pooling != m.pooling:
            raise SettingsMismatch(f"{folder} was built with pooling {m.pooling!r}, not {pooling!r}; query it without --pooling, or rebuild it")
        if encoder is None:
            encoder = _query_encoder(folder, m, model, device, fast_start)
        if encoder.fingerprint != m.model_fingerprint:
            raise SettingsMismatch(
                f"the model {m.model!r} now has weights {encoder.fingerprint}, but {folder} was built with "
                f"{m.model_fingerprint}; rebuild the index with --rebuild"
            )
        return cls(folder, m, vectors, docs, encoder, stamp)

    # One generation's manifest, vectors and docstore travel together: a search takes them once
    # and keeps them to its end, so a refresh in another thread never mixes two generations.
    @property
    def manifest(self):
        return self._gen.manifest

    @property
    def vectors(self):
        return self._gen.vectors

    @property
    def docs(self):
        return self._gen.docs

    def __len__(self) -> int:
        return self._gen.vectors.ntotal

    def refresh(self) -> bool:
        """Open the index's current generation if a writer published a new one since this
        Retriever loaded it; gives back True when it did. The encoder is kept (a new generation
        with other model weights or pooling is refused). search() calls this on its own while
        `auto_refresh` is on: a stat of manifest.json, a few microseconds."""
        with _REFRESH:
            stamp = manifest_stamp(self.folder)
            if stamp == self._stamp:
                return False
            old = self._gen
            m, vectors, docs = open_index(self.folder, getattr(old.vectors, "device", "cpu"), reuse=old.docs.segments())
            if m.generation == old.manifest.generation and m.segments == old.manifest.segments:
                self._stamp = stamp
                return False
            enc = self.encoder
            if m.model_fingerprint != enc.fingerprint or m.pooling != enc.pooling or \
                    (m.head or {}).get("fingerprint") != (old.manifest.head or {}).get("fingerprint"):
                raise SettingsMismatch(
                    f"{self.folder} was rebuilt with other settings (model {m.model} {m.model_fingerprint}, pooling "
                    f"{m.pooling!r}); load a new Retriever for it")
            # The old generation is left to the garbage collector rather than closed: a search
            # running in another thread finishes on it (its files stay readable after the writer
            # removes them).
            self._gen, self._stamp = _Generation(m, vectors, docs), stamp
            return True

    @property
    def default_mode(self) -> str:
        """hybrid where the index has its lexical side (measured best on SciFact), else dense."""
        return self._gen.default_mode(self.folder)

    def search(self, query: str, k: int = 10, mode: str | None = None, where: Any = None,
               fusion: str = "convex", alpha: float | None = None, explain: bool = False) -> list[Hit]:
        """The k chunks that best match query, best first.

        mode: 'dense' (cosine of embeddings), 'lexical' (BM25) or 'hybrid' (both, fused; the
        default where the index has a lexical side). where: metadata filter applied before
        ranking (see semsearch.filters), e.g. {"lang": "en"} or ["year>=2020", "path:*.md"].
        fusion: 'convex' (alpha * dense + (1 - alpha) * lexical, each min-max normalised) or 'rrf'.
        explain: give each hit an `explanation` (semsearch/explain.py): the chunk's tokens with
        their exact parts of the cosine, the query terms' parts of BM25, the fusion arithmetic.
        """
        if not isinstance(query, str):
            raise InputError(f"the query must be a string, got {type(query).__name__}")
        return self.search_batch([query], k, mode, where, fusion, alpha, explain)[0]

    def search_batch(self, queries: Sequence[str], k: int = 10, mode: str | None = None, where: Any = None,
                     fusion: str = "convex", alpha: float | None = None, explain: bool = False) -> list[list[Hit]]:
        """search() for many queries at once (one encoder pass)."""
        return self.search_at(queries, k, mode, where, fusion, alpha, explain)[1]

    def search_at(self, queries: Sequence[str], k: int = 10, mode: str | None = None, where: Any = None,
                  fusion: str = "convex", alpha: float | None = None,
                  explain: bool = False) -> tuple[int, list[list[Hit]]]:
        """(the generation the hits come from, search_batch's hits): a server labels its answers
        with the generation it searched, not one read before a refresh."""
        if isinstance(queries, str):
            raise InputError("search_batch takes a list of queries; use search() for one")
        for i, q in enumerate(queries):
            if not isinstance(q, str):
                raise InputError(f"query {i + 1} must be a string, got {type(q).__name__}")
            if blank(q):  # nothing but spaces or control characters
                raise InputError(f"query {i + 1} is empty" if len(queries) > 1 else "the query is empty")
        if not isinstance(k, int) or k < 1:
            raise InputError(f"k must be a positive integer, got {k!r}")
        if self.auto_refresh and manifest_stamp(self.folder) != self._stamp:
            self.refresh()
        g = self._gen  # one generation from here to the end, whatever another thread refreshes
        return g.manifest.generation, self._search(g, queries, k, mode, where, fusion, alpha, explain)

    def _search(self, g: "_Generation", queries, k, mode, where, fusion, alpha, explain) -> list[list[Hit]]:
        mode = fusion_.check_mode(mode or g.default_mode(self.folder))
        fusion_.check_fusion(fusion)
        if not queries:
            return []
        flt = filters.parse(where)
        allowed = flt.select(g.docs) if flt is not None else None
        if allowed is not None and not len(allowed):
            return [[] for _ in queries]
        if mode == "lexical":
            lex = g.lexical(self.folder)
            mask = allowed.rows(lex.ids) if allowed is not None else None
            found = [[(i, s, None, s) for i, s in lex.search(q, k, mask)] for q in queries]
            return self._explained(g, queries, None, _hits(g, found, mode), mode, fusion, alpha, None) if explain \
                else _hits(g, found, mode)
        warn_truncated(self.encoder, queries)
        qv = encode_queries(self.encoder, list(queries))
        if mode == "dense":
            scores, ids = _dense(g, qv, k, allowed)
            hits = _hits(g, _dense_found(scores, ids), mode)
            return self._explained(g, queries, qv, hits, mode, fusion, alpha, None) if explain else hits
        pools: list | None = [] if explain else None  # each query's candidates, for the fusion arithmetic
        found = _hybrid(g, g.lexical(self.folder), queries, qv, k, allowed, fusion,
                        fusion_.ALPHA if alpha is None else alpha, pools)
        hits = _hits(g, found, mode)
        return self._explained(g, queries, qv, hits, mode, fusion, alpha, pools) if explain else hits

    def _explained(self, g, queries, qv, hits, mode, fusion, alpha, pools) -> list[list[Hit]]:
        from semsearch.explain import explain_hits

        explain_hits(self, g, queries, qv, hits, mode, fusion, fusion_.ALPHA if alpha is None else alpha, pools)
        return hits

    def search_vectors(self, qv: np.ndarray, k: int = 10, where: Any = None) -> list[list[Hit]]:
        """Dense hits for query vectors (n, d), already normalised."""
        g = self._gen
        flt = filters.parse(where)
        allowed = flt.select(g.docs) if flt is not None else None
        if allowed is not None and not len(allowed):
            return [[] for _ in range(len(qv))]
        scores, ids = _dense(g, qv, k, allowed)
        return _hits(g, _dense_found(scores, ids), "dense")

    def _lexical(self, required: bool = True):
        return self._gen.lexical(self.folder, required)

    def close(self) -> None:
        self._gen.docs.close()


class _Generation:
    """One generation of an index as a Retriever reads it: manifest, vector index, docstore and
    (loaded on first use, once) the BM25 index of its chunks."""

    def __init__(self, manifest, vectors, docs):
        self.manifest, self.vectors, self.docs = manifest, vectors, docs
        self._lex_lock = threading.Lock()
        self._lex_loaded = False
        self._lex = None

    def default_mode(self, folder: Path) -> str:
        return "hybrid" if self.lexical(folder, required=False) is not None else "dense"

    def lexical(self, folder: Path, required: bool = True):
        if not self._lex_loaded:
            with self._lex_lock:
                if not self._lex_loaded:
                    self._lex = self.docs.lexical()
                    self._lex_loaded = True
        if self._lex is None and required:
            raise InputError(f"{folder} was built before lexical search; run `semsearch index CORPUS --index {folder}` "
                             "once to add it (nothing is re-encoded), or use --mode dense")
        return self._lex


# ---- the two sides and their fusion, over one generation ----------------------------------------
def _dense(g: _Generation, qv: np.ndarray, k: int, allowed, exact: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(scores (n, k), ids (n, k)) by cosine, only among the `allowed` selection where given (pre-filter).
    `exact`: score the allowed chunks exactly rather than through the index's filtered search; None
    decides by their count (a shard of an index is told what the whole index's count decides)."""
    if allowed is None:
        return g.vectors.search(qv, k)
    if exact if exact is not None else len(allowed) <= EXACT_BELOW:
        return _exact(g, qv, k, allowed.ids)
    scores, ids = g.vectors.search_filtered(qv, k, allowed)
    short = (ids >= 0).sum(1) < min(k, len(allowed))  # an approximate index missed some: be exact
    if short.any():
        es, ei = _exact(g, qv[short], k, allowed.ids)
        scores, ids = _pad(scores, k, -np.inf), _pad(ids, k, -1)
        scores[short], ids[short] = es, ei
    return scores, ids


def _exact(g: _Generation, qv: np.ndarray, k: int, allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact top k among the allowed ids: from the vectors the index holds in memory where it
    keeps them whole, else from the docstore."""
    vecs = g.vectors.reconstruct(allowed)
    ids = allowed
    if vecs is None:
        ids, vecs = g.docs.get_vectors(allowed)
    k_ = min(k, len(ids))
    scores = np.full((len(qv), k), -np.inf, np.float32)
    out = np.full((len(qv), k), -1, np.int64)
    if not k_:
        return scores, out
    s = np.asarray(qv, np.float32) @ vecs.T  # (n, m)
    top = np.argpartition(-s, k_ - 1, axis=1)[:, :k_]
    ts = np.take_along_axis(s, top, 1)
    order = np.argsort(-ts, axis=1, kind="stable")
    scores[:, :k_] = np.take_along_axis(ts, order, 1)
    out[:, :k_] = ids[np.take_along_axis(top, order, 1)]
    return scores, out


class _Beside:
    """A query's dense side run on a worker thread while the calling thread prunes its lexical
    side, where a core is free for it; where none is (every worker busy: a loaded server), the
    caller runs both, so concurrent queries never queue behind each other's halves. faiss and
    numpy's indexing and matrix work release the GIL, so the two halves overlap (1M chunks,
    2 cores: docs/benchmarks.md). Workers search on one OpenMP thread, and the halves' vector
    products run on one thread (vectors.dot_rows): faiss's and BLAS's spinning workers would
    otherwise take the core the caller's half runs on (10M chunks: hybrid p50 25.2 -> 14.5 ms)."""

    def __init__(self, workers: int | None = None) -> None:
        n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self._workers = n - 1 if workers is None else workers  # a core stays the caller's
        self._reset()
        if hasattr(os, "register_at_fork"):  # a forked child (a pre-forking server, multiprocessing)
            os.register_at_fork(after_in_child=self._reset)  # has none of the parent's threads

    def _reset(self) -> None:
        self._free = threading.BoundedSemaphore(self._workers) if self._workers else None
        self._pool = None
        self._lock = threading.Lock()

    def submit(self, fn):
        """A Future of fn() on a free worker, or None where none is free (run it yourself)."""
        if self._free is None or not self._free.acquire(blocking=False):
            return None
        try:
            if self._pool is None:
                with self._lock:
                    if self._pool is None:
                        from concurrent.futures import ThreadPoolExecutor

                        self._pool = ThreadPoolExecutor(self._workers, "semsearch-dense", _one_omp_thread)
            fut = self._pool.submit(fn)
        except BaseException:
            self._free.release()
            raise
        fut.add_done_callback(lambda _: self._free.release())
        return fut


def _one_omp_thread() -> None:
    try:
        import faiss
    except ImportError:  # the numpy matrix index only
        return
    faiss.omp_set_num_threads(1)


_BESIDE = _Beside()
BESIDE_MIN = 100_000  # chunks: below, a dense side costs less than handing it to a worker (~0.1 ms)
BESIDE_MAX_QUERIES = 4  # a larger batch keeps faiss's OpenMP threads on its dense side instead


def _hybrid(g: _Generation, lex, queries, qv, k, allowed, fusion, alpha, pools: list | None = None):
    """[(id, fused, cosine, bm25)] per query: the union of both sides' top DEPTH, each
    candidate scored exactly on both sides, fused (a long query's candidates that hold all its
    terms first: semsearch/fusion.py), best k. `pools`, where given, gets each query's candidates
    (ids, cosines, bm25, all-terms flags), or None where it has none."""
    depth = max(k, fusion_.DEPTH)
    mask = allowed.rows(lex.ids) if allowed is not None else None
    hashes = [lex.query_hashes(q) for q in queries]
    fut = None
    if len(lex.ids) >= BESIDE_MIN and len(queries) <= BESIDE_MAX_QUERIES:
        fut = _BESIDE.submit(lambda: _dense(g, qv, depth, allowed))
    if fut is not None:  # the lexical sides' pruning (most of their work) while the dense side runs
        pruned = [lex.prune(h, depth, mask) for h in hashes]
        dscores, dids = fut.result()
    else:
        pruned = None
        dscores, dids = _dense(g, qv, depth, allowed)
    out = []
    for qi, (v, ds, di) in enumerate(zip(qv, dscores, dids)):
        ok = di >= 0
        di, ds = di[ok], ds[ok]
        # pruned: exactly the exhaustive top, no pass over every row; the dense hits' BM25 read with it
        p = pruned[qi] if pruned is not None else lex.prune(hashes[qi], depth, mask)
        long = p.n_terms >= fusion_.ALL_TERMS_MIN  # then: which candidates hold all its terms
        lids, ls, dl, *held = lex.finish(p, di, terms=long)
        cand = np.union1d(di, lids)  # sorted ids
        if not len(cand):
            out.append([])
            if pools is not None:
                pools.append(None)
            continue
        d = np.empty(len(cand), np.float64)
        at = np.searchsorted(cand, di)
        d[at] = ds
        only_lex = np.setdiff1d(cand, di, assume_unique=True)
        if len(only_lex):  # their cosine, from the vectors the index or the docstore holds
            vecs = g.vectors.reconstruct(only_lex)
            ids = only_lex
            if vecs is None:
                ids, vecs = g.docs.get_vectors(only_lex)
            d[np.searchsorted(cand, ids)] = dot_rows(vecs, v)
        b = np.zeros(len(cand), np.float32)
        b[np.searchsorted(cand, di)] = dl
        b[np.searchsorted(cand, lids)] = ls
        full = np.zeros(len(cand), bool)
        if long:
            full[np.searchsorted(cand, di)] = fusion_.all_terms(held[1], p.n_terms)
            full[np.searchsorted(cand, lids)] = fusion_.all_terms(held[0], p.n_terms)
        if pools is not None:
            pools.append((cand, d, b, full))
        fused = fusion_.fuse(d, b, fusion, alpha) + full
        out.append([(int(cand[j]), float(fused[j]), float(d[j]), float(b[j])) for j in fusion_.top(cand, fused, k)])
    return out


def _hits(g: _Generation, found: list[list[tuple]], mode: str) -> list[list[Hit]]:
    """Hits from [(id, score, cosine, bm25)] per query, joined with the docstore."""
    return hits_from(g.docs.get_chunks({i for row in found for i, *_ in row}), found, mode)


def hits_from(chunks: dict[int, dict[str, Any]], found: list[list[tuple]], mode: str) -> list[list[Hit]]:
    """Hits from [(id, score, cosine, bm25)] per query and the chunk records by id."""
    out = []
    for row in found:
        hits = []
        for i, s, d, b in row:
            c = chunks.get(i)
            if c is None:  # FAISS pads with -1 and the docstore is the truth: never let a stray id out
                continue
            hits.append(Hit(rank=len(hits) + 1, score=s, text=c["text"], source=_display(c["path"]),
                            path=c["path"], start=c["start"], end=c["end"], row=c["row"], line=c["line"],
                            chunk=c["chunk"], id=c["id"], metadata=c["metadata"], mode=mode,
                            dense_score=d, lexical_score=b))
        out.append(hits)
    return out


def _dense_found(scores: np.ndarray, ids: np.ndarray) -> list[list[tuple]]:
    """[(id, cosine, cosine, None)] per query from a vector search, FAISS's -1 padding dropped."""
    return [[(int(i), float(s), float(s), None) for s, i in zip(sr, ir) if i >= 0] for sr, ir in zip(scores, ids)]


def _pad(a: np.ndarray, k: int, fill) -> np.ndarray:
    """a (n, <=k) widened to (n, k) with fill."""
    if a.shape[1] >= k:
        return a.copy()
    return np.concatenate([a, np.full((a.shape[0], k - a.shape[1]), fill, a.dtype)], 1)


def encode_queries(encoder, queries: list[str]) -> np.ndarray:
    """Query vectors: through the encoder's trained query layers where it has them."""
    fn = getattr(encoder, "encode_queries", None) or encoder.encode
    return fn(queries, progress=False)


def _query_encoder(folder: Path, m, model: str | None, device: str, fast_start: bool):
    """The encoder for queries on index m: torch-free where the model runs natively on the CPU."""
    from semsearch.encoder.models import fingerprint_folder, resolve_model, weight_stats

    if model is not None and resolve_model(model)[0] != m.model:
        raise SettingsMismatch(f"{folder} was built with model {m.model!r}, not {model!r}; query it without --model, or rebuild it")
    if m.head:
        from semsearch.encoder.heads import head_info

        if head_info(m.head["path"])["fingerprint"] != m.head["fingerprint"]:
            raise SettingsMismatch(f"the pooling head at {m.head['path']} changed since {folder} was built; "
                                   "re-pool the index with `semsearch index CORPUS --head DIR`")
    from semsearch.encoder.hardware import precision_for_index, resolve_device

    _, where = resolve_model(m.model)
    on_cpu = device != "cuda" if fast_start else resolve_device(device) == "cpu"
    # Queries in the index's own arithmetic: an int8 index is queried in int8 (ONNX Runtime);
    # trained query layers run in fp32 on either encoder (see NumpyEncoder).
    precision = precision_for_index(m.precision, "cpu" if on_cpu else "cuda")
    if fast_start and m.backend == "native" and isinstance(where, Path) and on_cpu:
        from semsearch.encoder.numpy_encoder import NumpyEncoder

        # Trust the recorded fingerprint while the weight files keep their size and time (as git does).
        fp = m.model_fingerprint if m.model_files and weight_stats(where) == m.model_files else fingerprint_folder(where)
        # int8 needs the exported model in the cache (it is there wherever the index was built);
        # else the torch encoder below exports it. bf16 one-shot queries run in fp32 here.
        from semsearch.encoder.onnx_backend import model_path

        if precision != "int8" or model_path(fp).exists():
            return NumpyEncoder(where, m.model, fp, m.pooling, m.max_length, m.head["path"] if m.head else None,
                                int8=precision == "int8")
    from semsearch.encoder.encoder import Encoder
    from semsearch.encoder.heads import load_head

    enc = Encoder(m.model, pooling=m.pooling, device=device, precision=precision, max_length=m.max_length,
                  head=load_head(m.head["path"]) if m.head else None)
    enc.head_info = m.head
    return enc
