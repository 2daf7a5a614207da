"""The lexical index: BM25 over chunk text, in a posting file beside each segment's docstore.

A writer analyses each chunk as it is added (its context and text, store/docstore.py) and keeps
its terms (64-bit term hashes and their counts) in memory until the segment's commit, which
inverts them into the segment's posting file (`lexical.<s>.bin`, below) in the same publish as
its text, so the lexical and dense sides of an index cannot disagree after an update or a
delete. Since format 5 the docstore keeps no copy of them (its `chunks.lex` column stays empty:
2.5 KB a chunk of 200 words as SQLite stored them); merges and re-pooling writes take the posting files' rows as they
are (write_segment_file). Docstores of older formats still hold their terms there and are read
from it where they have no posting file.

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
import threading
from collections import Counter, OrderedDict
from typing import Iterable, NamedTuple, Sequence

import numpy as np

from semsearch.store.files import unmap_pages

ANALYZER = "words-lower-stop-porter2-v1"  # changes here change every stored term: bump it
K1 = 1.2  # Lucene's defaults; on SciFact train 0.9/0.4 measured the same (69.81 vs 69.84 nDCG@10)
B = 0.75
MAX_TERMS = 1024  # distinct terms kept from a query (a 100 KB query would otherwise score thousands)
BLOCK = 128  # postings per block of the pruning bounds (Lucene's block size)
# Words that phrase a question rather than name its subject: not counted when hybrid search asks
# which candidates hold all of a long query's terms (semsearch/fusion.py). "how to configure the
# proxy timeout" asks for the chunks with configure, proxy and timeout, wherever "how" is.
QUESTION_WORDS = ("how", "what", "why", "when", "where", "which", "who", "whom", "whose", "do", "does", "did",
                  "can", "could", "should", "would")
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


def _term(word: str) -> int:
    """The 64-bit hash of a word's stem (a signed int64); remembered in _HASHES (bounded)."""
    h = _HASHES.get(word)
    if h is None:
        stem = _stemmer().stemWord(word)
        h = int.from_bytes(hashlib.blake2b(stem.encode("utf-8"), digest_size=8).digest(), "little", signed=True)
        if len(_HASHES) > 1 << 20:
            _HASHES.clear()
        _HASHES[word] = h
    return h


def terms(text: str) -> list[int]:
    """The analysed terms of a text, in order (stop words dropped)."""
    return [_term(w) for w in _words(text) if w not in STOPWORDS]


# Lower-case ASCII letters, digits and "_" (what \w matches in ASCII) kept, every other byte a
# space: an ASCII text's words are then one C-level translate and split, several times faster
# than the regular expression, with the same words (tests/test_posting_file.py checks both ways agree).
_ASCII_WORDS = bytes(c + 32 if 65 <= c <= 90 else c if chr(c).isalnum() and c < 128 or c == 95 else 32 for c in range(256))
_HASHES: dict[str, int] = {}  # word -> term hash: _term's memory (a dict look-up per word)


def _words(text: str) -> list[str]:
    """A text's words, lower-cased (as _WORD.findall(text.lower()))."""
    if text.isascii():
        return text.encode("ascii").translate(_ASCII_WORDS).decode("ascii").split()
    return _WORD.findall(text.lower())


def encode_terms(text: str) -> tuple[bytes, int]:
    """(blob of sorted term hashes int64 + their counts int32, number of terms) for a chunk.
    The same as counting terms(text), in C-level passes where it can (building an index of
    chunks of 200 words analyses each in ~0.25 ms instead of ~0.35)."""
    words = Counter(_words(text))
    for w in STOPWORDS.intersection(words):
        del words[w]
    hashes = list(map(_HASHES.get, words))  # _term's memory, read without a call per word
    if None in hashes:
        hashes = [h if h is not None else _term(w) for w, h in zip(words, hashes)]
    h = np.array(hashes, np.int64)
    tf = np.fromiter(words.values(), np.int64, len(words))
    order = np.argsort(h)
    h, tf = h[order], tf[order]
    if len(h) > 1 and (h[1:] == h[:-1]).any():  # words with one stem ("runs", "running")
        h, start = np.unique(h, return_index=True)
        tf = np.add.reduceat(tf, start)
    return h.tobytes() + tf.astype(np.int32).tobytes(), int(tf.sum())


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

    def term_list(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows, tf as float32) of postings lo:hi, one term's whole list (a stored file's
        arrays are mapped from disk: a query reads its terms' pages, page cache and not heap)."""
        return self.postings[lo:hi], self.tfs[lo:hi].astype(np.float32)

    def term_rows(self, lo: int, hi: int) -> np.ndarray:
        """The rows of postings lo:hi (sorted)."""
        return self.postings[lo:hi]

    def span(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows, tfs) of postings lo:hi, however many terms they cross."""
        return self.postings[lo:hi], self.tfs[lo:hi]

    def find_in(self, lo: int, hi: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(held, tf as float32 where held) of sorted `rows` in the list of postings lo:hi."""
        plist = self.postings[lo:hi]
        at = np.searchsorted(plist, rows).clip(0, max(hi - lo - 1, 0))
        ok = plist[at] == rows if hi > lo else np.zeros(len(rows), bool)
        return ok, self.tfs[lo + at[ok]].astype(np.float32)

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


@functools.lru_cache(maxsize=1)
def _question_hashes() -> frozenset[int]:
    return frozenset(int(h) for w in QUESTION_WORDS for h in terms(w))


