"""Merging segments, and the policy that decides when.

A write adds one small segment; left alone, a stream of writes would leave thousands of them
and every search would visit each. The policy (a log-structured one, as Lucene's
LogMergePolicy): a segment's level is the order of magnitude of its live chunks (all below
BASE are level 0); whenever FACTOR adjacent segments share a level they are merged into one, so
each level holds fewer than FACTOR segments and the count grows with the logarithm of the index.
A segment whose deleted chunks pass DELETED_SHARE is rewritten without them; a segment with no
live chunk is dropped; past MAX_SEGMENTS the two smallest neighbours are merged. Only adjacent
segments are merged, so segments keep disjoint, increasing id ranges.

A merge copies the live rows (texts, metadata, kept-state references; ids
unchanged) through SQLite, streams the live rows of the segments' vector files into the merged
segment's vector file, builds its vector index from that file (no re-encoding; memory holds the
index, a training sample and one batch), merges the segments' posting files term range by term
range (store/lexical/writing.py write_merged: bounded memory too), and is published with the write that asked for it, in
one manifest rename.
"""
from __future__ import annotations

import logging
import math
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from semsearch.store import integrity, keepvecs, lexical, vecfile
from semsearch.store.docstore import DocStore, docs_files
from semsearch.store.files import fsync_file
from semsearch.store.segments import Tombstones, segment_entry
from semsearch.store.vecfile import VectorFile
from semsearch.store.vectors import (IVF_TYPES, VectorIndex, bytes_per_vector, choose_type, default_nlist, exact_knn,
                                     resolve_index_device, tune)

log = logging.getLogger(__name__)

FACTOR = 10  # adjacent segments of one level merged at once
BASE = 1000  # live chunks below which a segment is level 0
DELETED_SHARE = 0.3  # a segment with more deleted rows than this is rewritten
MAX_SEGMENTS = 32
# A merge keeps at most this many docstores in place (each is a SQLite connection a reading
# thread opens: 40 for a 10M-chunk build of 250k-chunk segments); past it, they are copied.
MAX_KEPT_DOCSTORES = 64
MIN_APPROX = 50  # segments smaller than this are flat (searched exactly) whatever index type was forced

FILE_COLS = "id, path, hash, size, mtime_ns, documents, indexed_at, ctime_ns, inode"
CHUNK_COLS = "id, file_id, row, ord, start, end, line, text, metadata, state_file, state_off, state_len, lex, lex_len"


def level(live: int) -> int:
    return 0 if live < BASE else int(math.log10(live / BASE)) + 1


def plan(entries: list[dict], everything: bool = False, stale=None) -> list[tuple[int, int]]:
    """Ranges [a, b) of adjacent entries to merge, in order and disjoint (each becomes one segment).
    `everything`: all into one, or a lone segment rewritten where it has deletions or `stale(entry)`
    says its files are not what the index writes now."""
    n = len(entries)
    if everything:
        rewrite = n == 1 and (entries[0]["rows"] > entries[0]["live"] or (stale is not None and stale(entries[0])))
        return [(0, n)] if n > 1 or rewrite else []
    sizes = [int(e["live"]) for e in entries]
    groups: list[list[int]] = [[i] for i in range(n)]  # current grouping, merged step by step
    gsize = list(sizes)

    def lv(g: int) -> int:
        return level(gsize[g])

    changed = True
    while changed:
        changed = False
        for g in range(len(groups) - FACTOR, -1, -1):  # newest (smallest) first
            window = range(g, g + FACTOR)
            if len({lv(x) for x in window}) == 1:
                groups[g : g + FACTOR] = [[i for x in window for i in groups[x]]]
                gsize[g : g + FACTOR] = [sum(gsize[x] for x in window)]
                changed = True
                break
    while len(groups) > MAX_SEGMENTS:
        j = min(range(len(groups) - 1), key=lambda x: gsize[x] + gsize[x + 1])
        groups[j : j + 2] = [groups[j] + groups[j + 1]]
        gsize[j : j + 2] = [gsize[j] + gsize[j + 1]]
    out = []
    for g in groups:
        a, b = g[0], g[-1] + 1
        if b - a > 1:
            out.append((a, b))
        else:
            e = entries[a]
            if e["rows"] >= BASE and e["rows"] - e["live"] > DELETED_SHARE * e["rows"]:
                out.append((a, b))  # rewritten alone, without its deleted rows
    return out


