"""Keep an index in step with a folder: catch up, then publish one generation per batch of changes.

    w = Watcher("notes/", "indexes/notes", log=print).start()   # a daemon thread
    ...
    w.stop()

Each batch walks the folder again and hands the walk to `index_corpus`, exactly as `semsearch
index` does: unchanged files are recognised by their size, times and inode, so a batch embeds
only what changed, removes what is gone, and publishes it all as one atomic generation. Events
only decide *when* to look; the walk decides *what* changed, so a lost or coalesced event (a
rename, a folder moved in, a queue overflow) never leaves the index wrong after the next batch.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from semsearch.corpus.chunking import ChunkSettings
from semsearch.corpus.readers import SUPPORTED_EXTS, ReadOptions
from semsearch.corpus.walk import IGNORE_FILE, Selection, WalkResult, walk
from semsearch.errors import IndexFormatError, IndexLocked, InputError, SemsearchError, SettingsMismatch
from semsearch.store import Manifest, index_path, writer_lock

logger = logging.getLogger(__name__)

DEBOUNCE_MS = 300  # quiet time that ends a batch
MAX_WAIT_MS = 5_000  # a batch is taken after this long even while changes keep coming
TICK_MS = 1_000  # how often an idle watcher checks that the folder and the index are still there
RETRY_S = 5.0  # wait before retrying a batch that found the index locked by another process

# Skip reasons the user chose (hidden, excluded ...): never worth a line in a batch.
_CHOSEN = ("hidden", "ignored", "excluded", "not included")


class WatchStopped(SemsearchError):
    """The watched folder or the index went away while watching: watching ended, and the index
    keeps the last generation it published."""


@dataclass
class BatchReport:
    """What one batch did. `number` 0 is the catch-up at start."""

    number: int
    changes: int = 0  # file events that started it (0 for the catch-up)
    added: int = 0  # files
    changed: int = 0
    removed: int = 0
    skipped: int = 0  # changed files skipped (unreadable, binary, malformed with skip_errors)
    chunks: int = 0  # chunks embedded
    generation: int | None = None  # the index's generation after the batch
    published: bool = False  # whether the batch published a new generation
    files: int = 0  # what the index holds afterwards
    total_chunks: int = 0
    seconds: float = 0.0
    error: str | None = None  # why nothing was published
    retry: bool = False  # the index was locked by another process: retried after a wait
    skipped_files: list[str] = field(default_factory=list)  # 'path: reason'

    def line(self) -> str:
        what = "catch-up" if self.number == 0 else f"batch {self.number} ({self.changes} change{'s' * (self.changes != 1)})"
        if self.error is not None:
            return f"{what}: {self.error}"
        if not self.published and not (self.added or self.changed or self.removed):
            return f"{what}: index up to date ({self.files} files, {self.total_chunks} chunks); {self.seconds:.1f} s"
        skipped = f", {self.skipped} skipped" if self.skipped else ""
        return (f"{what}: {self.added} added, {self.changed} changed, {self.removed} removed{skipped} file(s); "
                f"{self.chunks} chunk(s) embedded; generation {self.generation}; {self.seconds:.1f} s; "
                f"index holds {self.files} files, {self.total_chunks} chunks")


class _Rules:
    """Whether a file event concerns a file the walk would take (the walk's own rules: hidden
    names, the root's ignore file, --include / --exclude, supported types), so that events for
    editor temporaries, excluded paths or the index folder inside the watched one cost nothing."""

    def __init__(self, root: Path, folder: Path, include: Iterable[str], exclude: Iterable[str]):
        self.root = root
        self.include, self.exclude = list(include), list(exclude)
        try:
            self.index_rel: tuple[str, ...] | None = folder.resolve().relative_to(root).parts or None
        except ValueError:
            self.index_rel = None
        self.dirs: set[str] = set()  # folders (relative) holding walked files: a deleted one mattered
        self.compile()

    def compile(self) -> None:
        self.inc, self.exc, self.ign = Selection(self.include, self.exclude).compile(self.root)

    def in_index(self, path: Path) -> bool:
        return self.index_rel is not None and path.relative_to(self.root).parts[: len(self.index_rel)] == self.index_rel

    def walk(self) -> WalkResult:
        found = walk(self.root, self.include, self.exclude)
        if self.index_rel is not None:  # the index's own files (manifest.json ...) are no documents
            found.files = [f for f in found.files if not self.in_index(f.path)]
        self.dirs = {p.as_posix() for f in found.files for p in f.path.relative_to(self.root).parents if p.parts}
        return found

    def _out(self, rel: str) -> bool:
        return bool((self.ign is not None and self.ign.match_file(rel)) or (self.exc is not None and self.exc.match_file(rel)))

    def __call__(self, change, path: str) -> bool:
        from watchfiles import Change

        p = Path(path)
        if p == self.root:
            return change == Change.deleted  # noticed at once; the watcher then stops
        try:
            parts = p.relative_to(self.root).parts
        except ValueError:
            return False
        if self.index_rel is not None and parts[: len(self.index_rel)] == self.index_rel:
            return False
        rel = "/".join(parts)
        if rel == IGNORE_FILE:
            return True  # the rules changed: the next walk applies them
        if any(x.startswith(".") for x in parts):
            return False
        if any(self._out("/".join(parts[:i]) + "/") for i in range(1, len(parts))):
            return False  # under a folder the walk does not enter
        if p.is_dir() or (not p.exists() and rel in self.dirs):
            # A folder moved in or out (its files may get no events of their own). A folder's
            # "modified" only says its listing changed: its files have their own events.
            return change != Change.modified and not self._out(rel + "/")
        if p.suffix.lower() not in SUPPORTED_EXTS or self._out(rel):
            return False
        return self.inc is None or bool(self.inc.match_file(rel))


class Watcher:
    """Keeps the index `index` (default: $SEMSEARCH_INDEX, else ./indexes/default) in step with
    the folder `corpus`: on start it catches up as `semsearch index` would (new and changed files
    embedded, deleted ones removed), then each batch of changes (ended by `debounce_ms` of quiet,
    or after `max_wait_ms` of changes) becomes one atomic generation.

    `include` / `exclude` / the root's .semsearchignore choose files as for `index`. `poll`:
    poll the folder every `poll_ms` instead of using file-system events (network and some
    container file systems give none). `encoder`: the document encoder to use (as
    `indexing.encoder_for_index` makes it); None loads one, once, with the index's settings
    (else `model` / `device` / `precision`). `skip_errors`: skip malformed files and lines with a
    warning; without it a batch that meets one publishes nothing, says why, and the next change
    retries. `log(line)` gets a line a batch; `on_batch(report)` the BatchReport.

    Every update holds `store.writer_lock(index)`, so that other writers of this process (a
    server's upserts) queue behind a batch rather than fail with IndexLocked.

    In a server: `w = Watcher(folder, index, log=logger.info).start()` at startup (the catch-up
    runs in the thread; `w.ready` is set once it has), `w.stop()` at shutdown. Its Retrievers pick
    each new generation up by themselves. Pass `encoder=` only a *document* encoder: a
    Retriever's own may carry trained query layers or be a numpy copy.
    """

    def __init__(self, corpus: str | Path, index: str | Path | None = None, *, include: Iterable[str] = (),
                 exclude: Iterable[str] = (), debounce_ms: int = DEBOUNCE_MS, max_wait_ms: int = MAX_WAIT_MS,
                 poll: bool = False, poll_ms: int = 300, encoder: Any = None, model: str | None = None,
                 device: str = "auto", precision: str = "auto", chunk_tokens: int | None = None,
                 overlap: int | None = None, text_column: str | None = None, skip_errors: bool = False,
                 checksum: bool = False, progress: bool | None = False,
                 log: Callable[[str], None] | None = None, on_batch: Callable[[BatchReport], None] | None = None):
        self.corpus = Path(corpus)
        self.folder = index_path(index)
        if not self.corpus.exists():  # before loading a model
            raise InputError(f"corpus path {str(self.corpus)!r} does not exist")
        if not self.corpus.is_dir():
            raise InputError(f"{str(self.corpus)!r} is not a folder: watch needs a folder (index a single file with `semsearch index`)")
        self.corpus = self.corpus.resolve()
        if debounce_ms < 1 or max_wait_ms < debounce_ms:
            raise InputError(f"debounce must be >= 1 ms and at most the longest wait ({max_wait_ms} ms), got {debounce_ms}")
        self.rules = _Rules(self.corpus, self.folder, include, exclude)  # a bad pattern fails here
        self.debounce_ms, self.max_wait_ms, self.poll, self.poll_ms = int(debounce_ms), int(max_wait_ms), poll, int(poll_ms)
        self.read = ReadOptions(text_column, skip_errors)
        self.checksum, self.progress = checksum, progress
        self.log = log or logger.info
        self.on_batch = on_batch
        self.encoder = encoder
        self._encoder_args = dict(model=model, device=device, precision=precision)
        self._chunk_args = (chunk_tokens, overlap)
        self.chunking: ChunkSettings | None = None
        self.batches = 0  # batches run, the catch-up not counted
        self.last: BatchReport | None = None
        self.ready = threading.Event()  # set once the catch-up has run
        self.error: BaseException | None = None  # what ended a start()ed watcher, if not stop()
        self._had_index = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- embedding ---------------------------------------------------------------------------
    def start(self) -> "Watcher":
        """Run in a daemon thread; gives back self (stop with stop())."""
        if self._thread is not None:
            raise RuntimeError("this Watcher was started already")
        self._thread = threading.Thread(target=self._run_logged, name=f"semsearch-watch {self.corpus.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 60.0) -> None:
        """Ask the watcher to end and wait up to `timeout` s for it (a batch under way finishes
        and publishes first)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run_logged(self) -> None:
        try:
            self.run(self._stop)
        except BaseException as e:  # noqa: BLE001 - a thread's end is reported, not raised into nothing
            self.error = e
            self.ready.set()
            if isinstance(e, SemsearchError):
                self.log(f"watch stopped: {e}")
            else:
                logger.exception("watch stopped")
                self.log(f"watch stopped: {type(e).__name__}: {e}")

    # ---- the loop ----------------------------------------------------------------------------
    def run(self, stop: threading.Event | None = None) -> None:
        """Catch up, then watch until `stop` is set (blocking). Raises WatchStopped when the
        folder or the index goes away, SettingsMismatch / IndexFormatError when the index cannot
        be written with these settings; a batch's other errors are reported and watching goes on."""
        import watchfiles

        stop = stop if stop is not None else self._stop
        self._load_encoder()
        pending: set[str] = set()
        catch_up, retry_at = True, None
        # The watch is armed before the catch-up walk (the first yield comes after at most one
        # tick), so a change made while catching up is seen by the next batch, not lost.
        events = watchfiles.watch(self.corpus, watch_filter=self.rules, debounce=self.max_wait_ms, step=self.debounce_ms,
                                  stop_event=stop, rust_timeout=TICK_MS, yield_on_timeout=True, force_polling=self.poll,
                                  poll_delay_ms=self.poll_ms)
        try:
            for changes in events:
                if stop.is_set():
                    break
                self._check_alive()
                pending |= {path for _, path in changes}
                if not (catch_up or pending or (retry_at is not None and time.monotonic() >= retry_at)):
                    continue
                report = self._batch(0 if catch_up else self.batches + 1, pending)
                if report.number:
                    self.batches += 1
                catch_up, pending = False, set()
                retry_at = time.monotonic() + RETRY_S if report.retry else None
                self.ready.set()
        except OSError as e:  # from the watch itself (a batch reports its own): no events to be had
            self._check_alive()
            raise InputError(f"cannot watch {self.corpus}: {e}; --poll (poll=True) scans it instead") from e
        finally:
            events.close()  # ends the file-system watch at once

    def _load_encoder(self) -> None:
        from semsearch.indexing import encoder_for_index, load_base, resolve_chunking

        base = load_base(self.folder, False)
        self._had_index = base is not None
        if self.encoder is None:  # once: a batch costs what it embeds, not a model load
            args = self._encoder_args
            self.encoder = encoder_for_index(base, args["model"], None, None, args["device"], args["precision"])
        self.chunking = resolve_chunking(base, self.encoder, *self._chunk_args)

    def _check_alive(self) -> None:
        if not self.corpus.is_dir():
            raise WatchStopped(f"{self.corpus} no longer exists: stopped watching (the index {self.folder} keeps "
                               "what it last published)")
        if self._had_index and not (self.folder / "manifest.json").exists():
            raise WatchStopped(f"the index {self.folder} was removed while watching: stopped watching "
                               f"(watch again to build it anew from {self.corpus})")

    def _batch(self, number: int, paths: set[str]) -> BatchReport:
        """One walk and one index update (one generation at most); errors become the report's."""
        from semsearch.indexing import index_corpus

        rep = BatchReport(number, len(paths))
        t0 = time.perf_counter()
        logger.info("%s: updating %s", "catch-up" if number == 0 else f"batch {number}", self.folder)
        try:
            self.rules.compile()  # the ignore file may have changed
            found = self.rules.walk()
            # The catch-up reports every file it could not read; a batch only the changed ones.
            found.skipped_paths = [(p, r) for p, r in found.skipped_paths
                                   if not r.startswith(_CHOSEN) and (number == 0 or p in paths)]
            with writer_lock(self.folder):
                before = self._generation()
                report = index_corpus(self.corpus, self.folder, self.encoder, self.chunking, self.read, progress=self.progress
                                      if number == 0 else False, checksum=self.checksum, found=found)
                rep.generation = self._generation()
            self._had_index = True
            rep.published = rep.generation != before
            rep.added, rep.changed, rep.removed, rep.chunks = report.added, report.updated, report.removed, report.chunks
            rep.skipped_files = list(report.skipped_files)
            rep.skipped = len(rep.skipped_files)
            rep.files, rep.total_chunks = report.totals.get("files", 0), report.totals.get("chunks", 0)
        except (SettingsMismatch, KeyboardInterrupt):
            raise
        except IndexLocked as e:
            rep.error, rep.retry = f"nothing published: {e}; retrying in {RETRY_S:.0f} s", True
        except Exception as e:  # noqa: BLE001 - one bad batch must not end the watch
            self._check_alive()  # the folder or the index went away under the batch
            if isinstance(e, IndexFormatError):
                raise
            if not isinstance(e, SemsearchError):
                logger.debug("batch %d failed", number, exc_info=True)
            hint = "" if self.read.skip_errors or "--skip-errors" in str(e) else " (fix the file, or watch with --skip-errors)"
            rep.error = f"FAILED, nothing published: {e}{hint}; the next change retries"
        rep.seconds = time.perf_counter() - t0
        self.last = rep
        self.log(rep.line())
        if self.on_batch is not None:
            self.on_batch(rep)
        return rep

    def _generation(self) -> int | None:
        try:
            return Manifest.load(self.folder).generation if (self.folder / "manifest.json").exists() else None
        except SemsearchError:
            return None
