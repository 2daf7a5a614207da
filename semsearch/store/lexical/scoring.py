"""BM25 over the live rows of an index's posting sets (LexicalIndex): statistics of every live row
together, scored whole for sparse queries, pruned by per-block bounds (MaxScore) for dense ones."""
from __future__ import annotations

import copy
from typing import Iterable, NamedTuple, Sequence

import numpy as np

from semsearch.store.lexical.analysis import counted, encode_terms, terms
from semsearch.store.lexical.postings import Postings


K1 = 1.2  # Lucene's defaults; on SciFact train 0.9/0.4 measured the same (69.81 vs 69.84 nDCG@10)
B = 0.75
MAX_TERMS = 1024  # distinct terms kept from a query (a 100 KB query would otherwise score thousands)
SPARSE_MAX = 1 << 16  # a query whose terms have at most this many postings in all is scored whole


def _sorted_unique(x: np.ndarray) -> np.ndarray:
    """np.unique of int64 rows by a sort (numpy 2's hash-based unique is ~20x slower here)."""
    x = np.sort(x)
    if len(x) > 1:
        keep = np.empty(len(x), bool)
        keep[0] = True
        np.not_equal(x[1:], x[:-1], out=keep[1:])
        x = x[keep]
    return x


def best_n(pos: np.ndarray, s: np.ndarray, n: int, ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The n best of rows `pos` (ascending) by score s, best first; ties go to the lower id, at
    the cut too, so the result is one whatever computed the scores. `ids`: the rows' ids where
    rows are not in id order (an index partitioned by document); None: they are."""
    key = pos if ids is None else ids[pos]
    if len(s) > n:
        kth = np.partition(s, len(s) - n)[len(s) - n]
        above = np.flatnonzero(s > kth)
        tied = np.flatnonzero(s == kth)
        if ids is not None:
            tied = tied[np.argsort(key[tied], kind="stable")]
        keep = np.sort(np.concatenate([above, tied[: n - len(above)]]))
        pos, s, key = pos[keep], s[keep], key[keep]
    order = np.lexsort((key, -s))
    return pos[order], s[order]


class Pruned(NamedTuple):
    """LexicalIndex.prune()'s result, for finish(): the rows still in the running (None: the
    query has no term any live row holds), their exact scores where the query's postings were
    few enough to score whole, with how many of the query's terms each holds, and the rows the
    caller may see (those with `exact` only)."""
    hashes: np.ndarray
    found: list
    n: int
    eligible: np.ndarray | None
    rows: np.ndarray | None
    exact: np.ndarray | None
    terms: np.ndarray | None = None

    @property
    def n_terms(self) -> int:
        """The query's terms that some live row holds, question words left out (the most a row
        can hold of those finish() counts)."""
        return sum(1 for h, _, _ in self.found if counted(h))


class LexicalIndex:
    """BM25 over the live rows of one or more posting sets (an index's segments), scored with numpy.

    Statistics are those of every live row together (row count, average length, each term's
    document frequency), so a row's score does not depend on how the rows are split into segments
    or on deleted rows: the same live rows give the same scores, bit for bit, in one segment or many.
    `ids` is every row's id, in row order: sorted where segments hold increasing id ranges; in an
    index partitioned by document (store/partition.py) the partitions' ids interleave, and ids are
    found through their sort order (`_order`); `deleted` gives, per part, the positions of its
    deleted rows (None: none)."""

    def __init__(self, parts: Sequence[Postings], deleted: Sequence[np.ndarray | None] | None = None,
                 k1: float = K1, b: float = B):
        self.parts = list(parts)
        self.k1, self.b = k1, b
        self.offsets = np.cumsum([0] + [len(p) for p in self.parts])
        self._order: np.ndarray | None = None  # rows by id, where row order is not id order
        self._sorted: np.ndarray | None = None  # ids[_order]
        if len(self.parts) == 1 and not getattr(self.parts[0], "interleaved", False):
            self.ids = self.parts[0].ids  # one segment: its (mapped) ids as they are, nothing read up front
        else:
            self.ids = np.concatenate([p.ids for p in self.parts]) if self.parts else np.zeros(0, np.int64)
            if len(self.ids) > 1 and not (np.diff(self.ids) > 0).all():  # a segment's own order is checked when written
                self._order = np.argsort(self.ids, kind="stable")
                self._sorted = self.ids[self._order]
                if (np.diff(self._sorted) == 0).any():
                    raise ValueError("two rows hold the same id")
        deleted = list(deleted) if deleted is not None else [None] * len(self.parts)
        self._dead: list[np.ndarray | None] = []  # per part: a boolean mask of deleted rows
        self.live: np.ndarray | None = None  # over all rows; None: every row is live
        total, n = 0.0, 0
        for p, d in zip(self.parts, deleted):
            dead = None
            if d is not None and len(d):
                dead = np.zeros(len(p), bool)
                dead[d] = True
            self._dead.append(dead)
            n += len(p) - (int(dead.sum()) if dead is not None else 0)
            total += p.total_length - (float(np.sum(p.lengths[dead], dtype=np.float64)) if dead is not None else 0.0)
        if any(d is not None for d in self._dead):
            self.live = ~np.concatenate([d if d is not None else np.zeros(len(p), bool) for p, d in zip(self.parts, self._dead)])
        self.n = n  # live rows
        self.total_length = total
        self.average_length = total / n if n else 1.0
        # tf (k1 + 1) / (tf + k1 (1 - b) + (k1 b / avg) len): the constants of this set of live rows
        self._c0 = np.float32(k1 * (1 - b))
        self._c1 = np.float32(k1 * b / max(self.average_length, 1e-9))
        self._bounds: dict[tuple[int, int], float] = {}  # (part, first posting) -> its largest weight / idf

    _df: dict[int, int] | None = None  # document frequencies of a larger collection (under())

    def __len__(self) -> int:
        return self.n

    def doc_freqs(self, hashes: np.ndarray) -> np.ndarray:
        """Each term's document frequency among the live rows here (0 where none holds it)."""
        got = {h: df for h, df, _ in self._term_spans(np.asarray(hashes, np.int64))}
        return np.array([got.get(int(h), 0) for h in hashes], np.int64)

    def under(self, n: int, total_length: float, df: dict[int, int]) -> "LexicalIndex":
        """This index scored with the statistics of a larger collection it is a part of (a shard's
        segments of a whole index): its live row count, total length, and the query terms'
        document frequencies there. Its rows then score as the whole collection's index scores
        them (the same float32 arithmetic on the same statistics). A view: this index is unchanged."""
        view = copy.copy(self)
        view.n, view.total_length = n, total_length
        view.average_length = total_length / n if n else 1.0
        view._c1 = np.float32(self.k1 * self.b / max(view.average_length, 1e-9))
        view._bounds = {}
        view._df = dict(df)
        return view

    @classmethod
    def from_rows(cls, ids: np.ndarray, blobs: Sequence[bytes | None], lengths: np.ndarray, **kw) -> "LexicalIndex":
        return cls([Postings.from_rows(ids, blobs, lengths)], **kw)

    @classmethod
    def from_texts(cls, texts: Sequence[str], **kw) -> "LexicalIndex":
        """An index over texts whose ids are their positions (for evaluation)."""
        enc = [encode_terms(t) for t in texts]
        return cls.from_rows(np.arange(len(texts)), [e[0] for e in enc], np.array([e[1] for e in enc]), **kw)

    def query_hashes(self, query: str) -> np.ndarray:
        """The query's distinct terms, in order of first occurrence (at most MAX_TERMS)."""
        return np.array(list(dict.fromkeys(terms(query)))[:MAX_TERMS], np.int64)

    def _terms(self, hashes: np.ndarray, everywhere: bool = False) -> list[tuple[int, float, list[tuple[int, int, int]]]]:
        """For each hash some live row holds: (hash, idf as float32, [(part, lo, hi)] of its postings).
        `everywhere` (explanations of a part of a larger collection, see under()): also the hashes
        only rows elsewhere in the collection hold, with no postings here, in the query's order."""
        local = {h: (df, spans) for h, df, spans in self._term_spans(hashes)}
        out = []
        for h in hashes.tolist():
            df, spans = local.get(h, (0, []))
            if self._df is not None:  # a part of a larger collection: its statistics
                df = max(self._df.get(h, 0), df)
                if not spans and not everywhere:
                    continue
            if not df:
                continue
            # Lucene's BM25 IDF, always positive: log(1 + (N - df + 0.5) / (df + 0.5)).
            out.append((h, float(np.float32(np.log1p((self.n - df + 0.5) / (df + 0.5)))), spans))
        return out

    def _term_spans(self, hashes: np.ndarray) -> list[tuple[int, int, list[tuple[int, int, int]]]]:
        """For each hash some live row here holds: (hash, its live document frequency here, its spans)."""
        found = [p.find(hashes) for p in self.parts]
        out = []
        for t, h in enumerate(hashes.tolist()):
            spans, df = [], 0
            for j, p in enumerate(self.parts):
                v = int(found[j][t])
                if v < 0:
                    continue
                lo, hi = int(p.indptr[v]), int(p.indptr[v + 1])
                dead = self._dead[j]
                df += (hi - lo) - (int(dead[p.term_rows(lo, hi)].sum()) if dead is not None else 0)
                spans.append((j, lo, hi))
            if df:
                out.append((h, df, spans))
        return out

    def _weights(self, j: int, lo: int, hi: int, idf: float) -> np.ndarray:
        """idf * tf (k1 + 1) / (tf + k1 (1 - b + b len / avg)) of postings lo:hi of part j (float32)."""
        rows, tf = self.parts[j].term_list(lo, hi)
        return self._weights_of(j, rows, tf, idf)

    def score_all(self, query: str | np.ndarray) -> np.ndarray:
        """BM25 scores (rows,) of every row for query (0 where no query term occurs; deleted rows
        may hold scores: top() leaves them out)."""
        hashes = self.query_hashes(query) if isinstance(query, str) else np.asarray(query, np.int64)
        acc = np.zeros(len(self.ids), np.float32)
        for _, idf, spans in self._terms(hashes):
            for j, lo, hi in spans:
                rows, tf = self.parts[j].term_list(lo, hi)
                acc[self.offsets[j] + rows] += self._weights_of(j, rows, tf, idf)  # a term posts a row at most once
        return acc

    # ---- rank-safe dynamic pruning (MaxScore) --------------------------------------------------
    def _weights_of(self, j: int, rows: np.ndarray, tf: np.ndarray, idf: float) -> np.ndarray:
        """The weights of postings of part j given their rows and tf (float32). The same float32
        operations on the same per-posting values whatever part a row is in, however it is reached
        (a whole list or a look-up) and however the file stores it, so scores do not depend on the
        segmentation, the pruning or the file layout, bit for bit."""
        tf1 = tf * np.float32(self.k1 + 1)
        den = self.parts[j].lengths[rows].astype(np.float32) * self._c1
        den += self._c0
        den += tf
        w = np.divide(tf1, den, out=den)
        w *= np.float32(idf)
        return w

    def _bound(self, idf: float, spans: list[tuple[int, int, int]]) -> float:
        """An upper bound of a term's weight in any row: the largest of its blocks' bounds (kept
        per term and part: they depend only on this index's statistics)."""
        best = 0.0
        for j, lo, hi in spans:
            got = self._bounds.get((j, lo))
            if got is None:
                p = self.parts[j]
                bptr, maxtf, minlen = p.blocks()
                v = int(np.searchsorted(p.indptr, lo, "right")) - 1
                a, b = int(bptr[v]), int(bptr[v + 1])
                tf = maxtf[a:b].astype(np.float64)  # a file may store both narrower: the same values
                got = self._bounds[(j, lo)] = float((tf * (self.k1 + 1) / (tf + float(self._c0) + float(self._c1) * minlen[a:b].astype(np.float32))).max())
            best = max(best, got)
        # float32 rounding of the real weights may land a hair above this float64 bound
        return best * idf * (1 + 1e-5) + 1e-6

    def _term_rows(self, idf: float, spans: list[tuple[int, int, int]]) -> tuple[np.ndarray, np.ndarray]:
        """(global rows, weights) of all a term's postings."""
        rows, weights = [], []
        for j, lo, hi in spans:  # sorted: parts hold increasing row ranges
            r, tf = self.parts[j].term_list(lo, hi)
            rows.append(self.offsets[j] + r.astype(np.int64))
            weights.append(self._weights_of(j, r, tf, idf))
        if len(spans) == 1:
            return rows[0], weights[0]
        return np.concatenate(rows), np.concatenate(weights)

    def _add_term(self, acc: np.ndarray, rows: np.ndarray, idf: float, spans: list[tuple[int, int, int]],
                  count: np.ndarray | None = None) -> np.ndarray:
        """acc (over the sorted global `rows`) plus the term's weights where a row holds it;
        `count`, where given, plus one there."""
        for j, lo, hi in spans:
            base = int(self.offsets[j])
            a, b = np.searchsorted(rows, [base, int(self.offsets[j + 1])])
            if a == b:
                continue
            local = rows[a:b] - base
            ok, tf = self.parts[j].find_in(lo, hi, local)
            if ok.any():
                at = a + np.flatnonzero(ok)
                acc[at] += self._weights_of(j, local[ok], tf, idf)
                if count is not None:
                    count[at] += 1
        return acc

    def top_k(self, query: str | np.ndarray, n: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids, scores) of the n best live rows with a positive score, best first (ties: lower id
        first): exactly what top(score_all(query), n, allowed) gives, scores bit for bit, without
        scoring every posting. MaxScore (Turtle and Flood, 1995): the terms that can lift a row
        the most are read whole until the rest together cannot lift a row they missed past the
        current k-th best; the rest are only looked up for the rows still in the running."""
        ids, s, _ = self.top_k_and(query, n, allowed)
        return ids, s

    def top_k_and(self, query: str | np.ndarray, n: int, allowed: np.ndarray | None = None,
                  also: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """top_k(query, n, allowed) and scores_of(query, also), in one pass: the exact scores of
        the other side's candidates (hybrid search's dense hits) are read with those of the
        pruned candidates, each term's postings looked up once for both."""
        return self.finish(self.prune(query, n, allowed), also)

    def prune(self, query: str | np.ndarray, n: int, allowed: np.ndarray | None = None) -> Pruned:
        """top_k's first and larger part: the rows still in the running for the top n (every row a
        query with few postings names, scored). finish() completes it; between the two, hybrid
        search runs its dense side."""
        hashes = self.query_hashes(query) if isinstance(query, str) else np.asarray(query, np.int64)
        found = self._terms(hashes)
        if not found or n <= 0:
            return Pruned(hashes, found, n, None, None, None)
        eligible = self.live if allowed is None else (allowed if self.live is None else allowed & self.live)
        if sum(hi - lo for _, _, spans in found for _, lo, hi in spans) <= SPARSE_MAX:
            # few postings: score them all, on the rows they name only (no array over every row)
            got = [self._term_rows(idf, spans) for _, idf, spans in found]
            rows = _sorted_unique(np.concatenate([r for r, _ in got]))
            exact = np.zeros(len(rows), np.float32)
            count = np.zeros(len(rows), np.int32)
            for (h, _, _), (trows, w) in zip(found, got):  # in query-term order, as score_all() adds them
                at = np.searchsorted(rows, trows)  # each term names a row once; rows holds all
                exact[at] += w
                if counted(h):
                    count[at] += 1
            return Pruned(hashes, found, n, eligible, rows, exact, count)
        bounds = [self._bound(idf, spans) for _, idf, spans in found]
        order = sorted(range(len(found)), key=lambda t: -bounds[t])
        rest = [0.0] * (len(order) + 1)  # rest[i]: the bounds of order[i:] summed
        for i in range(len(order) - 1, -1, -1):
            rest[i] = rest[i + 1] + bounds[order[i]]
        rows = np.zeros(0, np.int64)
        part = np.zeros(0, np.float32)
        i = 0
        theta = 0.0
        while i < len(order):
            _, idf, spans = found[order[i]]
            trows, tw = self._term_rows(idf, spans)
            if eligible is not None:
                keep = eligible[trows]
                trows, tw = trows[keep], tw[keep]
            merged = _sorted_unique(np.concatenate([rows, trows]))
            acc = np.zeros(len(merged), np.float32)
            acc[np.searchsorted(merged, rows)] = part
            acc[np.searchsorted(merged, trows)] += tw
            rows, part = merged, acc
            i += 1
            if len(part) >= n:
                theta = float(np.partition(part, len(part) - n)[len(part) - n])
            if rest[i] < theta:  # a row none of the terms so far holds cannot reach the top n
                break
        # the rows still in the running: those whose score may yet reach theta
        for t in order[i:]:
            alive = part + np.float32(rest[i]) >= theta
            if not alive.all():
                rows, part = rows[alive], part[alive]
            _, idf, spans = found[t]
            part = self._add_term(part, rows, idf, spans)
            i += 1
            if len(part) >= n:
                theta = max(theta, float(np.partition(part, len(part) - n)[len(part) - n]))
        return Pruned(hashes, found, n, None, rows, None)

    def finish(self, p: Pruned, also: np.ndarray | None = None, terms: bool = False) -> tuple:
        """(ids, scores) of prune()'s top n, best first, and the scores of the ids `also`; with
        `terms`, also how many of the query's terms (of p.n_terms) each of those ids holds:
        (ids, scores, also's scores, ids' terms, also's terms)."""
        also = np.zeros(0, np.int64) if also is None else np.asarray(also, np.int64)
        if p.rows is None:
            none = np.zeros(0, np.int64), np.zeros(0, np.float32), self.scores_of(p.hashes, also)
            return none + (np.zeros(0, np.int32), np.zeros(len(also), np.int32)) if terms else none
        rows, n = p.rows, p.n
        if p.exact is not None:  # every row the query's terms name, scored: any other scores 0
            exact, count = p.exact, p.terms
            pos = np.flatnonzero(exact > 0) if p.eligible is None else np.flatnonzero((exact > 0) & p.eligible[rows])
        else:
            # the final scores in query-term order, as score_all() adds them: equal bit for bit;
            # the other side's rows join this pass (only the pruned candidates compete for the top n)
            at, held = self.rows_of(also)
            cand = rows
            if held.any():
                rows = _sorted_unique(np.concatenate([rows, at[held].astype(np.int64)]))
            exact = np.zeros(len(rows), np.float32)
            count = np.zeros(len(rows), np.int32) if terms else None
            for h, idf, spans in p.found:
                exact = self._add_term(exact, rows, idf, spans, count if count is not None and counted(h) else None)
            mine = np.searchsorted(rows, cand) if len(rows) != len(cand) else np.arange(len(rows))
            pos = mine[exact[mine] > 0]
        pos, s = best_n(pos, exact[pos], n, None if self._order is None else self.ids[rows])
        out = self.ids[rows[pos]], s, self._values_in(rows, exact, also)
        return out + (count[pos], self._values_in(rows, count, also)) if terms else out

    def _values_in(self, rows: np.ndarray, values: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """The values of ids given those of the sorted `rows` (0 for a live row not among them:
        it holds no query term; 0 for ids no live row holds)."""
        out = np.zeros(len(ids), values.dtype)
        if not len(ids) or not len(rows):
            return out
        pos, held = self.rows_of(ids)
        at = np.searchsorted(rows, pos).clip(0, len(rows) - 1)
        ok = held & (rows[at] == pos)
        out[ok] = values[at[ok]]
        return out

    def terms_of(self, query: str | np.ndarray, ids: np.ndarray) -> np.ndarray:
        """How many of the query's terms each id holds, question words left out (0 for ids no
        live row holds)."""
        return self.scores_and_terms_of(query, ids)[1]

    def scores_of(self, query: str | np.ndarray, ids: np.ndarray) -> np.ndarray:
        """BM25 of the given ids (0 for ids no live row holds), as lookup(score_all(query), ids)
        gives them bit for bit, looking up only these rows in each term's postings."""
        return self.scores_and_terms_of(query, ids, terms=False)[0]

    def scores_and_terms_of(self, query: str | np.ndarray, ids: np.ndarray, terms: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """scores_of() and terms_of() of the given ids in one pass over the query's terms (the
        counts stay 0 unless `terms`)."""
        hashes = self.query_hashes(query) if isinstance(query, str) else np.asarray(query, np.int64)
        pos, held = self.rows_of(ids)
        scores, counts = np.zeros(len(pos), np.float32), np.zeros(len(pos), np.int32)
        if not held.any():
            return scores, counts
        rows = pos[held].astype(np.int64)
        order = np.argsort(rows, kind="stable")
        acc, count = np.zeros(len(rows), np.float32), np.zeros(len(rows), np.int32)
        for h, idf, spans in self._terms(hashes):
            acc = self._add_term(acc, rows[order], idf, spans, count if terms and counted(h) else None)
        for out, got in ((scores, acc), (counts, count)):
            tmp = np.empty(len(rows), got.dtype)
            tmp[order] = got
            out[held] = tmp
        return scores, counts

    def top(self, acc: np.ndarray, n: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids, scores) of the n best live rows with a positive score in acc, best first;
        `allowed` is a boolean mask over rows."""
        hit = acc > 0
        if allowed is not None:
            hit &= allowed
        if self.live is not None:
            hit &= self.live
        pos = np.flatnonzero(hit)
        pos, s = best_n(pos, acc[pos], n, None if self._order is None else self.ids)
        return self.ids[pos], s

    def search(self, query: str, n: int, allowed: np.ndarray | None = None) -> list[tuple[int, float]]:
        """The n best (id, score) for query, best first; `allowed` is a boolean mask over rows."""
        ids, s = self.top_k(query, n, allowed)
        return list(zip(ids.tolist(), s.tolist()))

    def rows_of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row positions, held) of ids: held is False for ids no live row has."""
        ids = np.asarray(ids, np.int64)
        if not len(self.ids):
            return np.zeros(len(ids), np.int64), np.zeros(len(ids), bool)
        if self._order is not None:
            at = np.searchsorted(self._sorted, ids).clip(0, len(self.ids) - 1)
            held = self._sorted[at] == ids
            pos = self._order[at]
        else:
            pos = np.searchsorted(self.ids, ids).clip(0, len(self.ids) - 1)
            held = self.ids[pos] == ids
        if self.live is not None:
            held &= self.live[pos]
        return pos, held

    def lookup(self, acc: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """The scores in acc of the given ids (0 for ids this index does not hold)."""
        pos, held = self.rows_of(ids)
        return np.where(held, acc[pos] if len(acc) else 0.0, 0.0).astype(np.float32)

    def scores_for(self, query: str, ids: Iterable[int]) -> dict[int, float]:
        """BM25 scores of the given ids (0.0 where no query term occurs; unknown ids absent)."""
        ids = np.fromiter((int(i) for i in ids), np.int64)
        if not len(ids) or not len(self.ids):
            return {}
        pos, held = self.rows_of(ids)
        acc = self.score_all(query)
        return {int(i): float(acc[p]) for i, p, k in zip(ids, pos, held) if k}

    def explain_terms(self, hashes: np.ndarray, ids: np.ndarray) -> tuple[list[tuple[int, float, list[float], list[int]]], list[float]]:
        """For explanations: per query term a live row holds, (hash, idf, each id's part of the
        score, each id's term count), as score_all() adds them; and each held id's length."""
        pos, held = self.rows_of(ids)
        part = np.searchsorted(self.offsets, pos, "right") - 1
        cols = []
        for h, idf, spans in self._terms(np.asarray(hashes, np.int64), everywhere=True):
            c, tf = [0.0] * len(ids), [0] * len(ids)
            for j, lo, hi in spans:
                mine = np.flatnonzero(held & (part == j))
                if not len(mine):
                    continue
                local = pos[mine] - self.offsets[j]
                order = np.argsort(local, kind="stable")
                ok, got_tf = self.parts[j].find_in(lo, hi, local[order])
                w = self._weights_of(j, local[order][ok], got_tf, idf)
                for m, wt, f in zip(mine[order][ok].tolist(), w.tolist(), got_tf.tolist()):
                    c[m], tf[m] = float(wt), int(f)
            cols.append((h, idf, c, tf))
        lengths = [float(self.parts[int(part[i])].lengths[pos[i] - self.offsets[int(part[i])]]) for i in np.flatnonzero(held)]
        return cols, lengths
