"""Writing posting files in bounded memory: a new segment's from its analysed rows, a merge's from
the live rows of other posting files, term range by term range."""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from semsearch.store.lexical.analysis import ANALYZER
from semsearch.store.lexical.postings import (
    _FILE_ARRAYS, _GAPS, _HEAD2, BLOCK, FILE_MAGIC, FILE_MAGIC_1, TF_ESCAPE, Postings, _file_counts, _layout, _layout2,
    release,
)


BATCH = 1 << 18  # postings encoded or merged at a time: what bounds a write's heap (a merge of 17M postings: 18.5 MB)
MERGE_STEP = 4  # a merge's step: about this many BATCHes of postings, shared among its parts
SPAN = 1 << 18  # a term's blocks share one width per SPAN postings (all of them, but for the longest lists)


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
        pstart = np.concatenate([[0], np.cumsum(counts)])
        first = np.repeat(pstart[:-1], nbp) + BLOCK * (np.arange(int(bstart[-1])) - np.repeat(bstart[:-1], nbp))
        width, before = self._gaps(rows, first, nbp, bstart, pstart, cont)
        new = np.ones(len(hashes), bool)
        new[0] = not cont
        self._put("vocab", np.asarray(hashes, np.int64)[new], "<i8")
        self._put("indptr", (c["nnz"] + pstart[:-1])[new], "<i8")
        self._put("bptr", (c["nb"] + bstart[:-1])[new], "<i8")
        for g in range(3):
            self._put(f"s{g}", before[g][new], "<i8")
        self._put("bfirst", rows[first], "<i4")
        self._put("bwidth", width, "<u1")
        self._bounds_and_tfs(first, tfs, plen)
        c["nnz"] += len(rows)
        c["nb"] += int(bstart[-1])
        c["V"] += int(new.sum())
        self.last = int(hashes[-1])
        self.term_at = int(counts[-1]) + (self.term_at if cont and len(counts) == 1 else 0)
        self.open_ended = self.term_at % SPAN == 0

    def _gaps(self, rows: np.ndarray, first: np.ndarray, nbp: np.ndarray, bstart: np.ndarray, pstart: np.ndarray,
              cont: bool) -> tuple[np.ndarray, dict]:
        """Write the rows' gaps (0 at each block's first posting) to the streams of their
        blocks' widths; gives back each block's width and, per width, each term's stream start."""
        c, total = self.c, int(bstart[-1])
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
        unit = np.repeat(np.arange(len(nbp)), nbp) * (1 << 40) + at // SPAN
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
        return width, before

    def _bounds_and_tfs(self, first: np.ndarray, tfs: np.ndarray, plen: np.ndarray) -> None:
        """The blocks' pruning bounds (largest tf, shortest row) and the postings' term counts:
        a byte each, TF_ESCAPE marking one kept exactly beside."""
        maxtf = np.maximum.reduceat(tfs, first)
        minlen = np.minimum.reduceat(np.asarray(plen, np.float32), first)
        self._put("maxtf", maxtf, "<i8")
        self._put("minlen", minlen, "<f4")
        self.max_tf = max(self.max_tf, int(maxtf.max()))
        if self.head["len_int"] and not (np.all(minlen == np.floor(minlen)) and float(minlen.max()) < 1 << 16 and float(minlen.min()) >= 0):
            self.head["len_int"] = 0
        esc = np.flatnonzero(tfs >= TF_ESCAPE)
        self._put("exc_at", self.c["nnz"] + esc, "<i8")
        self._put("exc_tf", tfs[esc], "<i4")
        self.c["nexc"] += len(esc)
        self._put("tfs", np.minimum(tfs, TF_ESCAPE), "<u1")

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
        if len(ids):
            raise ValueError("rows to invert beside carried posting sets whose id ranges overlap")
        write_merged(path, carried)  # partitions merged across (re-partitioning): their ids interleave
        return sum(len(p.ids) - int(np.isin(d, p.ids).sum()) for p, d in carried)
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
    by term range: memory stays bounded by a few BATCH postings whatever the parts' sizes.

    Parts whose id ranges interleave (the partitions of an index partitioned by document, merged
    across when it is re-partitioned: store/partition.py) are merged in id order: each part's
    rows are renumbered to their place among all the live ids (held in memory: 20 bytes a row),
    and each term's postings sorted by the new rows (a term's postings in one piece: the longest
    list is held whole)."""
    dead = [_dead_positions(p, d) for p, d in parts]
    live = [len(p.ids) - len(d) for (p, _), d in zip(parts, dead)]
    m = _Merge([p for p, _ in parts], dead, np.cumsum([0] + live), _interleaved([p for p, _ in parts], dead))
    w = _Writer(path, int(m.offsets[-1]))
    try:
        m.rows(w)
        while m.step(w):
            pass
        w.finish()
    finally:
        w.close()


def _dead_positions(p: Postings, d) -> np.ndarray:
    """The positions in p of the deleted ids `d` it holds."""
    d = np.asarray(d if d is not None else [], np.int64)
    pos = np.searchsorted(p.ids, d).clip(0, max(len(p.ids) - 1, 0))
    return np.unique(pos[p.ids[pos] == d]) if len(p.ids) else np.zeros(0, np.int64)


def _interleaved(parts: list[Postings], dead: list[np.ndarray]) -> "_Order | None":
    """The merged order of parts whose live ids interleave; None where each part's ids follow
    the last part's (segments of disjoint, increasing id ranges: the rows are the parts' in turn)."""
    ids = [np.delete(p.ids, d) for p, d in zip(parts, dead)]
    ranges = [(int(i[0]), int(i[-1])) for i in ids if len(i)]
    if all(a[1] < b[0] for a, b in zip(ranges, ranges[1:])):
        return None
    return _Order(ids, [np.delete(p.lengths, d) for p, d in zip(parts, dead)])


class _Order:
    """Rows of interleaving parts in id order: `ids` / `lengths` of the merged rows, and `place[j]`
    the new row of part j's i-th live row."""

    def __init__(self, ids: list[np.ndarray], lengths: list[np.ndarray]):
        every = np.concatenate(ids)
        order = np.argsort(every, kind="stable")
        self.ids, self.lengths = every[order], np.concatenate(lengths)[order]
        if len(self.ids) > 1 and not (np.diff(self.ids) > 0).all():
            raise ValueError("posting sets merged in id order hold the same id twice")
        new = np.empty(len(order), np.int64)
        new[order] = np.arange(len(order))
        cuts = np.cumsum([0] + [len(i) for i in ids])
        self.place = [new[a:b] for a, b in zip(cuts[:-1], cuts[1:])]


