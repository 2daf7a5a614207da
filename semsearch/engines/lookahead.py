"""The next file's first chunks read and encoded while a long local run publishes a segment.

A run that publishes a segment every 250k chunks (indexing.SEGMENT_CHUNKS) stops between two
files to do it: the segment's posting file, vector file, fsyncs and manifest, 9-13 s each. The
encoder waited all that time: with an encoder paced as a GPU (4,000 chunks/s, sleeping the rest),
a 1M-chunk build took 324.5 s, 1.30x the encoder's 250.5 s, four such waits making ~36 s of it
(docs/benchmarks.md). A Lookahead opens the file after the roll's and, in a thread of its own,
reads its documents and encodes their chunks, batch by batch, during the roll and after it; the
run then reads that file as usual, from the documents read ahead on, and the vectors already
encoded are taken instead of encoding those texts again (`take`).

Nothing is written to the store ahead: the file is registered, and its chunks added, after the
roll, in the run's order, so chunk ids and the segments' contents are a run's without it. A
reading error met ahead is raised where the run's own reading meets it (the file skipped or the
run stopped, as the reading options say); an encoding error only ends the look-ahead (the run
encodes those texts itself, and meets the error there)."""
from __future__ import annotations

import threading
from typing import Callable, Iterator

import numpy as np

from semsearch.corpus.titles import embedding_text
from semsearch.engines.reader import Opened

MAX_CHUNKS = 65_536  # chunks held ahead at most (~180 MB of rows and vectors at 384 dimensions)


class _Bytes:
    """The bytes-read callback of a file opened ahead: counted until the run's own callback is
    given (`to`), then handed on."""

    def __init__(self):
        self.count, self.target = 0, None

    def __call__(self, n: int) -> None:
        if self.target is None:
            self.count += n
        else:
            self.target(n)

    def to(self, target: Callable[[int], None]) -> None:
        self.target, count, self.count = target, self.count, 0
        if count:
            target(count)


class Lookahead:
    """One file opened (`open_file(on_bytes) -> Opened`) and read ahead in a thread, each
    `batch` chunks encoded (`encode(texts) -> vectors`): through the roll, and after it until
    the run's own reading catches up with the documents encoded so far (then the thread stops
    and the run reads on from the file itself), or MAX_CHUNKS are held. The run's encoding thread
    takes these vectors instantly, so the encoder would wait again while the run writes the
    chunks of the roll's seconds if the look-ahead stopped with the roll."""

    def __init__(self, path: str, open_file: Callable[[Callable[[int], None]], Opened],
                 encode: Callable[[list[str]], np.ndarray], batch: int):
        self.path = path
        self._bytes = _Bytes()
        self._opened = open_file(self._bytes)
        self._docs = iter(self._opened.docs)
        self._lock = threading.Lock()
        self._read: list = []  # (document number, chunk rows) read ahead, their chunks encoded
        self._tail: list = []  # read ahead after the last encoded batch: the run encodes them
        self._error: BaseException | None = None  # a reading error met ahead, raised where the run meets it
        self._vectors: dict[str, np.ndarray] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(encode, batch), name="semsearch-lookahead", daemon=True)
        self._thread.start()

    def _run(self, encode, batch: int) -> None:
        items: list = []
        texts: list[str] = []
        held = 0
        while not self._stop.is_set() and held < MAX_CHUNKS:
            try:
                item = next(self._docs, None)
            except BaseException as e:  # noqa: BLE001 - raised again where the run reads it
                self._error = e
                break
            if item is None:
                break
            items.append(item)
            texts.extend(embedding_text(r.context, r.text) for r in item[1])
            held += len(item[1])
            if len(texts) >= batch:
                if not self._encode(encode, texts, items):
                    break
                items, texts = [], []
        if items and not self._stop.is_set() and self._error is None and self._encode(encode, texts, items):
            items = []
        self._tail = items

    def _encode(self, encode, texts: list[str], items: list) -> bool:
        """Encode a batch and hand its documents to the run; False where the encoder failed."""
        try:
            vectors = encode(texts)
        except Exception:  # noqa: BLE001 - the run encodes these texts itself, and meets the error there
            return False
        with self._lock:
            self._vectors.update(zip(texts, vectors))
            self._read.extend(items)
        return True

    def stop(self) -> None:
        """End the reading ahead (after the batch it is at) and wait for it."""
        self._stop.set()
        self._thread.join()

    def opened(self, on_bytes: Callable[[int], None]) -> Opened:
        """The file as the run reads it: its documents read ahead, then the rest; the bytes read
        so far, and from now on, reported to on_bytes."""
        self._bytes.to(on_bytes)
        return Opened(self._opened.digest, self._opened.unreadable, self._all())

    def _all(self) -> Iterator:
        at = 0
        while True:
            with self._lock:
                item = self._read[at] if at < len(self._read) else None
            if item is None:
                break
            at += 1
            yield item
        self.stop()  # caught up: the thread ends after its batch; the run reads on from the file
        yield from self._read[at:]
        yield from self._tail
        if self._error is not None:
            raise self._error
        yield from self._docs

    def take(self, texts: list[str]) -> dict[int, np.ndarray]:
        """The vectors encoded ahead for these texts, by position. Kept, not popped: a text the
        file holds twice finds its vector both times, so the run never encodes a text read ahead
        (nor uses the encoder while this thread may)."""
        with self._lock:
            return {i: v for i, t in enumerate(texts) if (v := self._vectors.get(t)) is not None}
