"""The indexing pipeline: walk -> read -> chunk -> encode -> FAISS + SQLite, incrementally."""
from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import sqlite3
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from semsearch.corpus.chunking import ChunkSettings
from semsearch.corpus.readers import ReadOptions, Skip
from semsearch.corpus.titles import embedding_text
from semsearch.corpus.walk import WalkResult, file_hash, walk
from semsearch.progress import bar as progress_bar
from semsearch.encoder.tokens import token_table
from semsearch.encoder.models import weight_stats
from semsearch.engines import reader
from semsearch.engines.chunks import file_chunks
from semsearch.engines.lookahead import Lookahead
from semsearch.engines.reader import Opened, offsets_of
from semsearch.engines.register import drop_file, drop_gone, replace_file, same_stat
from semsearch.errors import CorpusError, InputError, SettingsMismatch
from semsearch.store.docstore import ChunkRow, StoredFile
from semsearch.store.folder import IndexWriter, now
from semsearch.store.files import damaged
from semsearch.store.manifest import Manifest

log = logging.getLogger(__name__)

AHEAD_SAMPLE = 200_000  # vectors a quantizer trained beside a long run takes (VectorIndex.build's sample)
SEGMENT_CHUNKS = 250_000  # a local run publishes a segment each time it has written this many new chunks


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
    repooled: int = 0  # chunks re-pooled from kept token states (new pooling or head)
    repool_seconds: float = 0.0
    totals: dict[str, int] = field(default_factory=dict)
    skipped_files: list[str] = field(default_factory=list)  # 'path: reason' of files skipped while reading
    resumed: int = 0  # chunks whose vectors an interrupted run had already embedded
    engine: dict[str, Any] | None = None  # figures of an engine run (semsearch.engines)

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        skipped = sum(self.skipped.values())
        repool = f"re-pooled {self.repooled} chunk(s) from kept token states in {self.repool_seconds:.1f} s; " if self.repooled else ""
        repool += f"resumed {self.resumed} chunk(s) embedded by an interrupted run; " if self.resumed else ""
        return repool + (
            f"{self.index}: {self.added} added, {self.updated} updated, {self.removed} removed, "
            f"{self.unchanged} unchanged file(s); embedded {self.documents} document(s), {self.chunks} chunk(s) "
            f"in {self.seconds:.1f} s ({self.chunks_per_s:.1f} chunks/s); {skipped} file(s) skipped; "
            f"index holds {self.totals.get('files', 0)} files, {self.totals.get('chunks', 0)} chunks"
        )

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["chunks_per_s"] = round(self.chunks_per_s, 2)
        return d


def scan_corpus(corpus: Path, include=(), exclude=()) -> WalkResult:
    """The corpus's indexable files (chosen by `include` / `exclude` globs and the root's
    .semsearchignore); an InputError when there are none (checked before any model is loaded,
    so a wrong path fails in milliseconds)."""
    found = walk(Path(corpus), include, exclude)
    if not found.files:
        why = ", ".join(f"{n} {r}" for r, n in found.skipped.items()) or "no files"
        raise InputError(f"no indexable files in {str(corpus)!r} ({why}); supported: "
                         ".txt .md .rst .csv .tsv .jsonl .json .parquet .pdf .html .htm .docx")
    return found


def load_base(folder: Path, rebuild: bool) -> Manifest | None:
    """The current manifest to build on, None for a new index or a rebuild."""
    if rebuild or not (folder / "manifest.json").exists():
        return None
    return Manifest.load(folder)


def encoder_for_index(base: Manifest | None, model: str | None = None, pooling: str | None = None,
                      head: Path | None = None, device: str = "auto", precision: str = "auto", max_length: int | None = None):
    """The encoder to (re)index with: what was asked for, else the index's own settings, else the
    defaults (bundled model, mean pooling). A head must have been trained on the same weights."""
    from semsearch.encoder.encoder import Encoder
    from semsearch.encoder.heads import head_info, head_pooling, is_query_head, load_head, read_head_config

    head_mod = info = None
    if head is not None:
        # A pooling head replaces the pooling; trained query layers keep the documents' pooling.
        head_mod, info, pooling = load_head(head), head_info(head), head_pooling(head)
    elif pooling is None and base is not None:
        pooling = base.pooling
        if base.head and (base.pooling == "head" or is_query_head(base.head)):
            head_mod, info = load_head(base.head["path"]), base.head
    if precision == "auto" and base is not None:  # new chunks in the index's own arithmetic
        from semsearch.encoder.hardware import precision_for_index, resolve_device

        precision = precision_for_index(base.precision, resolve_device(device))
    enc = Encoder(model or (base.model if base else None), pooling=pooling or "mean", device=device, precision=precision,
                  max_length=base.max_length if base and not model else max_length, head=head_mod)
    enc.head_info = info
    if head is not None:
        read_head_config(head, enc.fingerprint)  # refuses a head trained on other weights
    return enc


def resolve_chunking(base: Manifest | None, encoder, window: int | None, overlap: int | None) -> ChunkSettings:
    """Chunk settings: those given, else the index's, else the model's length with overlap 32;
    titles with the chunks as the index has them (a new index: with them)."""
    d = ChunkSettings.of_index(base.chunking) if base is not None else ChunkSettings(window=encoder.max_length - 2)
    return ChunkSettings(window if window is not None else d.window, overlap if overlap is not None else d.overlap, d.context)


def _pooling_head(info: dict | None) -> str | None:
    """The fingerprint of a pooling head (None for none, or for trained query layers)."""
    from semsearch.encoder.heads import is_query_head

    return None if not info or is_query_head(info) else info.get("fingerprint")


