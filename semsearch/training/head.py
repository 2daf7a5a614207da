"""Saving a trained attention-pooling head (the format: semsearch/encoder/heads.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from semsearch.encoder.heads import write_head_folder


def save_head(head, folder: Path, config: dict[str, Any], positive_ids: list[str] | None = None) -> dict[str, Any]:
    """Write a head and its config (and the ids of the documents it trained on as positives, so
    that `eval --head` can report the documents it never saw); gives back {'path', 'fingerprint'}."""
    out_dim = head.proj.out_features if head.proj is not None else None
    return write_head_folder(folder, head, {"dim": head.dim, "out_dim": out_dim, **config}, positive_ids)
