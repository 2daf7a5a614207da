"""The local build's encoding thread (indexing._Updating): files are read and chunked while a batch
is encoded, and the index is the one a build without the thread writes (the same ids, chunks,
vectors and files), also where a file fails part way with chunks in the thread, and where the
encoder fails."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import semsearch.indexing as indexing
from semsearch.corpus.readers import ReadOptions
from semsearch.errors import CorpusError, ModelError
from semsearch.indexing import index_corpus
from semsearch.store import Manifest

from conftest import FakeEncoder
from test_engines import dump


def write_corpus(root: Path, files: int = 12, lines: int = 30) -> Path:
    root.mkdir(parents=True)
    for f in range(files):
        (root / f"f{f:02d}.txt").write_text("\n\n".join(f"file {f} paragraph {i} about topic{(f * 7 + i) % 5} and more words"
                                                      for i in range(lines)))
    return root


class Sequential(FakeEncoder):
    """The fake encoder on the path without the thread (as the sentence-transformers backend is)."""

    backend = "sentence-transformers"


class Watched:
    """A fake encoder that takes 0.3 s a batch and notes whether the build chunked anything (called
    token_offsets) while a batch was being encoded."""

    def __init__(self, base):
        self.enc = base
        self.encoding = False
        self.batches = 0
        self.overlapped = set()  # batches during which something was chunked

    def __getattr__(self, name):
        return getattr(self.enc, name)

    def token_offsets(self, text):
        # chunking a text takes 20 ms here: long enough that the encoding thread, started as the
        # build goes on to the next file, is seen at work on a loaded machine (a fresh-clone CI run
        # with the suite's other worker busy once saw no overlap in 5 batches: the thread had not
        # yet been scheduled when the next file's few milliseconds of chunking were over)
        time.sleep(0.02)
        if self.encoding:
            self.overlapped.add(self.batches)
        return self.enc.token_offsets(text)

    def encode(self, texts, progress=None):
        self.batches += 1
        self.encoding = True
        try:
            time.sleep(0.3)
            return self.enc.encode(texts, progress)
        finally:
            self.encoding = False


def test_files_are_read_and_chunked_while_a_batch_is_encoded(tmp_path):
    src = write_corpus(tmp_path / "c", files=6)
    threaded, sequential = Watched(FakeEncoder()), Watched(Sequential())
    index_corpus(src, tmp_path / "a", threaded, flush_chunks=8, progress=False)
    index_corpus(src, tmp_path / "b", sequential, flush_chunks=8, progress=False)
    assert threaded.batches == sequential.batches >= 5
    # the next file is read and chunked while a batch is encoded (0.3 s: its chunking takes
    # milliseconds); without the thread, never
    assert len(threaded.overlapped) >= 1 and not sequential.overlapped


@pytest.mark.parametrize("flush", [1, 7, 64])
def test_the_threaded_build_writes_what_the_sequential_one_does(tmp_path, flush):
    src = write_corpus(tmp_path / "c")
    a, b = tmp_path / "threaded", tmp_path / "sequential"
    index_corpus(src, a, FakeEncoder(), flush_chunks=flush, progress=False)
    index_corpus(src, b, Sequential(), flush_chunks=flush, progress=False)
    (ra, va, fa), (rb, vb, fb) = dump(a), dump(b)
    assert ra == rb and fa == fb and len(ra) > 300
    np.testing.assert_allclose(va, vb, atol=1e-6)
    # and an update: one file changed, one gone, one new; batches in the thread cross files
    (src / "f03.txt").write_text("a changed file\n\nwith two paragraphs")
    (src / "f05.txt").unlink()
    (src / "new.txt").write_text("a new file about topic2")
    ra_, rb_ = (index_corpus(src, x, enc, flush_chunks=flush, progress=False).as_dict()
                for x, enc in ((a, FakeEncoder()), (b, Sequential())))
    assert {k: ra_[k] for k in ("added", "updated", "removed", "chunks")} == \
           {k: rb_[k] for k in ("added", "updated", "removed", "chunks")}
    (ra, va, fa), (rb, vb, fb) = dump(a), dump(b)
    assert ra == rb and fa == fb
    np.testing.assert_allclose(va, vb, atol=1e-6)


def test_a_file_failing_part_way_goes_with_its_chunks_already_in_the_thread(tmp_path, monkeypatch):
    """A file whose reading fails after several batches (some written, one in the encoding
    thread) is skipped whole under --skip-errors: none of its chunks stay, the others all do."""
    src = write_corpus(tmp_path / "c", files=5)
    real = indexing.file_chunks

    def failing(path, *args, **kw):
        docs = real(path, *args, **kw)
        if Path(path).name != "f02.txt":
            yield from docs
            return
        for n, rows in docs:  # one document; its chunks one at a time, then a damaged read
            for r in rows:
                yield n, [r]
        raise CorpusError(f"{path}: damaged after its chunks")

    monkeypatch.setattr(indexing, "file_chunks", failing)
    folder = tmp_path / "idx"
    rep = index_corpus(src, folder, FakeEncoder(), read=ReadOptions(skip_errors=True), flush_chunks=4, progress=False)
    rows, vecs, files = dump(folder)
    assert [Path(s.split(": ")[0]).name for s in rep.skipped_files] == ["f02.txt"]
    assert {Path(r[1]).name for r in rows} == {"f00.txt", "f01.txt", "f03.txt", "f04.txt"}
    assert len(rows) == len(vecs) == Manifest.load(folder).counts["chunks"] > 100
    with pytest.raises(CorpusError, match="damaged after its chunks"):  # without --skip-errors: the run fails
        index_corpus(src, tmp_path / "idx2", FakeEncoder(), flush_chunks=4, progress=False)


class FailsAtBatch(FakeEncoder):
    def __init__(self, at: int):
        super().__init__()
        self.at, self.batches = at, 0

    def encode(self, texts, progress=None):
        self.batches += 1
        if self.batches == self.at:
            raise ModelError("the encoder failed on batch 3")
        return super().encode(texts, progress)


def test_an_encoder_failure_in_the_thread_fails_the_run_and_leaves_the_index_as_it_was(tmp_path):
    src = write_corpus(tmp_path / "c", files=4)
    folder = tmp_path / "idx"
    index_corpus(src, folder, FakeEncoder(), progress=False)
    before = dump(folder)
    manifest = (folder / "manifest.json").read_bytes()
    for f in src.iterdir():
        f.write_text(f.read_text() + "\n\nchanged")
    with pytest.raises(ModelError, match="batch 3"):
        index_corpus(src, folder, FailsAtBatch(3), flush_chunks=5, progress=False)
    assert (folder / "manifest.json").read_bytes() == manifest
    after = dump(folder)
    assert after[0] == before[0] and after[2] == before[2]
    # the run finished the batch in the thread (it uses the resume cache, which the failed run
    # closes) and stopped the thread before it raised
    assert not [t for t in threading.enumerate() if t.name.startswith("semsearch-encode")]


# ---- the reader process (engines/reader.py) --------------------------------------------------


@pytest.fixture
def read_ahead(monkeypatch):
    """Every build reads in a reader process, whatever it has to read."""
    from semsearch.engines import reader

    monkeypatch.setattr(reader, "READ_AHEAD_BYTES", 0)
    monkeypatch.setattr(reader, "GROUP_CHARS", 2000)  # several messages a file
    started = []
    real = reader.ReadAhead.__init__

    def spy(self, *a, **kw):
        real(self, *a, **kw)
        started.append(self)

    monkeypatch.setattr(reader.ReadAhead, "__init__", spy)
    return started


def mixed_corpus(root: Path) -> Path:
    """Text files, a JSONL of many small documents, a CSV, Markdown with sections."""
    write_corpus(root, files=6)
    (root / "rows.jsonl").write_text("\n".join(json.dumps({"id": i, "text": f"row {i} about topic{i % 4} " * (1 + i % 9)})
                                                for i in range(400)))
    (root / "faq.csv").write_text("q,text\n" + "\n".join(f"q{i},answer {i} of the faq about topic{i % 3}" for i in range(50)))
    (root / "guide.md").write_text("# Guide\n\n" + "\n\n".join(f"## Part {i}\n\ntext of part {i} " * 20 for i in range(8)))
    return root


def test_a_build_read_in_a_reader_process_writes_what_one_process_does(tmp_path, read_ahead, monkeypatch):
    src = mixed_corpus(tmp_path / "c")
    a, b = tmp_path / "ahead", tmp_path / "here"
    rep_a = index_corpus(src, a, FakeEncoder(), flush_chunks=16, progress=False).as_dict()
    assert len(read_ahead) == 1 and read_ahead[0].returncode == 0  # it ran, and finished
    from semsearch.engines import reader

    monkeypatch.setattr(reader, "READ_AHEAD_BYTES", 1 << 60)
    rep_b = index_corpus(src, b, FakeEncoder(), flush_chunks=16, progress=False).as_dict()
    assert len(read_ahead) == 1
    keys = ("added", "updated", "removed", "unchanged", "documents", "chunks")
    assert {k: rep_a[k] for k in keys} == {k: rep_b[k] for k in keys} and rep_a["documents"] > 400
    (ra, va, fa), (rb, vb, fb) = dump(a), dump(b)
    assert ra == rb and fa == fb
    np.testing.assert_allclose(va, vb, atol=1e-6)
    # an update read ahead: one file changed, one touched (same bytes: hashed, not re-read), one new
    (src / "f03.txt").write_text("a changed file\n\nwith two paragraphs")
    os.utime(src / "f04.txt", (1, 1))
    (src / "new.txt").write_text("a new file about topic2")
    monkeypatch.setattr(reader, "READ_AHEAD_BYTES", 0)
    ra_ = index_corpus(src, a, FakeEncoder(), flush_chunks=16, progress=False).as_dict()
    monkeypatch.setattr(reader, "READ_AHEAD_BYTES", 1 << 60)
    rb_ = index_corpus(src, b, FakeEncoder(), flush_chunks=16, progress=False).as_dict()
    assert len(read_ahead) == 2
    assert {k: ra_[k] for k in keys} == {k: rb_[k] for k in keys}
    assert (ra_["added"], ra_["updated"], ra_["unchanged"]) == (1, 1, len(list(src.iterdir())) - 2)
    (ra, va, fa), (rb, vb, fb) = dump(a), dump(b)
    assert ra == rb and fa == fb
    np.testing.assert_allclose(va, vb, atol=1e-6)


def test_a_reader_process_stopped_and_resumed_over_and_over_sends_every_frame_whole(tmp_path, read_ahead, monkeypatch):
    """SIGSTOP and SIGCONT of the reader process (a build suspended with Ctrl-Z and resumed, or a
    job scheduler pausing it) while its frames, larger than a pipe holds, wait on a full pipe: the
    build gets every frame whole and writes the index one process writes. Through a buffered file
    object, such a build failed on a corrupt frame (a UnicodeDecodeError out of pickle)."""
    import signal

    from semsearch.engines import reader

    monkeypatch.setattr(reader, "GROUP_CHARS", 200_000)  # frames of ~200 KB: several pipe-fulls each
    monkeypatch.setattr(reader, "QUEUE_MESSAGES", 2)  # the pipe fills while the build writes
    src = tmp_path / "c"
    src.mkdir()
    for f in range(6):
        (src / f"f{f:02d}.txt").write_text("\n\n".join(f"file {f} paragraph {i} about topic{(f * 7 + i) % 5} " + "más palabras " * 40
                                                      for i in range(150)))

    class Slow(FakeEncoder):  # the build a little slower than the reader, so that the reader waits on the pipe
        def encode(self, texts, progress=None):
            time.sleep(0.002)
            return super().encode(texts, progress)

    done = threading.Event()

    def pester():
        while not read_ahead and not done.is_set():
            time.sleep(0.001)
        stops = 0
        while not done.is_set():
            pid = read_ahead[0]._proc.pid
            try:
                os.kill(pid, signal.SIGSTOP)
                time.sleep(0.005)
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                break
            stops += 1
            time.sleep(0.01)
        stopped.append(stops)

    stopped: list[int] = []
    t = threading.Thread(target=pester, daemon=True)
    t.start()
    try:
        rep_a = index_corpus(src, tmp_path / "ahead", Slow(), flush_chunks=64, progress=False).as_dict()
    finally:
        done.set()
        t.join(10)
    assert len(read_ahead) == 1 and stopped and stopped[0] >= 20, stopped  # it was stopped and resumed many times
    monkeypatch.setattr(reader, "READ_AHEAD_BYTES", 1 << 60)
    rep_b = index_corpus(src, tmp_path / "here", FakeEncoder(), flush_chunks=64, progress=False).as_dict()
    assert rep_a["chunks"] == rep_b["chunks"] > 0 and rep_a["documents"] == rep_b["documents"]
    (ra, va, fa), (rb, vb, fb) = dump(tmp_path / "ahead"), dump(tmp_path / "here")
    assert ra == rb and fa == fb
    np.testing.assert_allclose(va, vb, atol=1e-6)


def test_reader_process_errors_are_the_builds_own(tmp_path, read_ahead, caplog):
    """A JSONL file with a bad line after many documents (some sent, some written): the run fails
    naming the file and line, and the index is as it was; under --skip-errors the line is
    skipped and the file's other rows indexed, as in one process. A file that is not UTF-8 is
    skipped before anything of it is added."""
    src = mixed_corpus(tmp_path / "c")
    folder, here = tmp_path / "idx", tmp_path / "here"
    index_corpus(src, folder, FakeEncoder(), flush_chunks=16, progress=False)
    before, manifest = dump(folder), (folder / "manifest.json").read_bytes()
    good = [json.dumps({"text": f"good row {i} " * 30}) for i in range(300)]
    (src / "bad.jsonl").write_text("\n".join(good + ["{not json"] + good))
    (src / "latin.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    with pytest.raises(CorpusError, match=r"bad\.jsonl.*301"):
        index_corpus(src, folder, FakeEncoder(), flush_chunks=16, progress=False)
    assert (folder / "manifest.json").read_bytes() == manifest and dump(folder)[0] == before[0]
    assert all(p.returncode is not None for p in read_ahead)  # the failed run's reader was stopped
    skip = ReadOptions(skip_errors=True)
    caplog.clear()
    rep = index_corpus(src, folder, FakeEncoder(), read=skip, flush_chunks=16, progress=False)
    assert [Path(s.split(": ")[0]).name for s in rep.skipped_files] == ["latin.txt"]
    # the reader's warning, logged by the build as one process logs it
    assert [r.name for r in caplog.records if "bad.jsonl:301: skipped malformed line" in r.getMessage()] == \
        ["semsearch.corpus.readers"]
    assert len(read_ahead) == 3 and all(p.returncode is not None for p in read_ahead)
    from semsearch.engines import reader

    reader.READ_AHEAD_BYTES = 1 << 60  # (restored by the fixture's monkeypatch)
    index_corpus(src, here, FakeEncoder(), read=skip, flush_chunks=16, progress=False)
    (ra, va, fa), (rb, vb, fb) = dump(folder), dump(here)
    assert sorted(r[1:] for r in ra) == sorted(r[1:] for r in rb)  # the same chunks (ids: an update's, a build's)
    assert len(ra) > len(before[0]) + 600  # bad.jsonl's 600 good rows (several chunks each)


KILLED_BUILD = """
import sys, time
sys.path.insert(0, {tests!r})
from pathlib import Path
from conftest import FakeEncoder
from semsearch.engines import reader
from semsearch.indexing import index_corpus

