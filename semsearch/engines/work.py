"""The work every engine does, as plain functions a Ray task or actor can run: a file to chunk
rows, a batch of rows to rows with vectors, and the Parquet shard schema between them.

A shard holds chunk rows and one status row per file (doc = -1): whether the file was indexed,
unchanged (same hash), skipped, or failed, with its hash and document and chunk counts, so the
driver can check that every chunk of every file arrived exactly once.
"""
from __future__ import annotations

import functools
import itertools
import json
import os
import signal
from pathlib import Path
from typing import Any, Callable

import numpy as np

from semsearch.encoder.tokens import token_table
from semsearch.engines.spec import EncodeSpec
from semsearch.errors import ModelError, SemsearchError
from semsearch.store.kept import token_rows

NONE = -1  # row / line / doc sentinel: the shard columns are never null

COLUMNS = ("seq", "doc", "ord", "row", "start", "end", "line", "text", "metadata",
           "status", "hash", "info", "documents", "chunks", "context")


def schema(with_vectors: bool = True):
    """The Arrow schema of a shard (context: the chunk's titles, semsearch/corpus/titles.py, or
    empty; vector: float32 bytes (D,); state: fp16 bytes (T, D) or empty; tokens: int32 bytes
    (T, 3), the token table kept beside the states, or empty)."""
    import pyarrow as pa

    fields = [("seq", pa.int64()), ("doc", pa.int64()), ("ord", pa.int64()), ("row", pa.int64()),
              ("start", pa.int64()), ("end", pa.int64()), ("line", pa.int64()), ("text", pa.string()),
              ("metadata", pa.string()), ("status", pa.string()), ("hash", pa.string()), ("info", pa.string()),
              ("documents", pa.int64()), ("chunks", pa.int64()), ("context", pa.string())]
    if with_vectors:
        fields += [("vector", pa.binary()), ("state", pa.binary()), ("tokens", pa.binary())]
    return pa.schema(fields)


def _row(seq: int, doc: int = NONE, ord: int = NONE, row: int | None = None, start: int = 0, end: int = 0,
         line: int | None = None, text: str = "", metadata: dict | None = None, status: str = "", hash: str = "",
         info: str = "", documents: int = 0, chunks: int = 0, context: str = "") -> dict[str, Any]:
    return {"seq": seq, "doc": doc, "ord": ord, "row": NONE if row is None else row, "start": start, "end": end,
            "line": NONE if line is None else line, "text": text,
            "metadata": json.dumps(metadata, ensure_ascii=False) if metadata else "", "status": status,
            "hash": hash, "info": info, "documents": documents, "chunks": chunks, "context": context}


def chunk_file(job: dict[str, Any], spec: EncodeSpec, offsets: Callable[[str], list[tuple[int, int]]]) -> list[dict[str, Any]]:
    """The chunk rows of one file and its status row, as indexing._update would add them."""
    from semsearch.corpus.chunking import ChunkSettings
    from semsearch.corpus.readers import ReadOptions, Skip
    from semsearch.corpus.walk import file_hash
    from semsearch.engines.chunks import file_chunks

    seq, path = int(job["seq"]), Path(job["path"])
    try:
        digest = file_hash(path)
    except OSError as e:
        return [_row(seq, status="error", info=f"CorpusError: {path}: cannot read ({e})")]
    if digest == job.get("old_hash"):
        return [_row(seq, status="same", hash=digest)]
    settings = ChunkSettings(spec.window, spec.overlap, spec.context)
    docs = file_chunks(path, offsets, settings, ReadOptions(spec.text_column, spec.skip_errors))
    rows: list[dict[str, Any]] = []
    try:
        first = next(docs, None)
    except Skip as e:
        return [_row(seq, status="skip", hash=digest, info=str(e))]
    except SemsearchError as e:
        return [_row(seq, status="error", info=f"{type(e).__name__}: {e}")]
    n_docs: set[int] = set()
    try:
        for n, chunk_rows in itertools.chain([first] if first is not None else [], docs):
            n_docs.add(n)
            for r in chunk_rows:
                rows.append(_row(seq, n, r.ord, r.row, r.start, r.end, r.line, r.text, r.metadata, context=r.context))
    except Skip as e:  # readers check encodings up front; this would be a reader bug
        return [_row(seq, status="error", info=f"CorpusError: {path}: {e}")]
    except SemsearchError as e:
        return [_row(seq, status="error", info=f"{type(e).__name__}: {e}")]
    n_docs = len(n_docs)
    return rows + [_row(seq, status="indexed", hash=digest, documents=n_docs, chunks=len(rows))]


