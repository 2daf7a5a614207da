"""Notices about queries: one longer than the model reads is cut, and the user is told."""
from __future__ import annotations

import logging
from typing import Sequence

log = logging.getLogger("semsearch.search")


def truncated(encoder, queries: Sequence[str]) -> list[int]:
    """Indexes of the queries longer than the encoder's max length (they are cut there)."""
    limit = encoder.max_length - 2  # [CLS] and [SEP]
    out = []
    for i, q in enumerate(queries):
        if len(q) <= limit:  # every token covers at least one character: cannot be too long
            continue
        if hasattr(encoder, "token_offsets"):
            if len(encoder.token_offsets(q)) > limit:
                out.append(i)
        elif getattr(encoder, "tokenizer", None) is not None:  # truncating tokenizer: overflow = cut
            if encoder.tokenizer.encode(q).overflowing:
                out.append(i)
    return out


def warn_truncated(encoder, queries: Sequence[str]) -> None:
    for i in truncated(encoder, queries):
        which = f"query {i + 1}" if len(queries) > 1 else "the query"
        log.warning("%s is longer than the model's %d tokens: only its first %d tokens are searched",
                    which, encoder.max_length, encoder.max_length - 2)