def apply(folder: Path, entries: list[dict], dim: int, manifest, next_segment: int,
          everything: bool = False, tail: int = 0, trained: VectorIndex | None = None) -> tuple[list[dict], int]:
    """The entries after the merges the policy asks for (each merged segment written and
    fsynced); gives back (entries, next free segment id). `tail`: first merge the last `tail`
    entries into one (the segments a long run published as it went; `trained`: the quantizer
    the run trained for it, if any)."""
    if (tail > 1 or (tail == 1 and _outgrew_flat(entries[-1], manifest, dim))) and not everything:
        # (one published segment alone: a run that published one, then found the rest unchanged;
        # published flat, it is rewritten with the index its size asks for)
        merged = merge(Path(folder), entries[-tail:], next_segment, dim, manifest, trained=trained, in_place=True)
        log.info("merged the run's %d segments into segment %d (%d chunks)", tail, next_segment, merged["live"])
        entries, next_segment = entries[:-tail] + [merged], next_segment + 1
    out, next_segment = _run_plan(Path(folder), entries, dim, manifest, next_segment, everything, _stale(folder, manifest))
    return [e for e in out if e["live"] > 0 or e["files"] > 0], next_segment


def _stale(folder: Path, manifest):
    """stale(entry) for plan(): whether a segment has an older format's files, or vectors stored
    otherwise than the manifest asks (fp16 / fp32, an ivf-fastscan file not in list order)."""
    want = (getattr(manifest, "index", None) or {}).get("storage") or "fp32"

    def stale(e: dict) -> bool:
        if not e.get("vecs") or not e.get("postings"):
            return True
        vf = vecfile.open_files(Path(folder), e)
        return vf.storage != want or ((e.get("index") or {}).get("type") == "ivf-fastscan" and not vf.ordered)

    return stale


def _run_plan(folder: Path, entries: list[dict], dim: int, manifest, next_segment: int, everything: bool, stale,
              part: tuple[int, int] | None = None) -> tuple[list[dict], int]:
    """The entries after the merges plan() asks for (of one partition's entries: `part`, of how many)."""
    out: list[dict] = []
    at = 0
    for a, b in plan(entries, everything, stale):
        out += entries[at:a]
        t = time.perf_counter()
        out.append(merge(folder, entries[a:b], next_segment, dim, manifest, part=part))
        log.info("merged %d segment(s) into segment %d (%d chunks) in %.2f s", b - a, next_segment, out[-1]["live"],
                 time.perf_counter() - t)
        next_segment += 1
        at = b
    return out + entries[at:], next_segment


def apply_parted(folder: Path, entries: list[dict], dim: int, manifest, next_segment: int, n: int,
                 everything: bool = False, tail: int = 0, trained: VectorIndex | None = None) -> tuple[list[dict], int]:
    """apply() for an index partitioned by document into n (store/partition.py): every segment
    that holds documents of several partitions split into one segment a partition; the segments a
    long run published as it went (the last `tail`) merged into one segment a partition, split
    and merged in one step; then the merge policy within each partition. A segment without
    `part` (or with a part of another n) is split."""
    from semsearch.store import partition

    folder = Path(folder)
    cut = len(entries) - tail if tail and not everything else len(entries)
    if everything and entries and not any(e.get("parts") == n for e in entries):
        cut = 0  # partitioned anew (compact --shards): each partition one merge of every segment's rows in it
    pieces: list[dict] = []
    for e in entries[:cut]:
        if e.get("part") is not None and e.get("parts") == n:
            pieces.append(e)
        else:
            got, next_segment = _split(folder, [e], dim, manifest, next_segment, n)
            pieces += got
    got, next_segment = _split(folder, entries[cut:], dim, manifest, next_segment, n, trained)
    pieces += got
    stale = _stale(folder, manifest)
    out: list[dict] = []
    for p in sorted({int(e["part"]) for e in pieces}):
        block = partition.order([e for e in pieces if e["part"] == p])
        done, next_segment = _run_plan(folder, block, dim, manifest, next_segment, everything, stale, part=(p, n))
        out += done
    for e in out:
        e["parts"] = n
    return [e for e in out if e["live"] > 0 or e["files"] > 0], next_segment