def check_settings(base: Manifest, encoder, chunking: ChunkSettings, folder: Path) -> bool:
    """Refuse to mix vectors of another model or chunking into an index. A new pooling or head
    is allowed where the index kept its token states: gives back True when a re-pool is needed."""
    diffs = []
    if encoder.fingerprint != base.model_fingerprint:
        diffs.append(f"model {encoder.name} ({encoder.fingerprint}) vs the index's {base.model} ({base.model_fingerprint})")
    if encoder.max_length != base.max_length:
        diffs.append(f"max length {encoder.max_length} vs the index's {base.max_length}")
    if (chunking.window, chunking.overlap) != (base.chunking["window"], base.chunking["overlap"]):
        diffs.append(f"chunking {chunking.window}/{chunking.overlap} vs the index's {base.chunking['window']}/{base.chunking['overlap']}")
    held = ChunkSettings.of_index(base.chunking).titles
    if chunking.context is not None and chunking.titles != held:
        diffs.append(f"chunks embedded {_titles_words(chunking.titles)} vs the index's {_titles_words(held)}")
    pooling_diff = []
    if encoder.pooling != base.pooling:
        pooling_diff.append(f"pooling {encoder.pooling!r} vs the index's {base.pooling!r}")
    elif _pooling_head(base.head) != _pooling_head(getattr(encoder, "head_info", None)):
        # (Trained query layers change no document vector: a new one is only recorded.)
        pooling_diff.append("a different pooling head")
    if pooling_diff and not base.states:
        diffs += pooling_diff
    if diffs:
        hint = ""
        if pooling_diff and not base.states:
            tokens = base.counts.get("chunks", 0) * base.chunking["window"]
            hint = (f" An index built with --keep-states re-pools without re-encoding (it keeps fp16 token states: "
                    f"{2 * base.dim} bytes a token, up to {tokens * 2 * base.dim / 1e6:.0f} MB for this one).")
        raise SettingsMismatch(
            f"{folder} was built with other settings: {'; '.join(diffs)}. "
            "Use --rebuild to rebuild it with the new settings, or --index to write another index." + hint
        )
    return bool(pooling_diff)


def _titles_words(version: int) -> str:
    return f"with their titles (form {version})" if version else "without their titles"


def repool(writer: IndexWriter, encoder, batch: int = 256) -> int:
    """Recompute every vector from the kept token states with the encoder's pooling (no
    transformer pass) and rebuild the vector index; gives back the number of chunks."""
    import torch

    from semsearch.store.vectors import VectorIndex

    writer.absorb()  # every vector changes: the published segments become one new segment
    fresh = VectorIndex.create(encoder.out_dim, "flat")  # finalize_vectors() rebuilds other types
    maps: dict[str, np.ndarray] = {}
    n = 0
    for refs in writer.docs.iter_states_refs(batch):
        if any(r[1] is None for r in refs):
            raise SettingsMismatch(f"{writer.folder}: some chunks have no kept token states; rebuild with --rebuild --keep-states")
        T = max(r[3] for r in refs)
        states = np.zeros((len(refs), T, encoder.dim), np.float32)  # (B, T, D)
        mask = np.zeros((len(refs), T), np.int64)
        for b, (_, file, off, length) in enumerate(refs):
            if file not in maps:
                maps[file] = writer.read_states(file, encoder.dim)
            states[b, :length] = maps[file][off : off + length]
            mask[b, :length] = 1
        with torch.no_grad():
            v = encoder.pool(encoder.pooling, torch.from_numpy(states).to(encoder.device), torch.from_numpy(mask).to(encoder.device))
            v = torch.nn.functional.normalize(v, dim=-1).float().cpu().numpy()
        ids = np.array([r[0] for r in refs], np.int64)
        writer.docs.set_vectors(ids, v)
        fresh.add(ids, v)
        n += len(refs)
    writer.vectors = fresh
    return n


@dataclass
class VectorSettings:
    index_type: str = "auto"  # auto | flat | ivf | ivf-sq8 | hnsw
    target_recall: float = 0.95  # recall@k against exact search that the search knob is tuned to
    k: int = 10
    max_bytes_per_vector: int | None = None
    tune_queries: np.ndarray | None = None  # real query vectors; else held-out corpus vectors
    sample: int = 500
    device: str = "auto"  # where faiss builds and tunes: a GPU where faiss-gpu sees one
    storage: str | None = None  # full vectors on disk: fp32 | fp16 (None: the index's, fp32 for a new one)


def _keep_storage(entry: dict[str, Any], vs: VectorSettings, base: Manifest | None) -> None:
    """Record in a new segment's index entry how its full vectors are stored (--vector-storage, else
    the index's own; fp32 is recorded by leaving it out)."""
    storage = vs.storage or (base.index.get("storage") if base is not None else None)
    if storage not in (None, "fp32"):
        entry["storage"] = storage


