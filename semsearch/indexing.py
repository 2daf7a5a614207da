"""The indexing pipeline: walk -> read -> chunk -> encode -> FAISS + SQLite, incrementally."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from semsearch.corpus.chunking import ChunkSettings, chunk_text, line_of
from semsearch.corpus.readers import ReadOptions, Skip, read_documents
from semsearch.corpus.walk import file_hash, walk
from semsearch.progress import bar as progress_bar
from semsearch.errors import IndexFormatError, InputError, SettingsMismatch
from semsearch.store.docstore import ChunkRow
from semsearch.store.folder import IndexWriter, now
from semsearch.store.manifest import Manifest

log = logging.getLogger(__name__)


@dataclass
class IndexReport:
    index: str
    added: int = 0  # files
    updated: int = 0
    removed: int = 0
    unchanged: int = 0
    documents: int = 0  # documents and chunks embedded in this run
    chunks: int = 0
    seconds: float = 0.0
    skipped: dict[str, int] = field(default_factory=dict)
    totals: dict[str, int] = field(default_factory=dict)

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        skipped = sum(self.skipped.values())
        return (
            f"{self.index}: {self.added} added, {self.updated} updated, {self.removed} removed, "
            f"{self.unchanged} unchanged file(s); embedded {self.documents} document(s), {self.chunks} chunk(s) "
            f"in {self.seconds:.1f} s ({self.chunks_per_s:.1f} chunks/s); {skipped} file(s) skipped; "
            f"index holds {self.totals.get('files', 0)} files, {self.totals.get('chunks', 0)} chunks"
        )

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["chunks_per_s"] = round(self.chunks_per_s, 2)
        return d


def load_base(folder: Path, rebuild: bool) -> Manifest | None:
    """The current manifest to build on, None for a new index or a rebuild."""
    if rebuild or not (folder / "manifest.json").exists():
        return None
    return Manifest.load(folder)


def check_settings(base: Manifest, encoder, chunking: ChunkSettings, folder: Path) -> None:
    """Refuse to mix vectors of another model, pooling or chunking into an index."""
    diffs = []
    if encoder.fingerprint != base.model_fingerprint:
        diffs.append(f"model {encoder.name} ({encoder.fingerprint}) vs the index's {base.model} ({base.model_fingerprint})")
    if encoder.pooling != base.pooling:
        diffs.append(f"pooling {encoder.pooling!r} vs the index's {base.pooling!r}")
    if encoder.max_length != base.max_length:
        diffs.append(f"max length {encoder.max_length} vs the index's {base.max_length}")
    if (base.head or {}).get("fingerprint") != (getattr(encoder, "head_info", None) or {}).get("fingerprint"):
        diffs.append("a different pooling head")
    if {"window": chunking.window, "overlap": chunking.overlap} != base.chunking:
        diffs.append(f"chunking {chunking.window}/{chunking.overlap} vs the index's {base.chunking['window']}/{base.chunking['overlap']}")
    if diffs:
        raise SettingsMismatch(
            f"{folder} was built with other settings: {'; '.join(diffs)}. "
            "Use --rebuild to rebuild it with the new settings, or --index to write another index."
        )


def index_corpus(
    corpus: Path,
    folder: Path,
    encoder,
    chunking: ChunkSettings | None = None,
    read: ReadOptions | None = None,
    rebuild: bool = False,
    progress: bool | None = None,
    flush_chunks: int = 512,
) -> IndexReport:
    """Index (or incrementally update) `folder` from the files under `corpus`."""
    t0 = time.perf_counter()
    corpus, folder = Path(corpus), Path(folder)
    read = read or ReadOptions()
    found = walk(corpus)
    if not found.files:
        why = ", ".join(f"{n} {r}" for r, n in found.skipped.items()) or "no files"
        raise InputError(f"no indexable files in {str(corpus)!r} ({why}); supported: .txt .md .rst .csv .tsv .jsonl .json .parquet")
    base = load_base(folder, rebuild)
    if base is not None and chunking is None:
        chunking = ChunkSettings(**base.chunking)
    chunking = (chunking or ChunkSettings(window=encoder.max_length - 2)).check(encoder.max_length)
    if base is not None:
        check_settings(base, encoder, chunking, folder)

    report = IndexReport(index=str(folder), skipped=dict(found.skipped))
    writer = IndexWriter(folder, encoder.out_dim, base)
    try:
        _update(writer, found.files, corpus.resolve(), encoder, chunking, read, report, progress, flush_chunks)
        counts = writer.docs.counts()
        manifest = Manifest(
            model=encoder.name, model_fingerprint=encoder.fingerprint, backend=encoder.backend,
            pooling=encoder.pooling, dim=encoder.out_dim, max_length=encoder.max_length,
            precision=encoder.precision, chunking={"window": chunking.window, "overlap": chunking.overlap},
            head=getattr(encoder, "head_info", None), counts=counts,
            created=base.created if base else "",
        )
        report.totals = counts
        report.seconds = time.perf_counter() - t0
        manifest.last_run = {k: v for k, v in report.as_dict().items() if k not in ("totals", "index")}
        manifest.last_run["at"] = now()
        writer.commit(manifest)
    except BaseException:
        writer.abort()
        raise
    return report


def _update(writer, files, root, encoder, chunking, read, report, progress, flush_chunks) -> None:
    store = writer.docs
    stored = store.files()
    seen: set[str] = set()
    pending: list[ChunkRow] = []

    def flush() -> None:
        if pending:
            vecs = encoder.encode([c.text for c in pending], progress=False)
            writer.vectors.add(store.add_chunks(pending, vecs), vecs)
            report.chunks += len(pending)
            pending.clear()

    bar = progress_bar(sum(f.size for f in files), "indexing", "B", progress, unit_scale=True)
    for f in files:
        key = str(f.path)
        seen.add(key)
        old = stored.get(key)
        if old is not None and old.size == f.size and old.mtime_ns == f.mtime_ns:
            report.unchanged += 1  # same size and time: trust it without hashing
            bar.update(f.size)
            continue
        digest = file_hash(f.path)
        if old is not None and old.hash == digest:
            store.touch_file(old.id, f.size, f.mtime_ns)
            report.unchanged += 1
            bar.update(f.size)
            continue
        try:
            docs = list(_chunk_rows(f.path, encoder, chunking, read))
        except Skip as e:
            log.warning("skipped %s: %s", f.path, e)
            reason = str(e).split(" (")[0]
            report.skipped[reason] = report.skipped.get(reason, 0) + 1
            if old is not None:  # its indexed text no longer matches the file: drop it
                writer.vectors.remove(store.remove_file(old.id))
                report.removed += 1
            bar.update(f.size)
            continue
        if old is not None:
            writer.vectors.remove(store.remove_file(old.id))
            report.updated += 1
        else:
            report.added += 1
        file_id = store.add_file(key, digest, f.size, f.mtime_ns, now())
        n_docs = 0
        for doc_no, rows in docs:
            n_docs += 1
            for r in rows:
                r.file_id = file_id
                pending.append(r)
        store.set_documents(file_id, n_docs)
        report.documents += n_docs
        if len(pending) >= flush_chunks:
            flush()
        bar.update(f.size)
    flush()
    bar.close()
    # Files under this corpus root that are gone: remove their chunks.
    prefix = str(root) if root.is_dir() else None
    for key, old in stored.items():
        if key not in seen and prefix is not None and key.startswith(prefix.rstrip("/") + "/"):
            writer.vectors.remove(store.remove_file(old.id))
            report.removed += 1


def _chunk_rows(path: Path, encoder, chunking: ChunkSettings, read: ReadOptions):
    """(document number, [ChunkRow]) for each document of a file (file_id filled in later)."""
    for n, doc in enumerate(read_documents(path, read)):
        rows = []
        for i, c in enumerate(chunk_text(doc.text, encoder.token_offsets, chunking)):
            line = line_of(doc.text, c.start) if doc.row is None else None
            rows.append(ChunkRow(0, doc.row, i, c.start, c.end, line, c.text, doc.metadata))
        yield n, rows