def _split(folder: Path, group: list[dict], dim: int, manifest, next_segment: int, n: int,
           trained: VectorIndex | None = None) -> tuple[list[dict], int]:
    """The documents of the group's segments as one segment a partition: each partition's rows of
    every segment of the group in one merge (tombstones naming the other partitions' rows). A lone
    segment that holds one partition's documents is only tagged (unless it outgrew flat).
    `trained`: an empty index trained beside a long run, for a partition's size: each partition
    fills a copy of it where it fits (build_vectors), instead of training its own."""
    from semsearch.store import partition

    if not group:
        return [], next_segment
    found = [partition.entry_parts(folder, e, n) for e in group]
    if len(group) == 1 and len(found[0][0]) <= 1 and not _outgrew_flat(group[0], manifest, dim):
        lone = {k: v for k, v in group[0].items() if k != "rolled"}  # (a run's segment: settled now)
        return [{**lone, "part": next(iter(found[0][0]), 0), "parts": n}], next_segment
    out = []
    for p in sorted({p for parts, _ in found for p in parts}):
        mine = [(e, partition.without_others(dead, parts, p)) for e, (parts, dead) in zip(group, found) if p in parts]
        t = time.perf_counter()
        out.append(merge(folder, [e for e, _ in mine], next_segment, dim, manifest, [d for _, d in mine], part=(p, n),
                         trained=trained.empty_copy() if trained is not None else None))
        log.info("partition %d of %d segment(s) into segment %d (%d chunks) in %.2f s", p, len(mine), next_segment,
                 out[-1]["live"], time.perf_counter() - t)
        next_segment += 1
    return out, next_segment


def _requested(manifest) -> str:
    """The vector index type a merged segment is built as: the one the user forced, else auto."""
    index = (getattr(manifest, "index", None) or {})
    return index.get("requested", index.get("type", "auto")) if index.get("forced") else "auto"


def _outgrew_flat(entry: dict, manifest, dim: int) -> bool:
    """Whether a segment a long run published as it went (flat) is one its size wants indexed."""
    return bool(entry.get("rolled")) and (entry.get("index") or {}).get("type", "flat") == "flat" and \
        segment_type(_requested(manifest), int(entry.get("live", 0)), dim) != "flat"


def copy_live(dst: sqlite3.Connection, src: Path, dead: Tombstones, terms: bool = True) -> None:
    """Copy the live files and chunks of the docstore at src into dst (same ids), with the new
    stat of files the tombstones record. `terms`: with the lexical terms an older docstore's rows
    carry (False where the segment's posting file is carried instead)."""
    dst.commit()  # SQLite attaches only outside a transaction
    dst.execute("ATTACH DATABASE ? AS src", (str(src),))
    try:
        dst.execute("CREATE TEMP TABLE IF NOT EXISTS dead_chunks (id INTEGER PRIMARY KEY)")
        dst.execute("CREATE TEMP TABLE IF NOT EXISTS dead_files (id INTEGER PRIMARY KEY)")
        dst.execute("DELETE FROM dead_chunks")
        dst.execute("DELETE FROM dead_files")
        dst.executemany("INSERT INTO dead_chunks VALUES (?)", ((int(i),) for i in dead.chunks))
        dst.executemany("INSERT INTO dead_files VALUES (?)", ((int(i),) for i in dead.files))
        src_file_cols = {r[1] for r in dst.execute("PRAGMA src.table_info(files)")}
        fcols = ", ".join(c if c in src_file_cols else "0" for c in FILE_COLS.split(", "))
        if dead.documents:  # a split: each file counts its documents in this partition (store/partition.py)
            dst.execute("CREATE TEMP TABLE IF NOT EXISTS shares (id INTEGER PRIMARY KEY, documents INTEGER)")
            dst.execute("DELETE FROM shares")
            dst.executemany("INSERT INTO shares VALUES (?, ?)", dead.documents.items())
            fcols = fcols.replace("documents", "COALESCE((SELECT s.documents FROM shares s WHERE s.id = src.files.id), documents)")
        # A file whose records a re-partition gathers from several segments comes once a segment
        # (store/partition.py): one row, counting the documents of each.
        dst.execute(f"INSERT INTO files ({FILE_COLS}) SELECT {fcols} FROM src.files WHERE id NOT IN (SELECT id FROM dead_files)"
                    " ON CONFLICT(id) DO UPDATE SET documents = documents + excluded.documents")
        src_chunk_cols = {r[1] for r in dst.execute("PRAGMA src.table_info(chunks)")}
        ccols = ", ".join(c if c in src_chunk_cols and (terms or c not in ("lex", "lex_len")) else "NULL"
                          for c in CHUNK_COLS.split(", "))
        dst.execute(f"INSERT INTO chunks ({CHUNK_COLS}) SELECT {ccols} FROM src.chunks WHERE id NOT IN (SELECT id FROM dead_chunks)")
        dst.executemany("UPDATE files SET size = ?, mtime_ns = ?, ctime_ns = ?, inode = ? WHERE id = ?",
                        [(*s, f) for f, s in dead.stats.items()])
        dst.commit()
    finally:
        dst.execute("DETACH DATABASE src")