def counted(term: int) -> bool:
    """Whether a query term counts among the terms a candidate must hold all of (not a question word)."""
    return int(term) not in _question_hashes()


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
        pos, s = best_n(pos, exact[pos], n)
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
                order = np.argsort(local, kind="stable")
                ok, got_tf = self.parts[j].find_in(lo, hi, local[order])
                w = self._weights_of(j, local[order][ok], got_tf, idf)
                for m, wt, f in zip(mine[order][ok].tolist(), w.tolist(), got_tf.tolist()):
                    c[m], tf[m] = float(wt), int(f)
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
# `lexical.<s>.bin` beside the segment's docstore, little-endian, each array starting at a multiple
# of 64 bytes. Opening maps it and reads the header only: a query reads the pages of its terms'
# postings (page cache, not heap). Integrity is the manifest's (size, fingerprint, sha256), as for
# every data file. Written by hand, not .npz: numpy's .npy header parser is not safe from several
# threads on CPython 3.11 (python/cpython#106905).
#
# Version 2 (written): ~2.9 bytes a posting instead of 8 (1,168 MB -> 421 MB at 1M chunks of 200
# words). Per block of BLOCK postings of a term: its first row (i4) and the gaps between its rows,
# at the narrowest of 1, 2 or 4 bytes that holds every gap of the term (of each SPAN of its
# postings for the longest lists; the width is recorded per block), in three streams by width, so a
# list is one reshaped view of one stream: cast, cumulative sum along each block, plus the blocks'
# first rows (no Python loop per block). Term counts a byte each, 255 marking an exception kept
# exactly beside (posting number, tf). The pruning bounds per block: largest tf (u1/u2/u4, as the
# file's largest needs), shortest row (u2 where every one is an integer below 65,536, else f4).
# A look-up of some rows decodes only the blocks that may hold them (binary search in the blocks'
# first rows). Measured against lighter and heavier schemes (docs/benchmarks.md): bit-packing at
# each block's bit width (Lucene's, tantivy's) stores the rows in 182 MB instead of 251, but
# decoding it with numpy (a gather and shifts per posting) made the exhaustive scorer ~3x slower;
# term counts as 4-bit nibbles saved 66 MB and cost ~35% of the pruned p50 (this: ~10%).
# Why by hand: integer codecs for postings (FastPFor, StreamVByte) have Python bindings last
# released in 2023 and 2019, built from source; general compressors (Blosc2, numcodecs) compress
# chunks of bytes that a look-up of a few blocks would have to inflate whole. This layout is numpy
# views over the map. Header: MAGIC (8 bytes), the analyzer name (32, NUL-padded), then int64
# counts (_HEAD2); arrays in the order of _FILE2.
# Version 1 (read): ids, lengths, vocab, indptr, postings (i4), tfs (i4), bptr, block max tf (f4),
# block min length (f4), after counts n, V, nnz, nb and the total length.
FILE_MAGIC = b"SSLEX\x00\x02\x00"
FILE_MAGIC_1 = b"SSLEX\x00\x01\x00"
_FILE_HEAD = len(FILE_MAGIC) + 32 + 5 * 8
_FILE_ARRAYS = (("ids", "<i8"), ("lengths", "<f4"), ("vocab", "<i8"), ("indptr", "<i8"), ("postings", "<i4"), ("tfs", "<i4"),
                ("bptr", "<i8"), ("maxtf", "<f4"), ("minlen", "<f4"))
_HEAD2 = ("n", "V", "nnz", "nb", "total", "n8", "n16", "n32", "nexc", "tf_size", "len_int", "spare")
_FILE_HEAD2 = len(FILE_MAGIC) + 32 + 8 * len(_HEAD2)
_GAPS = ("<u1", "<u2", "<u4")  # block widths 0, 1, 2
_FILE2 = (("ids", "<i8", "n"), ("lengths", "<f4", "n"), ("g0", "<u1", "n8"), ("g1", "<u2", "n16"), ("g2", "<u4", "n32"),
          ("tfs", "<u1", "nnz"), ("exc_at", "<i8", "nexc"), ("exc_tf", "<i4", "nexc"), ("vocab", "<i8", "V"),
          ("indptr", "<i8", "V1"), ("bptr", "<i8", "V1"), ("s0", "<i8", "V1"), ("s1", "<i8", "V1"), ("s2", "<i8", "V1"),
          ("bfirst", "<i4", "nb"), ("bwidth", "<u1", "nb"), ("maxtf", None, "nb"), ("minlen", None, "nb"))
TF_ESCAPE = 255
SPAN = 1 << 18  # a term's blocks share one width per SPAN postings (all of them, but for the longest lists)
KEPT = 1 << 22  # postings of decoded lists a posting file keeps (rows int32: 16 MB)
WHOLE_AT = 4  # a look-up decodes a term's whole list where it needs at least 1/WHOLE_AT of its blocks
BATCH = 1 << 18  # postings encoded or merged at a time: what bounds a write's heap (a merge of 17M postings: 18.5 MB)


def _file_counts(n: int, v: int, nnz: int, nb: int) -> list[int]:
    return [n, n, v, v + 1, nnz, nnz, v + 1, nb, nb]


