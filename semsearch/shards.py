"""Search an index split into shards: each shard owns some of a generation's segments (their
vectors, BM25 postings and docstores), and a router merges the shards' answers into exactly what
one process over the whole index answers.

    shards = [Shard(folder, i, 3) for i in range(3)]          # or Ray Serve deployments (serve_ray.py)
    router = ShardedSearch(folder, local_fanout(shards), encoder)
    router.search_batch(["loan approval"], k=10, mode="hybrid", where={"lang": "en"})

A search takes two rounds, three where the router has not met one of its terms or its filter at
this generation (the first search of a generation asks for the 4,096 terms searched lately too,
so a write costs searches that round once, not once for each); each round is a call of every
shard at once (`fanout`):
    prepare     (only for what the router does not hold for the generation yet) each term's
                document frequency, the shard's live rows and their total length (BM25's
                statistics are the whole index's, as in one process), and how many chunks the
                filter lets through (the exact-search threshold is decided on the whole index's
                count); kept per generation by the router
    candidates  per query the shard's dense top `depth` and BM25 top `depth` (under the global
                statistics), and for hybrid each of those candidates' cosine and BM25; the router
                keeps the global top `depth` of each side and fuses (every candidate it keeps is in
                the top `depth` of a side of its shard, which scored it both ways)
    chunks      the hits' records
The merge is the one-process arithmetic on the same numbers: dense by score, BM25 by score (ties to
the lower id), hybrid fused over the union of both sides' global top `depth` (fusion.fuse, fusion.top).

Which shard owns a segment is a function of the manifest alone (`assign`: balanced by live chunk
count), so every replica of a shard opens the same segments without being told. Every call names
the generation the router searches; a shard that has moved on (or not yet) answers Stale, and the
router starts the search again on the newest generation: a search never mixes two generations.
"""
from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from semsearch import filters
from semsearch import fusion as fusion_
from semsearch.errors import InputError, SemsearchError
from semsearch.limits import blank
from semsearch.search import EXACT_BELOW, _dense, _Generation, encode_queries, hits_from
from semsearch.store.lexical import counted
from semsearch.store.vectors import dot_rows

STALE_RETRIES = 5


class Stale(SemsearchError):
    """A shard holds another generation than the one a search asked for."""

    def __init__(self, message: str, generation: int):
        super().__init__(message)
        self.generation = generation

    def __reduce__(self):  # travels between processes (Ray) with its generation
        return (Stale, (str(self), self.generation))


def assign(segments: Sequence[dict[str, Any]], shards: int) -> list[list[int]]:
    """Positions in `segments` owned by each of `shards` shards. The unit is a partition by
    document (all the segments of one `part`: store/partition.py), else a segment (an index
    without partitions, or a write's segment not yet split): the largest units first, each to
    the shard with the fewest live chunks so far (ties: the lower shard), each shard's in list
    order. An index of N partitions served by N shards: one partition a shard."""
    if shards < 1:
        raise InputError(f"the number of shards must be at least 1, got {shards}")
    units: dict[Any, list[int]] = {}
    for pos, e in enumerate(segments):
        units.setdefault(("part", e["part"]) if e.get("part") is not None else ("segment", pos), []).append(pos)
    size = {k: sum(int(segments[i].get("live", 0)) for i in v) for k, v in units.items()}
    load = [0] * shards
    owned: list[list[int]] = [[] for _ in range(shards)]
    for key in sorted(units, key=lambda k: (-size[k], units[k][0])):
        s = min(range(shards), key=lambda j: (load[j], j))
        owned[s] += units[key]
        load[s] += size[key]
    return [sorted(o) for o in owned]