def merge(folder: Path, group: list[dict], seg_id: int, dim: int, manifest, deads_given: list[Tombstones] | None = None,
          part: tuple[int, int] | None = None, trained: VectorIndex | None = None, in_place: bool = False) -> dict:
    """One segment holding the live rows of the group's segments: written, indexed, fsynced;
    gives back its manifest entry. `deads_given`: each segment's tombstones to apply instead of
    its own (a split: its own plus the other partitions' rows); `part`: the partition it holds,
    of how many;
    `trained`: a quantizer trained ahead, for build_vectors; `in_place`: the group's docstores
    are kept where they are, not copied, where they can be (keeps_docs)."""
    if in_place and keeps_docs(group, deads_given, part):
        return _merge_in_place(folder, group, seg_id, dim, manifest, trained)
    docs_file, vectors_file = f"docs.{seg_id}.sqlite", f"vectors.{seg_id}.faiss"
    store = DocStore(folder / docs_file, unpublished=True)  # fsynced before the manifest names it
    steps = _Steps(seg_id)
    try:
        states: set[str] = set()
        deads = []
        for i, e in enumerate(group):
            if deads_given is not None:
                dead = deads_given[i]
            else:
                dead = Tombstones.load(folder / e["deletes"]) if e.get("deletes") else Tombstones()
            for name in docs_files(e):
                copy_live(store.db, folder / name, dead, terms=not e.get("postings"))
            states |= set(e.get("states") or [])
            deads.append(dead)
        counts = store.counts()
        if any("states" not in e for e in group):
            states = store.state_files()
        steps.done("docstores copied")
        index = (manifest.index or {})
        vecs = merge_vectors(folder, group, vecfile.file_name(seg_id), dim, deads, index.get("storage"))
        steps.done("vectors copied")
        requested = _requested(manifest)
        target = (index.get("recall") or {}).get("target", 0.95)
        vi, entry = build_vectors(vecs, dim, requested, counts["chunks"], target, params=index.get("params"),
                                  trained=trained)
        steps.done("vector index built and tuned")
        order_by_lists(folder / vecfile.file_name(seg_id), vi)
        steps.done("vectors ordered by list")
        # posting files merged term range by term range (bounded memory); a segment from before
        # posting files has its terms in its docstore rows, inverted again
        store.write_lexical([(lexical.open_file(folder / e["postings"]), d.chunks) for e, d in zip(group, deads) if e.get("postings")])
        store.commit()
        steps.done("postings merged")
        vi.save(folder / vectors_file, vectors_elsewhere=True)
        for name in (docs_file, vectors_file):
            fsync_file(folder / name)
        steps.done("written to disk")
        out = segment_entry(folder, seg_id, store, vi, entry, sorted(states))
        if part is not None:
            from semsearch.store import partition

            partition.tag(out, store.db, *part)
        return out
    finally:
        store.close()


def keeps_docs(group: list[dict], deads_given=None, part: int | None = None) -> bool:
    """Whether a merge of `group` can keep its docstores in place (format 8, store/docstore.py
    DocStores): segments of the current format (vector and posting files), nothing deleted in
    them, in increasing id ranges, one partition (an index without partitions)."""
    if deads_given is not None or part is not None or len(group) < 1 or \
            sum(len(docs_files(e)) for e in group) > MAX_KEPT_DOCSTORES:
        return False
    if any(not e.get("vecs") or not e.get("postings") or e.get("deletes") or e.get("rows") != e.get("live")
           or e.get("min_id") is None or e.get("part") is not None for e in group):
        return False
    return all(a["max_id"] < b["min_id"] for a, b in zip(group, group[1:]))


