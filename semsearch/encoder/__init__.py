"""The encoder: transformer token states, pooling, and the text -> vector Encoder."""
from semsearch.encoder.encoder import DEFAULT_MODEL, Encoder
from semsearch.encoder.pooling import POOLINGS

__all__ = ["DEFAULT_MODEL", "Encoder", "POOLINGS"]