def finalize_vectors(writer: IndexWriter, dim: int, vs: VectorSettings, base: Manifest | None) -> dict[str, Any]:
    """The vector index of the writer's new segment: the type for its size (a small segment is
    flat whatever was asked: searched exactly), built and tuned to the recall target; gives back
    the entry for commit(): the segment's index, and the type asked for where it was forced."""
    from semsearch.store.merge import build_vectors

    n = writer.docs.new.counts()["chunks"]
    requested = vs.index_type
    if requested == "auto" and base is not None and base.index.get("forced"):
        requested = base.index["type"]  # a type the user forced stays until they ask otherwise
    if requested != "auto":
        from semsearch.store.vectors import choose_type

        choose_type(requested, 0, dim)  # an unknown type is refused before anything is built
    writer.vectors, entry = build_vectors(writer.new_vecs, dim, requested, n, vs.target_recall, writer.vectors.params,
                                          vs.k, vs.sample, vs.tune_queries, vs.device, vs.max_bytes_per_vector,
                                          current=writer.vectors)
    # A type the user forced stays forced through later writes that ask for nothing (upserts);
    # so does the storage of the full vectors.
    _keep_storage(entry, vs, base)
    entry["forced"] = requested != "auto"
    if entry["forced"]:
        entry["requested"] = requested
    return entry


def index_corpus(
    corpus: Path,
    folder: Path,
    encoder,
    chunking: ChunkSettings | None = None,
    read: ReadOptions | None = None,
    rebuild: bool = False,
    progress: bool | None = None,
    flush_chunks: int = 512,
    keep_states: bool = False,
    vectors: VectorSettings | None = None,
    checksum: bool = False,
    found: WalkResult | None = None,
    engine=None,
    include=(),
    exclude=(),
    force: bool = False,
    segment_chunks: int | None = SEGMENT_CHUNKS,
    shards: int | None = None,
) -> IndexReport:
    """Index (or incrementally update) `folder` from the files under `corpus`. `checksum` hashes
    every file instead of trusting unchanged size, times and inode; `found` is scan_corpus()'s; `engine` (from semsearch.engines.make_engine) reads, chunks
    and encodes elsewhere, None streams in this process. `include` / `exclude`: gitignore-style
    globs relative to the corpus root choosing the files (when `found` is not given). A head new
    to the index (the encoder's head_info) that records another corpus than the index's documents
    is refused (HeadCorpusMismatch) unless `force`: see encoder.heads.check_head_corpus.
    `segment_chunks`: the local engine publishes what it has written as a segment (flat, searched
    exactly) each time it holds this many new chunks, between files, so that a long run that is
    interrupted resumes from there; the run's segments are merged into one at its end (None:
    publish once, at the end). `shards`: partitions by document (store/partition.py; None: the index's)."""
    t0 = time.perf_counter()
    corpus, folder = Path(corpus), Path(folder)
    read = read or ReadOptions()
    found = found or scan_corpus(corpus, include, exclude)
    base = load_base(folder, rebuild)
    shards = check_shards(shards, base, folder)
    chunking, needs_repool = _settle_chunking(base, encoder, chunking, folder)
    keep_states = keep_states or bool(base and base.states)

    report = IndexReport(index=str(folder), skipped=dict(found.skipped), skipped_files=_walk_skips(found))
    if base is not None and not (needs_repool or checksum) and _nothing_to_do(folder, base, found.files, corpus.resolve(),
                                                                               encoder, vectors, keep_states):
        # Every file as the index holds it, the settings the same: no new generation (a run over a
        # large unchanged index used to copy its docstore and publish one).
        report.unchanged, report.totals = len(found.files), dict(base.counts)
        report.seconds = time.perf_counter() - t0
        return report
    run = _Run(folder, encoder, chunking, keep_states, base, vectors, report, needs_repool, force, shards)
    try:
        new_head = run.start()
        run.write(found.files, corpus.resolve(), read, progress, flush_chunks, checksum, engine, segment_chunks)
        run.finish(new_head, t0)
    except BaseException as e:
        run.abort()
        if isinstance(e, (sqlite3.DatabaseError, UnicodeDecodeError)) and base is not None:  # a docstore had damage its checks did not reach
            raise damaged(folder, base.files.get("docs", "docs"), f"damaged ({e})") from e
        raise
    if run.cache is not None:
        run.cache.drop()
    return report


def check_shards(shards: int | None, base: Manifest | None, folder: Path) -> int:
    """The number of partitions by document a run writes: `shards`, else the index's, else 1. A
    different number for an existing index is refused: re-partitioning rewrites every segment,
    which `semsearch compact --shards N` does on purpose."""
    have = int(base.shards) if base is not None else None
    if shards is None:
        return have or 1
    if shards < 1:
        raise InputError(f"--shards must be at least 1, got {shards}")
    if have is not None and shards != have:
        raise InputError(f"{folder} is partitioned into {have} shard(s), not {shards}: `semsearch compact --index {folder} "
                         f"--shards {shards}` re-partitions it (or index with --rebuild)")
    return shards


def _settle_chunking(base: Manifest | None, encoder, chunking: ChunkSettings | None,
                     folder: Path) -> tuple[ChunkSettings, bool]:
    """The run's chunk settings (those given, else the index's, else the model's length), checked
    against the index's; gives back them and whether the index needs a re-pool (check_settings)."""
    if base is not None and chunking is None:
        chunking = ChunkSettings.of_index(base.chunking)
    chunking = (chunking or ChunkSettings(window=encoder.max_length - 2)).check(encoder.max_length)
    needs_repool = check_settings(base, encoder, chunking, folder) if base is not None else False
    if chunking.context is None:  # titles as the index has them (one built before them: none); a new index's: with them
        chunking = dataclasses.replace(chunking, context=ChunkSettings.of_index(base.chunking).titles if base is not None else chunking.titles)
    return chunking, needs_repool