def _merge_in_place(folder: Path, group: list[dict], seg_id: int, dim: int, manifest,
                    trained: VectorIndex | None = None) -> dict:
    """merge() of a long run's segments that keeps their docstores where they are: the merged
    segment names them (docs, docs_more) and gets a vector index, vector file and posting file
    of its own. The disk a merge needs beside the segments is those three files, not a copy of
    the text (docs/benchmarks.md: 14 GB of a 10M-chunk build's 27)."""
    vectors_file = f"vectors.{seg_id}.faiss"
    steps = _Steps(seg_id)
    # The posting file is merged in a thread beside the vector side (numpy and faiss release the
    # interpreter's lock; neither reads what the other writes): the merge takes the longer of
    # the two, not their sum.
    postings = lexical.file_name(f"docs.{seg_id}.sqlite")
    posted = _beside(lambda: lexical.write_segment_file(folder / postings, np.zeros(0, np.int64), [], np.zeros(0, np.float32),
                                                        [(lexical.open_file(folder / e["postings"]), None) for e in group]))
    try:
        vi, ventry, rows, vec_names = _merged_vectors(folder, group, seg_id, dim, manifest, trained, steps)
    except BaseException:
        posted.exception()  # (its file is an unpublished one the writer removes: not while it is written)
        raise
    posted.result()
    steps.done("postings merged (beside the vectors), waited for")
    vi.save(folder / vectors_file, vectors_elsewhere=True)
    new = [vectors_file, postings] + [n for n in vec_names if n == vecfile.file_name(seg_id)]
    for name in new:
        fsync_file(folder / name)
    steps.done("written to disk")
    rec = integrity.record(folder, new, vi)
    docs = [n for e in group for n in docs_files(e)]
    for e in group:  # the docstores' and kept vector files' records as made (not hashed again)
        kept = (e.get("integrity") or {}).get("files") or {}
        rec["files"].update({n: kept[n] for n in [*docs_files(e), *vec_names] if n in kept and n not in rec["files"]})
    out = {"id": seg_id, "docs": docs[0], "docs_more": docs[1:], "vectors": vectors_file, "deletes": None,
           "rows": rows, "live": rows, "files": sum(int(e["files"]) for e in group),
           "documents": sum(int(e["documents"]) for e in group), "min_id": group[0]["min_id"],
           "max_id": group[-1]["max_id"], "index": ventry,
           "states": sorted(set().union(*(set(e.get("states") or ()) for e in group))), "lexical": True,
           "vecs": vec_names[0], "vecs_more": vec_names[1:], "postings": postings, "integrity": rec}
    if vi.kind == "flat":
        out["vectors_from"] = "vecs"
    for more in ("docs_more", "vecs_more"):
        if not out[more]:
            del out[more]
    return out


def _merged_vectors(folder: Path, group: list[dict], seg_id: int, dim: int, manifest, trained: VectorIndex | None,
                    steps: "_Steps") -> tuple[VectorIndex, dict, int, list[str]]:
    """_merge_in_place's vector side: the vector index of the segments' vector files read as one,
    and the merged segment's vector files, in order: for a fast-scan index the segments' own,
    kept in place, each in the index's list order (store/keepvecs.py); else one new file in id
    order. Then tuned against those files."""
    index = (manifest.index or {})
    # the segments' vector files read as one: indexed from there
    vecs = vecfile.Stacked([VectorFile(folder / n) for e in group for n in vecfile.file_names(e)])
    target = (index.get("recall") or {}).get("target", 0.95)
    rows = sum(int(e["rows"]) for e in group)
    vi, ventry = build_vectors(vecs, dim, _requested(manifest), rows, target, params=index.get("params"), trained=trained,
                               tune=False)
    steps.done("vector index built (docstores kept in place)")
    tunes = ventry["type"] != "flat" and rows > 10
    if vi.external_refine and len(vecs):
        names, found = keepvecs.keep_in_place(folder, group, seg_id, vecs, vi.lists(), tunes)
        vi.refine = vecs  # (its files now the kept ones)
        steps.done("vector files in list order, kept in place, and the tuning's exact neighbours")
    else:
        names, found = [vecfile.file_name(seg_id)], _one_file(folder / vecfile.file_name(seg_id), vecs, dim, index, tunes)
        steps.done("vectors written, and the tuning's exact neighbours")
    if found is not None:
        queries, exact, self_ids = found
        ventry["recall"], ventry["params"] = tune(vi, queries, exact, 10, target, self_ids), vi.params
        steps.done("recall tuned")
    return vi, ventry, rows, names


