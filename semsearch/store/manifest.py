"""The manifest: everything needed to query an index folder correctly, as JSON.

Format 2: the index is an ordered list of immutable segments (each a docstore `docs.<s>.sqlite`
and a vector index `vectors.<s>.faiss`, with an optional tombstone file `del.<s>.<g>.bin` naming
the chunks and files deleted from it since). Segments hold disjoint, increasing ranges of chunk
ids, in list order. Format 1 (one docstore and one vector index) reads as one segment.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from semsearch.errors import IndexFormatError
from semsearch.store.files import DATA_FILE, damaged, fsync_dir, remedy

FORMAT_VERSION = 6
# Format 1 opens as one segment. Format 2 opens as it is: its fast-scan segments hold their full
# vectors inside the faiss file (RFlat). Format 3 gave fast-scan segments `vectors.<s>.vec`; since
# format 4 every segment has one, and it is the only full copy of its vectors (the docstore's
# column stays empty). Since format 5 the posting file is the only copy of a segment's lexical
# terms (the docstore's `lex` column stays empty too; a writer of format 4 would invert that
# column again, so it may not write these). Segments of older formats open as they are (their
# docstores still hold their vectors and terms, and are read from there). Since format 6 a
# fast-scan segment's vector file keeps its rows list by list (store/vecfile.py: ordered files,
# which a format-5 reader cannot read); older segments keep id order. The next write
# publishes the current format, and `semsearch compact` rewrites every segment.
# Format 7 is format 6 partitioned by document (`shards` > 1, store/partition.py): the
# partitions' chunk ids interleave across segments, which a format-6 reader would look up in the
# wrong segment (a replica of an older version beside newer ones, say), so it refuses the index
# instead. An index of one partition is still written as format 6, which readers of either open.
PARTED_VERSION = 7
# Format 8: a segment may keep several docstores (`docs_more`: those a long run's segments wrote,
# left in place by the merge at its end; store/docstore.py DocStores), whose chunks a reader of
# format 7 would not see. Written only where a segment has them.
IN_PLACE_VERSION = 8
# Format 9: a partitioned index where a file of records has its records in several partitions,
# so its file row is in several segments (store/partition.py). A writer of format 8 would delete
# or replace such a file in one segment only, leaving its other records searchable.
SPREAD_VERSION = 9
# Format 10: a segment may keep several vector files (`vecs_more`: those of a long run's
# segments, each rewritten in the merged index's list order and left in place by the merge at
# its end, store/keepvecs.py), and a segment's vector file may be named `vectors.<s>.<m>.vec`
# (the file of segment s rewritten for merged segment m). A reader of format 9 would see the
# first file's vectors only. Written only where a segment has them.
MULTI_VEC_VERSION = 10
READABLE = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
MANIFEST = "manifest.json"


@dataclass
class Manifest:
    model: str  # name or folder the encoder was loaded from
    model_fingerprint: str  # sha256 prefix of the weights
    backend: str  # 'native' or 'sentence-transformers'
    pooling: str  # cls | mean | max | head
    dim: int
    max_length: int
    precision: str
    chunking: dict[str, int]  # window, overlap
    head: dict[str, Any] | None = None  # {'path', 'fingerprint'} for pooling 'head'
    model_files: dict[str, list[int]] = field(default_factory=dict)  # {file: [size, mtime_ns]}: skip re-hashing when unchanged
    states: dict[str, Any] | None = None  # {'dtype', 'dim'} when token states are kept (re-pooling)
    metric: str = "cosine"  # inner product of L2-normalised vectors, in [-1, 1]
    normalized: bool = True
    index: dict[str, Any] = field(default_factory=lambda: {"type": "flat"})
    counts: dict[str, int] = field(default_factory=lambda: {"files": 0, "documents": 0, "chunks": 0})
    generation: int = 0
    segments: list[dict[str, Any]] = field(default_factory=list)  # see semsearch/store/segments.py
    next_ids: dict[str, int] = field(default_factory=dict)  # 'chunk', 'file', 'segment': the next free ids
    created: str = ""
    updated: str = ""
    last_run: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    shards: int = 1  # partitions by document (store/partition.py); 1: none

    @property
    def files(self) -> dict[str, str]:
        """The data files of the first segment (an index built in one run has one segment)."""
        if not self.segments:
            return {}
        return {"docs": self.segments[0]["docs"], "vectors": self.segments[0]["vectors"]}

    def data_files(self) -> set[str]:
        """Every data file this manifest names."""
        out: set[str] = set()
        for s in self.segments:
            out |= {s["docs"], s["vectors"], *(s.get("docs_more") or ()), *(s.get("vecs_more") or ())}
            out |= {s[k] for k in ("deletes", "vecs", "postings") if s.get(k)}
        return out

    def to_json(self) -> str:
        # The fields as they are (asdict() deep-copies every segment entry first: a few ms a write).
        return json.dumps({f: getattr(self, f) for f in self.__dataclass_fields__}, indent=1, sort_keys=True)

    def save(self, folder: Path) -> None:
        """Write manifest.json atomically: the new generation becomes visible in one rename."""
        tmp = folder / (MANIFEST + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(self.to_json())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, folder / MANIFEST)
        fsync_dir(folder)  # the rename itself survives a power loss

    @classmethod
    def load(cls, folder: Path) -> "Manifest":
        path = Path(folder) / MANIFEST
        if not Path(folder).is_dir():
            raise IndexFormatError(f"no index at {str(folder)!r}: run `semsearch index CORPUS --index {folder}` first")
        if not path.exists():
            raise IndexFormatError(f"{folder} is not a semsearch index (no {MANIFEST})")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, OSError) as e:
            raise IndexFormatError(f"{path}: damaged manifest ({e}); {remedy(folder)}") from e
        version = raw.get("format_version") if isinstance(raw, dict) else None
        if version == 1 and isinstance(raw, dict):
            raw = upgrade_v1(raw, path)
        elif version not in READABLE:
            raise IndexFormatError(
                f"{folder} was written by index format version {version}; this semsearch reads versions "
                f"{', '.join(map(str, READABLE))}. Rebuild it with `semsearch index CORPUS --index {folder} --rebuild`."
            )
        check_manifest(raw, path)
        known = {k: v for k, v in raw.items() if k in cls.__dataclass_fields__}
        try:
            return cls(**known)
        except TypeError as e:
            raise IndexFormatError(f"{path}: damaged manifest ({e}); {remedy(folder)}") from e


# ---- the manifest's own shape ------------------------------------------------------------------
_TYPES: dict[str, type | tuple[type, ...]] = {
    "model": str, "model_fingerprint": str, "backend": str, "pooling": str, "dim": int, "max_length": int,
    "precision": str, "chunking": dict, "counts": dict, "index": dict, "segments": list, "next_ids": dict, "generation": int,
    "head": (dict, type(None)), "states": (dict, type(None)), "model_files": dict, "last_run": dict,
    "created": str, "updated": str, "metric": str, "normalized": bool, "shards": int,
}


def check_manifest(raw: Any, path: Path) -> None:
    """Refuse a manifest whose fields have the wrong types, or whose file names are not plain
    data-file names inside the folder (a crafted '../other/x' or absolute path would be read)."""
    folder = Path(path).parent
    if not isinstance(raw, dict):
        raise damaged(folder, path.name, "damaged manifest (not a JSON object)")
    for key, typ in _TYPES.items():
        if key in raw and (not isinstance(raw[key], typ) or (typ is int and isinstance(raw[key], bool))):
            raise damaged(folder, path.name, f"damaged manifest ({key!r} is {type(raw[key]).__name__})")
    for key, need in (("chunking", {"window", "overlap"}), ("counts", {"files", "documents", "chunks"})):
        if key in raw and not need <= set(raw[key]):
            raise damaged(folder, path.name, f"damaged manifest ({key} lacks {', '.join(sorted(need - set(raw[key])))})")
        for k, v in raw.get(key, {}).items():
            if not isinstance(v, int) or isinstance(v, bool):
                raise damaged(folder, path.name, f"damaged manifest ({key}.{k} is not an integer)")
    index, head, states = raw.get("index", {}), raw.get("head"), raw.get("states")
    if not isinstance(index.get("params", {}), dict):
        raise damaged(folder, path.name, "damaged manifest (index.params is not an object)")
    if head is not None and not (isinstance(head.get("path"), str) and isinstance(head.get("fingerprint"), str)):
        raise damaged(folder, path.name, "damaged manifest (head needs a path and a fingerprint)")
    if states is not None and not (states.get("dtype") == "float16" and isinstance(states.get("dim"), int)
                                   and not isinstance(states.get("dim"), bool) and states["dim"] > 0):
        raise damaged(folder, path.name, "damaged manifest (states needs dtype float16 and a dim)")
    segs = raw.get("segments", [])
    if not isinstance(segs, list) or not all(isinstance(x, dict) for x in segs):
        raise damaged(folder, path.name, "damaged manifest (segments is not a list of objects)")
    for x in segs:
        check_segment(x, folder, path.name)
    chunks = (raw.get("counts") or {}).get("chunks", 0)
    if not segs and _is_int(chunks) and chunks > 0:  # (a format-1 manifest was given its list by upgrade_v1)
        raise damaged(folder, path.name, f"damaged manifest (it counts {chunks} chunks but names no segment)")
    ids = raw.get("next_ids", {})
    if not isinstance(ids, dict) or not all(_is_int(v) for v in ids.values()):
        raise damaged(folder, path.name, "damaged manifest (next_ids)")
    if raw.get("dim", 1) < 1 or raw.get("max_length", 3) < 3:
        raise damaged(folder, path.name, "damaged manifest (dim or max_length out of range)")
    if raw.get("index", {}).get("type", "flat") not in ("flat", "ivf", "ivf-fastscan", "ivf-sq8", "hnsw"):
        raise damaged(folder, path.name, f"damaged manifest (unknown index type {raw['index'].get('type')!r})")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _vector_file(v) -> bool:
    """A vector file's name: `vectors.<s>.vec`, or `vectors.<s>.<m>.vec` (format 10)."""
    return isinstance(v, str) and bool(DATA_FILE.fullmatch(v)) and v.startswith("vectors.") and v.endswith(".vec")