class _Run:
    """What the steps of one index_corpus run share: its settings, its report, the resume cache
    and the current writer (a long run publishes segments as it goes and goes on with a new
    writer: roll)."""

    def __init__(self, folder: Path, encoder, chunking: ChunkSettings, keep_states: bool, base: Manifest | None,
                 vectors: VectorSettings | None, report: IndexReport, needs_repool: bool, force: bool, shards: int = 1):
        self.folder, self.encoder, self.chunking, self.keep_states = folder, encoder, chunking, keep_states
        self.shards = shards
        self.base, self.vectors, self.vs = base, vectors, vectors or VectorSettings()
        self.report, self.needs_repool, self.force = report, needs_repool, force
        self.writer = IndexWriter(folder, encoder.out_dim, base)
        self.cache = None
        self.rolls = 0  # segments this run published as it went (roll)
        self.ahead: _Ahead | None = None  # the final merge's quantizer, trained beside the run (train_ahead)

    def manifest_for(self, w: IndexWriter, entry: dict) -> Manifest:
        """The manifest of the run's settings for what `w` holds, with `entry` as its new segment's index."""
        encoder, base = self.encoder, self.base
        return Manifest(
            model=encoder.name, model_fingerprint=encoder.fingerprint, backend=encoder.backend,
            pooling=encoder.pooling, dim=encoder.out_dim, max_length=encoder.max_length,
            precision=encoder.precision, chunking=self.chunking.as_manifest(),
            head=getattr(encoder, "head_info", None), counts=w.docs.counts(),
            states={"dtype": "float16", "dim": encoder.dim} if self.keep_states else None,
            model_files=weight_stats(encoder.folder) if getattr(encoder, "folder", None) else {},
            created=base.created if base else "", index=entry, shards=self.shards,
        )

    def _flat_entry(self, w: IndexWriter) -> dict:
        """w's new segment indexed flat, for a run that merges its segments at its end (where the
        index of the type their size asks for is built once), with the type the run asks for."""
        from semsearch.store.merge import build_vectors

        vs, base = self.vs, self.base
        req = vs.index_type if vs.index_type != "auto" else (base.index["type"] if base is not None and base.index.get("forced") else "auto")
        w.vectors, entry = build_vectors(w.new_vecs, self.encoder.out_dim, "flat", w.docs.new.counts()["chunks"], vs.target_recall,
                                         current=w.vectors)
        entry["forced"] = req != "auto"
        if entry["forced"]:
            entry["requested"] = req
        _keep_storage(entry, vs, base)  # the run's segments are stored as its end's will be
        return entry

    def roll(self, w: IndexWriter, done: float = 0.0) -> IndexWriter:
        """Publish w's new segment as it is (flat: the run's segments are merged, and indexed as
        their size asks, at its end) and go on with a new writer. `done`: the fraction of the
        run's bytes read, from which the run's size is foreseen (train_ahead)."""
        t0 = time.perf_counter()
        m = self.manifest_for(w, self._flat_entry(w))
        m.last_run = {k: v for k, v in self.report.as_dict().items() if k not in ("totals", "index")}
        m.last_run.update(at=now(), partial=True)
        w.commit(m, merge="none", rolled=True)
        self.rolls += 1
        if self.cache is not None:  # its files are published: a run resumed after this one skips them
            self.cache.forget()
        log.info("published %d chunks so far as a segment (%.1f s)", m.counts["chunks"], time.perf_counter() - t0)
        published = Manifest.load(self.folder)
        self.writer = IndexWriter(self.folder, self.encoder.out_dim, published)
        if self.ahead is None:
            self.ahead = train_ahead(self.folder, published, self.rolls, done)
        elif self.shards <= 1:  # its vectors go into the index trained beside the run, there
            self.ahead.add(published.segments[-1])  # (partitioned: each partition fills a copy at the end)
        return self.writer

    def start(self) -> str | None:
        """Open the resume cache, check a head new to an index against its documents and re-pool
        where the pooling changed, all before any encoding; gives back the new head's folder."""
        from semsearch.store.resume import ResumeCache, encoder_key

        self.cache = None if self.keep_states else ResumeCache(self.folder, encoder_key(self.encoder))
        new_head = _new_head(self.base, self.encoder)
        if new_head is not None and self.base is not None:  # before any re-pooling or encoding
            _check_head_corpus(new_head, self.writer, self.force)
        if self.needs_repool:
            t = time.perf_counter()
            self.report.repooled = repool(self.writer, self.encoder)
            self.report.repool_seconds = round(time.perf_counter() - t, 2)
        return new_head

    def write(self, files, root: Path, read: ReadOptions, progress, flush_chunks: int, checksum: bool, engine,
              segment_chunks: int | None) -> None:
        """The walked files into the index: streamed in this process (rolling segments as it goes,
        except in a re-pooling run), or read, chunked and encoded by `engine`."""
        if engine is None:
            _update(self.writer, files, root, self.encoder, self.chunking, read, self.report, progress, flush_chunks,
                    self.keep_states, self.cache, checksum, self.roll if segment_chunks and not self.needs_repool else None,
                    segment_chunks or 0)
        else:
            from semsearch.engines.build import update_with_engine

            self.report.engine = update_with_engine(self.writer, files, root, self.encoder, self.chunking, read, self.report,
                                                    self.keep_states, engine, self.vectors, self.shards)
        self.report.resumed = self.cache.reused if self.cache else 0

    def finish(self, new_head: str | None, t0: float) -> None:
        """Check a head new to a new index against its documents, build the vector index and
        publish, the segments this run published as it went merged into one."""
        writer = self.writer
        if new_head is not None and self.base is None:  # a new index: its documents are known now
            _check_head_corpus(new_head, writer, self.force)
        # a run that published segments as it went merges them with this one: its vector index
        # is built once, by that merge (not first for this segment alone)
        # (so is a partitioned index's: its split builds each partition's)
        index_entry = (self._flat_entry(writer) if self.rolls or self.shards > 1
                       else finalize_vectors(writer, self.encoder.out_dim, self.vs, self.base))
        counts = writer.docs.counts()
        manifest = self.manifest_for(writer, index_entry)
        self.report.totals = counts
        self.report.seconds = time.perf_counter() - t0
        manifest.last_run = {k: v for k, v in self.report.as_dict().items() if k not in ("totals", "index")}
        manifest.last_run["at"] = now()
        trained = self.ahead.result() if self.ahead is not None else None
        writer.commit(manifest, merge="run", trained=trained)  # the segments this run published as it went become one

    def abort(self) -> None:
        """After a failure: keep the resume cache (the next run takes the vectors embedded so far
        from it) and remove what the current writer wrote."""
        if self.cache is not None:
            self.cache.close()
        self.writer.abort()