def _one_file(path: Path, vecs, dim: int, index: dict, tunes: bool):
    """The merged vector file written in id order, the tuning's exact neighbours found in a
    thread beside (neither changes what the other reads)."""
    with vecs.sweeping():
        truth = _beside(lambda: tuning_truth(vecs) if tunes else None, "semsearch-recall-tuning")
        try:
            vecfile.write_batches(path, vecs.ids, dim, (v for _, v in vecs.iter(65536)), index.get("storage"))
        except BaseException:
            truth.exception()  # (it reads the segments' files, which stay: waited for, not stopped)
            raise
        return truth.result()


def _beside(fn, name: str = "semsearch-postings-merge") -> "Future":
    """fn() run in a thread of its own; its result (or exception) from the future it gives back.
    The thread is a daemon: a merge stopped by an error or Ctrl-C does not wait for it at exit."""
    from concurrent.futures import Future

    out: Future = Future()

    def run() -> None:
        try:
            out.set_result(fn())
        except BaseException as e:  # noqa: BLE001 - handed to result()
            out.set_exception(e)

    threading.Thread(target=run, name=name, daemon=True).start()
    return out


class _Steps:
    """A merge's steps and their seconds, logged (`semsearch -v`: where a large build's end goes)."""

    def __init__(self, seg_id: int):
        self.seg_id, self.t = seg_id, time.perf_counter()

    def done(self, what: str) -> None:
        now = time.perf_counter()
        log.info("merge into segment %d: %s in %.1f s", self.seg_id, what, now - self.t)
        self.t = now


def order_by_lists(path: Path, vi: VectorIndex) -> None:
    """Rewrite a fast-scan segment's vector file (at path, in id order) list by list, and have
    vi re-rank against the new file. A query re-ranks candidates from the few lists it probes:
    stored together they are a few runs of pages, not ~1,000 rows scattered over the file (1M
    chunks: the 1,666 queries of scripts/bench/bench_scale.py mapped the whole file, 0.78 GB, into
    the process; docs/benchmarks.md). Other types re-rank nothing from the file."""
    if vi.external_refine and len(vi.refine):
        vi.refine = vecfile.reorder(path, vi.lists())


def merge_vectors(folder: Path, group: list[dict], name: str, dim: int, deads: list[Tombstones] | None = None,
                  storage: str | None = None) -> VectorFile:
    """Write the live vectors of the group's segments, in id order, to the vector file `name`
    (streamed: one batch in memory; `storage`: fp32 (None) or fp16) and open it. `deads`: the
    segments' tombstones, where the caller has them loaded already."""
    sources = _vector_sources(folder, group, deads)
    ids = np.concatenate([i for i, _ in sources]) if sources else np.zeros(0, np.int64)
    if len(ids) > 1 and not (np.diff(ids) > 0).all():  # partitions merged across: their ids interleave
        ids, batches = _in_id_order(_vector_sources(folder, group, deads, INTERLEAVED_BATCH), dim)
    else:
        batches = (v for _, fn in sources for _, v in fn())
    vecfile.write_batches(folder / name, ids, dim, batches, storage)
    return VectorFile(folder / name)


INTERLEAVED_BATCH = 8192  # rows read at a time from each segment of a merge whose ids interleave


def _in_id_order(sources: list, dim: int, batch: int = 65536) -> tuple[np.ndarray, Iterator[np.ndarray]]:
    """(the sources' ids sorted, their vectors in that order, in batches) for segments whose ids
    interleave (an index partitioned by document, re-partitioned: each segment's ids are sorted,
    the segments' are not in turn). Each output batch takes the next rows of each source it
    holds ids of; memory holds the ids and one read batch a source."""
    every = np.concatenate([i for i, _ in sources])
    src = np.repeat(np.arange(len(sources)), [len(i) for i, _ in sources])
    order = np.argsort(every, kind="stable")
    ids = every[order]
    if len(ids) > 1 and not (np.diff(ids) > 0).all():
        raise ValueError("segments merged in id order hold the same chunk id twice")

    def batches() -> Iterator[np.ndarray]:
        readers = [_Rows(fn()) for _, fn in sources]
        for a in range(0, len(order), batch):
            s = src[order[a : a + batch]]
            out = np.empty((len(s), dim), np.float32)
            for j in np.unique(s):
                at = s == j
                out[at] = readers[j].take(int(at.sum()))
            yield out

    return ids, batches()


