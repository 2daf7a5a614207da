"""The manifest: everything needed to query an index folder correctly, as JSON."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from semsearch.errors import IndexFormatError
from semsearch.store.files import DATA_FILE, damaged, fsync_dir, remedy

FORMAT_VERSION = 1
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
    files: dict[str, str] = field(default_factory=dict)  # 'vectors', 'docs' -> file names of this generation
    created: str = ""
    updated: str = ""
    last_run: dict[str, Any] = field(default_factory=dict)
    integrity: dict[str, Any] | None = None  # sizes, fingerprints, hashes of the data files; vector count and id set
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

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
        if version != FORMAT_VERSION:
            raise IndexFormatError(
                f"{folder} was written by index format version {version}; this semsearch reads version "
                f"{FORMAT_VERSION}. Rebuild it with `semsearch index CORPUS --index {folder} --rebuild`."
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
    "precision": str, "chunking": dict, "counts": dict, "index": dict, "files": dict, "generation": int,
    "head": (dict, type(None)), "states": (dict, type(None)), "model_files": dict, "last_run": dict,
    "integrity": (dict, type(None)), "created": str, "updated": str, "metric": str, "normalized": bool,
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
    files = raw.get("files", {})
    if set(files) != {"vectors", "docs"}:
        raise damaged(folder, path.name, f"damaged manifest (files {sorted(files)}, expected docs and vectors)")
    for role, name in files.items():
        if role not in ("vectors", "docs") or not isinstance(name, str) or not DATA_FILE.fullmatch(name) \
                or not name.startswith(role + ".") or name.endswith(".sqlite") != (role == "docs"):
            raise damaged(folder, path.name, f"damaged manifest (file {role!r} is {name!r}, not a data file of this folder)")
    rec = raw.get("integrity")
    if rec is not None:
        recs = rec.get("files")
        if not isinstance(recs, dict) or not all(
                isinstance(v, dict) and _is_int(v.get("size")) and isinstance(v.get("fingerprint"), str)
                and isinstance(v.get("sha256"), str) for v in recs.values()) \
                or not _is_int(rec.get("ntotal")) or not isinstance(rec.get("ids"), str) \
                or not set(recs) <= set(raw.get("files", {}).values()):
            raise damaged(folder, path.name, "damaged manifest (integrity records)")
    if raw.get("dim", 1) < 1 or raw.get("max_length", 3) < 3:
        raise damaged(folder, path.name, "damaged manifest (dim or max_length out of range)")
    if raw.get("index", {}).get("type", "flat") not in ("flat", "ivf", "ivf-fastscan", "ivf-sq8", "hnsw"):
        raise damaged(folder, path.name, f"damaged manifest (unknown index type {raw['index'].get('type')!r})")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
