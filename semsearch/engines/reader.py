"""Reading and chunking in a process of their own, ahead of the local build.

The local build (indexing._Updating) encodes in one thread and writes (term analysis, SQLite,
vectors) in another; reading and chunking are Python too (parsing, the chunker, the tokenizer
calls), and under one GIL they took a fifth of a build's time on the writer's core. Where a run
has enough to read, a reader process walks the same files in the same order, hashes each, and
sends its documents' chunk rows back in bounded groups; the build consumes them exactly where it
would have read the file itself, so the index is the one a build without the process writes.

Hand-written, not multiprocessing.Pool or concurrent.futures: a file's documents are a stream
(a 1,000-page PDF in flat memory), its failure can come after some of them were sent, and the
consumer must see them in order with back-pressure; one ordered stream of messages into a
bounded queue does exactly that. The process is started fresh (not forked: the build holds an
encoding thread and OpenMP pools).
"""
from __future__ import annotations

import logging
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

log = logging.getLogger(__name__)

READ_AHEAD_BYTES = 32 << 20  # a run with less than this to read reads in its own process (start-up ~1 s)
GROUP_CHARS = 1 << 18  # a message holds documents of about this much text
QUEUE_MESSAGES = 32  # messages in flight: the reader runs at most ~8 MB of text ahead (and a pipe's worth)


def offsets_of(encoder) -> Callable[[str], list[tuple[int, int]]] | None:
    """The encoder's chunking tokenizer as a picklable callable (its `chunk_offsets()`), or None
    where it has none: such an encoder's build reads in its own process."""
    make = getattr(encoder, "chunk_offsets", None)
    return make() if callable(make) else None


class Opened:
    """One file as the build reads it: its hash (None: unreadable, `unreadable` says why) and an
    iterator of its (document number, chunk rows), read only where the hash changed."""

    __slots__ = ("digest", "unreadable", "docs")

    def __init__(self, digest: str | None, unreadable: str | None, docs: Iterator):
        self.digest, self.unreadable, self.docs = digest, unreadable, docs


def _reader(jobs: list[tuple[str, str | None]], offsets, chunking, read, out: Callable[[tuple], None]) -> None:
    """The reader process: for each (path, hash it had), a head message (seq, hash or why it is
    unreadable), then, where the hash changed, its documents in groups, ending with `end` or
    the pickled error the reading raised."""
    from semsearch.corpus.walk import file_hash
    from semsearch.engines.chunks import file_chunks

    for seq, (path, old_hash) in enumerate(jobs):
        try:
            digest = file_hash(Path(path))
        except OSError as e:
            out(("head", seq, None, e.strerror or str(e)))
            continue
        out(("head", seq, digest, None))
        if digest == old_hash:
            continue
        read_bytes = 0

        def on_bytes(n: int) -> None:
            nonlocal read_bytes
            read_bytes += n

        group: list = []
        chars = 0
        try:
            for n, rows in file_chunks(Path(path), offsets, chunking, read, on_bytes):
                group.append((n, rows))
                chars += sum(len(r.text) + len(r.context) for r in rows)
                if chars >= GROUP_CHARS:
                    out(("docs", seq, group, read_bytes))
                    group, chars, read_bytes = [], 0, 0
        except Exception as e:  # noqa: BLE001 - sent to the build, which raises or skips it as it would have
            if group:
                out(("docs", seq, group, read_bytes))
                read_bytes = 0
            out(("error", seq, _pickled(e, path), read_bytes))
            continue
        if group:
            out(("docs", seq, group, 0))
        out(("end", seq, None, read_bytes))


def _pickled(e: Exception, path: str) -> bytes:
    """The error as bytes the build can raise; one that does not pickle becomes a RuntimeError
    naming the file."""
    try:
        data = pickle.dumps(e)
        pickle.loads(data)
        return data
    except Exception:  # noqa: BLE001
        return pickle.dumps(RuntimeError(f"{path}: reading failed in the reader process: {type(e).__name__}: {e}"))


class _Forward(logging.Handler):
    """The reader's log records (a skipped line, say), sent in the stream to be logged by the build."""

    def __init__(self, out):
        super().__init__(logging.INFO)
        self.out = out

    def emit(self, record: logging.LogRecord) -> None:
        self.out(("log", -1, (record.name, record.levelno, record.getMessage()), 0))