class _Rows:
    """The next rows of an iterator of (ids, vectors) batches, k at a time."""

    def __init__(self, it: Iterator[tuple[np.ndarray, np.ndarray]]):
        self.it, self.held = it, np.zeros((0, 0), np.float32)

    def take(self, k: int) -> np.ndarray:
        got, n = [], 0
        while n < k:
            if not len(self.held):
                self.held = next(self.it)[1]
            piece, self.held = self.held[: k - n], self.held[k - n :]
            got.append(piece)
            n += len(piece)
        return np.concatenate(got) if len(got) > 1 else got[0]


def live_vectors(folder: Path, group: list[dict], deads: list[Tombstones] | None = None
                 ) -> tuple[np.ndarray, Iterator[tuple[np.ndarray, np.ndarray]]]:
    """(the live chunk ids of the group's segments in order, an iterator of (ids, vectors) batches
    of them): from each segment's vector file, or its docstore where it was written before
    format 4. `deads`: the segments' tombstones (loaded here where not given)."""
    sources = _vector_sources(folder, group, deads)
    ids = np.concatenate([i for i, _ in sources]) if sources else np.zeros(0, np.int64)
    return ids, (b for _, batches in sources for b in batches())


def _vector_sources(folder: Path, group: list[dict], deads: list[Tombstones] | None = None, batch: int = 65536) -> list:
    """[(a segment's live ids, a function giving its (ids, vectors) batches)] for each segment of
    the group (live_vectors)."""
    if deads is not None and len(deads) != len(group):
        raise ValueError("live_vectors: one tombstone set a segment")
    sources = []
    for at, e in enumerate(group):
        dead = deads[at] if deads is not None else Tombstones.load(folder / e["deletes"]) if e.get("deletes") else Tombstones()
        keep = (lambda ids, d=dead.chunks: ~np.isin(ids, d)) if len(dead.chunks) else None
        if e.get("vecs"):
            vf = vecfile.open_files(folder, e)
            ids = vf.ids if keep is None else vf.ids[keep(vf.ids)]
            sources.append((ids, lambda vf=vf, keep=keep: vf.iter(batch, keep)))
        else:
            docs = DocStore(folder / e["docs"], readonly=True)
            try:
                ids = np.array([r[0] for r in docs.db.execute("SELECT id FROM chunks ORDER BY id")], np.int64)
            finally:
                docs.close()
            ids = ids if keep is None else ids[keep(ids)]
            sources.append((ids, lambda e=e, keep=keep: _docstore_vectors(folder / e["docs"], keep, batch)))
    return sources


def _docstore_vectors(path: Path, keep, batch: int = 65536):
    """The kept vectors of a docstore written before format 4, opened for the iteration only."""
    docs = DocStore(path, readonly=True)
    try:
        yield from docs.iter_vectors(batch, keep)
    finally:
        docs.close()


def segment_type(requested: str, n: int, dim: int, max_bytes_per_vector: int | None = None) -> str:
    """The vector index type of a segment of n chunks: as choose_type() decides (automatic: flat,
    searched exactly, below 50k chunks), except that a tiny segment (a document written by an
    upsert) is flat whatever type was forced: nothing to train an approximate index on."""
    if n < MIN_APPROX:
        return "flat"
    return choose_type(requested, n, dim, max_bytes_per_vector)