class _Ahead:
    """A vector index's quantizer trained in a thread beside the build (train_ahead), and then,
    in the same thread, the vectors of the run's published segments added to it, each segment's
    as it is published (add()), on one OpenMP thread beside the stream. When the stream ends
    (result()) the thread stops adding at the next batch, and the final merge adds the rest with
    every thread (merge.fits: the index holds exactly the merged segment's ids up to `through`).
    A daemon thread: a run stopped by Ctrl-C or an error exits without waiting for it (a pool's
    worker would be joined at exit, up to minutes of k-means)."""

    def __init__(self, work, folder: Path, published: list[dict]):
        import queue

        from semsearch.store.vectors import one_omp_thread

        self._future: Future = Future()
        self._todo: queue.Queue = queue.Queue()
        self._stop = threading.Event()  # the stream has ended: what is left is the merge's to add
        for e in published:
            self._todo.put(e)

        def run() -> None:
            try:
                vi = work()
                with one_omp_thread():
                    while not self._stop.is_set() and (e := self._todo.get()) is not None:
                        _add_published(vi, folder, e, self._stop)
                        self._todo.task_done()
                self._future.set_result(vi)
            except BaseException as e:  # noqa: BLE001 - handed to result()
                self._future.set_exception(e)

        threading.Thread(target=run, name="semsearch-quantizer", daemon=True).start()

    def add(self, entry: dict) -> None:
        """A segment the run published after the training started: its vectors go in next."""
        self._todo.put(entry)

    def wait(self) -> None:
        """Until the training is done and every segment given so far is added, or the thread
        has ended (a failed training): for tests."""
        while self._todo.unfinished_tasks and not self._future.done():
            time.sleep(0.01)

    def result(self):
        """The trained index holding the published segments' vectors (once the thread has added
        them all), or None where training failed (the final merge then trains its own)."""
        self._stop.set()
        self._todo.put(None)
        try:
            return self._future.result()
        except Exception as e:  # noqa: BLE001 - an optimisation only: the merge does what it did before
            log.warning("training the vector index beside the build failed (%s); the final merge trains it", e)
            return None


def _add_published(vi, folder: Path, entry: dict, stop: threading.Event) -> None:
    """Add a published segment's vectors (from its vector file, in id order, a batch at a time
    until `stop` is set) to the index trained beside the run, recording the last id it holds
    (vi.through)."""
    from semsearch.store.vecfile import VectorFile

    t, n = time.perf_counter(), 0
    vf = VectorFile(folder / entry["vecs"])
    for ids, vecs in vf.iter(65536):
        if stop.is_set():
            break
        vi.add(ids, vecs, refine=False)  # (its re-ranking rows are the merged segment's file, set by fill)
        vi.through, n = int(ids[-1]), n + len(ids)
    log.info("added %d of segment %d's %d vectors to the index trained beside the build (%.1f s)", n, entry["id"],
             len(vf.ids), time.perf_counter() - t)


def train_ahead(folder: Path, published: Manifest, rolls: int, done: float) -> _Ahead | None:
    """Train, in a thread beside a long run, the quantizer of the vector index its final merge
    will build, on a sample of the segments it has published, once they hold the sample it needs.

    The final merge of a 1M-chunk build trained its IVF quantizer on 200k of its vectors first
    (k-means: ~55 s of its ~150 s, both cores), after the stream had ended; trained beside the
    stream (129 s on one thread) it delayed the stream by ~3.5 s (docs/benchmarks.md). The run's size is foreseen from the bytes read so far
    (`done`); the merge takes the index only where its type and list count still fit the size
    the run ended at (merge.fits), else trains as before. faiss releases the interpreter's lock
    while it trains, and runs one OpenMP thread here, so the stream keeps its cores' share."""
    from semsearch.store import merge as merge_
    from semsearch.store.vecfile import Sampled, VectorFile
    from semsearch.store.vectors import IVF_TYPES, VectorIndex, default_nlist, one_omp_thread

    mine = published.segments[-rolls:] if rolls else []
    have = sum(e["live"] for e in mine)
    if not mine or done <= 0:
        return None
    shards = int(getattr(published, "shards", 1) or 1)
    n = int(have / min(done, 1.0))
    size = n // shards  # a partitioned run's partitions (store/partition.py) each fill a copy of it
    kind = merge_.segment_type(merge_._requested(published), size, published.dim)
    if kind not in IVF_TYPES or have < max(AHEAD_SAMPLE, 39 * default_nlist(size)) or n <= have:
        return None  # flat at the end, a sample not there yet, or nothing left to read
    params = {k: v for k, v in ((published.index or {}).get("params") or {}).items() if k == "k_factor"}
    files = [VectorFile(folder / e["vecs"]) for e in mine]

    def work():
        with one_omp_thread():
            t = time.perf_counter()
            vi = VectorIndex.trained(published.dim, kind, size, Sampled(files), params, train_sample=AHEAD_SAMPLE)
            log.info("trained the %s quantizer for ~%d chunks beside the build (%.1f s)", kind, size, time.perf_counter() - t)
            return vi

    log.info("training the vector index's quantizer for ~%d chunks beside the build", size)
    return _Ahead(work, folder, mine if shards <= 1 else [])


