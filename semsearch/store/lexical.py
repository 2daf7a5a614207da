"""The lexical index: BM25 over chunk text, kept in the docstore's own SQLite file.

Each chunk row carries its analysed terms (`chunks.lex`: 64-bit term hashes and their counts,
`chunks.lex_len`: its length in terms), written in the same transaction as its text, so the
lexical and dense sides of an index cannot disagree after an update or a delete. At commit the
per-chunk terms are inverted into posting arrays (table `lexical`, a few blobs) in the same
generation file; a reader loads those blobs and scores queries with numpy.

Why not SQLite FTS5, which the docstore could hold as well: measured on SciFact (5,183 docs),
FTS5's bm25() ranks an OR-query in ~6 ms p50 on a quiet 2-core machine (it scores each of the
~2,800 matching rows through its auxiliary-function API) against ~0.35 ms for the posting arrays
here, and its k1/b and IDF are fixed (the IDF of a term in more than half the rows is clamped to
~0). `scripts/bench_hybrid.py` measures both, quality and speed, in one run.
Why not a BM25 package (rank-bm25, bm25s, Pyserini): none stores its index incrementally in the
docstore's transaction, and Pyserini needs a JVM. The analysis is Lucene's English recipe
(lower-case, stop words, Porter2 stemming from the Snowball project's stemmer).
"""
from __future__ import annotations

import copy
import functools
import hashlib
import json
import re
import sqlite3
from collections import Counter
from typing import Iterable, Sequence

import numpy as np

ANALYZER = "words-lower-stop-porter2-v1"  # changes here change every stored term: bump it
K1 = 1.2  # Lucene's defaults; on SciFact train 0.9/0.4 measured the same (69.81 vs 69.84 nDCG@10)
B = 0.75
MAX_TERMS = 1024  # distinct terms kept from a query (a 100 KB query would otherwise score thousands)
BLOCK = 128  # postings per block of the pruning bounds (Lucene's block size)
SPARSE_MAX = 1 << 16  # a query whose terms have at most this many postings in all is scored whole

# Lucene's English stop set: frequent words that match nearly every chunk and rank nothing.
STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these "
    "they this to was will with".split()
)

_WORD = re.compile(r"\w+", re.UNICODE)


@functools.lru_cache(maxsize=1)
def _stemmer():
    import snowballstemmer  # uses PyStemmer's C implementation where it is installed

    return snowballstemmer.stemmer("english")


@functools.lru_cache(maxsize=1 << 20)
def _term(word: str) -> int:
    """The 64-bit hash of a word's stem (a signed int64)."""
    stem = _stemmer().stemWord(word)
    return int.from_bytes(hashlib.blake2b(stem.encode("utf-8"), digest_size=8).digest(), "little", signed=True)


def terms(text: str) -> list[int]:
    """The analysed terms of a text, in order (stop words dropped)."""
    return [_term(w) for w in _WORD.findall(text.lower()) if w not in STOPWORDS]


def encode_terms(text: str) -> tuple[bytes, int]:
    """(blob of sorted term hashes int64 + their counts int32, number of terms) for a chunk."""
    counts = Counter(terms(text))
    h = np.fromiter(counts.keys(), np.int64, len(counts))
    order = np.argsort(h)
    tf = np.fromiter(counts.values(), np.int32, len(counts))[order]
    return h[order].tobytes() + tf.tobytes(), int(sum(counts.values()))


def decode_terms(blob: bytes) -> tuple[np.ndarray, np.ndarray]:
    n = len(blob) // 12
    return np.frombuffer(blob, np.int64, n), np.frombuffer(blob, np.int32, n, offset=8 * n)


