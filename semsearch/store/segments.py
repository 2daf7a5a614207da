"""An index generation as readers see it: an ordered list of immutable segments, each with the
chunks and files deleted from it since it was written.

A segment is a docstore (`docs.<s>.sqlite`: files, chunks, texts, metadata, vectors, lexical
postings) and its own vector index (`vectors.<s>.faiss`); it is never rewritten. A write adds a
small segment and records deletions in tombstone files (`del.<s>.<g>.bin`: the deleted chunk ids
and file ids of segment s as of generation g, plus the new stat of files whose bytes did not
change); merges (semsearch/store/merge.py) replace adjacent segments by one without their deleted
chunks. Segments hold disjoint chunk-id ranges, increasing along the list, so the concatenation
of their sorted ids is sorted.

Readers open each segment once and keep it across generations (its files never change), so a
new generation costs what it adds. Search over the segments gives what one index over the same
live chunks gives: dense top-k merged from each segment's top-k (exact for flat segments), BM25
with statistics over every live chunk (semsearch/store/lexical/), filters over global ids.
"""
from __future__ import annotations

import threading
import zlib
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from semsearch.errors import IndexFormatError
from semsearch.store import integrity, lexical, vecfile
from semsearch.store.docstore import DocStore, StoredFile, docs_files, open_docs
from semsearch.store.files import DB_ERRORS, Memo, damaged
from semsearch.store.lexical import LexicalIndex, Postings
from semsearch.store.vecfile import VectorFile
from semsearch.store.vectors import MatrixIndex, VectorIndex, faiss_gpus

DEL_SMALL = 256  # up to this many deletions, a segment is searched for k + deleted and filtered after
# A one-shot reader (Retriever.load(fast_start=True)) searches flat segments up to this many rows
# with numpy from their docstores' vectors (store/vectors.py: MatrixIndex), without importing faiss.
LIGHT_ROWS = 4096
SMALL_ROWS = 4096  # adjacent segments this small are searched together from memory (one matmul, one posting set)
SMALL_RUN = 32768  # rows at most in one such group


def small_runs(parts: list["Part"], flat_only: bool) -> list[list["Part"]]:
    """The parts grouped: runs of adjacent small segments (each at most SMALL_ROWS rows, together
    at most SMALL_RUN; flat ones only where `flat_only`), every other part alone. Writes leave a
    tail of small segments until merges gather them: searched one by one, each costs a FAISS call
    and numpy calls per query term; grouped, they cost about one."""
    runs: list[list[Part]] = []
    rows = 0
    prev_small = False
    for p in parts:
        small = p.entry["rows"] <= SMALL_ROWS and (not flat_only or p.segment.vectors.kind == "flat")
        if small and prev_small and rows + p.entry["rows"] <= SMALL_RUN:
            runs[-1].append(p)
            rows += p.entry["rows"]
        else:
            runs.append([p])
            rows = p.entry["rows"]
        prev_small = small
    return runs