def _nothing_to_do(folder: Path, base: Manifest, files, root: Path, encoder, vectors: VectorSettings | None,
                   keep_states: bool) -> bool:
    """Whether a run would change nothing: the same head, states and vector settings, no
    interrupted run to finish, the lexical side present, and every walked file stored with the
    same size, times and inode, none gone. Read-only: the docstore is only opened."""
    from semsearch.store import integrity
    from semsearch.store.docstore import open_docs

    integrity.check_files(folder, base)  # a damaged index is reported as a writing run would report it
    vs = vectors or VectorSettings()
    if _new_head(base, encoder) is not None or (keep_states and not base.states) or (folder / "resume.sqlite").exists():
        return False
    forced_same = vs.index_type == base.index.get("type") and base.index.get("forced")
    if not (vs.index_type == "auto" or forced_same) or vs.max_bytes_per_vector is not None:
        return False
    if vs.target_recall != (base.index.get("recall") or {}).get("target", VectorSettings.target_recall):
        return False
    if (vs.storage or base.index.get("storage") or "fp32") != (base.index.get("storage") or "fp32"):
        return False  # recorded for the next segments; `semsearch compact` rewrites the stored ones
    from semsearch.store.lexical import has_terms
    from semsearch.store.segments import Tombstones, live_files

    stored = {}
    for e in base.segments:
        try:
            docs = open_docs(folder, e)
        except sqlite3.Error:
            return False
        try:
            if not has_terms(docs.db):
                return False
            stored.update(live_files(docs, Tombstones.load(folder / e["deletes"]) if e.get("deletes") else Tombstones()))
        except sqlite3.Error:
            return False
        finally:
            docs.close()
    seen = set()
    for f in files:
        old = stored.get(str(f.path))
        if old is None or not same_stat(old, f):
            return False
        seen.add(str(f.path))
    prefix = str(root).rstrip("/") + "/" if root.is_dir() else None
    return not any(key not in seen and prefix is not None and key.startswith(prefix) for key in stored)


def _new_head(base: Manifest | None, encoder) -> str | None:
    """The folder of the encoder's head where the index does not record that head yet."""
    info = getattr(encoder, "head_info", None)
    if not info or (base is not None and base.head and base.head.get("fingerprint") == info.get("fingerprint")):
        return None
    return info.get("path")


def _check_head_corpus(head: str, writer: IndexWriter, force: bool) -> None:
    from semsearch.encoder.heads import check_head_corpus, index_row_key

    rows = writer.docs.select("c.metadata, c.text", "c.ord = 0")
    check_head_corpus(head, (index_row_key(meta, text) for _, meta, text in rows), force)


def _update(writer, files, root, encoder, chunking, read, report, progress, flush_chunks, keep_states,
            cache=None, checksum: bool = False, roll=None, segment_chunks: int = 0) -> None:
    """Walked files into the writer's new segment. `roll(writer, done) -> writer` publishes what
    is written so far and gives the writer to go on with, called between files once the new
    segment holds `segment_chunks` chunks (`done`: the fraction of the bytes to read read so far)."""
    stored = writer.docs.files()
    seen: set[str] = set()
    up = _Updating(writer, encoder, chunking, read, report, flush_chunks, keep_states, cache)
    try:
        _add_files(up, files, stored, seen, root, report, progress, checksum, roll, segment_chunks)
    finally:
        # After an error or Ctrl-C too, the batch in the thread is finished first: it reads and
        # writes the resume cache, which the run's abort then closes (closing it under the
        # thread crashed the process in SQLite).
        up.close()


def _add_files(up, files, stored, seen, root, report, progress, checksum, roll, segment_chunks) -> None:
    bar = progress_bar(sum(f.size for f in files), "indexing", "B", progress, unit_scale=True)
    trusted = {str(f.path) for f in files if _trusted(stored.get(str(f.path)), f, checksum)}
    up.read_ahead([f for f in files if str(f.path) not in trusted], stored)
    to_read, read = sum(f.size for f in files if str(f.path) not in trusted), 0
    for at, f in enumerate(files):
        key = str(f.path)
        seen.add(key)
        old = stored.get(key)
        if key in trusted:
            report.unchanged += 1  # same size, times and inode (as git checks): trust it without hashing
            bar.update(f.size)
            continue
        read += f.size
        if not up.add_file(f, old, bar):
            continue
        if roll is not None and up.written + len(up.pending) >= segment_chunks and at < len(files) - 1:
            # (after the last file the run's end publishes, and merges, what is written)
            up.flush(wait=True)  # a file's chunks and its record stay in one segment: publish between files
            following = next(((g, stored.get(str(g.path))) for g in files[at + 1:] if str(g.path) not in trusted), None)
            up.roll_reading_ahead(roll, read / max(to_read, 1), following)
    up.flush(wait=True)
    bar.close()
    drop_gone(up.writer, stored, seen, root, report)  # files under this corpus root that are gone