def build_vectors(vecs, dim: int, requested: str, n: int, target: float, params: dict | None = None,
                  k: int = 10, sample: int = 500, tune_queries: np.ndarray | None = None, device: str = "cpu",
                  max_bytes_per_vector: int | None = None, current: VectorIndex | None = None,
                  trained_on: int = 0, trained: VectorIndex | None = None, tune: bool = True
                  ) -> tuple[VectorIndex, dict[str, Any]]:
    """The vector index of a segment's vectors `vecs` (n of them: its vector file, or the rows a
    writer holds; store/vecfile.py) and its manifest entry: the type for its size; `current`
    (the index filled while writing) is kept where it is that type and needs no retraining; the
    search knob is tuned to recall `target` at k. `trained`: an empty index whose quantizer a long
    run trained beside its build (indexing._Run), filled instead of training one here where it
    is the type and about the size this segment asks for. Reads the vectors in batches: memory
    holds the index, the training sample and one batch. `tune=False`: the caller tunes it
    (tune_segment, its result the entry's `recall`)."""
    with vecs.sweeping():  # a file no reader has yet: its scattered reads by pread, its pages let go of
        t0 = time.perf_counter()
        kind = segment_type(requested, n, dim, max_bytes_per_vector)
        vi = current
        rebuild = vi is None or vi.kind != kind or vi.dirty or (kind in IVF_TYPES and n > 4 * max(trained_on, 1))
        if rebuild:
            keep = ({k_: v for k_, v in (params or {}).items() if k_ in ("M", "efConstruction", "k_factor")}
                    if vi is None or vi.kind == kind else {})
            if fits(trained, kind, n, vecs.ids):
                held = trained.ntotal
                vi = trained.fill(vecs, after=trained.through if held else None)
                log.info("the vector index: a quantizer trained beside the build, which held %d vectors; %d added",
                         held, n - held)
            else:
                vi = VectorIndex.build(dim, kind, vecs, n, keep, device=resolve_index_device(device))
            trained_on = n
        entry: dict[str, Any] = {"type": kind, "params": vi.params, "trained_on": trained_on,
                                 "bytes_per_vector": bytes_per_vector(kind, dim), "built_on": vi.built_on}
        if tune and kind != "flat" and n > k:
            entry["recall"] = tune_segment(vi, vecs, target, k, sample, tune_queries)
            entry["params"] = vi.params
        entry["build_seconds"] = round(time.perf_counter() - t0, 2)
        return vi, entry


def tune_segment(vi: VectorIndex, vecs, target: float, k: int = 10, sample: int = 500,
                 tune_queries: np.ndarray | None = None) -> dict[str, Any]:
    """Tune vi's search knobs (vectors.tune) to recall@k `target` against exact search over
    `vecs` (a segment's vector file, or the rows a writer holds): on `tune_queries`, else on
    `sample` of the segment's own vectors, each one's own vector left out of both lists."""
    queries, exact, self_ids = tuning_truth(vecs, k, sample, tune_queries)
    return tune(vi, queries, exact, k, target, self_ids)


def tuning_truth(vecs, k: int = 10, sample: int = 500, tune_queries: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """tune_segment's queries, their exact top k over `vecs` and the queries' own ids (None for
    `tune_queries`)."""
    if tune_queries is not None and len(tune_queries):
        queries, self_ids = np.ascontiguousarray(tune_queries, np.float32), None
    else:
        pick = np.sort(np.random.default_rng(0).choice(len(vecs), min(sample, len(vecs)), replace=False))
        queries, self_ids = vecs.at_positions(pick), vecs.ids[pick].copy()
    # in the order the rows are stored (the ground truth needs every row, not id order)
    return queries, exact_knn(queries, getattr(vecs, "iter_stored", vecs.iter)(65536), k, self_ids), self_ids


def fits(trained: VectorIndex | None, kind: str, n: int, ids: np.ndarray | None = None) -> bool:
    """Whether an index trained ahead serves a segment of n vectors of type kind with the sorted
    `ids`: the same type, its list count within a factor 2 of what n asks for (default_nlist),
    and empty, or holding as many vectors as `ids` has up to the last id added (`through`: the
    segments a long run published, added beside it, none of them deleted since)."""
    if trained is None or trained.kind != kind or kind not in IVF_TYPES:
        return False
    if trained.ntotal:
        through = getattr(trained, "through", None)
        if through is None or ids is None or int(np.searchsorted(ids, through, "right")) != trained.ntotal:
            return False
    ratio = int(trained.params.get("nlist", 0)) / default_nlist(n)
    return 0.5 <= ratio <= 2.0


def summary(entries: list[dict], new_index: dict) -> dict[str, Any]:
    """The manifest's `index` entry: the largest segment's (its type is what searches mostly
    run on), whether the type was forced, the storage of new full vectors, and the types of all
    segments."""
    if not entries:
        return dict(new_index)
    big = max(entries, key=lambda e: e["live"])
    out = dict(big.get("index") or {"type": "flat"})
    out["forced"] = bool(new_index.get("forced"))
    out.pop("storage", None)
    if new_index.get("storage"):  # how the next segments store their full vectors (--vector-storage)
        out["storage"] = new_index["storage"]
    if out["forced"]:
        out["type"] = new_index.get("requested", new_index.get("type", out.get("type")))
    kinds: dict[str, int] = {}
    for e in entries:
        t = (e.get("index") or {}).get("type", "flat")
        kinds[t] = kinds.get(t, 0) + 1
    out["segments"] = kinds
    return out