def _layout(counts: list[int]) -> tuple[list[int], int]:
    offsets, at = [], _FILE_HEAD
    for (_, dt), c in zip(_FILE_ARRAYS, counts):
        at = -(-at // 64) * 64
        offsets.append(at)
        at += np.dtype(dt).itemsize * c
    return offsets, at


def _layout2(h: dict) -> tuple[dict, dict, int]:
    """(offset, dtype) of each array of a version 2 file with header values h, and its size."""
    counts = dict(h, V1=h["V"] + 1)
    dts = {name: dt for name, dt, _ in _FILE2}
    dts["maxtf"] = {1: "<u1", 2: "<u2", 4: "<u4"}[h["tf_size"]]
    dts["minlen"] = "<u2" if h["len_int"] else "<f4"
    offsets, at = {}, _FILE_HEAD2
    for name, _, c in _FILE2:
        at = -(-at // 64) * 64
        offsets[name] = at
        at += np.dtype(dts[name]).itemsize * counts[c]
    return offsets, {name: (dts[name], counts[c]) for name, _, c in _FILE2}, at


SMALL_FILE = 1 << 20  # postings up to which a posting file's streams are written from memory


class _Writer:
    """Writes a version 2 posting file from its rows (ids, lengths) and then its postings, term
    by term in hash order, in batches, so memory stays bounded whatever the file's size: the gap
    stream of width 0 goes straight into place; the other arrays, whose offsets depend on counts
    known only at the end, go to unnamed temporary files and are copied in after."""

    _SPILLED = ("g1", "g2", "tfs", "exc_at", "exc_tf", "vocab", "indptr", "bptr", "s0", "s1", "s2", "bfirst", "bwidth",
                "maxtf", "minlen")

    def __init__(self, path, n: int, in_memory: bool = False):
        import io
        import tempfile
        from pathlib import Path

        self.path, self.n = Path(path), n
        self.fh = open(self.path, "wb")
        # `in_memory`: a small file's streams are kept in memory (a one-document write: 15 temporary
        # files cost ~15 ms, most of its posting file's time)
        self.spill = {k: io.BytesIO() if in_memory else tempfile.TemporaryFile(dir=self.path.parent) for k in self._SPILLED}
        self.c = dict.fromkeys(("rows", "nnz", "nb", "n8", "n16", "n32", "nexc", "V"), 0)
        self.head = {"n": n, "V": 0, "nnz": 0, "nb": 0, "n8": 0, "n16": 0, "n32": 0, "nexc": 0, "tf_size": 1,
                     "len_int": 1, "total": 0, "spare": 0}
        self.off, _, _ = _layout2(self.head)  # ids, lengths and g0 come first: their offsets need n only
        self.last: int | None = None  # the last term written, and whether it may go on (its postings so far fill spans)
        self.open_ended = False
        self.term_at = 0  # postings of the last term written so far
        self.max_tf, self.max_len = 0, 0.0
        self.total = 0.0

    def rows(self, ids: np.ndarray, lengths: np.ndarray) -> None:
        """The next rows' ids and lengths (all n of them, before any term)."""
        at = self.c["rows"]
        self.fh.seek(self.off["ids"] + 8 * at)
        self.fh.write(np.ascontiguousarray(ids, "<i8").tobytes())
        self.fh.seek(self.off["lengths"] + 4 * at)
        lengths = np.ascontiguousarray(lengths, "<f4")
        self.fh.write(lengths.tobytes())
        self.c["rows"] = at + len(ids)
        self.total += float(np.sum(lengths, dtype=np.float64))

    def _put(self, name: str, a: np.ndarray, dt: str) -> None:
        self.spill[name].write(np.ascontiguousarray(a, dt).tobytes())

    def terms(self, hashes: np.ndarray, counts: np.ndarray, rows: np.ndarray, tfs: np.ndarray, plen: np.ndarray) -> None:
        """Postings of terms `hashes` (increasing, counts[t] postings each, at least one): their
        rows (sorted within a term), tfs and the length of each posting's row. The first term may
        go on with the previous call's last one, whose postings so far must fill whole blocks."""
        c = self.c
        counts = np.asarray(counts, np.int64)
        if not len(hashes):
            return
        cont = self.last is not None and int(hashes[0]) == self.last
        if cont and not self.open_ended:
            raise ValueError("a term goes on after a part span")
        if self.last is not None and int(hashes[0]) < self.last:
            raise ValueError("terms out of order")
        rows = np.asarray(rows, np.int64)
        tfs = np.asarray(tfs, np.int64)
        nbp = -(-counts // BLOCK)
        bstart = np.concatenate([[0], np.cumsum(nbp)])
        total = int(bstart[-1])
        pstart = np.concatenate([[0], np.cumsum(counts)])
        first = np.repeat(pstart[:-1], nbp) + BLOCK * (np.arange(total) - np.repeat(bstart[:-1], nbp))
        cnt = np.diff(np.append(first, len(rows)))
        gaps = np.empty(len(rows), np.int64)
        gaps[:1] = 0
        np.subtract(rows[1:], rows[:-1], out=gaps[1:])
        gaps[first] = 0
        # one width for a term's blocks (per SPAN of its postings): a list then decodes from one
        # stream as one reshaped view (per block it would be ~3% smaller, and slower to decode)
        at = first - np.repeat(pstart[:-1], nbp)  # each block's first posting within its piece
        if cont:
            at[: nbp[0]] += self.term_at
        unit = np.repeat(np.arange(len(counts)), nbp) * (1 << 40) + at // SPAN
        ustart = np.flatnonzero(np.concatenate([[True], unit[1:] != unit[:-1]]))
        widest = np.maximum.reduceat(np.maximum.reduceat(gaps, first), ustart)
        width = np.repeat((widest >= 1 << 8).astype(np.uint8) + (widest >= 1 << 16), np.diff(np.append(ustart, total)))
        ew = np.repeat(width, cnt)
        before = {}  # per width: the stream's entries before each piece
        for g, name in enumerate(("n8", "n16", "n32")):
            vals = gaps[ew == g]
            per_block = np.concatenate([[0], np.cumsum(np.where(width == g, cnt, 0))])
            before[g] = c[name] + per_block[bstart[:-1]]
            if g == 0:
                self.fh.seek(self.off["g0"] + c[name])
                self.fh.write(vals.astype("<u1").tobytes())
            else:
                self._put(f"g{g}", vals, _GAPS[g])
            c[name] += len(vals)
        new = np.ones(len(hashes), bool)
        new[0] = not cont
        self._put("vocab", np.asarray(hashes, np.int64)[new], "<i8")
        self._put("indptr", (c["nnz"] + pstart[:-1])[new], "<i8")
        self._put("bptr", (c["nb"] + bstart[:-1])[new], "<i8")
        for g in range(3):
            self._put(f"s{g}", before[g][new], "<i8")
        self._put("bfirst", rows[first], "<i4")
        self._put("bwidth", width, "<u1")
        maxtf = np.maximum.reduceat(tfs, first)
        minlen = np.minimum.reduceat(np.asarray(plen, np.float32), first)
        self._put("maxtf", maxtf, "<i8")
        self._put("minlen", minlen, "<f4")
        self.max_tf = max(self.max_tf, int(maxtf.max()))
        if self.head["len_int"] and not (np.all(minlen == np.floor(minlen)) and float(minlen.max()) < 1 << 16 and float(minlen.min()) >= 0):
            self.head["len_int"] = 0
        # term counts: a byte each, TF_ESCAPE marking one kept exactly beside
        esc = np.flatnonzero(tfs >= TF_ESCAPE)
        self._put("exc_at", c["nnz"] + esc, "<i8")
        self._put("exc_tf", tfs[esc], "<i4")
        c["nexc"] += len(esc)
        self._put("tfs", np.minimum(tfs, TF_ESCAPE), "<u1")
        c["nnz"] += len(rows)
        c["nb"] += total
        c["V"] += int(new.sum())
        self.last = int(hashes[-1])
        self.term_at = int(counts[-1]) + (self.term_at if cont and len(counts) == 1 else 0)
        self.open_ended = self.term_at % SPAN == 0

    def finish(self) -> None:
        import os
        import shutil

        c, h = self.c, self.head
        if c["rows"] != self.n:
            raise ValueError("rows missing")
        self._put("indptr", [c["nnz"]], "<i8")
        self._put("bptr", [c["nb"]], "<i8")
        for g, name in enumerate(("n8", "n16", "n32")):
            self._put(f"s{g}", [c[name]], "<i8")
        h.update({k: c[k] for k in ("V", "nnz", "nb", "n8", "n16", "n32", "nexc")})
        h["total"] = int(self.total)
        h["tf_size"] = 1 if self.max_tf < 1 << 8 else 2 if self.max_tf < 1 << 16 else 4
        off, dts, end = _layout2(h)
        assert off["g0"] == self.off["g0"]
        for name in self._SPILLED:
            src = self.spill[name]
            src.seek(0)
            self.fh.seek(off[name])
            if name in ("maxtf", "minlen"):  # spilled wide, kept at the width this file needs
                wide = "<i8" if name == "maxtf" else "<f4"
                while chunk := src.read(1 << 20):
                    self.fh.write(np.frombuffer(chunk, wide).astype(dts[name][0]).tobytes())
            else:
                shutil.copyfileobj(src, self.fh, 1 << 20)
        self.fh.truncate(end)
        self.fh.seek(0)
        self.fh.write(FILE_MAGIC + ANALYZER.encode().ljust(32, b"\0") + np.array([h[k] for k in _HEAD2], "<i8").tobytes())
        self.fh.flush()
        os.fsync(self.fh.fileno())

    def close(self) -> None:
        self.fh.close()
        for f in self.spill.values():
            f.close()


def _pieces(indptr: np.ndarray, v0: int, v1: int, batch: int) -> Iterable[tuple[int, int, int, int]]:
    """(first term, end term, first posting, end posting) of runs of terms v0:v1 with about
    `batch` postings each; a term with more is cut into pieces of whole blocks."""
    v = v0
    while v < v1:
        lo = int(indptr[v])
        e = int(np.searchsorted(indptr, lo + batch, "right")) - 1
        e = min(max(e, v), v1)
        if e > v:
            yield v, e, lo, int(indptr[e])
            v = e
            continue
        hi = int(indptr[v + 1])
        step = max(batch // SPAN, 1) * SPAN
        for a in range(lo, hi, step):
            yield v, v + 1, a, min(a + step, hi)
        v += 1


def write_file(path, p: Postings) -> None:
    """Write posting arrays to a posting file (version 2), fsynced; memory beyond the arrays is
    bounded by BATCH postings."""
    w = _Writer(path, len(p.ids), in_memory=len(p.tfs) <= SMALL_FILE)
    try:
        for a in range(0, len(p.ids), BATCH):
            w.rows(p.ids[a : a + BATCH], p.lengths[a : a + BATCH])
        for v0, v1, lo, hi in _pieces(p.indptr, 0, len(p.vocab), BATCH):
            counts = np.diff(np.clip(p.indptr[v0 : v1 + 1], lo, hi))
            rows = p.postings[lo:hi]
            w.terms(p.vocab[v0:v1], counts, rows, p.tfs[lo:hi], p.lengths[rows])
        w.finish()
    finally:
        w.close()


def write_segment_file(path, ids: np.ndarray, blobs: Sequence[bytes], lengths: np.ndarray,
                       carried: Sequence[tuple[Postings, np.ndarray]] = ()) -> int:
    """Write a new segment's posting file: rows inverted from their terms (`ids` with their term
    blobs and lengths, see encode_terms), with the live rows of `carried` posting sets
    [(postings, deleted chunk ids)] taken as they are (segments a merge or a re-pooling write
    absorbs: their texts are not analysed again). Every part is placed by its id range; a row to
    invert may not fall inside a carried part's range (segments hold disjoint id ranges).
    Gives back the row count."""
    ids = np.asarray(ids, np.int64)
    order = np.argsort(ids, kind="stable")
    ids, lengths = ids[order], np.asarray(lengths, np.float32)[order]
    blobs = [blobs[i] for i in order]
    carried = [(p, np.sort(np.asarray(d if d is not None else [], np.int64))) for p, d in carried if len(p.ids)]
    if not carried:
        p = Postings.from_rows(ids, blobs, lengths)
        write_file(path, p)
        return len(p)
    carried.sort(key=lambda pd: int(pd[0].ids[0]))
    firsts = np.array([int(p.ids[0]) for p, _ in carried], np.int64)
    lasts = np.array([int(p.ids[-1]) for p, _ in carried], np.int64)
    if (firsts[1:] <= lasts[:-1]).any():
        raise ValueError("carried posting sets with overlapping id ranges")
    group = np.searchsorted(firsts, ids, "right")  # fresh rows after carried part group - 1
    inside = (group > 0) & (ids <= lasts[(group - 1).clip(0)])
    if inside.any():
        raise ValueError(f"row {int(ids[inside][0])} falls inside a carried posting set's id range")
    parts: list[tuple[Postings, np.ndarray]] = []
    for g in range(len(carried) + 1):
        sel = np.flatnonzero(group == g)
        if len(sel):
            parts.append((Postings.from_rows(ids[sel], [blobs[i] for i in sel], lengths[sel]), np.zeros(0, np.int64)))
        if g < len(carried):
            parts.append(carried[g])
    write_merged(path, parts)
    return sum(len(p.ids) - int(np.isin(d, p.ids).sum()) for p, d in parts)


def write_merged(path, parts: Sequence[tuple[Postings, np.ndarray]]) -> None:
    """Write the posting file of the live rows of several posting sets, in their order (a
    merge of segments): `parts` is [(postings, deleted chunk ids)], each opened from a segment's
    posting file. The file is the one write_file() writes from the merged rows inverted afresh
    (rows renumbered, deleted ones gone, terms left without postings gone), written term range
    by term range: memory stays bounded by a few BATCH postings whatever the parts' sizes."""
    dead = []
    for p, d in parts:  # positions of the deleted ids each part holds
        d = np.asarray(d if d is not None else [], np.int64)
        pos = np.searchsorted(p.ids, d).clip(0, max(len(p.ids) - 1, 0))
        dead.append(np.unique(pos[p.ids[pos] == d]) if len(p.ids) else np.zeros(0, np.int64))
    live = [len(p.ids) - len(d) for (p, _), d in zip(parts, dead)]
    offsets = np.cumsum([0] + live)
    w = _Writer(path, int(offsets[-1]))
    try:
        for (p, _), d in zip(parts, dead):
            for a in range(0, len(p.ids), BATCH):
                keep = np.ones(min(BATCH, len(p.ids) - a), bool)
                keep[d[(d >= a) & (d < a + BATCH)] - a] = False
                w.rows(p.ids[a : a + BATCH][keep], p.lengths[a : a + BATCH][keep])
            release(p)
        cursor = [0] * len(parts)
        share = max(BATCH // max(len(parts), 1), BLOCK)
        while True:
            for p, _ in parts:  # what the last term range read: a forward sweep lets its pages go
                release(p)
            heads = [int(p.vocab[v]) for (p, _), v in zip(parts, cursor) if v < len(p.vocab)]
            if not heads:
                break
            # a hash bound below which each part holds at most `share` postings (or one term)
            bound = None
            for (p, _), v in zip(parts, cursor):
                if v < len(p.vocab):
                    e = int(np.searchsorted(p.indptr, int(p.indptr[v]) + share, "right")) - 1
                    if e < len(p.vocab):
                        h = int(p.vocab[max(e, v)])
                        bound = h if bound is None else min(bound, h)
            first = min(heads)
            if bound is not None and bound == first:  # one term with many postings: in pieces
                got = []
                for j, ((p, _), v) in enumerate(zip(parts, cursor)):
                    if v < len(p.vocab) and int(p.vocab[v]) == first:
                        got.append((j, v))
                        cursor[j] = v + 1
                buf_rows, buf_tfs, buf_len = [], [], []
                held = 0
                for j, v in got:
                    p = parts[j][0]
                    for _, _, lo, hi in _pieces(p.indptr, v, v + 1, share):
                        r, t, ln = _live_postings(p, dead[j], int(offsets[j]), lo, hi)
                        buf_rows.append(r)
                        buf_tfs.append(t)
                        buf_len.append(ln)
                        held += len(r)
                        if held >= max(BATCH, SPAN):
                            r, t, ln = (np.concatenate(x) for x in (buf_rows, buf_tfs, buf_len))
                            cut = len(r) // SPAN * SPAN
                            w.terms(np.array([first]), [cut], r[:cut], t[:cut], ln[:cut])
                            buf_rows, buf_tfs, buf_len, held = [r[cut:]], [t[cut:]], [ln[cut:]], len(r) - cut
                r, t, ln = (np.concatenate(x) for x in (buf_rows, buf_tfs, buf_len))
                if len(r):
                    w.terms(np.array([first]), [len(r)], r, t, ln)
                continue
            hs, rs, ts, ls = [], [], [], []
            for j, (p, _) in enumerate(parts):
                v = cursor[j]
                e = len(p.vocab) if bound is None else int(np.searchsorted(p.vocab, bound))
                if e <= v:
                    continue
                lo, hi = int(p.indptr[v]), int(p.indptr[e])
                r, t, ln, h = _live_postings(p, dead[j], int(offsets[j]), lo, hi, (v, e))
                for out, x in zip((hs, rs, ts, ls), (h, r, t, ln)):
                    out.append(x)
                cursor[j] = e
            if not hs:
                continue
            h = np.concatenate(hs)
            order = np.argsort(h, kind="stable")  # parts in order, rows sorted within each: each term's rows sorted
            h = h[order]
            if not len(h):  # every posting of these terms was deleted
                continue
            u, counts = np.unique(h, return_counts=True)
            w.terms(u, counts, np.concatenate(rs)[order], np.concatenate(ts)[order], np.concatenate(ls)[order])
        w.finish()
    finally:
        w.close()


def _live_postings(p: Postings, dead: np.ndarray, offset: int, lo: int, hi: int, terms: tuple[int, int] | None = None):
    """(new rows, tfs, row lengths[, term hash of each]) of postings lo:hi of p without the
    postings of dead rows, rows renumbered past `offset` as the merged file numbers them."""
    rows, tfs = p.span(lo, hi)
    rows = rows.astype(np.int64)
    lens = p.lengths[rows]
    h = np.repeat(p.vocab[terms[0]:terms[1]], np.diff(p.indptr[terms[0]:terms[1] + 1])) if terms else None
    if len(dead):
        k = np.searchsorted(dead, rows)
        keep = dead[k.clip(0, len(dead) - 1)] != rows
        rows, tfs, lens, k = rows[keep], tfs[keep], lens[keep], k[keep]
        h = h[keep] if h is not None else None
        rows -= k
    rows += offset
    return (rows, tfs, lens, h) if terms else (rows, tfs, lens)


class PackedPostings(Postings):
    """The postings of a version 2 posting file, decoded per query term from the mapped file
    (see the layout above): a whole list with a few numpy passes over reshaped views, a look-up
    of some rows by decoding only the blocks that may hold them. `postings` and `tfs` decode the
    whole file (for merging runs of small segments and for checks), kept once made."""

    def __init__(self, a: dict, h: dict):
        self.ids, self.lengths, self.vocab, self.indptr = a["ids"], a["lengths"], a["vocab"], a["indptr"]
        self.total_length = float(h["total"])
        self.bptr, self.bfirst, self.bwidth = a["bptr"], a["bfirst"], a["bwidth"]
        self._streams = (a["g0"], a["g1"], a["g2"])
        self._starts = (a["s0"], a["s1"], a["s2"])
        self._tfb, self._exc_at, self._exc_tf = a["tfs"], a["exc_at"], a["exc_tf"]
        self._blocks = (a["bptr"], a["maxtf"], a["minlen"])
        self._all: tuple[np.ndarray, np.ndarray] | None = None
        self._recent: OrderedDict[int, np.ndarray] = OrderedDict()  # term -> its decoded rows (read-only)
        self._recent_n = 0
        self._lock = threading.Lock()

    def forget(self) -> None:
        """Drop the decoded lists kept (for measurements of a query on its own)."""
        with self._lock:
            self._recent.clear()
            self._recent_n = 0

    def _list(self, v: int, n: int) -> np.ndarray:
        """Term v's rows (its n postings), decoded whole. The lists decoded last are kept, up to
        KEPT postings (16 MB): a pruned query reads each term at least twice (its pruning, then
        its exact sum), and queries share terms."""
        with self._lock:
            got = self._recent.get(v)
            if got is not None:
                self._recent.move_to_end(v)
                return got
        rows = self._term_blocks(v).reshape(-1)[:n]
        rows.flags.writeable = False
        if n <= KEPT // 8:
            with self._lock:
                if v not in self._recent:
                    self._recent[v] = rows
                    self._recent_n += n
                while self._recent_n > KEPT:
                    self._recent_n -= len(self._recent.popitem(last=False)[1])
        return rows

    def blocks(self):
        return self._blocks

    @property
    def postings(self) -> np.ndarray:
        return self._whole()[0]

    @property
    def tfs(self) -> np.ndarray:
        return self._whole()[1]

    def _whole(self) -> tuple[np.ndarray, np.ndarray]:
        if self._all is None:
            nnz = int(self.indptr[-1]) if len(self.indptr) else 0
            r, t = self.span(0, nnz)
            self._all = (r.astype(np.int32), t.astype(np.int32))
        return self._all

    def _term(self, lo: int) -> int:
        return int(self.indptr.searchsorted(lo, "right")) - 1

    def _term_blocks(self, v: int, js: np.ndarray | None = None) -> np.ndarray:
        """The rows of term v's blocks js (all: None) as (blocks, BLOCK) int32, a row per block;
        the last block of a term holds fewer postings: the rest of its row is undefined."""
        a, b = self.bptr[v : v + 2].tolist()
        i0, i1 = self.indptr[v : v + 2].tolist()
        k = b - a
        rem = i1 - i0 - BLOCK * (k - 1)
        spans = [s[v : v + 2].tolist() for s in self._starts]
        out = np.empty((k if js is None else len(js), BLOCK), np.int32)
        held = [g for g in range(3) if spans[g][0] != spans[g][1]]
        if len(held) == 1:  # every block of one width (all but the longest lists): views only
            s0, s1 = spans[held[0]]
            data = self._streams[held[0]][s0:s1]
            nfull = (s1 - s0) // BLOCK
            full = data[: nfull * BLOCK].reshape(nfull, BLOCK)
            if js is None:  # the blocks' gaps are consecutive: one cumulative sum over them, padded
                if nfull < k:
                    out[k - 1, rem:] = 0
                out.reshape(-1)[: len(data)] = data
                out.cumsum(axis=1, out=out)
                out += self.bfirst[a:b, None]
                return out
            else:
                m = len(js) - (nfull < k and len(js) > 0 and int(js[-1]) == k - 1)
                if m:
                    np.cumsum(full[js[:m]].astype(np.int32), axis=1, out=out[:m])
                last = len(js) - 1 if m < len(js) else -1
            if nfull < k and last >= 0:
                np.cumsum(data[nfull * BLOCK :].astype(np.int32), out=out[last, :rem])
            out += (self.bfirst[a:b] if js is None else self.bfirst[a + js])[:, None]
            return out
        w = self.bwidth[a:b]
        for g in held:
            s0, s1 = spans[g]
            data = self._streams[g][s0:s1]
            nfull = (s1 - s0) // BLOCK
            tail = rem < BLOCK and int(w[-1]) == g  # the term's part last block is in this stream
            full = data[: nfull * BLOCK].reshape(nfull, BLOCK)
            if js is None:
                if nfull == k:
                    np.cumsum(full.astype(np.int32), axis=1, out=out)
                    continue
                sel = np.flatnonzero(w == g)
                if nfull:
                    if nfull == len(sel) - tail and sel[nfull - 1] == nfull - 1:
                        np.cumsum(full.astype(np.int32), axis=1, out=out[:nfull])
                    else:
                        out[sel[:nfull]] = np.cumsum(full.astype(np.int32), axis=1)
                last = k - 1
            else:
                m = w == g
                rank = np.cumsum(m) - 1
                sel = np.flatnonzero(m[js])
                is_tail = (js[sel] == k - 1) & tail
                fsel = sel[~is_tail]
                if len(fsel):
                    out[fsel] = np.cumsum(full[rank[js[fsel]]].astype(np.int32), axis=1)
                if not is_tail.any():
                    continue
                last = len(js) - 1
            if tail:
                out[last, :rem] = np.cumsum(data[nfull * BLOCK:].astype(np.int32))
        out += (self.bfirst[a:b] if js is None else self.bfirst[a + js])[:, None]
        return out

    def _tf(self, lo: int, hi: int) -> np.ndarray:
        """The term counts of postings lo:hi as float32."""
        tf = self._tfb[lo:hi].astype(np.float32)
        a, b = self._exc_at.searchsorted((lo, hi)).tolist()
        if b > a:
            tf[self._exc_at[a:b] - lo] = self._exc_tf[a:b]
        return tf

    def _tf_at(self, at: np.ndarray) -> np.ndarray:
        """The term counts of postings `at` as float32."""
        tf = self._tfb[at].astype(np.float32)
        esc = np.flatnonzero(tf == TF_ESCAPE)
        if len(esc):
            tf[esc] = self._exc_tf[np.searchsorted(self._exc_at, at[esc])]
        return tf

    def term_list(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        return self._list(self._term(lo), hi - lo), self._tf(lo, hi)

    def term_rows(self, lo: int, hi: int) -> np.ndarray:
        return self._list(self._term(lo), hi - lo)

    def find_in(self, lo: int, hi: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        v = self._term(lo)
        a, b = self.bptr[v : v + 2].tolist()
        pos = None
        if WHOLE_AT * len(rows) >= b - a or v in self._recent:  # rows enough for many of the blocks: the whole list
            flat = self._list(v, hi - lo)
        else:
            blk = self.bfirst[a:b].searchsorted(rows, "right") - 1  # the block that may hold each row
            js = blk[blk >= 0]
            if len(js) > 1:
                js = js[np.concatenate([[True], js[1:] != js[:-1]])]
            flat = self._term_blocks(v, js).reshape(-1)
            if len(js) and js[-1] == b - a - 1:
                flat = flat[: len(flat) - BLOCK * (b - a) + (hi - lo)]
            pos = js
        if not len(flat):
            return np.zeros(len(rows), bool), np.zeros(0, np.float32)
        at = np.searchsorted(flat, rows).clip(0, len(flat) - 1)
        ok = flat[at] == rows
        at = at[ok]
        if pos is not None:
            at = pos[at // BLOCK] * BLOCK + at % BLOCK
        return ok, self._tf_at(lo + at)

    def span(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows int64, tfs int64) of postings lo:hi, lo at a term's or a block's start,
        however many terms they cross, decoded together (for merges and whole-file reads)."""
        if hi <= lo:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        v0, v1 = self._term(lo), self._term(hi - 1)
        b0 = int(self.bptr[v0]) + (lo - int(self.indptr[v0])) // BLOCK
        b1 = int(self.bptr[v1]) + -(-(hi - int(self.indptr[v1])) // BLOCK)
        bb0 = int(self.bptr[v0])
        bt = np.repeat(np.arange(v0, v1 + 1), np.diff(self.bptr[v0 : v1 + 2]))  # term of each block bb0:b1
        bt = bt[: b1 - bb0]
        bi = np.arange(bb0, b1)
        start_post = self.indptr[bt] + BLOCK * (bi - self.bptr[bt])
        cnt = np.minimum(self.indptr[bt + 1] - start_post, BLOCK)
        w = self.bwidth[bb0:b1]
        entry = np.zeros(len(bi), np.int64)
        for g in range(3):  # each block's first entry in its stream
            m = (w == g).astype(np.int64)
            ex = np.cumsum(m) - m
            rank = ex - ex[self.bptr[bt] - bb0]
            entry = np.where(m.astype(bool), self._starts[g][bt] + BLOCK * rank, entry)
        keep = slice(b0 - bb0, None)
        w, cnt, entry, first = w[keep], cnt[keep], entry[keep], self.bfirst[b0:b1].astype(np.int64)
        n = int(cnt.sum())
        out_start = np.concatenate([[0], np.cumsum(cnt)[:-1]])
        gaps = np.empty(n, np.int64)
        ar = np.arange(n) - np.repeat(out_start, cnt)
        ew = np.repeat(w, cnt)
        src = np.repeat(entry, cnt) + ar
        for g in range(3):
            m = ew == g
            gaps[m] = self._streams[g][src[m]]
        gaps[out_start] = 0
        c = np.cumsum(gaps)
        rows = c - np.repeat(c[out_start], cnt) + np.repeat(first, cnt)
        rows = rows[: hi - lo]
        return rows, self._tf(lo, hi).astype(np.int64)


def open_file(path) -> Postings:
    """The posting arrays of a posting file (either version), as views of a read-only map
    (ValueError: not one, or damaged in its header or size)."""
    import mmap
    import os

    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < _FILE_HEAD:
            raise ValueError("not a posting file (too short)")
        raw = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    magic = raw[: len(FILE_MAGIC)]
    if magic not in (FILE_MAGIC, FILE_MAGIC_1):
        raise ValueError("not a posting file")
    if raw[len(FILE_MAGIC): len(FILE_MAGIC) + 32].rstrip(b"\0").decode("ascii", "replace") != ANALYZER:
        raise ValueError("posting file of another analyzer")
    if hasattr(mmap, "MADV_RANDOM"):
        raw.madvise(mmap.MADV_RANDOM)  # queries read scattered posting lists: no read-ahead around them
    if magic == FILE_MAGIC:
        if size < _FILE_HEAD2:
            raise ValueError("not a posting file (too short)")
        h = dict(zip(_HEAD2, (int(x) for x in np.frombuffer(raw, "<i8", len(_HEAD2), len(FILE_MAGIC) + 32))))
        if min(h.values()) < 0 or h["tf_size"] not in (1, 2, 4) or h["len_int"] not in (0, 1):
            raise ValueError("damaged posting file header")
        offsets, dts, end = _layout2(h)
        if size != end:
            raise ValueError(f"posting file size {size}, its header says {end}")
        a = {name: np.frombuffer(raw, dt, c, offsets[name]) for name, (dt, c) in dts.items()}
        if (a["indptr"][0] != 0 or a["indptr"][-1] != h["nnz"] or a["bptr"][-1] != h["nb"]
                or any(a[f"s{g}"][-1] != h[k] for g, k in enumerate(("n8", "n16", "n32")))):
            raise ValueError("posting offsets out of range")
        out = PackedPostings(a, h)
        out._map = raw
        return out
    n, v, nnz, nb, total = (int(x) for x in np.frombuffer(raw, "<i8", 5, len(FILE_MAGIC) + 32))
    if min(n, v, nnz, nb) < 0:
        raise ValueError("damaged posting file header")
    counts = _file_counts(n, v, nnz, nb)
    offsets, end = _layout(counts)
    if size != end:
        raise ValueError(f"posting file size {size}, its header says {end}")
    a = {name: np.frombuffer(raw, dt, c, off) for (name, dt), c, off in zip(_FILE_ARRAYS, counts, offsets)}
    if (v + 1 and (a["indptr"][0] != 0 or a["indptr"][-1] != nnz)) or (a["bptr"][-1] != nb):
        raise ValueError("posting offsets out of range")
    out = Postings(a["ids"], a["lengths"], a["vocab"], a["indptr"], a["postings"], a["tfs"], float(total),
                   (a["bptr"], a["maxtf"], a["minlen"]))
    out._map = raw
    return out


def release(p: Postings) -> None:
    """Unmap the pages of p's posting file that this process has touched (madvise DONTNEED; a
    no-op for postings in memory): they stay in the page cache. A merge reads each source file
    from end to end, and would otherwise end with all of them mapped (0.4 GB at 1M chunks, ~4 GB
    at 10M, counted in the build's RSS). The file never changes, so another reader's next read
    of a page finds the same bytes."""
    unmap_pages(getattr(p, "_map", None))


def write_file_v1(path, p: Postings) -> None:
    """Write posting arrays in the version 1 layout (what indexes written before version 2 hold;
    kept to test that they open, and to measure the two layouts side by side)."""
    import os

    bptr, maxtf, minlen = p.blocks()
    arrays = [p.ids, p.lengths, p.vocab, p.indptr, p.postings, p.tfs, bptr, maxtf, minlen]
    counts = _file_counts(len(p.ids), len(p.vocab), len(p.postings), len(maxtf))
    offsets, _ = _layout(counts)
    head = (FILE_MAGIC_1 + ANALYZER.encode().ljust(32, b"\0")
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
