"""Token tables: what a tokenizer made of a text, as the rows kept beside its token states.

Light (no torch): the writers of an index call it whatever encoder they hold.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def table_of(tokenizer, texts: Sequence[str]) -> list[np.ndarray]:
    """Each text's tokens as `tokenizer` (framed, truncated as it is set) makes them: see
    encoding_table."""
    return [encoding_table(e) for e in tokenizer.encode_batch(list(texts))]


def encoding_table(e) -> np.ndarray:
    """A tokenizer's encoding as (T, 3) int32 rows of token id, character start and end in the
    text (-1, -1 for special tokens)."""
    t = np.empty((len(e.ids), 3), np.int32)
    t[:, 0] = e.ids
    if len(e.ids):
        t[:, 1:] = e.offsets
        t[np.asarray(e.special_tokens_mask, bool), 1:] = -1
    return t


def token_table(encoder, texts: Sequence[str]) -> list[np.ndarray | None]:
    """encoder.token_table(texts) where the encoder has one (the native encoder), else None for each."""
    fn = getattr(encoder, "token_table", None)
    return fn(list(texts)) if fn is not None else [None] * len(texts)