def _trusted(old: StoredFile | None, f, checksum: bool) -> bool:
    """Whether a file's record is trusted without reading it: the same size, times and inode."""
    return old is not None and not checksum and same_stat(old, f)


class _Updating:
    """What _update shares between files: the current writer (a roll gives a new one), the chunks
    read but not embedded yet (`pending`, embedded `flush_chunks` at a time) and the number of
    chunks the new segment got since the last roll (`written`).

    Encoding runs beside the rest: a full batch goes to one encoding thread, and this thread
    writes the batch before it (term analysis, SQLite, the vector file) and reads and chunks the
    files after it meanwhile, so a build takes about its slower side's time, not the sum (a GPU,
    or the int8 and bf16 kernels, release the GIL while they run). Batches are written in the
    order they were read, so chunk ids are what a run without the thread gives. Only one batch is
    in the thread at a time, and everything that touches the store (a file dropped part way, a
    roll, the run's end) first waits for it (`flush(wait=True)`)."""

    def __init__(self, writer, encoder, chunking, read, report, flush_chunks, keep_states, cache):
        self.encoder, self.chunking, self.read, self.report = encoder, chunking, read, report
        self.flush_chunks, self.keep_states, self.cache = flush_chunks, keep_states, cache
        self.writer, self.store = writer, writer.docs
        self.written = 0
        self.pending: list[ChunkRow] = []
        self._pool = None  # the encoding thread, started at the first batch
        self._inflight = None  # (chunks, the future of their vectors [and states])
        self.ahead: reader.ReadAhead | None = None  # the reader process, where the run has one
        self.lookahead: Lookahead | None = None  # the file read and encoded during the last roll

    def rolled(self, writer) -> None:
        """Go on with the writer a roll gave: a new segment, empty."""
        self.writer, self.store = writer, writer.docs
        self.written = 0

    def roll_reading_ahead(self, roll, done: float, following) -> None:
        """roll(writer, done), the next file to read (`following`: (file, its record) or None)
        read and encoded meanwhile (engines/lookahead.py), then go on with the writer it gave."""
        if self.lookahead is not None:  # (the last one's file is read: it has stopped already)
            self.lookahead.stop()
        self.lookahead = ahead = None
        if following is not None and not self.keep_states and overlap_safe(self.encoder):
            f, old = following
            ahead = Lookahead(str(f.path), lambda on_bytes: self._open(f, old, on_bytes),
                              lambda texts: self.encoder.encode(texts, progress=False), self.flush_chunks)
        try:
            writer = roll(self.writer, done)
        except BaseException:
            if ahead is not None:
                ahead.stop()
            raise
        self.lookahead = ahead  # (reading on until the run's reading catches up with it)
        self.rolled(writer)

    def flush(self, wait: bool = False) -> None:
        """Hand the pending chunks to the encoding thread, and add the batch before them, with its
        vectors, to the new segment; `wait`: this batch too, before returning."""
        batch, self.pending = self.pending, []
        if batch:
            texts = [embedding_text(c.context, c.text) for c in batch]  # a chunk's titles, then its text
            keys = self.cache.keys(texts) if self.cache is not None and not self.keep_states else None
            self.written += len(batch)
            if not overlap_safe(self.encoder):
                self._write_inflight()
                future: Future = Future()
                future.set_result(self._embed(texts, keys))  # encoded here, written with the next batch as the thread's are
            else:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(1, thread_name_prefix="semsearch-encode")
                future = self._pool.submit(self._embed, texts, keys)
                self._write_inflight()
            self._inflight = (batch, future)
        if wait:
            self._write_inflight()

    def _embed(self, texts: list[str], keys: list[bytes] | None):
        """(vectors, token states or None, vectors to put in the resume cache): the encoding
        thread's work, no more (the cache's keys were hashed before, its inserts come after).
        Texts encoded ahead during a roll (self.lookahead) are taken from there."""
        got = self.lookahead.take(texts) if self.lookahead is not None and not self.keep_states else {}
        if not got:
            return self._encode(texts, keys)
        todo = [i for i in range(len(texts)) if i not in got]
        out = np.empty((len(texts), self.encoder.out_dim), np.float32)
        new: list = []
        if todo:
            out[todo], _, new = self._encode([texts[i] for i in todo], [keys[i] for i in todo] if keys is not None else None)
        at = list(got)
        out[at] = np.stack([got[i] for i in at])
        if keys is not None:  # the resume cache holds them too
            new = [*new, *((keys[i], got[i]) for i in at)]
        return out, None, new

    def _encode(self, texts: list[str], keys: list[bytes] | None):
        encoder = self.encoder
        if self.keep_states:
            vecs, states = encoder.encode_with_states(texts, progress=False)
            return vecs, list(zip(states, token_table(encoder, texts))), []
        if keys is not None:
            vecs, new = self.cache.encode_deferred(encoder, texts, keys)
            return vecs, None, new
        return encoder.encode(texts, progress=False), None, []

    def _write_inflight(self) -> None:
        if self._inflight is None:
            return
        batch, future = self._inflight
        self._inflight = None
        vecs, states, new = future.result()
        if states is not None:
            for c, (st, tb) in zip(batch, states):
                c.state = self.writer.append_states(st, tb)
        self.writer.vectors.add(self.store.add_chunks(batch, vecs), vecs)
        if new:
            self.cache.put(new)
        self.report.chunks += len(batch)

    def close(self) -> None:
        """Stop the encoding thread, once the batch it holds (if a failure left one) is encoded,
        the look-ahead and the reader process."""
        if self.lookahead is not None:
            self.lookahead.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self.ahead is not None:
            self.ahead.close()
            self.ahead = None

    def read_ahead(self, files, stored: dict[str, StoredFile]) -> None:
        """Read and chunk `files` (those the run reads, in its order) in a reader process
        (engines/reader.py), where there is enough to read to pay for its start, there is a
        second core, and the encoder's tokenizer can go to another process."""
        offsets = offsets_of(self.encoder)
        if offsets is None or (os.cpu_count() or 1) < 2 or sum(f.size for f in files) < reader.READ_AHEAD_BYTES:
            return
        olds = [stored.get(str(f.path)) for f in files]
        self.ahead = reader.ReadAhead([(f.path, o.hash if o is not None else None) for f, o in zip(files, olds)],
                                      offsets, self.chunking, self.read)

    def _open(self, f, old: StoredFile | None, on_bytes) -> Opened:
        """A file's hash and documents: read ahead during a roll, from the reader process, else
        read here (lazily)."""
        if self.lookahead is not None and self.lookahead.path == str(f.path):
            return self.lookahead.opened(on_bytes)
        if self.ahead is not None:
            return self.ahead.open(f.path, on_bytes)
        try:
            digest = file_hash(f.path)
        except OSError as e:
            return Opened(None, e.strerror, iter(()))
        return Opened(digest, None, file_chunks(f.path, self.encoder.token_offsets, self.chunking, self.read, on_bytes))

    def add_file(self, f, old: StoredFile | None, bar) -> bool:
        """A file whose stat differs from its record, or that `checksum` hashes: only touched where
        its hash is the same, else read into the new segment (or skipped, as the reading options
        say); gives back whether its documents were added."""
        report = self.report
        done = 0

        def on_bytes(n: int) -> None:
            nonlocal done
            done += n
            bar.update(n)

        opened = self._open(f, old, on_bytes)
        digest, docs = opened.digest, opened.docs
        if old is not None and old.hash == digest:
            self.store.touch_file(old.id, f.size, f.mtime_ns, f.ctime_ns, f.inode)
            report.unchanged += 1
            bar.update(f.size)
            return False
        # Stream the file's documents: the first one is read before the file is registered, so a
        # file skipped as unreadable (checked up front by the readers) leaves nothing behind.
        try:
            if digest is None:
                raise Skip(f"unreadable ({opened.unreadable})")
            first = next(docs, None)
        except (Skip, CorpusError) as e:
            if isinstance(e, CorpusError) and not self.read.skip_errors:
                raise
            _skip_file(f.path, e, report)
            if old is not None:  # its indexed text no longer matches the file: drop it
                drop_file(self.writer, old, report)
            bar.update(f.size - done)
            return False
        file_id = replace_file(self.writer, f, old, digest, report)
        added = self._add_documents(f, old, file_id, itertools.chain([first] if first is not None else [], docs))
        bar.update(f.size - done)
        return added

    def _add_documents(self, f, old: StoredFile | None, file_id: int, docs) -> bool:
        """A registered file's documents, (number, chunk rows) each, into the pending chunks;
        where one fails past the first, the file goes with what it had added (an error unless
        the reading options skip it). Gives back whether they were added."""
        report = self.report
        doc_numbers: set[int] = set()
        try:
            for n, rows in docs:
                doc_numbers.add(n)
                for r in rows:
                    r.file_id = file_id
                    self.pending.append(r)
                if len(self.pending) >= self.flush_chunks:
                    self.flush()
        except (Skip, CorpusError) as e:  # an error past the first document (a bad line, a damaged row group)
            if not self.read.skip_errors:
                raise e if isinstance(e, CorpusError) else CorpusError(f"{f.path}: {e}") from e
            self.pending[:] = [r for r in self.pending if r.file_id != file_id]  # the file goes, with what it had added
            self.flush(wait=True)  # (its chunks in the encoding thread too: written, then removed with the file)
            self.writer.vectors.remove(self.store.remove_file(file_id))
            _skip_file(f.path, e, report)
            if old is None:
                report.added -= 1
            else:
                report.updated -= 1
                report.removed += 1
            return False
        self.store.set_documents(file_id, len(doc_numbers))
        report.documents += len(doc_numbers)
        return True


