"""The encoder: transformer token states, pooling, and the text -> vector Encoder.

Attributes load lazily so that light submodules (models, numpy_encoder) never import torch.
"""
from __future__ import annotations

__all__ = ["DEFAULT_MODEL", "Encoder", "POOLINGS"]

DEFAULT_MODEL = "all-MiniLM-L6-v2"
POOLINGS = ("cls", "mean", "max")


def __getattr__(name: str):
    if name == "Encoder":
        from semsearch.encoder.encoder import Encoder

        return Encoder
    raise AttributeError(f"module 'semsearch.encoder' has no attribute {name!r}")