class _Merge:
    """write_merged's sweep over its parts' terms in hash order: `cursor` holds each part's next
    term; each step writes the terms below a bound that keeps every part's share of the step
    near BATCH / parts postings (or one long term, in pieces). `order`: the rows' places where
    the parts' ids interleave (_interleaved)."""

    def __init__(self, parts: list[Postings], dead: list[np.ndarray], offsets: np.ndarray, order: _Order | None = None):
        self.parts, self.dead, self.offsets, self.order = parts, dead, offsets, order
        # each part's row lengths, copied out of its map once: every step looks up its postings'
        # rows at random, and the step's release() of the map's pages would fault them in again
        # (4 bytes a row: 40 MB at 10M chunks)
        self.lengths = [np.array(p.lengths, np.float32) for p in parts]
        self.cursor = [0] * len(parts)
        self.share = max(MERGE_STEP * BATCH // max(len(parts), 1), BLOCK)

    def _live(self, j: int, lo: int, hi: int, terms: tuple[int, int] | None = None):
        """_live_postings of part j, its rows numbered as the merged file numbers them."""
        got = _live_postings(self.parts[j], self.dead[j], int(self.offsets[j]), lo, hi, terms, self.lengths[j])
        if self.order is not None:
            got = (self.order.place[j][got[0] - int(self.offsets[j])],) + tuple(got[1:])
        return got

    def rows(self, w: _Writer) -> None:
        """Every part's live rows, in order."""
        if self.order is not None:
            for a in range(0, len(self.order.ids), BATCH):
                w.rows(self.order.ids[a : a + BATCH], self.order.lengths[a : a + BATCH])
            for p in self.parts:
                release(p)
            return
        for p, d in zip(self.parts, self.dead):
            for a in range(0, len(p.ids), BATCH):
                keep = np.ones(min(BATCH, len(p.ids) - a), bool)
                keep[d[(d >= a) & (d < a + BATCH)] - a] = False
                w.rows(p.ids[a : a + BATCH][keep], p.lengths[a : a + BATCH][keep])
            release(p)

    def step(self, w: _Writer) -> bool:
        """Write the next range of terms; False once every term is written."""
        for p in self.parts:  # what the last term range read: a forward sweep lets its pages go
            release(p)
        heads = [int(p.vocab[v]) for p, v in zip(self.parts, self.cursor) if v < len(p.vocab)]
        if not heads:
            return False
        bound, first = self._bound(), min(heads)
        if bound is not None and bound == first:  # one term with many postings: in pieces
            self._long_term(w, first)
        else:
            self._term_range(w, bound)
        return True

    def _bound(self) -> int | None:
        """A hash bound below which each part holds at most `share` postings (or one term)."""
        bound = None
        for p, v in zip(self.parts, self.cursor):
            if v < len(p.vocab):
                e = int(np.searchsorted(p.indptr, int(p.indptr[v]) + self.share, "right")) - 1
                if e < len(p.vocab):
                    h = int(p.vocab[max(e, v)])
                    bound = h if bound is None else min(bound, h)
        return bound

    def _long_term(self, w: _Writer, first: int) -> None:
        """Term `first`'s postings from every part holding it, written SPAN postings at a time."""
        got = []
        for j, (p, v) in enumerate(zip(self.parts, self.cursor)):
            if v < len(p.vocab) and int(p.vocab[v]) == first:
                got.append((j, v))
                self.cursor[j] = v + 1
        buf_rows, buf_tfs, buf_len = [], [], []
        held = 0
        for j, v in got:
            p = self.parts[j]
            for _, _, lo, hi in _pieces(p.indptr, v, v + 1, self.share):
                r, t, ln = self._live(j, lo, hi)
                buf_rows.append(r)
                buf_tfs.append(t)
                buf_len.append(ln)
                held += len(r)
                if held >= max(BATCH, SPAN) and self.order is None:  # (interleaved: sorted whole, below)
                    r, t, ln = (np.concatenate(x) for x in (buf_rows, buf_tfs, buf_len))
                    cut = len(r) // SPAN * SPAN
                    w.terms(np.array([first]), [cut], r[:cut], t[:cut], ln[:cut])
                    buf_rows, buf_tfs, buf_len, held = [r[cut:]], [t[cut:]], [ln[cut:]], len(r) - cut
        r, t, ln = (np.concatenate(x) for x in (buf_rows, buf_tfs, buf_len))
        if self.order is not None:
            by_row = np.argsort(r, kind="stable")
            r, t, ln = r[by_row], t[by_row], ln[by_row]
            cut = len(r) // SPAN * SPAN
            if cut:
                w.terms(np.array([first]), [cut], r[:cut], t[:cut], ln[:cut])
                r, t, ln = r[cut:], t[cut:], ln[cut:]
        if len(r):
            w.terms(np.array([first]), [len(r)], r, t, ln)

    def _term_range(self, w: _Writer, bound: int | None) -> None:
        """Every part's terms below `bound` (None: all the rest), merged by term."""
        pieces = []
        for j, p in enumerate(self.parts):
            v = self.cursor[j]
            e = len(p.vocab) if bound is None else int(np.searchsorted(p.vocab, bound))
            if e > v:
                pieces.append((j, v, e))
                self.cursor[j] = e
        if not pieces:
            return
        if self.order is None and not any(len(self.dead[j]) for j, _, _ in pieces):
            self._placed(w, pieces)
            return
        hs, rs, ts, ls = [], [], [], []
        for j, v, e in pieces:
            p = self.parts[j]
            lo, hi = int(p.indptr[v]), int(p.indptr[e])
            r, t, ln, h = self._live(j, lo, hi, (v, e))
            for out, x in zip((hs, rs, ts, ls), (h, r, t, ln)):
                out.append(x)
        h = np.concatenate(hs)
        if self.order is None:
            order = np.argsort(h, kind="stable")  # parts in order, rows sorted within each: each term's rows sorted
        else:
            order = np.lexsort((np.concatenate(rs), h))  # the parts' rows interleave: by term, then row
        h = h[order]
        if not len(h):  # every posting of these terms was deleted
            return
        u, counts = np.unique(h, return_counts=True)
        w.terms(u, counts, np.concatenate(rs)[order], np.concatenate(ts)[order], np.concatenate(ls)[order])


    def _placed(self, w: _Writer, pieces: list[tuple[int, int, int]]) -> None:
        """_term_range where nothing is deleted and each part's rows follow the last part's (a
        long run's final merge): the merged terms are the union of the parts', and each part's
        postings of a term go after the earlier parts' ones, so each posting's place is known
        from the counts alone and is written there, without sorting the step's postings by term
        (the stable argsort and the unique over them were most of a 10M-chunk build's ~300 s
        merge of its posting files: docs/benchmarks.md)."""
        vocs = [self.parts[j].vocab[v:e] for j, v, e in pieces]
        terms = np.unique(np.concatenate(vocs)) if len(vocs) > 1 else np.asarray(vocs[0], np.int64)
        per = np.zeros((len(pieces), len(terms)), np.int64)  # each part's postings of each merged term
        slots = []
        for i, ((j, v, e), voc) in enumerate(zip(pieces, vocs)):
            slots.append(np.searchsorted(terms, voc))
            per[i, slots[-1]] = np.diff(self.parts[j].indptr[v : e + 1])
        counts = per.sum(axis=0)
        base = np.cumsum(per, axis=0) - per  # where a part's postings of a term start among the term's
        base += np.concatenate([[0], np.cumsum(counts)[:-1]])
        n = int(counts.sum())
        rows, tfs, lens = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.float32)
        for i, (j, v, e) in enumerate(pieces):
            p = self.parts[j]
            ptr = p.indptr[v : e + 1]
            lo, hi = int(ptr[0]), int(ptr[-1])
            r, t = p.span(lo, hi)
            at = np.repeat(base[i, slots[i]] - (ptr[:-1] - lo), np.diff(ptr))
            at += np.arange(hi - lo)
            rows[at] = r + int(self.offsets[j])
            tfs[at] = t
            lens[at] = self.lengths[j][r]
        w.terms(terms, counts, rows, tfs, lens)


def _live_postings(p: Postings, dead: np.ndarray, offset: int, lo: int, hi: int, terms: tuple[int, int] | None = None,
                   lengths: np.ndarray | None = None):
    """(new rows, tfs, row lengths[, term hash of each]) of postings lo:hi of p without the
    postings of dead rows, rows renumbered past `offset` as the merged file numbers them."""
    rows, tfs = p.span(lo, hi)
    rows = rows.astype(np.int64)
    lens = (p.lengths if lengths is None else lengths)[rows]
    h = np.repeat(p.vocab[terms[0]:terms[1]], np.diff(p.indptr[terms[0]:terms[1] + 1])) if terms else None
    if len(dead):
        k = np.searchsorted(dead, rows)
        keep = dead[k.clip(0, len(dead) - 1)] != rows
        rows, tfs, lens, k = rows[keep], tfs[keep], lens[keep], k[keep]
        h = h[keep] if h is not None else None
        rows -= k
    rows += offset
    return (rows, tfs, lens, h) if terms else (rows, tfs, lens)


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
