"""Shared fixtures: the real bundled model, a small deterministic fake encoder, temp corpora."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# pytest -n N: each worker, and every process its tests start, gets cores / N threads for the
# OpenMP teams of torch and faiss. Two workers with a team of two each on two cores wait on each
# other's busy cores, the effect semsearch.encoder measured for queries (137 ms against 46 ms on
# 2 cores beside two busy processes); docs/benchmarks.md, "The test suite's time", has the suite's.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Exported int8 encoders go to a throwaway cache, not the user's (exported once per test session).
# The process that makes it (pytest, or xdist's controller: its workers and their subprocesses
# inherit it) removes it when the session ends (~22 MB an int8 export).
_OWN_CACHE = None
if "SEMSEARCH_CACHE" not in os.environ:
    _OWN_CACHE = os.environ["SEMSEARCH_CACHE"] = tempfile.mkdtemp(prefix="semsearch-test-cache-")


def pytest_unconfigure(config):
    if _OWN_CACHE is not None:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "data" / "sample"
SHARED = Path(os.environ.get("SEMSEARCH_SHARED") or REPO.parent / "shared")  # data beside the repo, not in it
SCIFACT = SHARED / "data" / "beir" / "scifact"
NO_SCIFACT = f"SciFact not found at {SCIFACT} (set SEMSEARCH_SHARED to the folder holding data/beir/scifact)"


class FakeEncoder:
    """Deterministic bag-of-words hashing encoder: for unit tests of the layers above the encoder."""

    name = "fake-bow"
    fingerprint = "fake0001"
    backend = "fake"
    precision = "fp32"
    head_info = None

    def __init__(self, dim: int = 64, max_length: int = 40, pooling: str = "mean"):
        self.dim = self.out_dim = dim
        self.max_length = max_length
        self.pooling = pooling
        self.calls = 0  # texts encoded so far

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        return word_offsets(text)

    def chunk_offsets(self):
        """token_offsets for a build's reader process (a module function: pickled by name)."""
        return word_offsets

    def encode(self, texts, progress=None) -> np.ndarray:
        if isinstance(texts, str):
            texts = [texts]
        self.calls += len(texts)
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"\w+", t.lower()):
                out[i, int(hashlib.md5(w.encode()).hexdigest(), 16) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-12)


def word_offsets(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in re.finditer(r"\w+", text)]


@pytest.fixture
def fake_encoder() -> FakeEncoder:
    return FakeEncoder()


@pytest.fixture(scope="session")
def real_encoder():
    from semsearch.encoder import Encoder

    return Encoder(precision="fp32", device="cpu")


@pytest.fixture
def sample_copy(tmp_path: Path) -> Path:
    """A private copy of the bundled sample corpus, safe to modify."""
    dst = tmp_path / "corpus"
    shutil.copytree(SAMPLE, dst)
    return dst


@pytest.fixture
def small_corpus(tmp_path: Path) -> Path:
    """Three tiny text files about different topics."""
    root = tmp_path / "small"
    root.mkdir()
    (root / "bank.txt").write_text("The bank approved the loan after checking the credit score.\nMortgage rates fell.\n")
    (root / "cook.md").write_text("# Soup\nSimmer lentils with onion and cumin for twenty minutes.\n")
    (root / "space.txt").write_text("Meteor showers happen when Earth crosses a comet's debris trail.\n")
    return root


@contextmanager
def running(app):
    """A real uvicorn server for an ASGI app on a free loopback port; yields its base URL."""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    deadline = time.time() + 30
    while not server.started:
        if time.time() > deadline or not t.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        t.join(10)


def terms_into_docstore(folder, seg: dict) -> None:
    """Give a segment's docstore rows their lexical terms in the `lex` column, as formats before
    5 wrote them (read back from its posting file: each row's term hashes and counts)."""
    import sqlite3

    from semsearch.store import lexical

    p = lexical.open_file(Path(folder) / seg["postings"])
    rows, tfs = p.span(0, int(p.indptr[-1]))
    h = np.repeat(p.vocab, np.diff(p.indptr))
    order = np.lexsort((h, rows))
    rows, h, tfs = rows[order], h[order], np.asarray(tfs, np.int32)[order]
    cuts = np.searchsorted(rows, np.arange(len(p.ids) + 1))
    out = [(h[a:b].tobytes() + tfs[a:b].tobytes(), int(p.lengths[i]), int(p.ids[i]))
           for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:]))]
    del p
    db = sqlite3.connect(Path(folder) / seg["docs"])
    db.executemany("UPDATE chunks SET lex = ?, lex_len = ? WHERE id = ?", out)
    db.commit()
    db.close()


def vectors_into_faiss(folder, seg: dict) -> None:
    """Make a flat segment entry (edited in place) and its faiss file what formats before 6
    wrote: the faiss file holds the vectors too (no `vectors_from`)."""
    import faiss

    from semsearch.store import integrity, vecfile

    if seg.pop("vectors_from", None) is None:
        return
    vf = vecfile.VectorFile(Path(folder) / seg["vecs"])
    index = faiss.IndexIDMap2(faiss.IndexFlatIP(vf.dim))
    if len(vf):
        index.add_with_ids(np.ascontiguousarray(vf.matrix, np.float32), np.ascontiguousarray(vf.ids, np.int64))
    del vf
    faiss.write_index(index, str(Path(folder) / seg["vectors"]))
    seg["integrity"]["files"][seg["vectors"]] = integrity.file_record(Path(folder) / seg["vectors"])


def vectors_into_docstore(folder, seg: dict) -> None:
    """Make a segment entry (edited in place) and its files what formats before 4 wrote: its
    vectors in its docstore's `vector` column, no vector file."""
    import sqlite3

    from semsearch.store import integrity, vecfile

    vectors_into_faiss(folder, seg)
    vf = vecfile.VectorFile(Path(folder) / seg.pop("vecs"))
    rows = [(v.tobytes(), int(i)) for i, v in zip(vf.ids, vf.matrix)]
    del vf
    db = sqlite3.connect(Path(folder) / seg["docs"])
    db.executemany("UPDATE chunks SET vector = ? WHERE id = ?", rows)
    db.commit()
    db.close()
    (Path(folder) / f"vectors.{seg['id']}.vec").unlink()
    files = seg["integrity"]["files"]
    files.pop(f"vectors.{seg['id']}.vec")
    files[seg["docs"]] = integrity.file_record(Path(folder) / seg["docs"])


def mapped_rss(path) -> int:
    """Bytes of `path` resident in this process's mappings (/proc/self/smaps)."""
    total, name = 0, None
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line
                name = head[5] if len(head) > 5 else None
            elif name == str(path) and line.startswith("Rss:"):
                total += int(head[1]) * 1024
    return total