# ---- tombstones ---------------------------------------------------------------------------------
class Tombstones:
    """What was deleted from one segment: chunk ids and file ids (sorted), and the new stat
    (size, mtime_ns, ctime_ns, inode) of files whose bytes did not change. `documents` (never
    saved): where a merge splits the segment by partition, the documents each file it keeps
    counts in that partition (store/partition.py)."""

    def __init__(self, chunks=None, files=None, stats: dict[int, tuple[int, int, int, int]] | None = None,
                 documents: dict[int, int] | None = None):
        self.chunks = np.asarray(chunks if chunks is not None else np.zeros(0, np.int64), np.int64)
        self.files = np.asarray(files if files is not None else np.zeros(0, np.int64), np.int64)
        self.stats = dict(stats or {})
        self.documents = dict(documents or {})

    def __bool__(self) -> bool:
        return bool(len(self.chunks) or len(self.files) or self.stats)

    # The file: MAGIC, three little-endian int64 counts (chunk ids, file ids, stat rows), the int64
    # values, then the CRC-32 of all that. Written by hand rather than with np.save/np.savez:
    # numpy reads an .npy header with ast.literal_eval, and on CPython 3.11 two threads building
    # an AST at once can fail with "SystemError: AST constructor recursion depth mismatch"
    # (python/cpython#106905): readers load tombstones from many threads.
    MAGIC = b"SSDEL\x00\x01\x00"

    @classmethod
    def load(cls, path: Path) -> "Tombstones":
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise damaged(path.parent, path.name, f"unreadable ({e})") from e
        head = len(cls.MAGIC) + 24
        if len(raw) < head + 4 or raw[: len(cls.MAGIC)] != cls.MAGIC:
            raise damaged(path.parent, path.name, "damaged (not a tombstone file)")
        n_chunks, n_files, n_stats = (int(x) for x in np.frombuffer(raw, "<i8", 3, len(cls.MAGIC)))
        size = head + 8 * (n_chunks + n_files + 5 * n_stats)
        if min(n_chunks, n_files, n_stats) < 0 or len(raw) != size + 4:
            raise damaged(path.parent, path.name, "damaged (truncated)")
        if zlib.crc32(raw[:size]) != int.from_bytes(raw[size:], "little"):
            raise damaged(path.parent, path.name, "damaged (checksum)")
        values = np.frombuffer(raw, "<i8", size // 8 - head // 8, head).astype(np.int64)
        chunks, files = values[:n_chunks], values[n_chunks : n_chunks + n_files]
        stats = values[n_chunks + n_files :].reshape(-1, 5)
        return cls(chunks, files, {int(r[0]): tuple(int(x) for x in r[1:]) for r in stats})

    def save(self, path: Path) -> None:
        stats = np.array([[f, *s] for f, s in sorted(self.stats.items())], np.int64).reshape(-1, 5)
        chunks, files = np.unique(self.chunks), np.unique(self.files)
        body = (self.MAGIC + np.array([len(chunks), len(files), len(stats)], "<i8").tobytes()
                + np.concatenate([chunks, files, stats.ravel()]).astype("<i8").tobytes())
        with open(path, "wb") as fh:
            fh.write(body + zlib.crc32(body).to_bytes(4, "little"))
            fh.flush()

    def with_deleted(self, chunks: np.ndarray, file_id: int) -> "Tombstones":
        out = Tombstones(np.union1d(self.chunks, chunks), np.union1d(self.files, [file_id]), self.stats)
        out.stats.pop(file_id, None)
        return out


def live_files(store: DocStore, dead: Tombstones, paths: list[str] | None = None) -> dict[str, StoredFile]:
    """{path: stored file} of a segment's docstore less the files its tombstones delete, with the
    stat they record; only the given paths where `paths` is given (an index lookup each)."""
    if paths is None:
        held = list(store.files().values())
    else:
        held = []
        for at in range(0, len(paths), 500):
            part = paths[at : at + 500]
            held += [store.stored_file(r) for r in store.db.execute(
                "SELECT id, path, hash, size, mtime_ns, documents, ctime_ns, inode FROM files"
                f" WHERE path IN ({','.join('?' * len(part))})", part)]
    gone = set(dead.files.tolist())
    out: dict[str, StoredFile] = {}
    for f in held:
        if f.id in gone:
            continue
        if f.id in dead.stats:
            f.size, f.mtime_ns, f.ctime_ns, f.inode = dead.stats[f.id]
        out[f.path] = f
    return out


def partitioned(entry: dict[str, Any]) -> bool:
    """Whether a segment holds one partition of an index partitioned by document into more than
    one (store/partition.py): its ids interleave with the other partitions'."""
    return entry.get("part") is not None and int(entry.get("parts") or 1) > 1


def add_files(out: dict[str, StoredFile], got: dict[str, StoredFile]) -> dict[str, StoredFile]:
    """`out` with a segment's live files added: a file held by several segments (its records in
    several partitions, store/partition.py) once, counting the documents of each."""
    for path, f in got.items():
        if path in out:
            out[path].documents += f.documents
        else:
            out[path] = f
    return out


def select_sql(columns: str, where: str = "") -> str:
    """(chunk id, *columns) of a docstore's chunks in id order: `columns` and `where` are SQL over
    `chunks c JOIN files f ON f.id = c.file_id`."""
    return (f"SELECT c.id, {columns} FROM chunks c JOIN files f ON f.id = c.file_id"
            + (f" WHERE {where}" if where else "") + " ORDER BY c.id")


def segment_entry(folder: Path, seg_id: int, store: DocStore, vectors, index: dict[str, Any], states: list[str],
                  **extra) -> dict[str, Any]:
    """The manifest entry of a freshly written segment (its docstore still open; its data files
    saved and fsynced): counts, id range, vector index entry, kept-state files, integrity records."""
    counts = store.counts()
    # (two primary-key lookups: SQLite answers MIN and MAX in one statement by a scan of every row)
    lo, hi = (next(iter(store.db.execute(f"SELECT id FROM chunks ORDER BY id {d} LIMIT 1")), (None,))[0] for d in ("ASC", "DESC"))
    docs_file, vectors_file = f"docs.{seg_id}.sqlite", f"vectors.{seg_id}.faiss"
    names = [docs_file, vectors_file]
    if (Path(folder) / vecfile.file_name(seg_id)).exists():  # its vectors (store/vecfile.py)
        extra = {**extra, "vecs": vecfile.file_name(seg_id)}
        names.append(extra["vecs"])
        if vectors.kind == "flat":  # saved without them (VectorIndex.save): searched from the vector file
            extra["vectors_from"] = "vecs"
    if (Path(folder) / lexical.file_name(docs_file)).exists():  # its posting file (store/lexical/)
        extra = {**extra, "postings": lexical.file_name(docs_file)}
        names.append(extra["postings"])
    return {"id": seg_id, "docs": docs_file, "vectors": vectors_file, "deletes": None, "rows": counts["chunks"],
            "live": counts["chunks"], "files": counts["files"], "documents": counts["documents"], "min_id": lo, "max_id": hi,
            "index": index, "states": states, "lexical": True, **extra,
            "integrity": integrity.record(folder, names, vectors)}


def segment_key(entry: dict[str, Any]) -> tuple:
    """What identifies a published segment across generations (a reader reuses the Segment it
    opened): its docstores, by name and fingerprint. The vector files join them where a segment
    keeps docstores another wrote (format 8: the merged segment of a long run names the first
    rolled segment's docstore first)."""
    recs = (entry.get("integrity") or {}).get("files") or {}
    key: tuple = (entry["docs"], recs.get(entry["docs"], {}).get("fingerprint", ""))
    if entry.get("docs_more"):
        key += tuple(entry["docs_more"]) + (entry["vectors"], recs.get(entry["vectors"], {}).get("fingerprint", ""))
    return key


# ---- one segment, opened once -------------------------------------------------------------------
class Segment:
    """An immutable segment opened for reading: its docstore (read-only), its vector index, and
    what readers derive from them once (sorted ids, posting arrays, filter columns)."""

    def __init__(self, folder: Path, entry: dict[str, Any], device: str = "cpu", light: bool = False):
        self.folder, self.entry = Path(folder), entry
        self.id, self.name = int(entry["id"]), entry["docs"]
        self.light = light
        integrity.check_segment_files(self.folder, entry)
        kind = entry.get("index", {}).get("type", "flat")
        try:
            self.docs = open_docs(self.folder, entry)
        except DB_ERRORS as e:
            raise damaged(self.folder, entry["docs"], f"damaged ({e})") from e
        self.vecs: VectorFile | None = None  # the segment's vectors (format 4; fast-scan ones of format 3)
        try:
            self.vecs = vecfile.open_files(self.folder, entry)  # (format 10: several, read as one)
            if kind == "flat" and entry.get("vectors_from") == "vecs":  # format 6: the vector file is the only copy
                if self.vecs is None:
                    raise ValueError("a flat segment without its vector file")
                # (rows in list order: a rolled segment whose file the run's merge rewrote; keepvecs)
                if device == "cuda" and faiss_gpus() > 0:  # faiss's GPU scan, filled from the file
                    self.vectors = VectorIndex.create(self.vecs.dim, "flat", device="cuda")
                    for ids, vecs in self.vecs.iter(65536):
                        self.vectors.add(ids, vecs)
                else:
                    self.vectors = MatrixIndex(self.vecs.ids, self.vecs.matrix, use_faiss=not light)
            elif light and kind == "flat" and device != "cuda" and entry.get("rows", LIGHT_ROWS + 1) <= LIGHT_ROWS:
                if self.vecs is not None:
                    self.vectors = MatrixIndex(self.vecs.ids, self.vecs.matrix)
                else:
                    got = list(self.docs.iter_vectors())
                    self.vectors = MatrixIndex(np.concatenate([i for i, _ in got]) if got else np.zeros(0, np.int64),
                                               np.concatenate([v for _, v in got]) if got else np.zeros((0, int(entry.get("dim", 0) or 0)), np.float32))
            else:
                self.vectors = VectorIndex.load(self.folder / entry["vectors"], kind, entry.get("index", {}).get("params"), device,
                                                refine=self.vecs)
        except (RuntimeError, MemoryError, AttributeError, TypeError, ValueError, OSError) as e:
            self.docs.close()
            raise damaged(self.folder, entry["vectors"], f"damaged ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from e
        except BaseException:
            self.docs.close()
            raise
        try:
            integrity.check_segment_loaded(self.folder, entry, self.vectors, self.docs)
            # Mapped now, not at the first lexical query: a writer's merge may delete the file of a
            # segment this generation still names (readers keep what they opened, as with SQLite).
            self._postings = self._map_postings() if entry.get("postings") else None
        except BaseException:
            self.docs.close()
            raise
        self._lock = threading.Lock()
        self._memo = Memo()
        self._ids: np.ndarray | None = None
        self._file_ids: np.ndarray | None = None

    @property
    def key(self) -> tuple:
        return segment_key(self.entry)

    def _columns(self) -> None:
        with self._lock:
            if self._ids is None:
                ids, files = self.docs.chunk_files()
                self._file_ids, self._ids = files, ids

    @property
    def ids(self) -> np.ndarray:
        """Every chunk id the segment holds (deleted ones too), sorted."""
        if self._ids is None:
            self._columns()
        return self._ids

    @property
    def file_ids(self) -> np.ndarray:
        """The file id of each chunk, in the order of `ids`."""
        if self._ids is None:
            self._columns()
        return self._file_ids

    def postings(self):
        """The segment's BM25 posting arrays, mapped from its posting file (read from the
        docstore for a segment written before posting files; None before lexical search)."""
        if self._postings is not None:
            return self._postings
        return self.docs.memo("postings", self.docs.lexical)

    def _map_postings(self) -> Postings:
        name = self.entry["postings"]
        try:
            return lexical.open_file(self.folder / name)
        except (OSError, ValueError) as e:
            raise damaged(self.folder, name, f"damaged ({e})") from e

    def memo(self, key: Any, build):
        """build() computed once for this segment (the readers' forms of its columns); its own,
        not its docstore's: several docstores may be shared with other openers (open_docs)."""
        return self._memo(key, build)

    def vectors_of(self, ids) -> tuple[np.ndarray, np.ndarray]:
        """(the given ids the segment holds, sorted; their stored vectors): from its vector file,
        or its docstore where it was written before format 4."""
        if self.vecs is not None:
            return self.vecs.found(ids)
        return self.docs.get_vectors(ids)

    def iter_vectors(self, batch: int = 8192, keep=None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(ids, vectors) of the segment in id order, in batches; `keep(ids) -> mask` selects."""
        yield from (self.vecs.iter(batch, keep) if self.vecs is not None else self.docs.iter_vectors(batch, keep))

    def close(self) -> None:
        self.docs.close()


class Part:
    """A segment as one generation sees it: the segment and its tombstones."""

    def __init__(self, segment: Segment, dead: Tombstones, entry: dict[str, Any]):
        self.segment, self.dead, self.entry = segment, dead, entry
        self.live = int(entry["live"])
        self._lock = threading.Lock()
        self._live_bits: np.ndarray | None = None

    @property
    def lo(self) -> int:
        """The segment's first chunk id (-1: it holds none): from the manifest where it records it
        (reading a large segment's ids costs a scan of its chunks)."""
        if self.entry.get("min_id") is not None:
            return int(self.entry["min_id"])
        if self.entry.get("rows") == 0:
            return -1
        ids = self.segment.ids
        return int(ids[0]) if len(ids) else -1

    @property
    def hi(self) -> int:
        if self.entry.get("max_id") is not None:
            return int(self.entry["max_id"])
        if self.entry.get("rows") == 0:
            return -2
        ids = self.segment.ids
        return int(ids[-1]) if len(ids) else -2

    def keep(self, ids: np.ndarray) -> np.ndarray:
        """A mask over ids: those not deleted."""
        if not len(self.dead.chunks):
            return np.ones(len(ids), bool)
        return ~np.isin(ids, self.dead.chunks, assume_unique=False)

    def live_selection(self):
        """This segment's live ids as an ID-selector bitmap object (for many deletions)."""
        with self._lock:
            if self._live_bits is None:
                mask = np.zeros(self.hi + 1, bool)
                mask[self.segment.ids] = True
                mask[self.dead.chunks[self.dead.chunks <= self.hi]] = False
                self._live_bits = _Bits(mask)
        return self._live_bits


class _Bits:
    """A boolean mask over ids in the form VectorIndex.search_filtered takes."""

    def __init__(self, mask: np.ndarray):
        self.mask = mask
        self.count = int(mask.sum())
        self.bitmap = np.packbits(mask, bitorder="little")

    def __len__(self) -> int:
        return self.count


def open_parts(folder: Path, manifest, device: str = "cpu", reuse: dict | None = None, light: bool = False) -> list[Part]:
    """The manifest's segments, each opened (or taken from `reuse`: {Segment.key: Segment})
    with its tombstones; `light`: small flat segments searched with numpy (see LIGHT_ROWS)."""
    parts: list[Part] = []
    opened: list[Segment] = []
    try:
        for entry in manifest.segments:
            seg = None
            if reuse:
                seg = reuse.get(segment_key(entry))
                if seg is not None and (seg.entry.get("index") or {}).get("params") != (entry.get("index") or {}).get("params"):
                    seg = None  # its search knobs were tuned again (folder.tune): opened with the new ones
            if seg is None:
                seg = Segment(folder, entry, device, light)
                opened.append(seg)
            dead = Tombstones()
            name = entry.get("deletes")
            if name:
                dead = (reuse or {}).get(("deletes", name))
                if dead is None:
                    integrity.check_file(folder, name, ((entry.get("integrity") or {}).get("files") or {}).get(name))
                    dead = Tombstones.load(Path(folder) / name)
            parts.append(Part(seg, dead, entry))
        for group in _by_partition(parts):  # within a partition (or an index without), increasing id ranges
            held = [parts[j] for j in group if parts[j].entry.get("rows", 1)]
            for a, b in zip(held, held[1:]):
                if a.hi >= b.lo >= 0:
                    raise damaged(folder, "manifest.json", f"segments {a.segment.id} and {b.segment.id} overlap in chunk ids")
    except BaseException:
        for s in opened:
            s.close()
        raise
    return parts


# ---- the generation's docstore ------------------------------------------------------------------
class SegmentedDocs:
    """One generation's chunks and files across its segments, with the read interface of a
    DocStore: deleted chunks and files are never given out."""

    readonly = True

    def __init__(self, folder: Path, parts: list[Part], counts: dict[str, int]):
        self.folder, self.parts = Path(folder), parts
        self._counts = dict(counts)
        self._memo = Memo()
        self.path = self.folder  # for messages

    def memo(self, key: Any, build):
        return self._memo(key, build)

    def segments(self) -> dict:
        """{Segment.key: Segment} and {("deletes", file): Tombstones} of this generation, for the
        next one to reuse (both are immutable once published)."""
        out: dict = {p.segment.key: p.segment for p in self.parts}
        out.update({("deletes", p.entry["deletes"]): p.dead for p in self.parts if p.entry.get("deletes")})
        return out

    def close(self) -> None:
        for p in self.parts:
            p.segment.close()

    def counts(self) -> dict[str, int]:
        return dict(self._counts)

    def _route(self, ids: Iterable[int]) -> list[tuple[Part, list[int]]]:
        """The ids grouped by the part holding them (ids no part holds are dropped)."""
        ids = sorted({int(i) for i in ids})
        if not ids or not self.parts:
            return []
        at = _part_of(self.parts, np.array(ids, np.int64))
        out: dict[int, list[int]] = {}
        for i, j in zip(ids, at.tolist()):
            if j >= 0:
                out.setdefault(j, []).append(i)
        routed = []
        for j, part_ids in sorted(out.items()):
            p = self.parts[j]
            arr = np.array(part_ids, np.int64)
            arr = arr[p.keep(arr)]
            if len(arr):
                routed.append((p, arr.tolist()))
        return routed

    def held(self, ids: Iterable[int]) -> np.ndarray:
        """The ids, of those given, that a live chunk of these segments holds (sorted)."""
        got = [i for _, part_ids in self._route(ids) for i in part_ids]
        return np.array(sorted(got), np.int64)

    def get_chunks(self, ids: Iterable[int]) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for p, part_ids in self._route(ids):
            out.update(p.segment.docs.get_chunks(part_ids))
        return out

    def get_vectors(self, ids: Iterable[int]) -> tuple[np.ndarray, np.ndarray]:
        got = [p.segment.vectors_of(part_ids) for p, part_ids in self._route(ids)]
        got = [g for g in got if len(g[0])]
        if not got:
            return np.zeros(0, np.int64), np.zeros((0, 0), np.float32)
        ids, vecs = np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got])
        if len(got) > 1 and not (np.diff(ids) > 0).all():  # by id, as one docstore gives them (partitions interleave)
            order = np.argsort(ids, kind="stable")
            ids, vecs = ids[order], vecs[order]
        return ids, vecs

    def state_refs(self, ids: Iterable[int]) -> list[tuple[int, str | None, int | None, int | None]]:
        """[(chunk id, state file, first row, tokens)] of the given ids."""
        out = []
        for p, part_ids in self._route(ids):
            marks = ",".join("?" * len(part_ids))
            out += p.segment.docs.db.execute(f"SELECT id, state_file, state_off, state_len FROM chunks WHERE id IN ({marks})",
                                             part_ids).fetchall()
        return out

    def iter_vectors(self, batch: int = 8192) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for p in self.parts:
            yield from p.segment.iter_vectors(batch, p.keep)

    def iter_states_refs(self, batch: int = 4096) -> Iterator[list[tuple[int, str | None, int | None, int | None]]]:
        """[(chunk id, state file, first row, tokens)] of the live chunks, in batches."""
        rows: list = []
        for row in self.select("c.state_file, c.state_off, c.state_len"):
            rows.append(row)
            if len(rows) >= batch:
                yield rows
                rows = []
        if rows:
            yield rows

    def select(self, columns: str, where: str = "", params: tuple = ()) -> Iterator[tuple]:
        """(chunk id, *columns) of every live chunk, in id order: `columns` and `where` are SQL
        over `chunks c JOIN files f ON f.id = c.file_id`."""
        sql = select_sql(columns, where)
        for p in self.parts:
            dead = set(p.dead.chunks.tolist()) if len(p.dead.chunks) else None
            try:
                for row in p.segment.docs.db.execute(sql, params):
                    if dead is None or row[0] not in dead:
                        yield row
            except DB_ERRORS as e:
                raise damaged(self.folder, p.segment.name, f"damaged ({e})") from e

    def files(self) -> dict[str, StoredFile]:
        out: dict[str, StoredFile] = {}
        for p in self.parts:
            add_files(out, live_files(p.segment.docs, p.dead))
        return out

    def files_matching(self, globs: list[str]) -> np.ndarray:
        got = []
        for p in self.parts:
            ids = p.segment.docs.files_matching(globs)
            if len(p.dead.files):
                ids = ids[~np.isin(ids, p.dead.files)]
            got.append(ids)
        return np.concatenate(got) if got else np.zeros(0, np.int64)

    def lexical(self) -> LexicalIndex | None:
        """BM25 over the live chunks of every segment (None where a segment predates lexical search)."""
        postings, deleted = [], []
        for run in small_runs(self.parts, flat_only=False):
            posts = [p.segment.postings() for p in run]
            if any(post is None for post in posts):
                return None
            dead = []
            for p, post in zip(run, posts):
                if len(p.dead.chunks) and len(post.ids):
                    pos = np.searchsorted(post.ids, p.dead.chunks).clip(0, len(post.ids) - 1)
                    dead.append(pos[post.ids[pos] == p.dead.chunks])
                else:
                    dead.append(np.zeros(0, np.int64))
            if len(run) == 1:
                postings.append(posts[0])
                deleted.append(dead[0] if len(dead[0]) else None)
                continue
            key = ("postings-run",) + tuple(p.segment.key for p in run)
            combined = run[-1].segment.memo(key, lambda posts=posts: Postings.combine(posts))
            offsets = np.cumsum([0] + [len(post) for post in posts[:-1]])
            d = np.concatenate([o + x for o, x in zip(offsets, dead)])
            postings.append(combined)
            deleted.append(d if len(d) else None)
        try:
            return LexicalIndex(postings, deleted)
        except ValueError as e:
            raise IndexFormatError(f"{self.folder}: damaged lexical index ({e})") from e


# ---- the generation's vector index --------------------------------------------------------------
class SegmentedVectors:
    """Inner-product search over every segment's vector index, top-k merged, deleted chunks left out."""

    def __init__(self, parts: list[Part], index_entry: dict[str, Any], device: str = "cpu"):
        self.parts = parts
        self.kind = index_entry.get("type", "flat")
        self.params = dict(index_entry.get("params") or {})
        self.device = device if any(p.segment.vectors.device == "cuda" for p in parts) else "cpu"
        self._runs: list | None = None
        self._runs_lock = threading.Lock()

    def runs(self) -> list:
        """Each part alone, or runs of small flat parts as one _Small (made on first use)."""
        if self._runs is None:
            with self._runs_lock:
                if self._runs is None:
                    runs: list = []
                    for run in small_runs(self.parts, flat_only=True):
                        if not any(p.live for p in run):
                            continue
                        if len(run) > 1 and any(p.segment.light and isinstance(p.segment.vectors, MatrixIndex) for p in run):
                            runs += [p for p in run if p.live]  # a one-shot reader: each searched with numpy
                        else:
                            runs.append(run[0] if len(run) == 1 else _Small(run))
                    self._runs = runs
        return self._runs

    @property
    def ntotal(self) -> int:
        return sum(p.live for p in self.parts)

    def _one(self, p: Part, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        vi = p.segment.vectors
        ndel = len(p.dead.chunks)
        if not ndel:
            return vi.search(q, k)
        if ndel <= DEL_SMALL:
            s, i = vi.search(q, k + ndel)
            drop = np.isin(i, p.dead.chunks)
            s = np.where(drop, -np.inf, s)
            i = np.where(drop, -1, i)
            return s, i
        return vi.search_filtered(q, k, p.live_selection())

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores (n, k), ids (n, k)); rows may hold fewer than k hits, padded with id -1."""
        q = np.ascontiguousarray(queries, np.float32)
        got = [r.search(q, k) if isinstance(r, _Small) else self._one(r, q, k) for r in self.runs()]
        return _merge(got, len(q), k)

    def search_filtered(self, queries: np.ndarray, k: int, allowed) -> tuple[np.ndarray, np.ndarray]:
        """search() among the allowed ids (a Selection over global ids, deleted ones not in it).
        An approximate segment that finds fewer than k of them (its probed lists hold few) is
        searched exactly among its own allowed chunks: so each segment gives its best k, and the
        answer is the same whichever shards the segments are spread over (shards.py)."""
        q = np.ascontiguousarray(queries, np.float32)
        got = []
        for r in self.runs():
            if isinstance(r, _Small):
                got.append(r.search(q, k, allowed))
            else:
                found = r.segment.vectors.search_filtered(q, k, allowed, _share(r, allowed))
                got.append(_exact_where_short(r, q, k, allowed, *found))
        return _merge(got, len(q), k)

    def reconstruct(self, ids: np.ndarray) -> np.ndarray | None:
        """The stored vectors of the given (live) ids, in their order; None where a segment's index
        does not keep full vectors (the docstore has them)."""
        ids = np.asarray(ids, np.int64)
        if not len(ids):
            return np.zeros((0, 0), np.float32)
        out = None
        at = _part_of(self.parts, ids)
        for j in np.unique(at).tolist():
            if j < 0:
                return None
            sel = np.flatnonzero(at == j)
            v = self.parts[j].segment.vectors.reconstruct(ids[sel])
            if v is None:
                return None
            if out is None:
                out = np.empty((len(ids), v.shape[1]), np.float32)
            out[sel] = v
        return out


def _by_partition(parts: list[Part]) -> list[list[int]]:
    """Positions in parts grouped by the partition by document their segments hold (one group in
    an index without partitions; store/partition.py), each group in list order."""
    groups: dict[Any, list[int]] = {}
    for j, p in enumerate(parts):
        groups.setdefault(p.entry.get("part"), []).append(j)
    return list(groups.values())


def _part_of(parts: list[Part], ids: np.ndarray) -> np.ndarray:
    """For each id, the index in parts of the part whose id range holds it (-1: none). Within
    one partition by document (or an index without) segments hold increasing, disjoint id
    ranges; the partitions' ranges interleave, so in a partitioned index (even where these parts
    are one partition's: a shard's) a segment whose range holds an id is taken only if the id is
    among its own (sorted) ids."""
    groups = _by_partition(parts)
    out = np.full(len(ids), -1, np.int64)
    interleaved = len(groups) > 1 or any(partitioned(p.entry) for p in parts)
    for group in groups:
        held = [j for j in group if parts[j].lo >= 0]
        if not held:
            continue
        los = np.array([parts[j].lo for j in held], np.int64)
        his = np.array([parts[j].hi for j in held], np.int64)
        at = np.searchsorted(los, ids, "right") - 1
        ok = (at >= 0) & (ids <= his[at.clip(0)]) & (out < 0)
        cand = np.array(held, np.int64)[at.clip(0)]
        if interleaved:
            for j in np.unique(cand[ok]).tolist():
                sel = np.flatnonzero(ok & (cand == j))
                own = parts[j].segment.ids
                if not len(own):
                    ok[sel] = False
                    continue
                ok[sel] = own[np.searchsorted(own, ids[sel]).clip(0, len(own) - 1)] == ids[sel]
        out[ok] = cand[ok]
    return out


class _Small:
    """Adjacent small flat segments searched as one, exactly, from memory: their vectors in one
    matrix (kept with the last segment across generations while the group is the same)."""

    def __init__(self, run: list[Part]):
        key = ("matrix-run",) + tuple(p.segment.key for p in run)

        def build():
            import faiss

            ids = np.concatenate([p.segment.ids for p in run])
            # a segment without chunks (a first run over files without text) may not know the
            # dimension: the others' is the index's
            filled = [p for p in run if len(p.segment.ids)]
            flat = faiss.IndexFlatIP((filled or run)[0].segment.vectors.d)
            for p in filled:
                flat.add(np.ascontiguousarray(p.segment.vectors.reconstruct(p.segment.ids), np.float32))
            return ids, flat

        self.ids, self.flat = run[-1].segment.memo(key, build)
        dead = [p.dead.chunks for p in run if len(p.dead.chunks)]
        self.live = ~np.isin(self.ids, np.concatenate(dead)) if dead else None

    def search(self, q: np.ndarray, k: int, allowed=None) -> tuple[np.ndarray, np.ndarray]:
        """Exact top k over the group's rows (FAISS's flat scan on one thread: for a few
        thousand rows faster than a BLAS call, whose threads then contend with the encoder's)."""
        import faiss

        from semsearch.store.vectors import one_omp_thread

        keep = self.live
        if allowed is not None:
            inside = self.ids < len(allowed.mask)
            ok = np.zeros(len(self.ids), bool)
            ok[inside] = allowed.mask[self.ids[inside]]
            keep = ok if keep is None else keep & ok
        k_ = min(k, len(self.ids))
        if not k_:
            return np.zeros((len(q), 0), np.float32), np.zeros((len(q), 0), np.int64)
        params = None
        if keep is not None:
            params = faiss.SearchParameters(sel=faiss.IDSelectorBitmap(np.packbits(keep, bitorder="little")))
        with one_omp_thread():
            s, rows = self.flat.search(q, k_, params=params)
        return s, np.where(rows >= 0, self.ids[rows.clip(0)], -1)


def _share(part: "Part", allowed) -> float:
    """The share of an approximate segment's rows a filter's Selection lets through, the same in
    one process and in every shard: counted over the segment's id range, or, in a partitioned
    index (whose partitions' ranges interleave), on its own ids; 1.0 where not known."""
    from semsearch.store.vectors import IVF_TYPES

    rows = int(part.entry.get("rows") or 0)
    if part.segment.vectors.kind not in IVF_TYPES or not hasattr(allowed, "mask") or part.lo < 0 or not rows:
        return 1.0
    if partitioned(part.entry):
        got = np.count_nonzero(allowed.rows(part.segment.ids))
    else:
        got = np.count_nonzero(allowed.mask[part.lo : part.hi + 1])
    return max(float(got), 1.0) / rows


def _exact_where_short(part: "Part", q: np.ndarray, k: int, allowed, scores: np.ndarray, ids: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray]:
    """A segment's filtered (scores, ids), with the queries for which it found fewer than k of its
    allowed chunks answered exactly among them (from its stored vectors)."""
    found = (ids >= 0).sum(1)
    if (found >= k).all():
        return scores, ids
    lo, hi = part.lo, part.hi
    cand = np.asarray(allowed.ids, np.int64)
    cand = cand[(cand >= lo) & (cand <= hi)]
    own = part.segment.ids
    cand = cand[own[np.searchsorted(own, cand).clip(0, max(len(own) - 1, 0))] == cand] if len(own) else cand[:0]
    short = found < min(k, len(cand))
    if not short.any():
        return scores, ids
    vecs = part.segment.vectors.reconstruct(cand)
    if vecs is None:  # (an index that does not keep full vectors: its vector file has them)
        cand, vecs = part.segment.vectors_of(cand)
    s = np.asarray(q[short], np.float32) @ np.asarray(vecs, np.float32).T
    es, ei = _top(s, np.broadcast_to(cand, s.shape), k)
    width = max(k, scores.shape[1])
    out_s = np.full((len(q), width), -np.inf, np.float32)
    out_i = np.full((len(q), width), -1, np.int64)
    out_s[:, : scores.shape[1]], out_i[:, : ids.shape[1]] = scores, ids
    out_s[short] = -np.inf
    out_i[short] = -1
    out_s[short, : es.shape[1]], out_i[short, : ei.shape[1]] = es, ei
    return out_s, out_i


def _merge(got: list[tuple[np.ndarray, np.ndarray]], nq: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The best k of several (scores, ids) lists per query (ids -1: none)."""
    if not got:
        return np.full((nq, 0), -np.inf, np.float32), np.full((nq, 0), -1, np.int64)
    if len(got) == 1:
        s, i = got[0]
        if s.shape[1] > k:
            s, i = _top(s, i, k)
        return s, i
    s = np.concatenate([np.where(g[1] >= 0, g[0], -np.inf) for g in got], 1).astype(np.float32)
    i = np.concatenate([g[1] for g in got], 1)
    return _top(s, i, k)


def _top(s: np.ndarray, i: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    s = np.where(i >= 0, s, -np.inf)
    k_ = min(k, s.shape[1])
    order = np.lexsort((i, -s), axis=1)[:, :k_] if s.shape[1] else np.zeros((len(s), 0), np.int64)
    ts, ti = np.take_along_axis(s, order, 1), np.take_along_axis(i, order, 1)
    ti = np.where(np.isfinite(ts), ti, -1)
    return ts, ti


def live_counts(parts_or_entries) -> dict[str, int]:
    """The index's counts from its segment entries."""
    files = docs = chunks = 0
    for e in parts_or_entries:
        files += int(e["files"])
        docs += int(e["documents"])
        chunks += int(e["live"])
    return {"files": files, "documents": docs, "chunks": chunks}


__all__ = ["Part", "Segment", "SegmentedDocs", "SegmentedVectors", "Tombstones", "open_parts", "live_counts"]


def read_rows(folder: Path, manifest, columns: str, where: str = "", params: tuple = ()) -> Iterator[tuple]:
    """(chunk id, *columns) of every live chunk of a published generation, in id order, reading
    only the docstores (no vector index is loaded): for training and tools. `columns` and `where`
    are SQL over `chunks c JOIN files f ON f.id = c.file_id`."""
    from semsearch.store.files import connect_readonly

    sql = select_sql(columns, where)
    for e in manifest.segments:
        integrity.check_segment_files(folder, e)
        dead = set(Tombstones.load(Path(folder) / e["deletes"]).chunks.tolist()) if e.get("deletes") else set()
        for name in docs_files(e):
            db = connect_readonly(Path(folder) / name)
            try:
                for row in db.execute(sql, params):
                    if row[0] not in dead:
                        yield row
            except DB_ERRORS as ex:
                raise damaged(folder, name, f"damaged ({ex})") from ex
            finally:
                db.close()


def has_lexical(folder: Path, manifest) -> bool:
    """Whether every segment's docstore holds lexical terms."""
    from semsearch.store.files import connect_readonly

    for e in manifest.segments:
        for name in docs_files(e):
            db = connect_readonly(Path(folder) / name)
            try:
                if not lexical.has_terms(db):
                    return False
            finally:
                db.close()
    return True