def check_segment(x: dict, folder: Path, name: str) -> None:
    """One segment entry: plain data-file names of this folder, integer counts, integrity records."""
    sid = x.get("id")
    if not _is_int(sid) or sid < 0:
        raise damaged(folder, name, "damaged manifest (a segment without an id)")
    for role, ext in (("docs", "sqlite"), ("vectors", "faiss")):
        v = x.get(role)
        if not isinstance(v, str) or not DATA_FILE.fullmatch(v) or not v.startswith(role + ".") or not v.endswith(ext):
            raise damaged(folder, name, f"damaged manifest (segment {sid}: file {role!r} is {v!r}, not a data file of this folder)")
    more = x.get("docs_more")
    if more is not None and not (isinstance(more, list) and all(
            isinstance(f, str) and DATA_FILE.fullmatch(f) and f.startswith("docs.") and f.endswith(".sqlite") for f in more)):
        raise damaged(folder, name, f"damaged manifest (segment {sid}: docs_more is not a list of docstores of this folder)")
    v = x.get("vecs")
    if v is not None and not _vector_file(v):
        raise damaged(folder, name, f"damaged manifest (segment {sid}: vecs {v!r} is not a data file of this folder)")
    vmore = x.get("vecs_more")
    if vmore is not None and not (v is not None and isinstance(vmore, list) and all(_vector_file(f) for f in vmore)):
        raise damaged(folder, name, f"damaged manifest (segment {sid}: vecs_more is not a list of vector files of this folder)")
    pf = x.get("postings")
    if pf is not None and not (isinstance(pf, str) and DATA_FILE.fullmatch(pf) and pf == f"lexical.{sid}.bin"):
        raise damaged(folder, name, f"damaged manifest (segment {sid}: postings {pf!r} is not a data file of this folder)")
    d = x.get("deletes")
    if d is not None and not (isinstance(d, str) and DATA_FILE.fullmatch(d) and d.startswith("del.")):
        raise damaged(folder, name, f"damaged manifest (segment {sid}: deletes {d!r} is not a data file of this folder)")
    for key in ("rows", "live", "files", "documents"):
        if not _is_int(x.get(key)) or x[key] < 0:
            raise damaged(folder, name, f"damaged manifest (segment {sid}: {key} is not a count)")
    for key in ("min_id", "max_id"):
        if x.get(key) is not None and not _is_int(x[key]):
            raise damaged(folder, name, f"damaged manifest (segment {sid}: {key})")
    for key in ("part", "parts"):  # its partition by document of how many (store/partition.py)
        if x.get(key) is not None and (not _is_int(x[key]) or x[key] < 0):
            raise damaged(folder, name, f"damaged manifest (segment {sid}: {key})")
    if not isinstance(x.get("index", {}), dict) or not isinstance(x.get("index", {}).get("params", {}), dict):
        raise damaged(folder, name, f"damaged manifest (segment {sid}: index)")
    if x.get("index", {}).get("type", "flat") not in ("flat", "ivf", "ivf-fastscan", "ivf-sq8", "hnsw"):
        raise damaged(folder, name, f"damaged manifest (segment {sid}: unknown index type {x['index'].get('type')!r})")
    if not isinstance(x.get("states", []), list) or not all(isinstance(v, str) for v in x.get("states", [])):
        raise damaged(folder, name, f"damaged manifest (segment {sid}: states)")
    rec = x.get("integrity")
    if rec is not None:
        recs = rec.get("files") if isinstance(rec, dict) else None
        names = {x["docs"], x["vectors"], *(more or ()), *(vmore or ())} | {f for f in (d, v, pf) if f}
        if not isinstance(recs, dict) or not all(
                isinstance(v, dict) and _is_int(v.get("size")) and isinstance(v.get("fingerprint"), str)
                and isinstance(v.get("sha256"), str) for v in recs.values()) \
                or not _is_int(rec.get("ntotal")) or not isinstance(rec.get("ids"), str) or not set(recs) <= names:
            raise damaged(folder, name, f"damaged manifest (segment {sid}: integrity records)")


