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
                 postings: np.ndarray, tfs: np.ndarray):
        self.ids, self.lengths, self.vocab, self.indptr, self.postings, self.tfs = ids, lengths, vocab, indptr, postings, tfs
        self.total_length = float(np.sum(lengths, dtype=np.float64))  # integer-valued: exact
        self._per_posting: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def per_posting(self, k1: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tf, tf (k1 + 1), length of the posting's row) per posting as float32, made once: the
        parts of a BM25 weight that do not depend on the index's statistics, laid out so a query
        term's weights are a few passes over contiguous slices (no gather by row)."""
        got = self._per_posting
        if got is None or got[3] != k1:
            tf = self.tfs.astype(np.float32)
            got = self._per_posting = (tf, tf * np.float32(k1 + 1), self.lengths[self.postings].astype(np.float32), k1)
        return got[:3]

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
        self.ids = np.concatenate([p.ids for p in self.parts]) if self.parts else np.zeros(0, np.int64)
        if len(self.ids) > 1 and not (np.diff(self.ids) > 0).all():
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
        self.average_length = total / n if n else 1.0
        # tf (k1 + 1) / (tf + k1 (1 - b) + (k1 b / avg) len): the constants of this set of live rows
        self._c0 = np.float32(k1 * (1 - b))
        self._c1 = np.float32(k1 * b / max(self.average_length, 1e-9))

    def __len__(self) -> int:
        return self.n

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

    def _terms(self, hashes: np.ndarray) -> list[tuple[int, float, list[tuple[int, int, int]]]]:
        """For each hash some live row holds: (hash, idf as float32, [(part, lo, hi)] of its postings)."""
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
                # Lucene's BM25 IDF, always positive: log(1 + (N - df + 0.5) / (df + 0.5)).
                out.append((h, float(np.float32(np.log1p((self.n - df + 0.5) / (df + 0.5)))), spans))
        return out

    def _weights(self, j: int, lo: int, hi: int, idf: float) -> np.ndarray:
        """idf * tf (k1 + 1) / (tf + k1 (1 - b + b len / avg)) of postings lo:hi of part j (float32).
        The same float32 operations on the same per-posting values whatever part a row is in, so
        scores do not depend on the segmentation, bit for bit."""
        tf, tf1, plen = self.parts[j].per_posting(self.k1)
        den = plen[lo:hi] * self._c1
        den += self._c0
        den += tf[lo:hi]
        w = np.divide(tf1[lo:hi], den, out=den)
        w *= np.float32(idf)
        return w

    def score_all(self, query: str) -> np.ndarray:
        """BM25 scores (rows,) of every row for query (0 where no query term occurs; deleted rows
        may hold scores: top() leaves them out)."""
        acc = np.zeros(len(self.ids), np.float32)
        for _, idf, spans in self._terms(self.query_hashes(query)):
            for j, lo, hi in spans:
                acc[self.offsets[j] + self.parts[j].postings[lo:hi]] += self._weights(j, lo, hi, idf)  # a term posts a row at most once
        return acc

    def top(self, acc: np.ndarray, n: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids, scores) of the n best live rows with a positive score in acc, best first;
        `allowed` is a boolean mask over rows."""
        hit = acc > 0
        if allowed is not None:
            hit &= allowed
        if self.live is not None:
            hit &= self.live
        pos = np.flatnonzero(hit)
        s = acc[pos]
        if len(pos) > n:
            keep = np.argpartition(-s, n - 1)[:n]
            pos, s = pos[keep], s[keep]
        order = np.lexsort((pos, -s))  # ties: lower id first (rows are in id order)
        return self.ids[pos[order]], s[order]

    def search(self, query: str, n: int, allowed: np.ndarray | None = None) -> list[tuple[int, float]]:
        """The n best (id, score) for query, best first; `allowed` is a boolean mask over rows."""
        ids, s = self.top(self.score_all(query), n, allowed)
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
        for h, idf, spans in self._terms(np.asarray(hashes, np.int64)):
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


# ---- persistence in the docstore ------------------------------------------------------------
ARRAYS = ("ids", "lengths", "vocab", "indptr", "postings", "tfs")
DTYPES = {"ids": np.int64, "lengths": np.float32, "vocab": np.int64, "indptr": np.int64, "postings": np.int32, "tfs": np.int32}
SCHEMA = "CREATE TABLE IF NOT EXISTS lexical (name TEXT PRIMARY KEY, data BLOB NOT NULL);"


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


def write(db: sqlite3.Connection) -> int:
    """Invert the chunks' terms into the `lexical` table (at commit); gives back the row count."""
    db.executescript(SCHEMA)
    rows = db.execute("SELECT id, lex, lex_len FROM chunks ORDER BY id").fetchall()
    li = Postings.from_rows(np.array([r[0] for r in rows], np.int64), [r[1] for r in rows],
                                np.array([r[2] or 0 for r in rows], np.float32))
    data = {k: getattr(li, k) for k in ARRAYS}
    db.execute("DELETE FROM lexical")
    db.executemany("INSERT INTO lexical (name, data) VALUES (?, ?)",
                   [(k, np.ascontiguousarray(v, DTYPES[k]).tobytes()) for k, v in data.items()]
                   + [("meta", json.dumps({"analyzer": ANALYZER, "rows": len(li)}).encode())])
    return len(li)


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
    rows = db.execute("SELECT id, lex, lex_len FROM chunks ORDER BY id").fetchall()
    return Postings.from_rows(np.array([r[0] for r in rows], np.int64), [r[1] for r in rows],
                                  np.array([r[2] or 0 for r in rows], np.float32))
