"""semsearch: sentence embeddings and semantic search over a folder of documents.

    import semsearch
    semsearch.index("data/sample")                                  # ./indexes/default
    hits = semsearch.Retriever.load().search("loan approval", k=5)
    semsearch.evaluate("beir/scifact", modes=["dense", "hybrid"])   # nDCG@10 ...
    semsearch.train("heads/x", beir="beir/scifact", index="indexes/scifact")

One function per command of the CLI (semsearch/api.py), beside Retriever.
"""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["Encoder", "Hit", "NotImproved", "Retriever", "__version__", "evaluate", "index", "train", "watch"]


def __getattr__(name: str):
    # Lazy: `import semsearch` stays cheap; torch loads only when an encoder is made.
    if name in ("Retriever", "Hit"):
        from semsearch import search

        return getattr(search, name)
    if name in ("index", "evaluate", "train", "NotImproved"):
        from semsearch import api

        return getattr(api, name)
    if name == "watch":  # the module (semsearch.watch.Watcher), as `import semsearch.watch` gives it
        import importlib

        return importlib.import_module("semsearch.watch")
    if name == "Encoder":
        from semsearch.encoder.encoder import Encoder

        return Encoder
    raise AttributeError(f"module 'semsearch' has no attribute {name!r}")