def overlap_safe(encoder) -> bool:
    """Whether chunking may run while the encoder encodes in another thread: not on the
    sentence-transformers backend, whose chunking and encoding share one Hugging Face fast
    tokenizer (it sets its truncation on every call: two threads at once fail with "Already
    borrowed"); the native backend chunks with a tokenizer of its own."""
    return getattr(encoder, "backend", "") != "sentence-transformers"


# What the user chose to leave out is listed after what semsearch could not read.
_CHOSEN = ("hidden", "ignored", "excluded", "not included")


def _walk_skips(found) -> list[str]:
    """'path: reason' of every file the walk skipped, the ones the user did not choose first."""
    chosen = [f"{p}: {r}" for p, r in found.skipped_paths if r.startswith(_CHOSEN)]
    unread = [f"{p}: {r}" for p, r in found.skipped_paths if not r.startswith(_CHOSEN)]
    for line in unread:
        log.warning("skipped %s", line)
    return unread + chosen


def _skip_file(path: Path, e: Exception, report: IndexReport) -> None:
    msg = str(e).removeprefix(f"{path}: ")
    log.warning("skipped %s: %s", path, msg)
    reason = msg.split(" (")[0] if isinstance(e, Skip) else "unreadable or malformed"
    report.skipped[reason] = report.skipped.get(reason, 0) + 1
    report.skipped_files.append(f"{path}: {msg}")