def upgrade_v1(raw: dict, path: Path) -> dict:
    """A format-1 manifest (one docstore, one vector index) as format 2: one segment holding
    them, no deletions. Nothing on disk changes until the next write publishes format 2."""
    folder = Path(path).parent
    raw = dict(raw)
    files = raw.pop("files", None)
    integrity = raw.pop("integrity", None)
    if not isinstance(files, dict) or set(files) != {"vectors", "docs"}:
        raise damaged(folder, path.name, f"damaged manifest (files {sorted(files or {})}, expected docs and vectors)")
    counts = raw.get("counts") if isinstance(raw.get("counts"), dict) else {}
    gen = raw.get("generation", 0)
    seg = {"id": gen if _is_int(gen) else 0, "docs": files["docs"], "vectors": files["vectors"], "deletes": None,
           "rows": counts.get("chunks", 0), "live": counts.get("chunks", 0), "files": counts.get("files", 0),
           "documents": counts.get("documents", 0), "min_id": None, "max_id": None,
           "index": raw.get("index", {"type": "flat"}), "integrity": integrity, "states": None}
    if seg["states"] is None:
        seg.pop("states")
    raw["segments"] = [seg]
    raw["next_ids"] = {}
    raw["format_version"] = FORMAT_VERSION
    return raw
