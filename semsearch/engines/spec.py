"""What an engine is given: the files to embed and how to rebuild the driver's encoder and
chunker on a worker (picklable), and the Engine protocol itself."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class FileJob:
    """A file to embed: its position in the walk (rows are added in that order) and the hash
    the index holds for it (None if new): a worker that finds the same bytes embeds nothing."""

    seq: int
    path: str
    old_hash: str | None = None


@dataclass(frozen=True)
class EncodeSpec:
    """Everything a worker needs to rebuild the driver's encoder and chunker (picklable)."""

    model: str  # a model folder or hub name
    fingerprint: str  # the driver's weights: a worker with other weights refuses to run
    pooling: str
    max_length: int
    precision: str
    window: int
    overlap: int
    head: str | None = None  # a pooling head folder
    text_column: str | None = None
    skip_errors: bool = False
    keep_states: bool = False
    batch_tokens: int | None = None  # None: the worker's device's default (encoder.default_batch_tokens)
    context: int = 0  # chunks with their titles (ChunkSettings.context, resolved)


class Engine(Protocol):
    name: str

    def run(self, jobs: list[FileJob], spec: EncodeSpec, staging: Path) -> dict:
        """Read, chunk and encode the files of `jobs` into Parquet shards under `staging`
        (schema: `engines.work.SCHEMA`); gives back figures of the run (seconds, workers)."""
        ...


def spec_for(encoder, chunking, read, keep_states: bool) -> EncodeSpec:
    """The EncodeSpec that rebuilds `encoder` on a worker."""
    model = str(encoder.folder) if getattr(encoder, "folder", None) else encoder.name
    head = (getattr(encoder, "head_info", None) or {}).get("path")
    return EncodeSpec(model=model, fingerprint=encoder.fingerprint, pooling=encoder.pooling, max_length=encoder.max_length,
                      precision=encoder.precision, window=chunking.window, overlap=chunking.overlap, head=head,
                      text_column=read.text_column, skip_errors=read.skip_errors, keep_states=keep_states,
                      batch_tokens=getattr(encoder, "batch_tokens_asked", None), context=chunking.titles)