reader.READ_AHEAD_BYTES = 0
real = reader.ReadAhead.__init__

def spy(self, *a, **kw):
    real(self, *a, **kw)
    print(self._proc.pid, flush=True)

reader.ReadAhead.__init__ = spy

class Slow(FakeEncoder):
    def encode(self, texts, progress=None):
        time.sleep(0.5)
        return super().encode(texts, progress)

index_corpus(Path({src!r}), Path({folder!r}), Slow(), flush_chunks=4, progress=False)
"""


def test_a_build_killed_with_sigkill_leaves_no_reader_process(tmp_path):
    """The build is SIGKILLed while its reader process runs ahead: the reader, finding its
    pipe closed, exits (no orphan), and the index is as it was before the run."""
    import signal
    import subprocess
    import sys

    src = write_corpus(tmp_path / "c", files=12, lines=60)
    folder = tmp_path / "idx"
    code = KILLED_BUILD.format(tests=str(Path(__file__).parent), src=str(src), folder=str(folder))
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(p.stdout.readline())
        time.sleep(2.0)  # batches encoded, the reader ahead of them
        assert p.poll() is None, "the build ended before it was killed"
        p.send_signal(signal.SIGKILL)
        assert p.wait(30) == -signal.SIGKILL
    finally:
        if p.poll() is None:
            p.kill()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        if Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            break  # exited; its parent (killed) was not there to reap it
        time.sleep(0.2)
    else:
        pytest.fail(f"the reader process {pid} outlived the killed build")
    assert not (folder / "manifest.json").exists() or Manifest.load(folder).counts["chunks"] == 0