class _ShardGeneration:
    """One generation's segments of one shard, opened."""

    def __init__(self, folder: Path, manifest, positions: list[int], device: str):
        from semsearch.store.segments import SegmentedDocs, SegmentedVectors, live_counts, open_parts

        self.manifest = manifest
        sub = dataclasses.replace(manifest, segments=[manifest.segments[i] for i in positions])
        parts = open_parts(folder, sub, device)
        self.empty = not parts  # more shards than segments: this one waits for more
        self.g = None if self.empty else _Generation(sub, SegmentedVectors(parts, manifest.index, device),
                                                     SegmentedDocs(folder, parts, live_counts(sub.segments)))
        self.lex = self.g.docs.lexical() if not self.empty else None
        self.has_lexical = self.lex is not None or self.empty

    def allowed(self, where):
        """The filter's selection of this shard's chunks (None: no filter); the rounds of one search
        ask twice, and filters keep recent selections per generation."""
        flt = filters.parse(where)
        return flt.select(self.g.docs) if flt is not None and not self.empty else None


class Shard:
    """Shard `index` of `count` over an index folder: the segments `assign` gives it, reopened
    when the manifest names a new generation. Every method takes the generation the router
    searches and raises Stale where this shard cannot answer for it."""

    def __init__(self, folder: str | Path, index: int, count: int, device: str = "cpu"):
        from semsearch.store.folder import index_path

        if not 0 <= index < count:
            raise InputError(f"shard {index} of {count} does not exist")
        self.folder, self.index, self.count, self.device = index_path(folder), index, count, device
        self._lock = threading.Lock()
        self._gens: dict[int, _ShardGeneration] = {}  # the current generation and the one before
        self._open_current()

    def _open_current(self) -> _ShardGeneration:
        from semsearch.store.manifest import Manifest

        with self._lock:
            m = Manifest.load(self.folder)
            if m.generation not in self._gens:
                got = _ShardGeneration(self.folder, m, assign(m.segments, self.count)[self.index], self.device)
                self._gens[m.generation] = got
                for old in sorted(self._gens)[:-2]:  # searches still on the one before finish on it
                    del self._gens[old]
            return self._gens[m.generation]

    def _at(self, generation: int) -> _ShardGeneration:
        got = self._gens.get(generation)
        if got is None:
            got = self._open_current()
            if got.manifest.generation != generation:
                raise Stale(f"shard {self.index} holds generation {got.manifest.generation}, not {generation}",
                            got.manifest.generation)
        return got

    def generation(self) -> int:
        return self._open_current().manifest.generation

    # ---- the rounds ------------------------------------------------------------------------------
    def prepare(self, generation: int, hashes: list[np.ndarray], where: Any) -> dict[str, Any]:
        s = self._at(generation)
        allowed = s.allowed(where)
        lex = s.lex
        return {"n": lex.n if lex is not None else 0, "total": lex.total_length if lex is not None else 0.0,
                "df": [lex.doc_freqs(h) if lex is not None else np.zeros(len(h), np.int64) for h in hashes],
                "allowed": None if allowed is None else len(allowed), "has_lexical": s.has_lexical}

    def candidates(self, generation: int, qv: np.ndarray | None, hashes: list[np.ndarray] | None, depth: int, where: Any,
                   exact: bool, stats: list[dict] | None) -> dict[str, Any]:
        """Per query: this shard's dense (scores, ids) top `depth` (qv given) and BM25 (ids, scores)
        top `depth` under the whole index's statistics (hashes given); for hybrid (both given),
        `both`: each of those candidates' stored-vector cosine, BM25 score and count of the
        query's terms it holds, so the router fuses without asking again (a fused candidate is in
        the top `depth` of a side of the shard that holds it)."""
        s = self._at(generation)
        out: dict[str, Any] = {"dense": None, "lexical": None, "both": None}
        if s.empty:
            return out
        allowed = s.allowed(where)
        if allowed is not None and not len(allowed):
            return out
        if qv is not None:
            out["dense"] = _dense(s.g, qv, depth, allowed, exact)
        if hashes is not None and s.lex is not None:
            mask = allowed.rows(s.lex.ids) if allowed is not None else None
            out["lexical"] = [_under(s.lex, st).top_k(h, depth, mask) for h, st in zip(hashes, stats)]
        if out["dense"] is not None and out["lexical"] is not None:
            _, dids = out["dense"]
            out["both"] = [_scores_of(s, v, h, np.union1d(d[d >= 0], np.asarray(lex[0], np.int64)), st)
                           for v, h, d, lex, st in zip(qv, hashes, dids, out["lexical"], stats)]
        return out

    def chunks(self, generation: int, ids: list[int]) -> dict[int, dict[str, Any]]:
        s = self._at(generation)
        return {} if s.empty else s.g.docs.get_chunks(ids)

    def select(self, generation: int, columns: str, where: str = "", params: tuple = ()) -> list[tuple]:
        """SegmentedDocs.select over this shard's segments (for `fetch` of a whole document)."""
        s = self._at(generation)
        return [] if s.empty else list(s.g.docs.select(columns, where, params))

    def explain_lexical(self, generation: int, items: list[tuple[str, dict, list[tuple]]]
                        ) -> list[dict[int, dict[str, Any]]]:
        """Per query (its text, the whole index's statistics, its hits as (id, text, BM25, titles)): the BM25
        part of the explanation of each hit this shard holds, {id: dict}, as one process gives it."""
        from semsearch.explain import QueryTerms, explain_lexical_many

        s = self._at(generation)
        out: list[dict[int, dict[str, Any]]] = []
        for query, st, rows in items:
            held = set(s.g.docs.held([r[0] for r in rows]).tolist()) if not s.empty and s.lex is not None else set()
            mine = [r for r in rows if r[0] in held]
            if not mine:
                out.append({})
                continue
            lex = _under(s.lex, st)
            parts = explain_lexical_many(lex, QueryTerms(lex, query), mine)
            out.append({int(r[0]): part for r, part in zip(mine, parts)})
        return out

    def vectors(self, generation: int, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(the ids this shard holds, of those given; their stored vectors)."""
        s = self._at(generation)
        held = s.g.docs.held(ids) if not s.empty else np.zeros(0, np.int64)
        if not len(held):
            return held, np.zeros((0, 0), np.float32)
        vecs = s.g.vectors.reconstruct(held)
        if vecs is None:
            held, vecs = s.g.docs.get_vectors(held)
        return np.asarray(held, np.int64), np.asarray(vecs, np.float32)

    def call(self, method: str, *args):
        """One of the rounds by name (what a shard deployment's replicas are called with)."""
        if method not in ("prepare", "candidates", "chunks", "select", "generation", "explain_lexical", "vectors"):
            raise InputError(f"no shard method {method!r}")
        return getattr(self, method)(*args)


def _under(lex, st: dict):
    return lex.under(st["n"], st["total"], st["df"])


def _scores_of(s: _ShardGeneration, v: np.ndarray, h: np.ndarray, ids: np.ndarray, st: dict
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(ids, their cosines from the stored vectors, their BM25 scores under the whole index's
    statistics, how many of the query's terms each holds): what one process computes for its
    fused candidates."""
    if not len(ids):
        return np.zeros(0, np.int64), np.zeros(0, np.float64), np.zeros(0, np.float32), np.zeros(0, np.int32)
    held = ids
    vecs = s.g.vectors.reconstruct(held)
    if vecs is None:
        held, vecs = s.g.docs.get_vectors(held)
    cos = dot_rows(vecs, v)
    # the counts only for a query long enough to use them
    b, t = _under(s.lex, st).scores_and_terms_of(h, held, terms=len(h) >= fusion_.ALL_TERMS_MIN)
    return np.asarray(held, np.int64), np.asarray(cos, np.float64), b, t


# ---- the router ----------------------------------------------------------------------------------
Fanout = Callable[..., list]  # fanout(method, *args) -> [every shard's answer], in shard order


def local_fanout(shards: Sequence[Shard]) -> Fanout:
    """A fanout over Shard objects of this process (tests, and one machine without Ray)."""
    def fanout(method: str, *args):
        return [getattr(s, method)(*args) for s in shards]

    return fanout


class ShardedSearch:
    """The router: encodes queries (the index's model), asks every shard, merges."""

    def __init__(self, folder: str | Path, fanout: Fanout, encoder, generation: Callable[[], int] | None = None):
        from semsearch.store.folder import index_path
        from semsearch.store.manifest import Manifest

        self.folder = index_path(folder)
        self.fanout = fanout
        self.encoder = encoder
        self._generation = generation or (lambda: Manifest.load(self.folder).generation)
        self._lock = threading.Lock()
        self._prep: dict[int, _Prepared] = {}  # per generation: what `prepare` said (self._prepared)
        self._recent: dict[int, None] = {}  # the terms searched lately, oldest first (_CARRY_TERMS at most)

    def search(self, query: str, k: int = 10, mode: str | None = None, where: Any = None, **kw):
        return self.search_batch([query], k, mode, where, **kw)[0]

    def search_batch(self, queries: Sequence[str], k: int = 10, mode: str | None = None, where: Any = None,
                     fusion: str = "convex", alpha: float | None = None, explain: bool = False):
        """As Retriever.search_batch, over the shards; one generation throughout."""
        return self.search_at(queries, k, mode, where, fusion, alpha, explain)[1]

    def search_at(self, queries: Sequence[str], k: int = 10, mode: str | None = None, where: Any = None,
                  fusion: str = "convex", alpha: float | None = None, explain: bool = False):
        """(the generation searched, search_batch's hits)."""
        queries = list(queries)
        if not queries or any(not isinstance(q, str) or blank(q) for q in queries):
            raise InputError("every query must be a non-empty string")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise InputError(f"k must be a positive integer, got {k!r}")
        filters.parse(where)  # a bad filter fails here, before any shard is asked
        fusion_.check_fusion(fusion)
        generation = self._generation()
        for attempt in range(STALE_RETRIES):
            try:
                return generation, self._search(generation, queries, k, mode, where, fusion,
                                                fusion_.ALPHA if alpha is None else alpha, explain)
            except Stale as e:
                if attempt == STALE_RETRIES - 1:
                    raise
                generation = max(getattr(e, "generation", 0) or 0, self._generation())
        raise AssertionError("unreachable")

    def _search(self, gen: int, queries: list[str], k: int, mode: str | None, where: Any, fusion: str, alpha: float,
                explain: bool = False):
        from semsearch.store.lexical import MAX_TERMS, terms

        hashes = [np.array(list(dict.fromkeys(terms(q)))[:MAX_TERMS], np.int64) for q in queries]
        prep, df, counts = self._prepared(gen, hashes, where)
        mode = fusion_.check_mode(mode or ("hybrid" if prep.has_lexical else "dense"))
        if mode != "dense" and not prep.has_lexical:
            raise InputError(f"{self.folder} was built before lexical search; use mode dense")
        # chunks the filter lets through, per shard (None: no filter; a shard that holds no
        # segment says None under a filter too, and lets nothing through)
        filtered = any(c is not None for c in counts)
        allowed = sum(c or 0 for c in counts)
        if filtered and not allowed:
            return [[] for _ in queries]
        exact = filtered and allowed <= EXACT_BELOW
        stats = [{"n": prep.n, "total": prep.total, "df": {int(h): df[int(h)] for h in hs}} for hs in hashes]
        qv = None if mode == "lexical" else encode_queries(self.encoder, queries)
        depth = k if mode != "hybrid" else max(k, fusion_.DEPTH)
        parts = self.fanout("candidates", gen, qv, None if mode == "dense" else hashes, depth, where, exact,
                            None if mode == "dense" else stats)
        if mode == "dense":
            found = [[(i, s, s, None) for i, s in _merge_dense(parts, q, k)] for q in range(len(queries))]
        elif mode == "lexical":
            found = [[(i, s, None, s) for i, s in _merge_lexical(parts, q, k)] for q in range(len(queries))]
        pools: list | None = [] if explain else None
        if mode == "hybrid":
            found = self._hybrid(gen, parts, qv, hashes, stats, depth, k, fusion, alpha, pools)
        ids = sorted({i for row in found for i, *_ in row})
        chunks: dict[int, dict[str, Any]] = {}
        for part in self.fanout("chunks", gen, ids):
            chunks.update(part)
        hits = hits_from(chunks, found, mode)
        if explain:
            self._explain(gen, queries, qv, hits, mode, fusion, alpha, pools, stats)
        return hits

    def _prepared(self, gen: int, hashes: list[np.ndarray], where: Any) -> tuple["_Prepared", dict[int, int], list]:
        """The whole index's BM25 statistics at generation gen: (its counts, the document
        frequency of each of the queries' terms, the filter's count per shard). Kept per
        generation, so the `prepare` round is asked only for terms and filters this router has
        not met at gen (a search of known terms is two rounds). What a search gets is copied out
        under the lock: another search may clear the kept ones (past their bounds) meanwhile."""
        key = _where_key(where)
        mine = {int(h) for hs in hashes for h in hs}
        with self._lock:
            for h in mine:  # (most recent last)
                self._recent.pop(h, None)
                self._recent[h] = None
            while len(self._recent) > _CARRY_TERMS:
                del self._recent[next(iter(self._recent))]
            got = self._prep.get(gen)
            known = {h: got.df[h] for h in mine if h in got.df} if got is not None else {}
            want = sorted(mine - set(known))
            if got is not None and not want and key in got.allowed:
                return got, known, got.allowed[key]
            if got is None:  # a new generation: the terms searched lately are asked in this one round,
                want = sorted(set(want) | set(self._recent))  # not one search at a time after each write
        parts = self.fanout("prepare", gen, [np.array(want, np.int64)], where)
        asked = {h: int(sum(int(p["df"][0][t]) for p in parts)) for t, h in enumerate(want)}
        counts = [p["allowed"] for p in parts]
        with self._lock:
            got = self._prep.get(gen)
            if got is None:
                got = self._prep[gen] = _Prepared(sum(p["n"] for p in parts), sum(p["total"] for p in parts),
                                                  all(p["has_lexical"] for p in parts))
                for old in sorted(self._prep)[:-2]:  # searches still on the one before finish on it
                    del self._prep[old]
            if len(got.df) > _PREP_TERMS or len(got.allowed) > _PREP_FILTERS:
                got.df.clear()
                got.allowed.clear()
            got.df.update(asked)
            got.allowed[key] = counts
            return got, {**known, **asked}, counts

    def _explain(self, gen, queries, qv, hits, mode, fusion, alpha, pools, stats) -> None:
        """Each hit's explanation, as one process gives it: the BM25 parts from the shards that hold
        the hits (under the whole index's statistics), the dense parts here (the query encoder,
        the hits' stored vectors from the shards), the fusion from the candidates kept."""
        from semsearch.explain import explain_hits, hit_context
        from semsearch.store.manifest import Manifest

        parts = None
        m = Manifest.load(self.folder)
        if mode != "dense":
            items = [(q, st, [(h.id, h.text, h.lexical_score, hit_context(m, h)) for h in row]) for q, st, row in zip(queries, stats, hits)]
            parts = {(qi, i): d for got in self.fanout("explain_lexical", gen, items) for qi, per in enumerate(got)
                     for i, d in per.items()}
        explain_hits(self, _RouterGeneration(m, self.fanout, gen), queries, qv, hits, mode,
                     fusion, alpha, pools, lexical_parts=parts)

    def _hybrid(self, gen, parts, qv, hashes, stats, depth, k, fusion, alpha, pools: list | None = None):
        cands, dense = [], []
        for q in range(len(hashes)):
            d = _merge_dense(parts, q, depth)
            lids = [i for i, _ in _merge_lexical(parts, q, depth)]
            cands.append(np.union1d(np.array([i for i, _ in d], np.int64), np.array(lids, np.int64)))
            dense.append(dict(d))
        filled = [p["both"] for p in parts if p.get("both") is not None]  # each shard's candidates, both scores
        out = []
        for q, cand in enumerate(cands):
            if not len(cand):
                out.append([])
                if pools is not None:
                    pools.append(None)
                continue
            d = np.empty(len(cand), np.float64)
            b = np.zeros(len(cand), np.float32)
            t = np.zeros(len(cand), np.int32)
            for held, cos, bm, terms in (f[q] for f in filled):
                keep = np.isin(held, cand)  # a shard's candidate that is in the whole index's top of a side
                at = np.searchsorted(cand, held[keep])
                d[at] = cos[keep]
                b[at] = bm[keep]
                t[at] = terms[keep]
            for i, s in dense[q].items():  # the search's own cosines, as one process keeps them
                d[np.searchsorted(cand, i)] = s
            # the query's terms some live chunk of the whole index holds, as one process counts them
            full = fusion_.all_terms(t, sum(1 for h in hashes[q] if stats[q]["df"].get(int(h), 0) > 0 and counted(h)))
            if pools is not None:
                pools.append((cand, d, b, full))
            fused = fusion_.fuse(d, b, fusion, alpha) + full
            out.append([(int(cand[j]), float(fused[j]), float(d[j]), float(b[j])) for j in fusion_.top(cand, fused, k)])
        return out


_PREP_TERMS = 1 << 20  # terms' document frequencies a router keeps per generation (~100 MB at most)
# The terms searched lately whose document frequencies a new generation's first `prepare` asks
# for too (one round per write for them, instead of one per search that meets one first).
_CARRY_TERMS = 4096
_PREP_FILTERS = 4096  # filters' counts


@dataclasses.dataclass
class _Prepared:
    """What the shards' `prepare` said of one generation: its live chunks and their total length,
    whether every shard has BM25, document frequencies of the terms asked so far ({hash: df}),
    and the chunks each shard lets through per filter asked so far ({key: [count or None]})."""

    n: int
    total: float
    has_lexical: bool
    df: dict[int, int] = dataclasses.field(default_factory=dict)
    allowed: dict[str, list] = dataclasses.field(default_factory=dict)


def _where_key(where: Any) -> str:
    """A filter as a key of the router's per-generation counts (the same filter written otherwise
    is only asked again)."""
    import json

    return json.dumps(where, sort_keys=True, default=repr)


class _RouterGeneration:
    """What explain_hits reads of a generation, for the router of a sharded index: the manifest
    (its head; token states are not read across shards: hits are encoded again), the hits' stored
    vectors from the shards, and no lexical index (the shards explain BM25)."""

    def __init__(self, manifest, fanout: Fanout, generation: int):
        self.manifest = dataclasses.replace(manifest, states=None)
        self.vectors = self
        self.docs = self
        self._fanout, self._generation = fanout, generation

    def lexical(self, folder=None, required: bool = False):
        return None

    def reconstruct(self, ids) -> None:
        return None  # the docstore path (get_vectors) asks the shards

    def get_vectors(self, ids) -> tuple[np.ndarray, np.ndarray]:
        got = [p for p in self._fanout("vectors", self._generation, [int(i) for i in ids]) if len(p[0])]
        if not got:
            return np.zeros(0, np.int64), np.zeros((0, 0), np.float32)
        held = np.concatenate([g[0] for g in got])
        vecs = np.concatenate([g[1] for g in got])
        order = np.argsort(held, kind="stable")
        return held[order], vecs[order]


def _merge_dense(parts: list[dict], q: int, k: int) -> list[tuple[int, float]]:
    """The best k (id, cosine) of every shard's dense answer to query q."""
    got = []
    for p in parts:
        if p["dense"] is not None:
            scores, ids = p["dense"]
            got += [(int(i), float(s)) for s, i in zip(scores[q], ids[q]) if i >= 0]
    got.sort(key=lambda x: (-x[1], x[0]))
    return got[:k]


def _merge_lexical(parts: list[dict], q: int, k: int) -> list[tuple[int, float]]:
    """The best k (id, BM25) of every shard's BM25 answer to query q (ties: the lower id)."""
    got = []
    for p in parts:
        if p["lexical"] is not None:
            ids, scores = p["lexical"][q]
            got += [(int(i), float(s)) for i, s in zip(ids, scores)]
    got.sort(key=lambda x: (-np.float32(x[1]), x[0]))
    return got[:k]
