"""The manifest: everything needed to query an index folder correctly, as JSON."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from semsearch.errors import IndexFormatError
from semsearch.store.integrity import check_manifest, fsync_dir, remedy

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
