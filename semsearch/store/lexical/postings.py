"""Posting sets: in memory (Postings), in a segment's memory-mapped posting file (its format,
opening it, and decoding its lists: PackedPostings), and the terms older docstores kept."""
from __future__ import annotations

import json
import sqlite3
import threading
from collections import OrderedDict
from typing import Sequence

import numpy as np

from semsearch.store.files import unmap_pages
from semsearch.store.lexical.analysis import ANALYZER, decode_terms, encode_terms


BLOCK = 128  # postings per block of the pruning bounds (Lucene's block size)


SMALL_SORT = 1 << 16  # postings below which _by_term sorts with numpy alone


def _by_term(h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the distinct terms, sorted; each one's offsets into the postings; the order that puts the
    postings term by term, each term's in their given order) of the term hashes h. A stable
    argsort of h does the same, ~3x slower: 36M postings (a 250k-chunk segment) took 7.4-8.9 s
    of a build's ~15 s to publish one. Here pandas' hash table ranks the terms and one sort of
    int64 keys (rank, position), which numpy sorts with SIMD, gives the order. Below SMALL_SORT
    postings (a one-document write's) the argsort: importing pandas was ~0.26 s of the first
    write of a process."""
    n = len(h)
    if n < SMALL_SORT or n >= 1 << 32:
        order = np.argsort(h, kind="stable")
        vocab, starts = np.unique(h[order], return_index=True)
        return vocab, np.append(starts, n).astype(np.int64), order
    import pandas as pd

    rank, vocab = pd.factorize(h, sort=True)  # rank: each posting's term's place among the sorted terms
    indptr = np.zeros(len(vocab) + 1, np.int64)
    np.cumsum(np.bincount(rank, minlength=len(vocab)), out=indptr[1:])
    key = rank.astype(np.int64) << 32
    key |= np.arange(n, dtype=np.int64)
    key.sort()
    key &= 0xFFFFFFFF
    return np.asarray(vocab, np.int64), indptr, key


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
        self.interleaved = False  # combine()'s rows of segments whose ids interleave (partitions by document)
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
        vocab, indptr, order = _by_term(h)
        return cls(ids, np.asarray(lengths, np.float32), vocab, indptr, rows[order], tf[order])

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
        """One posting set over the rows of several, in their order (ids increase, but for the
        segments of different partitions by document: `interleaved`); each term's rows stay
        sorted (a stable sort by term keeps part order, then row order)."""
        offsets = np.cumsum([0] + [len(p) for p in parts[:-1]])
        h = np.concatenate([np.repeat(p.vocab, np.diff(p.indptr)) for p in parts])
        rows = np.concatenate([(p.postings.astype(np.int64) + o) for p, o in zip(parts, offsets)]).astype(np.int32)
        tfs = np.concatenate([p.tfs for p in parts])
        order = np.argsort(h, kind="stable")
        h, rows, tfs = h[order], rows[order], tfs[order]
        vocab, starts = np.unique(h, return_index=True)
        indptr = np.append(starts, len(h)).astype(np.int64)
        ids = np.concatenate([p.ids for p in parts])
        out = cls(ids, np.concatenate([p.lengths for p in parts]), vocab, indptr, rows, tfs)
        out.interleaved = len(ids) > 1 and not bool((np.diff(ids) > 0).all())
        return out

    def find(self, hashes: np.ndarray) -> np.ndarray:
        """Each hash's position in vocab, -1 where these rows do not hold it."""
        if not len(self.vocab) or not len(hashes):
            return np.full(len(hashes), -1, np.int64)
        pos = np.searchsorted(self.vocab, hashes).clip(0, len(self.vocab) - 1)
        return np.where(self.vocab[pos] == hashes, pos, -1)


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
KEPT = 1 << 22  # postings of decoded lists a posting file keeps (rows int32: 16 MB)
WHOLE_AT = 4  # a look-up decodes a term's whole list where it needs at least 1/WHOLE_AT of its blocks


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
            return self._one_width(held[0], spans[held[0]], a, b, rem, js, out)
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

    def _one_width(self, g: int, span: list, a: int, b: int, rem: int, js: np.ndarray | None, out: np.ndarray) -> np.ndarray:
        """_term_blocks for a term whose blocks all have width g: views of one stream."""
        k = b - a
        s0, s1 = span
        data = self._streams[g][s0:s1]
        nfull = (s1 - s0) // BLOCK
        full = data[: nfull * BLOCK].reshape(nfull, BLOCK)
        if js is None:  # the blocks' gaps are consecutive: one cumulative sum over them, padded
            if nfull < k:
                out[k - 1, rem:] = 0
            out.reshape(-1)[: len(data)] = data
            out.cumsum(axis=1, out=out)
            out += self.bfirst[a:b, None]
            return out
        m = len(js) - (nfull < k and len(js) > 0 and int(js[-1]) == k - 1)
        if m:
            np.cumsum(full[js[:m]].astype(np.int32), axis=1, out=out[:m])
        if m < len(js):  # the term's last block, part full
            np.cumsum(data[nfull * BLOCK :].astype(np.int32), out=out[len(js) - 1, :rem])
        out += self.bfirst[a + js][:, None]
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