def main() -> None:
    """`python -m semsearch.engines.reader`: the job on stdin (pickled: the build's sys.path, then
    the jobs and chunking settings), frames on stdout (4-byte length, pickled message)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the build's to handle: it stops this process
    stdin, stdout = sys.stdin.buffer, sys.stdout.fileno()
    sys.stdout = sys.stderr  # nothing else may write into the frames
    path, job = pickle.load(stdin)
    sys.path[:] = path  # where the encoder's tokenizer callable is importable from (a test's module, say)
    jobs, offsets, chunking, read = pickle.loads(job)

    def out(msg: tuple) -> None:
        data = pickle.dumps(msg, pickle.HIGHEST_PROTOCOL)
        write_all(stdout, _LEN.pack(len(data)) + data)

    root = logging.getLogger()
    root.addHandler(_Forward(out))
    root.setLevel(logging.INFO)
    try:
        _reader(jobs, offsets, chunking, read, out)
    except BrokenPipeError:  # the build stopped reading (it failed, or was killed): nothing to flush to
        os._exit(0)


_LEN = struct.Struct("<I")


def write_all(fd: int, data: bytes) -> None:
    """Write all of data to a pipe's file descriptor, one os.write after another.

    Not a buffered file object's write: a build suspended and resumed (Ctrl-Z then `fg`, SIGSTOP
    and SIGCONT) while a frame was going through io.BufferedWriter into a full pipe lost or
    repeated bytes of it on CPython 3.11, and the build failed on a corrupt frame
    (tests/test_index_pipeline.py stops and resumes a build's processes). os.write gives back how
    much of each call went through, so the loop writes each byte once."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class ReadAhead:
    """The build's side of the reader process: `open(f)` for each file of `jobs`, in their order.

    The process is `python -m semsearch.engines.reader` (not multiprocessing's spawn, which
    imports the caller's main module again: a script that calls semsearch.index() without an
    `if __name__ == "__main__"` guard would run twice), its frames read by a thread into a
    bounded queue, so the reader runs ahead while the build writes."""

    def __init__(self, jobs: list[tuple[Path, str | None]], offsets, chunking, read):
        self._jobs = [(str(p), h) for p, h in jobs]
        job = pickle.dumps((self._jobs, offsets, chunking, read), pickle.HIGHEST_PROTOCOL)
        self._proc = subprocess.Popen([sys.executable, "-m", "semsearch.engines.reader"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, env=_child_env())
        self._q: queue.Queue = queue.Queue(QUEUE_MESSAGES)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, name="semsearch-read", daemon=True)
        self._thread.start()
        try:
            write_all(self._proc.stdin.fileno(), pickle.dumps((list(sys.path), job), pickle.HIGHEST_PROTOCOL))
            self._proc.stdin.close()
        except BrokenPipeError:
            pass  # it failed to start: _get says how
        self._seq = 0
        self._open_docs: Iterator | None = None

    def _pump(self) -> None:
        """The thread: frames from the process's stdout into the queue, None at its end."""
        stream = self._proc.stdout
        while not self._stop.is_set():
            head = stream.read(_LEN.size)
            if len(head) < _LEN.size:
                break
            data = stream.read(_LEN.unpack(head)[0])
            while not self._stop.is_set():
                try:
                    self._q.put(data, timeout=0.5)
                    break
                except queue.Full:
                    continue
        self._q.put(None)

    def open(self, path: Path, on_bytes: Callable[[int], None]) -> Opened:
        """The next file's hash and documents: `path` must be the next of the jobs."""
        if self._open_docs is not None:  # the last file's documents, where its reader stopped early
            for _ in self._open_docs:
                pass
        seq = self._seq
        if seq >= len(self._jobs) or self._jobs[seq][0] != str(path):
            raise RuntimeError(f"the reader process reads {self._jobs[seq][0] if seq < len(self._jobs) else 'nothing'}, "
                               f"not {path}")
        self._seq += 1
        kind, got, digest, why = self._get()
        self._expect(kind == "head" and got == seq, kind, got, seq)
        if digest is None or digest == self._jobs[seq][1]:
            return Opened(digest, why, iter(()))  # unreadable or unchanged: the reader sent nothing more
        docs = self._open_docs = self._docs(seq, on_bytes)
        return Opened(digest, why, docs)

    @staticmethod
    def _expect(ok: bool, *what) -> None:
        if not ok:
            raise RuntimeError(f"the reader process is out of step with the build: {what}")

    def _docs(self, seq: int, on_bytes) -> Iterator:
        while True:
            kind, got, payload, n = self._get()
            self._expect(got == seq and kind in ("docs", "end", "error"), kind, got, seq)
            if n:
                on_bytes(n)
            if kind == "docs":
                yield from payload
            elif kind == "end":
                self._open_docs = None
                return
            else:
                self._open_docs = None
                raise pickle.loads(payload)

    def _get(self) -> Any:
        while True:
            data = self._q.get()
            if data is None:
                self._q.put(None)  # (for a later call too)
                raise RuntimeError(f"the reader process stopped before it had read every file (exit code {self._proc.wait()})")
            msg = pickle.loads(data)
            if msg[0] != "log":
                return msg
            name, level, text = msg[2]
            logging.getLogger(name).log(level, "%s", text)

    def close(self) -> None:
        """Stop the process (at the run's end it has finished; after a failure it may be reading)."""
        if not (self._seq == len(self._jobs) and self._open_docs is None):
            self._proc.terminate()  # the run stopped before it read everything
        self._stop.set()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._thread.join(10)
        self._proc.stdout.close()

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode


def _child_env() -> dict[str, str]:
    """The reader's environment: one thread for any numeric library it loads (it reads and chunks)."""
    package_root = str(Path(__file__).resolve().parents[2])  # semsearch importable however the build found it
    python_path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": python_path, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


if __name__ == "__main__":
    main()