def embed_table(table, encoder, keep_states: bool):
    """The rows of `table` with `vector` (and `state`) columns: chunk rows encoded (with their
    context before them, as the local engine encodes them), status rows empty."""
    import pyarrow as pa

    from semsearch.corpus.titles import embedding_text

    doc = table.column("doc").to_numpy()
    texts = [embedding_text(c or "", t) for c, t in zip(table.column("context").to_pylist(), table.column("text").to_pylist())]
    pick = np.flatnonzero(doc >= 0)
    vectors: list[bytes] = [b""] * len(doc)
    states: list[bytes] = [b""] * len(doc)
    tokens: list[bytes] = [b""] * len(doc)
    if len(pick):
        chunk_texts = [texts[i] for i in pick]
        if keep_states:
            vecs, sts = encoder.encode_with_states(chunk_texts, progress=False)
            tables = token_table(encoder, chunk_texts)
            for j, i in enumerate(pick):
                states[i] = np.ascontiguousarray(sts[j], np.float16).tobytes()
                tokens[i] = token_rows(tables[j], len(sts[j])).tobytes()
        else:
            vecs = encoder.encode(chunk_texts, progress=False)
        for j, i in enumerate(pick):
            vectors[i] = np.ascontiguousarray(vecs[j], np.float32).tobytes()
    table = table.select(list(COLUMNS))
    table = table.append_column("vector", pa.array(vectors, pa.binary()))
    table = table.append_column("state", pa.array(states, pa.binary()))
    return table.append_column("tokens", pa.array(tokens, pa.binary()))


@functools.lru_cache(maxsize=2)
def offsets_for(spec: EncodeSpec) -> Callable[[str], list[tuple[int, int]]]:
    """The chunker's tokenizer for spec's model, once a worker process (a Ray worker runs many
    chunking tasks): the tokenizer alone for BERT-family folders (as Encoder.token_offsets, and
    without importing torch, which costs a chunking worker seconds), else a whole encoder on the CPU."""
    from semsearch.encoder.models import is_bert_folder

    folder = Path(spec.model)
    if folder.is_dir() and is_bert_folder(folder):
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        tok.no_padding()
        tok.no_truncation()
        return lambda text: tok.encode(text, add_special_tokens=False).offsets
    return encoder_for(spec, "cpu").token_offsets


def encoder_for(spec: EncodeSpec, device: str):
    """The encoder of spec on device; refuses weights other than the driver's."""
    from semsearch.encoder.encoder import Encoder
    from semsearch.encoder.heads import load_head

    head = load_head(Path(spec.head)) if spec.head else None
    enc = Encoder(spec.model, pooling=spec.pooling, device=device, precision=spec.precision,
                  max_length=spec.max_length, batch_tokens=spec.batch_tokens, head=head)
    if enc.fingerprint != spec.fingerprint:
        raise ModelError(f"model {spec.model} on this worker has weights {enc.fingerprint}, the driver's {spec.fingerprint}: "
                         "install the same model on every node")
    return enc


def maybe_die(kill_once_after: int | None, batches_done: int, marker: Path) -> None:
    """Tests only: after `kill_once_after` batches, SIGKILL this process, once a run (the
    marker file, made atomically, tells the restarted actors it has happened)."""
    if kill_once_after is None or batches_done != kill_once_after:
        return
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)
