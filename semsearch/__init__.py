"""semsearch: sentence embeddings and semantic search over a folder of documents.

    from semsearch import Retriever
    hits = Retriever.load("indexes/default").search("loan approval", k=5)
"""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["Encoder", "Hit", "Retriever", "__version__"]


def __getattr__(name: str):
    # Lazy: `import semsearch` stays cheap; torch loads only when an encoder is made.
    if name in ("Retriever", "Hit"):
        from semsearch import search

        return getattr(search, name)
    if name == "Encoder":
        from semsearch.encoder.encoder import Encoder

        return Encoder
    raise AttributeError(f"module 'semsearch' has no attribute {name!r}")
