"""The FAISS vector index behind a small interface, so the index type can change."""
from __future__ import annotations

from pathlib import Path

import numpy as np

INDEX_TYPES = ("flat",)


class VectorIndex:
    """Inner-product search over L2-normalised vectors with stable int64 ids."""

    def __init__(self, index, kind: str = "flat"):
        self.index = index
        self.kind = kind

    @classmethod
    def create(cls, dim: int, kind: str = "flat") -> "VectorIndex":
        import faiss

        if kind != "flat":
            raise ValueError(f"unknown index type {kind!r}; valid types are: {', '.join(INDEX_TYPES)}")
        return cls(faiss.IndexIDMap2(faiss.IndexFlatIP(dim)), kind)

    @classmethod
    def load(cls, path: Path, kind: str = "flat") -> "VectorIndex":
        import faiss

        return cls(faiss.read_index(str(path)), kind)

    def save(self, path: Path) -> None:
        import faiss

        faiss.write_index(self.index, str(path))

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        if len(ids):
            self.index.add_with_ids(np.ascontiguousarray(vectors, np.float32), np.ascontiguousarray(ids, np.int64))

    def remove(self, ids: np.ndarray) -> None:
        import faiss

        if len(ids):
            self.index.remove_ids(faiss.IDSelectorBatch(np.ascontiguousarray(ids, np.int64)))

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores (n, k), ids (n, k)); rows may hold fewer than k hits, padded with id -1."""
        q = np.ascontiguousarray(queries, np.float32)
        return self.index.search(q, min(k, max(self.ntotal, 1)))
