"""Retriever: the one object a RAG pipeline needs — search(query, k) -> list[Hit]."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from semsearch.errors import InputError, SettingsMismatch
from semsearch.querycheck import warn_truncated
from semsearch.store.folder import index_path, open_index
from semsearch.store.integrity import manifest_stamp


@dataclass
class Hit:
    """One search result. `score` is the cosine similarity of query and chunk, in [-1, 1]."""

    rank: int
    score: float
    text: str
    source: str  # the source file, relative to the working directory where it can be
    path: str  # the source file, absolute
    start: int  # character offsets of the chunk in its document
    end: int
    row: int | None = None  # 1-based row / record for tabular files
    line: int | None = None  # 1-based line of the chunk's start for text files
    chunk: int = 0  # chunk number within its document
    id: int = 0  # the chunk's id in the index
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def location(self) -> str:
        """'path:line' for text files, 'path row N' for tabular ones."""
        if self.row is not None:
            return f"{self.source} row {self.row}"
        return f"{self.source}:{self.line}" if self.line else self.source

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["location"] = self.location
        return d


def _display(path: str) -> str:
    try:
        rel = os.path.relpath(path)
        return path if rel.startswith("..") else rel
    except ValueError:
        return path


class Retriever:
    """Search an index folder. Queries are encoded with the index's own model and pooling."""

    def __init__(self, folder: Path, manifest, vectors, docs, encoder):
        self.folder = Path(folder)
        self.manifest = manifest
        self.vectors = vectors
        self.docs = docs
        self.encoder = encoder
        self.auto_refresh = True  # search() picks up a new generation (one stat of manifest.json a call)
        self._stamp = manifest_stamp(self.folder)

    @classmethod
    def load(
        cls,
        index: str | os.PathLike | None = None,
        model: str | None = None,
        pooling: str | None = None,
        device: str = "auto",
        encoder=None,
        fast_start: bool = False,
    ) -> "Retriever":
        """Open an index folder (default: $SEMSEARCH_INDEX or ./indexes/default) for searching.

        `model` and `pooling`, when given, must match the index's; they are checks, not overrides.
        `fast_start` encodes queries with a torch-free numpy copy of the encoder (for one-shot
        processes: no 1.5-3 s torch import); otherwise the torch encoder (faster per query, in
        bf16 on CPUs that have AMX) is used. `device` places the encoder and, where faiss has GPU
        support, the vector index ('auto': a GPU where there is one).
        """
        from semsearch.store.vectors import resolve_index_device

        folder = index_path(index)
        # A one-shot process searches the index on the CPU unless told otherwise: starting CUDA
        # and copying the index to the GPU costs seconds, a CPU search milliseconds.
        m, vectors, docs = open_index(folder, resolve_index_device("cpu" if fast_start and device == "auto" else device))
        if pooling is not None and pooling != m.pooling:
            raise SettingsMismatch(f"{folder} was built with pooling {m.pooling!r}, not {pooling!r}; query it without --pooling, or rebuild it")
        if encoder is None:
            encoder = _query_encoder(folder, m, model, device, fast_start)
        if encoder.fingerprint != m.model_fingerprint:
            raise SettingsMismatch(
                f"the model {m.model!r} now has weights {encoder.fingerprint}, but {folder} was built with "
                f"{m.model_fingerprint}; rebuild the index with --rebuild"
            )
        return cls(folder, m, vectors, docs, encoder)

    def __len__(self) -> int:
        return self.vectors.ntotal

    def refresh(self) -> bool:
        """Open the index's current generation if a writer published a new one since this
        Retriever loaded it; gives back True when it did. The encoder is kept (a new generation
        with other model weights or pooling is refused). search() calls this on its own while
        `auto_refresh` is on: a stat of manifest.json, a few microseconds."""
        from semsearch.store.refresh import reopen

        return reopen(self)

    def search(self, query: str, k: int = 10) -> list[Hit]:
        """The k chunks most similar to query, best first."""
        if not isinstance(query, str):
            raise InputError(f"the query must be a string, got {type(query).__name__}")
        return self.search_batch([query], k)[0]

    def search_batch(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]:
        """search() for many queries at once (one encoder pass)."""
        if isinstance(queries, str):
            raise InputError("search_batch takes a list of queries; use search() for one")
        for i, q in enumerate(queries):
            if not isinstance(q, str):
                raise InputError(f"query {i + 1} must be a string, got {type(q).__name__}")
            if not q or not q.strip():
                raise InputError(f"query {i + 1} is empty" if len(queries) > 1 else "the query is empty")
        if k < 1:
            raise InputError(f"k must be at least 1, got {k}")
        if not queries:
            return []
        warn_truncated(self.encoder, queries)
        if self.auto_refresh and manifest_stamp(self.folder) != self._stamp:
            self.refresh()
        qv = self.encoder.encode(list(queries), progress=False)
        return self.search_vectors(qv, k)

    def search_vectors(self, qv: np.ndarray, k: int = 10) -> list[list[Hit]]:
        """Hits for query vectors (n, d), already normalised."""
        scores, ids = self.vectors.search(qv, k)
        found = self.docs.get_chunks(i for i in np.unique(ids) if i >= 0)
        out = []
        for srow, irow in zip(scores, ids):
            hits = []
            for s, i in zip(srow, irow):
                if i < 0 or int(i) not in found:  # FAISS pads with -1: never let it out
                    continue
                c = found[int(i)]
                hits.append(Hit(rank=len(hits) + 1, score=float(s), text=c["text"], source=_display(c["path"]),
                                path=c["path"], start=c["start"], end=c["end"], row=c["row"], line=c["line"],
                                chunk=c["chunk"], id=c["id"], metadata=c["metadata"]))
            out.append(hits)
        return out

    def close(self) -> None:
        self.docs.close()


def _query_encoder(folder: Path, m, model: str | None, device: str, fast_start: bool):
    """The encoder for queries on index m: torch-free where the model runs natively on the CPU."""
    from semsearch.encoder.models import fingerprint_folder, resolve_model, weight_stats

    if model is not None and resolve_model(model)[0] != m.model:
        raise SettingsMismatch(f"{folder} was built with model {m.model!r}, not {model!r}; query it without --model, or rebuild it")
    if m.head:
        from semsearch.train.head import head_info

        if head_info(m.head["path"])["fingerprint"] != m.head["fingerprint"]:
            raise SettingsMismatch(f"the pooling head at {m.head['path']} changed since {folder} was built; "
                                   "re-pool the index with `semsearch index CORPUS --head DIR`")
    _, where = resolve_model(m.model)
    if fast_start and m.backend == "native" and isinstance(where, Path) and device != "cuda":
        from semsearch.encoder.numpy_encoder import NumpyEncoder

        # Trust the recorded fingerprint while the weight files keep their size and time (as git does).
        fp = m.model_fingerprint if m.model_files and weight_stats(where) == m.model_files else fingerprint_folder(where)
        return NumpyEncoder(where, m.model, fp, m.pooling, m.max_length, m.head["path"] if m.head else None)
    from semsearch.encoder.encoder import Encoder
    from semsearch.train.head import load_head

    enc = Encoder(m.model, pooling=m.pooling, device=device, max_length=m.max_length,
                  head=load_head(m.head["path"]) if m.head else None)
    enc.head_info = m.head
    return enc
