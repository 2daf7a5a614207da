"""Documents given by a program (the HTTP API, a script) rather than read from files.

Each such document is stored as a pseudo-file whose path is `api:<id>`, with one document and
its chunks, so it is searched, chunked, kept and rebuilt exactly like a file's. A later
`semsearch index CORPUS` only removes files under CORPUS, never `api:` documents; `--rebuild`
starts from nothing and drops them too.

Every call is one write of the index folder: it takes the writer lock, writes one small segment
with the new chunks and the tombstones of what it replaces or deletes (semsearch/store/segments.py:
the cost is that of the change, not of the index) and publishes them with one rename. Readers
keep the previous generation until then.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from semsearch.corpus.chunking import ChunkSettings, chunk_text, line_of
from semsearch.corpus.titles import embedding_text
from semsearch.encoder.tokens import token_table
from semsearch.errors import DocumentNotFound, IndexFormatError, InputError, SettingsMismatch, TooLarge
from semsearch.limits import check_depth, check_encodable
from semsearch.store.docstore import ChunkRow
from semsearch.store.folder import IndexWriter, now
from semsearch.store.manifest import Manifest

PREFIX = "api:"
MAX_ID_CHARS = 256


@dataclass
class Document:
    """A document to upsert: its id (unique in the index), text and metadata (JSON values)."""

    id: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class WriteReport:
    added: int = 0  # documents
    updated: int = 0
    unchanged: int = 0  # same text and metadata as stored: nothing re-embedded
    deleted: int = 0
    chunks: int = 0  # chunks embedded
    generation: int = 0  # the index generation that holds the change
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def doc_path(doc_id: str) -> str:
    """The docstore path of an API document."""
    return PREFIX + doc_id


def doc_id_of(path: str) -> str | None:
    """The id of an API document from its docstore path (None for a file)."""
    return path[len(PREFIX):] if path.startswith(PREFIX) else None


def check_id(doc_id: Any) -> str:
    """doc_id if it is a usable document id, else InputError saying why."""
    if not isinstance(doc_id, str) or not doc_id.strip():
        raise InputError(f"a document id must be a non-empty string, got {doc_id!r}")
    if len(doc_id) > MAX_ID_CHARS:
        raise InputError(f"document id {doc_id[:40]!r}… is {len(doc_id)} characters; the most is {MAX_ID_CHARS}")
    if any(ord(c) < 32 or c == "\x7f" for c in doc_id):
        raise InputError(f"document id {doc_id!r} contains control characters")
    return doc_id


def _check(docs: list[Document]) -> None:
    seen: set[str] = set()
    for i, d in enumerate(docs):
        check_id(d.id)
        if d.id in seen:
            raise InputError(f"document id {d.id!r} appears twice in one request")
        seen.add(d.id)
        if not isinstance(d.text, str) or not d.text.strip():
            raise InputError(f"document {d.id!r} has no text")
        if not isinstance(d.metadata, Mapping) or not all(isinstance(k, str) for k in d.metadata):
            raise InputError(f"the metadata of document {d.id!r} must be an object with string keys")
        check_depth(d.metadata, f"the metadata of document {d.id!r}")
        check_encodable({"text": d.text, "metadata": d.metadata}, f"document {d.id!r}")  # SQLite cannot store a lone surrogate
        try:
            json.dumps(d.metadata, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise InputError(f"the metadata of document {d.id!r} is not plain JSON: {e}") from e


def _digest(d: Document) -> str:
    blob = json.dumps({"text": d.text, "metadata": d.metadata}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _check_encoder(base: Manifest, encoder, folder: Path) -> None:
    from semsearch.indexing import check_settings

    if check_settings(base, encoder, ChunkSettings.of_index(base.chunking), folder):
        raise SettingsMismatch(f"{folder} was built with pooling {base.pooling!r}; documents must be encoded with it, not {encoder.pooling!r}")


def create_index(folder: str | Path, encoder, chunking: ChunkSettings | None = None) -> Path:
    """An empty index at `folder` for documents to be upserted into, built for `encoder` (its model
    and pooling; `chunking` or the model's default); a folder that already holds an index is left as it is."""
    from semsearch.corpus.walk import WalkResult
    from semsearch.indexing import index_corpus

    folder = Path(folder)
    if not (folder / "manifest.json").exists():
        index_corpus(folder, folder, encoder, chunking, progress=False, found=WalkResult())  # no files to walk
    return folder


def _chunked(docs: list[Document], stored: dict, encoder, chunking, report: WriteReport, max_chunks: int | None):
    """(document, digest, its stored file or None, its chunk rows) of each document that changed,
    all chunked before any is encoded, so that `max_chunks` refuses a write before its work."""
    plans = []
    for d in docs:
        digest = _digest(d)
        old = stored.get(doc_path(d.id))
        if old is not None and old.hash == digest:
            report.unchanged += 1
            continue
        rows = [ChunkRow(0, None, i, c.start, c.end, line_of(d.text, c.start), c.text, dict(d.metadata))
                for i, c in enumerate(chunk_text(d.text, encoder.token_offsets, chunking))]
        if not rows:
            raise InputError(f"document {d.id!r} has no text the model can read")
        plans.append((d, digest, old, rows))
    total = sum(len(p[3]) for p in plans)
    if max_chunks is not None and total > max_chunks:
        raise TooLarge(f"the documents of this write make {total:,} chunks to encode; one write encodes at most "
                       f"{max_chunks:,}: send fewer or shorter documents in each")
    return plans


def upsert_documents(folder: str | Path, docs: Iterable[Document], encoder, flush_chunks: int = 32,
                     max_chunks: int | None = None) -> WriteReport:
    """Add or replace documents by id in an existing index, in one new generation.

    `encoder` must be the index's (same weights, pooling, head). Chunks are encoded in batches of
    `flush_chunks`, so an encoder shared with searches is not held for the whole write.
    `max_chunks`: the most chunks the write may encode (TooLarge before any is, where the
    documents make more; a server's bound on one request's work)."""
    t0 = time.perf_counter()
    folder = Path(folder)
    docs = list(docs)
    _check(docs)
    base = Manifest.load(folder)
    _check_encoder(base, encoder, folder)
    chunking = ChunkSettings.of_index(base.chunking)
    report = WriteReport()
    held = _stored_hashes(folder, base, [doc_path(d.id) for d in docs])
    if held is not None and all(held.get(doc_path(d.id)) == _digest(d) for d in docs):
        # nothing to change: no writer, no copy of the docstore, no new generation
        report.unchanged, report.generation = len(docs), base.generation
        report.seconds = round(time.perf_counter() - t0, 3)
        return report
    with _new_generation(folder, base, report, t0) as writer:
        store = writer.docs
        stored = store.find_files([doc_path(d.id) for d in docs])
        pending: list[ChunkRow] = []

        def flush() -> None:
            if not pending:
                return
            # as the index encodes a chunk: its context (none for an API document: its metadata is
            # the caller's, semsearch/corpus/titles.py), then its text
            texts = [embedding_text(c.context, c.text) for c in pending]
            if base.states:  # the index keeps token states for re-pooling: so must these chunks
                vecs, states = encoder.encode_with_states(texts, progress=False)
                for c, st, tb in zip(pending, states, token_table(encoder, texts)):
                    c.state = writer.append_states(st, tb)
            else:
                vecs = encoder.encode(texts, progress=False)
            writer.vectors.add(store.add_chunks(pending, vecs), vecs)
            report.chunks += len(pending)
            pending.clear()

        for d, digest, old, rows in _chunked(docs, stored, encoder, chunking, report, max_chunks):
            if old is not None:
                writer.vectors.remove(store.remove_file(old.id))
                report.updated += 1
            else:
                report.added += 1
            file_id = store.add_file(doc_path(d.id), digest, len(d.text.encode("utf-8")), 0, now())
            store.set_documents(file_id, 1)
            for r in rows:
                r.file_id = file_id
                pending.append(r)
                if len(pending) >= flush_chunks:
                    flush()
        flush()
    return report


def _stored_hashes(folder: Path, base: Manifest, paths: list[str]) -> dict[str, str] | None:
    """The content hashes of these docstore paths in generation `base` (read-only), by path;
    None when that generation cannot be read any more (a newer one replaced it meanwhile)."""
    from semsearch.store.docstore import open_docs
    from semsearch.store.files import DB_ERRORS
    from semsearch.store.segments import Tombstones, live_files

    out: dict[str, str] = {}
    for e in base.segments:
        try:
            store = open_docs(folder, e)
        except (OSError, *DB_ERRORS):
            return None
        try:
            dead = Tombstones.load(folder / e["deletes"]) if e.get("deletes") else Tombstones()
            out.update((path, f.hash) for path, f in live_files(store, dead, paths).items())
        except (*DB_ERRORS, IndexFormatError):
            return None
        finally:
            store.close()
    return out


def stored_documents(store, ids: Iterable[str]) -> dict[str, Document]:
    """The API documents with these ids that `store` (a DocStore) holds, by id, in the order asked:
    each one's text joined from its chunks (from its first to its last token: surrounding blanks
    are not kept; in an index chunked without overlap, one space joins windows) and its metadata.
    Ids it does not hold are left out."""
    found = joined_documents(store, [doc_path(i) for i in dict.fromkeys(ids)])
    return {doc_id_of(p): Document(doc_id_of(p), text, meta) for p, (text, meta, _) in found.items()}


def joined_documents(store, paths: Iterable[str], row: int | None = None) -> dict[str, tuple[str, dict[str, Any], int]]:
    """(text, metadata, chunks) of the documents or files at these docstore paths, by path, in the
    order asked: the text joined from the chunks as `stored_documents` says; the metadata of the
    first chunk. Paths the store does not hold are left out. `row`: of a tabular file, that row
    only (each row is a document of its own, its offsets its own)."""
    paths = list(dict.fromkeys(paths))
    parts: dict[str, list[tuple]] = {}
    for at in range(0, len(paths), 500):
        part = paths[at : at + 500]
        where = f"f.path IN ({','.join('?' * len(part))})" + ("" if row is None else " AND c.row = ?")
        rows = sorted(store.select("f.path, c.ord, c.start, c.end, c.text, c.metadata", where,
                                   tuple(part) + (() if row is None else (row,))), key=lambda r: (r[1], r[2]))
        for _, path, _, *chunk in rows:
            parts.setdefault(path, []).append(chunk)
    out: dict[str, tuple[str, dict[str, Any], int]] = {}
    for path in paths:
        if path not in parts:
            continue
        text, done = "", None  # done: the document offset where `text` ends
        for start, end, chunk, _ in parts[path]:
            if done is None or start >= done:  # the first chunk, or one after a gap (chunks without overlap)
                text += chunk if done is None or start == done else " " + chunk
            else:  # overlapping windows: the part past what is there already
                text += chunk[done - start:]
            done = max(done or 0, end)
        meta = parts[path][0][3]
        out[path] = (text, json.loads(meta) if meta else {}, len(parts[path]))
    return out


def delete_documents(folder: str | Path, ids: Iterable[str], missing_ok: bool = False) -> WriteReport:
    """Remove documents by id, in one new generation; DocumentNotFound (nothing removed) if any
    id is not in the index, unless `missing_ok` (then ids not in the index are passed over)."""
    t0 = time.perf_counter()
    folder = Path(folder)
    ids = [check_id(i) for i in ids]
    base = Manifest.load(folder)
    report = WriteReport()
    with _new_generation(folder, base, report, t0) as writer:
        stored = writer.docs.find_files([doc_path(i) for i in ids])
        missing = [i for i in ids if doc_path(i) not in stored]
        if missing and not missing_ok:
            raise DocumentNotFound(f"no document with id {missing[0]!r} in {folder}").quoting(repr(missing[0]))
        for i in dict.fromkeys(i for i in ids if doc_path(i) in stored):
            writer.vectors.remove(writer.docs.remove_file(stored[doc_path(i)].id))
            report.deleted += 1
    return report


@contextlib.contextmanager
def _new_generation(folder: Path, base: Manifest, report: WriteReport, t0: float):
    """An IndexWriter whose writes are published as one new generation when the block ends, or
    thrown away (nothing changes) if it raises; fills report.generation and report.seconds."""
    writer = IndexWriter(folder, base.dim, base)
    try:
        yield writer
        if report.added + report.updated + report.deleted == 0:  # nothing changed: publish nothing
            generation = Manifest.load(folder).generation  # still the newest: the writer lock is held
            writer.abort()
            report.generation, report.seconds = generation, round(time.perf_counter() - t0, 3)
            return
        _commit(writer, base)
    except BaseException:
        writer.abort()
        raise
    report.generation = writer.gen
    report.seconds = round(time.perf_counter() - t0, 3)


def _commit(writer: IndexWriter, base: Manifest) -> None:
    from semsearch.indexing import VectorSettings, finalize_vectors

    target = (base.index.get("recall") or {}).get("target", VectorSettings.target_recall)
    entry = finalize_vectors(writer, base.dim, VectorSettings(target_recall=target), base)
    # The manifest stays the index run's (its settings and last run); only what changed is new.
    manifest = dataclasses.replace(base, counts=writer.docs.counts(), index=entry)
    writer.commit(manifest)


__all__ = ["Document", "WriteReport", "check_id", "create_index", "delete_documents", "doc_id_of", "doc_path", "stored_documents",
           "upsert_documents"]