class Postings:
    """One set of rows' posting arrays by term (a segment's, or a whole evaluation corpus's):
    `ids` (n,) the row ids (chunk ids, or document positions in evaluation), sorted; `vocab`
    (V,) sorted term hashes; postings of term v are rows postings[indptr[v]:indptr[v + 1]] with
    term counts tfs[...]; `lengths` (n,) terms per row. Raw counts only: the BM25 weights depend on
    statistics over every live row of the index, so they are computed at query time."""

    def __init__(self, ids: np.ndarray, lengths: np.ndarray, vocab: np.ndarray, indptr: np.ndarray,
                 postings: np.ndarray, tfs: np.ndarray, total_length: float | None = None,
                 blocks: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None):
        self.ids, self.lengths, self.vocab, self.indptr, self.postings, self.tfs = ids, lengths, vocab, indptr, postings, tfs
        # integer-valued: exact (a file records it, so opening one reads no row)
        self.total_length = float(np.sum(lengths, dtype=np.float64)) if total_length is None else float(total_length)
        self._blocks: tuple[np.ndarray, np.ndarray, np.ndarray] | None = blocks

    def blocks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(bptr (V + 1,), max tf, min row length) per block of BLOCK postings of each term: term
        v's blocks are bptr[v]:bptr[v + 1], block i covering its postings i*BLOCK:(i+1)*BLOCK. What
        a query's pruning bounds are made of (a BM25 weight grows with tf and falls with length, so
        a block's weight is at most the weight of its largest tf at its shortest row). Made once."""
        got = self._blocks
        if got is None:
            lens = np.diff(self.indptr)
            nb = -(-lens // BLOCK)
            bptr = np.concatenate([[0], np.cumsum(nb)]).astype(np.int64)
            total = int(bptr[-1])
            if total:
                first = np.repeat(self.indptr[:-1], nb) + BLOCK * (np.arange(total) - np.repeat(bptr[:-1], nb))
                maxtf = np.maximum.reduceat(self.tfs, first).astype(np.float32)
                minlen = np.minimum.reduceat(self.lengths[self.postings], first).astype(np.float32)
            else:
                maxtf = minlen = np.zeros(0, np.float32)
            got = self._blocks = (bptr, maxtf, minlen)
        return got

    def weight_parts(self, at, k1: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tf, tf (k1 + 1), length of the posting's row) as float32 for the postings at `at` (a
        slice or positions): the parts of a BM25 weight that do not depend on the index's
        statistics, read from the arrays (mapped from disk for a published segment) per query.
        (Kept whole in memory they cost 12 bytes a posting: 1.7 GB at 1M chunks of 200 words.)"""
        tf = self.tfs[at].astype(np.float32)
        return tf, tf * np.float32(k1 + 1), self.lengths[self.postings[at]].astype(np.float32)

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def from_rows(cls, ids: np.ndarray, blobs: Sequence[bytes | None], lengths: np.ndarray) -> "Postings":
        """Invert per-row term blobs (see encode_terms) into posting arrays."""
        ids = np.asarray(ids, np.int64)
        parts = [decode_terms(b) if b else (np.zeros(0, np.int64), np.zeros(0, np.int32)) for b in blobs]
        h = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
        tf = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int32)
        rows = np.repeat(np.arange(len(ids), dtype=np.int32), [len(p[0]) for p in parts])
        order = np.argsort(h, kind="stable")
        h, tf, rows = h[order], tf[order], rows[order]
        vocab, starts = np.unique(h, return_index=True)
        indptr = np.append(starts, len(h)).astype(np.int64)
        return cls(ids, np.asarray(lengths, np.float32), vocab, indptr, rows, tf)

    def check(self) -> "Postings":
        """Stored arrays that agree with each other (damage inside a blob would otherwise surface
        as an IndexError in some later query); ValueError where they do not."""
        n, nnz = len(self.ids), len(self.postings)
        if len(self.lengths) != n or len(self.tfs) != nnz or len(self.indptr) != len(self.vocab) + 1:
            raise ValueError("posting array sizes disagree")
        if len(self.indptr) and (self.indptr[0] != 0 or self.indptr[-1] != nnz or (np.diff(self.indptr) < 0).any()):
            raise ValueError("posting offsets out of order")
        if nnz and (int(self.postings.min()) < 0 or int(self.postings.max()) >= n):
            raise ValueError("a posting names a row that does not exist")
        if n > 1 and not (np.diff(self.ids) > 0).all():
            raise ValueError("row ids out of order")
        return self

    @classmethod
    def combine(cls, parts: Sequence["Postings"]) -> "Postings":
        """One posting set over the rows of several, in their order (ids stay increasing); each
        term's rows stay sorted (a stable sort by term keeps part order, then row order)."""
        offsets = np.cumsum([0] + [len(p) for p in parts[:-1]])
        h = np.concatenate([np.repeat(p.vocab, np.diff(p.indptr)) for p in parts])
        rows = np.concatenate([(p.postings.astype(np.int64) + o) for p, o in zip(parts, offsets)]).astype(np.int32)
        tfs = np.concatenate([p.tfs for p in parts])
        order = np.argsort(h, kind="stable")
        h, rows, tfs = h[order], rows[order], tfs[order]
        vocab, starts = np.unique(h, return_index=True)
        indptr = np.append(starts, len(h)).astype(np.int64)
        return cls(np.concatenate([p.ids for p in parts]), np.concatenate([p.lengths for p in parts]), vocab, indptr, rows, tfs)

    def find(self, hashes: np.ndarray) -> np.ndarray:
        """Each hash's position in vocab, -1 where these rows do not hold it."""
        if not len(self.vocab) or not len(hashes):
            return np.full(len(hashes), -1, np.int64)
        pos = np.searchsorted(self.vocab, hashes).clip(0, len(self.vocab) - 1)
        return np.where(self.vocab[pos] == hashes, pos, -1)


def _sorted_unique(x: np.ndarray) -> np.ndarray:
    """np.unique of int64 rows by a sort (numpy 2's hash-based unique is ~20x slower here)."""
    x = np.sort(x)
    if len(x) > 1:
        keep = np.empty(len(x), bool)
        keep[0] = True
        np.not_equal(x[1:], x[:-1], out=keep[1:])
        x = x[keep]
    return x


def best_n(pos: np.ndarray, s: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The n best of rows `pos` (ascending) by score s, best first; ties go to the lower row
    (rows are in id order), at the cut too, so the result is one whatever computed the scores."""
    if len(s) > n:
        kth = np.partition(s, len(s) - n)[len(s) - n]
        above = np.flatnonzero(s > kth)
        keep = np.sort(np.concatenate([above, np.flatnonzero(s == kth)[: n - len(above)]]))
        pos, s = pos[keep], s[keep]
    order = np.lexsort((pos, -s))
    return pos[order], s[order]


class LexicalIndex:
    """BM25 over the live rows of one or more posting sets (an index's segments), scored with numpy.

    Statistics are those of every live row together (row count, average length, each term's
    document frequency), so a row's score does not depend on how the rows are split into segments
    or on deleted rows: the same live rows give the same scores, bit for bit, in one segment or many.
    `ids` is every row's id, in row order (segments hold increasing id ranges, so it is sorted);
    `deleted` gives, per part, the positions of its deleted rows (None: none)."""

    def __init__(self, parts: Sequence[Postings], deleted: Sequence[np.ndarray | None] | None = None,
                 k1: float = K1, b: float = B):
        self.parts = list(parts)
        self.k1, self.b = k1, b
        self.offsets = np.cumsum([0] + [len(p) for p in self.parts])
        if len(self.parts) == 1:  # one segment: its (mapped) ids as they are, nothing read up front
            self.ids = self.parts[0].ids
        else:
            self.ids = np.concatenate([p.ids for p in self.parts]) if self.parts else np.zeros(0, np.int64)
            if len(self.ids) > 1 and not (np.diff(self.ids) > 0).all():  # a segment's own order is checked when written
                raise ValueError("the rows' ids are not increasing across segments")
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
                df += (hi - lo) - (int(dead[p.postings[lo:hi]].sum()) if dead is not None else 0)
                spans.append((j, lo, hi))
            if df:
                out.append((h, df, spans))
        return out

    def _weights(self, j: int, lo: int, hi: int, idf: float) -> np.ndarray:
        """idf * tf (k1 + 1) / (tf + k1 (1 - b + b len / avg)) of postings lo:hi of part j (float32)."""
        return self._weights_at(j, slice(lo, hi), idf)

    def score_all(self, query: str | np.ndarray) -> np.ndarray:
        """BM25 scores (rows,) of every row for query (0 where no query term occurs; deleted rows
        may hold scores: top() leaves them out)."""
        hashes = self.query_hashes(query) if isinstance(query, str) else np.asarray(query, np.int64)
        acc = np.zeros(len(self.ids), np.float32)
        for _, idf, spans in self._terms(hashes):
            for j, lo, hi in spans:
                acc[self.offsets[j] + self.parts[j].postings[lo:hi]] += self._weights(j, lo, hi, idf)  # a term posts a row at most once
        return acc

    # ---- rank-safe dynamic pruning (MaxScore) --------------------------------------------------
    def _weights_at(self, j: int, at, idf: float) -> np.ndarray:
        """_weights of the postings at `at` (a slice or positions) of part j. The same float32
        operations on the same per-posting values whatever part a row is in and however it is
        reached (a whole list or a look-up), so scores do not depend on the segmentation or the
        pruning, bit for bit."""
        tf, tf1, plen = self.parts[j].weight_parts(at, self.k1)
        den = plen * self._c1
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
                tf = maxtf[a:b].astype(np.float64)
                got = self._bounds[(j, lo)] = float((tf * (self.k1 + 1) / (tf + float(self._c0) + float(self._c1) * minlen[a:b])).max())
            best = max(best, got)
        # float32 rounding of the real weights may land a hair above this float64 bound
        return best * idf * (1 + 1e-5) + 1e-6

    def _term_rows(self, idf: float, spans: list[tuple[int, int, int]]) -> tuple[np.ndarray, np.ndarray]:
        """(global rows, weights) of all a term's postings."""
        if len(spans) == 1:
            j, lo, hi = spans[0]
            return self.offsets[j] + self.parts[j].postings[lo:hi].astype(np.int64), self._weights(j, lo, hi, idf)
        return self._rows(spans), np.concatenate([self._weights(j, lo, hi, idf) for j, lo, hi in spans])

    def _rows(self, spans: list[tuple[int, int, int]]) -> np.ndarray:
        """The global rows of a term's postings, sorted (parts hold increasing row ranges)."""
        return np.concatenate([self.offsets[j] + self.parts[j].postings[lo:hi].astype(np.int64) for j, lo, hi in spans])

    def _add_term(self, acc: np.ndarray, rows: np.ndarray, idf: float, spans: list[tuple[int, int, int]]) -> np.ndarray:
        """acc (over the sorted global `rows`) plus the term's weights where a row holds it."""
        for j, lo, hi in spans:
            base = int(self.offsets[j])
            a, b = np.searchsorted(rows, [base, int(self.offsets[j + 1])])
            if a == b:
                continue
            plist = self.parts[j].postings[lo:hi]
            local = rows[a:b] - base
            at = np.searchsorted(plist, local).clip(0, hi - lo - 1)
            ok = plist[at] == local
            if ok.any():
                acc[a + np.flatnonzero(ok)] += self._weights_at(j, lo + at[ok], idf)
        return acc

    def top_k(self, query: str | np.ndarray, n: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids, scores) of the n best live rows with a positive score, best first (ties: lower id
        first): exactly what top(score_all(query), n, allowed) gives, scores bit for bit, without
        scoring every posting. MaxScore (Turtle and Flood, 1995): the terms that can lift a row
        the most are read whole until the rest together cannot lift a row they missed past the
        current k-th best; the rest are only looked up for the rows still in the running."""
        hashes = self.query_hashes(query) if isinstance(query, str) else np.asarray(query, np.int64)
        found = self._terms(hashes)
        if not found or n <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        eligible = self.live if allowed is None else (allowed if self.live is None else allowed & self.live)
        if sum(hi - lo for _, _, spans in found for _, lo, hi in spans) <= SPARSE_MAX:
            # few postings: score them all, on the rows they name only (no array over every row)
            got = [self._term_rows(idf, spans) for _, idf, spans in found]
            rows = _sorted_unique(np.concatenate([r for r, _ in got]))
            if eligible is not None:
                rows = rows[eligible[rows]]
            exact = np.zeros(len(rows), np.float32)
            for trows, w in got:  # in query-term order, as score_all() adds them
                at = np.searchsorted(rows, trows).clip(0, max(len(rows) - 1, 0))
                ok = rows[at] == trows if len(rows) else np.zeros(len(trows), bool)
                exact[at[ok]] += w[ok]
            pos = np.flatnonzero(exact > 0)
            pos, s = best_n(pos, exact[pos], n)
            return self.ids[rows[pos]], s
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
        # the final scores in query-term order, as score_all() adds them: equal bit for bit
        exact = np.zeros(len(rows), np.float32)
        for _, idf, spans in found:
            exact = self._add_term(exact, rows, idf, spans)
        pos = np.flatnonzero(exact > 0)
        pos, s = best_n(pos, exact[pos], n)
        return self.ids[rows[pos]], s

    def scores_of(self, query: str | np.ndarray, ids: np.ndarray) -> np.ndarray:
        """BM25 of the given ids (0 for ids no live row holds), as lookup(score_all(query), ids)
        gives them bit for bit, looking up only these rows in each term's postings."""
        hashes = self.query_hashes(query) if isinstance(query, str) else np.asarray(query, np.int64)
        pos, held = self.rows_of(ids)
        out = np.zeros(len(pos), np.float32)
        if not held.any():
            return out
        rows = pos[held].astype(np.int64)
        order = np.argsort(rows, kind="stable")
        acc = np.zeros(len(rows), np.float32)
        for _, idf, spans in self._terms(hashes):
            acc = self._add_term(acc, rows[order], idf, spans) if len(rows) else acc
        tmp = np.empty(len(rows), np.float32)
        tmp[order] = acc
        out[held] = tmp
        return out

    def top(self, acc: np.ndarray, n: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids, scores) of the n best live rows with a positive score in acc, best first;
        `allowed` is a boolean mask over rows."""
        hit = acc > 0
        if allowed is not None:
            hit &= allowed
        if self.live is not None:
            hit &= self.live
        pos = np.flatnonzero(hit)
        pos, s = best_n(pos, acc[pos], n)
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
                plist = self.parts[j].postings[lo:hi]
                at = np.searchsorted(plist, local).clip(0, max(hi - lo - 1, 0))
                ok = plist[at] == local if hi > lo else np.zeros(len(local), bool)
                w = self._weights(j, lo, hi, idf)
                for m, a, f in zip(mine.tolist(), at.tolist(), ok.tolist()):
                    if f:
                        c[m], tf[m] = float(w[a]), int(self.parts[j].tfs[lo + a])
            cols.append((h, idf, c, tf))
        lengths = [float(self.parts[int(part[i])].lengths[pos[i] - self.offsets[int(part[i])]]) for i in np.flatnonzero(held)]
        return cols, lengths


# ---- the docstore's terms, and the posting blobs of format 2 (read, no longer written) -----------
ARRAYS = ("ids", "lengths", "vocab", "indptr", "postings", "tfs")
DTYPES = {"ids": np.int64, "lengths": np.float32, "vocab": np.int64, "indptr": np.int64, "postings": np.int32, "tfs": np.int32}


def has_terms(db: sqlite3.Connection) -> bool:
    """Whether a docstore's chunks carry lexical terms (a docstore from before lexical search does not)."""
    return "lex" in {r[1] for r in db.execute("PRAGMA table_info(chunks)")}


def add_columns(db: sqlite3.Connection, missing_only: bool = False) -> bool:
    """Give an older docstore the chunk columns of the lexical index and fill them from the chunk
    texts; gives back True when it had to. `missing_only`: fill the rows that lack them."""
    cols = {r[1] for r in db.execute("PRAGMA table_info(chunks)")}
    if missing_only:
        rows = db.execute("SELECT id, text FROM chunks WHERE lex IS NULL").fetchall()
        db.executemany("UPDATE chunks SET lex = ?, lex_len = ? WHERE id = ?", ((*encode_terms(t), i) for i, t in rows))
        return bool(rows)
    if "lex" in cols:
        return False
    db.execute("ALTER TABLE chunks ADD COLUMN lex BLOB")
    db.execute("ALTER TABLE chunks ADD COLUMN lex_len INTEGER")
    rows = db.execute("SELECT id, text FROM chunks").fetchall()
    db.executemany("UPDATE chunks SET lex = ?, lex_len = ? WHERE id = ?", ((*encode_terms(t), i) for i, t in rows))
    return True


def invert(db: sqlite3.Connection) -> Postings:
    """The posting arrays of a docstore's chunk rows (their stored terms), inverted."""
    rows = db.execute("SELECT id, lex, lex_len FROM chunks ORDER BY id").fetchall()
    return Postings.from_rows(np.array([r[0] for r in rows], np.int64), [r[1] for r in rows],
                              np.array([r[2] or 0 for r in rows], np.float32))


# ---- a published segment's posting file, memory-mapped ------------------------------------------
# `lexical.<s>.bin` beside the segment's docstore. Layout (little-endian): MAGIC (8 bytes), the
# analyzer name (32 bytes, NUL-padded), counts n (rows), V (terms), nnz (postings), nb (blocks) and
# the rows' total length (int64 each), then, each starting at a multiple of 64 bytes: ids (i8, n),
# lengths (f4, n), vocab (i8, V), indptr (i8, V + 1), postings (i4, nnz), tfs (i4, nnz), bptr
# (i8, V + 1), block max tf (f4, nb), block min length (f4, nb). Opening maps it and reads the
# header only: a query reads the pages of its terms' postings (page cache, not heap). Integrity is
# the manifest's (size, fingerprint, sha256), as for every data file. Written by hand, not .npz:
# numpy's .npy header parser is not safe from several threads on CPython 3.11 (python/cpython#106905).
FILE_MAGIC = b"SSLEX\x00\x01\x00"
_FILE_HEAD = len(FILE_MAGIC) + 32 + 5 * 8
_FILE_ARRAYS = (("ids", "<i8"), ("lengths", "<f4"), ("vocab", "<i8"), ("indptr", "<i8"), ("postings", "<i4"), ("tfs", "<i4"),
                ("bptr", "<i8"), ("maxtf", "<f4"), ("minlen", "<f4"))


def _file_counts(n: int, v: int, nnz: int, nb: int) -> list[int]:
    return [n, n, v, v + 1, nnz, nnz, v + 1, nb, nb]


def _layout(counts: list[int]) -> tuple[list[int], int]:
    offsets, at = [], _FILE_HEAD
    for (_, dt), c in zip(_FILE_ARRAYS, counts):
        at = -(-at // 64) * 64
        offsets.append(at)
        at += np.dtype(dt).itemsize * c
    return offsets, at


def write_file(path, p: Postings) -> None:
    """Write posting arrays (with their pruning blocks) to a posting file, fsynced."""
    import os

    bptr, maxtf, minlen = p.blocks()
    arrays = [p.ids, p.lengths, p.vocab, p.indptr, p.postings, p.tfs, bptr, maxtf, minlen]
    counts = _file_counts(len(p.ids), len(p.vocab), len(p.postings), len(maxtf))
    offsets, _ = _layout(counts)
    head = (FILE_MAGIC + ANALYZER.encode().ljust(32, b"\0")
            + np.array([counts[0], counts[2], counts[4], counts[7], int(p.total_length)], "<i8").tobytes())
    with open(path, "wb") as fh:
        fh.write(head)
        at = len(head)
        for (name, dt), a, off in zip(_FILE_ARRAYS, arrays, offsets):
            fh.write(b"\0" * (off - at))
            data = np.ascontiguousarray(a, dt).tobytes()
            fh.write(data)
            at = off + len(data)
        fh.flush()
        os.fsync(fh.fileno())


def open_file(path) -> Postings:
    """The posting arrays of a posting file, as views of a read-only map (ValueError: not one,
    or damaged in its header or size)."""
    import mmap
    import os

    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < _FILE_HEAD:
            raise ValueError("not a posting file (too short)")
        raw = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    if raw[: len(FILE_MAGIC)] != FILE_MAGIC:
        raise ValueError("not a posting file")
    if raw[len(FILE_MAGIC): len(FILE_MAGIC) + 32].rstrip(b"\0").decode("ascii", "replace") != ANALYZER:
        raise ValueError("posting file of another analyzer")
    n, v, nnz, nb, total = (int(x) for x in np.frombuffer(raw, "<i8", 5, len(FILE_MAGIC) + 32))
    if min(n, v, nnz, nb) < 0:
        raise ValueError("damaged posting file header")
    counts = _file_counts(n, v, nnz, nb)
    offsets, end = _layout(counts)
    if size != end:
        raise ValueError(f"posting file size {size}, its header says {end}")
    a = {name: np.frombuffer(raw, dt, c, off) for (name, dt), c, off in zip(_FILE_ARRAYS, counts, offsets)}
    if hasattr(mmap, "MADV_RANDOM"):
        raw.madvise(mmap.MADV_RANDOM)  # queries read scattered posting lists: no read-ahead around them
    if (v + 1 and (a["indptr"][0] != 0 or a["indptr"][-1] != nnz)) or (a["bptr"][-1] != nb):
        raise ValueError("posting offsets out of range")
    return Postings(a["ids"], a["lengths"], a["vocab"], a["indptr"], a["postings"], a["tfs"], float(total),
                    (a["bptr"], a["maxtf"], a["minlen"]))


def file_name(docs_name: str) -> str:
    """The posting file of a segment's docstore: docs.<s>.sqlite -> lexical.<s>.bin."""
    return "lexical." + docs_name.split(".")[1] + ".bin"


def load(db: sqlite3.Connection) -> Postings | None:
    """The posting arrays of a docstore: its stored posting arrays where they are current, else
    inverted from the chunk rows; None where the docstore predates lexical search."""
    cols = {r[1] for r in db.execute("PRAGMA table_info(chunks)")}
    if "lex" not in cols:
        return None
    n = db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
    has_table = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'lexical'").fetchone()
    if has_table:
        blobs = dict(db.execute("SELECT name, data FROM lexical"))
        meta = json.loads(blobs.get("meta", b"{}"))
        if meta.get("analyzer") == ANALYZER and meta.get("rows") == n and all(k in blobs for k in ARRAYS):
            a = {k: np.frombuffer(blobs[k], DTYPES[k]) for k in ARRAYS}
            return Postings(a["ids"], a["lengths"], a["vocab"], a["indptr"], a["postings"], a["tfs"]).check()
    return invert(db)
