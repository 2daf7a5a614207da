"""Real-world files and damage: odd index paths, damaged or foreign data files, crafted manifests,
restored mtimes, unreadable files of any format, large files, interrupted runs, live re-indexing.

Uses the FakeEncoder (the layers under test are the store, the corpus readers and the pipeline),
real FAISS and real SQLite files in tmp_path.
"""
from __future__ import annotations

import json
import logging
import os
import random
import shutil
import sqlite3
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from semsearch.corpus import ChunkSettings
from semsearch.corpus.chunking import chunk_text, line_of
from semsearch.corpus.readers import ReadOptions
from semsearch.corpus.streaming import chunk_stream, text_blocks
from semsearch.errors import CorpusError, IndexFormatError, InputError
from semsearch.indexing import index_corpus
from semsearch.search import Retriever
from semsearch.store import Manifest, open_index
from semsearch.store import integrity

from conftest import FakeEncoder

TEXTS = {
    "bank.txt": "The bank approved the loan after checking the credit score.\nMortgage rates fell.\n",
    "cook.md": "# Soup\nSimmer lentils with onion and cumin for twenty minutes.\n",
    "space.txt": "Meteor showers happen when Earth crosses a comet's debris trail.\n",
    "garden.txt": "Tomatoes need six hours of sun and steady watering.\n",
}


def corpus(root: Path, files: dict[str, str | bytes] = TEXTS) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (root / name).write_bytes(data if isinstance(data, bytes) else data.encode())
    return root


def top(folder: Path, query: str, enc=None) -> str:
    r = Retriever.load(folder, encoder=enc or FakeEncoder())
    try:
        return Path(r.search(query, k=1)[0].path).name
    finally:
        r.close()


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# ---- 1. index paths with #, ?, %, spaces, unicode ------------------------------------------------
@pytest.mark.parametrize("name", ["idx#1", "idx?x=1", "idx%41", "my index", "índex-ünï", "a#b?c%20d e"])
def test_index_and_query_under_special_characters_in_the_path(tmp_path, name):
    src = corpus(tmp_path / "corpus")
    parent = tmp_path / "indexes"
    parent.mkdir()
    folder = parent / name
    enc = FakeEncoder()
    rep = index_corpus(src, folder, enc)
    assert rep.added == 4
    assert top(folder, "credit score loan") == "bank.txt"
    rep = index_corpus(src, folder, enc)  # an update reads the base through the same path
    assert (rep.added, rep.unchanged) == (0, 4)
    (src / "cook.md").write_text("# Bread\nKnead the dough and let it rise overnight.\n")
    rep = index_corpus(src, folder, enc)
    assert (rep.updated, rep.unchanged) == (1, 3)
    _, vectors, docs = open_index(folder)
    assert vectors.ntotal == docs.counts()["chunks"] == 4  # no file re-added
    docs.close()
    assert top(folder, "knead dough") == "cook.md"
    assert tree(parent) == {name} | {f"{name}/{p}" for p in tree(folder)}  # nothing created beside it


# ---- 4. manifest file names --------------------------------------------------------------------
@pytest.mark.parametrize("docs_name", ["../other/docs.1.sqlite", "ABS", "docs.1.sqlite/../docs.1.sqlite", "sub/docs.1.sqlite",
                                       "vectors.1.faiss", "docs.1.sqlite\x00"])
def test_manifest_naming_files_outside_the_folder_is_refused(tmp_path, docs_name):
    src = corpus(tmp_path / "corpus")
    index_corpus(src, tmp_path / "other", FakeEncoder())
    folder = tmp_path / "idx"
    index_corpus(src, folder, FakeEncoder())
    raw = json.loads((folder / "manifest.json").read_text())
    raw["segments"][0]["docs"] = str(tmp_path / "other" / "docs.1.sqlite") if docs_name == "ABS" else docs_name
    raw["segments"][0]["integrity"] = None
    (folder / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(IndexFormatError, match=r"manifest\.json: damaged manifest .*not a data file of this folder.*--rebuild"):
        Retriever.load(folder, encoder=FakeEncoder())
    with pytest.raises(IndexFormatError, match="not a data file"):
        index_corpus(src, folder, FakeEncoder())


# ---- 3. damaged, missing, foreign data files -----------------------------------------------------
@pytest.fixture
def built(tmp_path):
    src = corpus(tmp_path / "corpus")
    folder = tmp_path / "idx"
    index_corpus(src, folder, FakeEncoder())
    return src, folder


def data_file(folder: Path, role: str) -> Path:
    m = Manifest.load(folder)
    return folder / (m.segments[0][role] if role == "vecs" else m.files[role])


DAMAGE = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "missing": lambda p: p.unlink(),
    "flipped": lambda p: p.write_bytes(bytes(b ^ 0x5A if i % 97 == 13 else b for i, b in enumerate(p.read_bytes()))),
    "empty": lambda p: p.write_bytes(b""),
}


@pytest.mark.parametrize("role", ["vectors", "docs"])
@pytest.mark.parametrize("how", list(DAMAGE))
def test_damaged_data_file_is_named_with_the_remedy_and_rebuild_works(built, role, how):
    src, folder = built
    p = data_file(folder, role)
    DAMAGE[how](p)
    for attempt in (lambda: Retriever.load(folder, encoder=FakeEncoder()),
                    lambda: index_corpus(src, folder, FakeEncoder())):
        with pytest.raises(IndexFormatError) as e:
            attempt()
        msg = str(e.value)
        assert str(p) in msg and "--rebuild" in msg and "\n" not in msg
    rep = index_corpus(src, folder, FakeEncoder(), rebuild=True)
    assert rep.added == 4 and top(folder, "meteor comet") == "space.txt"


def test_vectors_of_another_index_with_the_same_dimension_and_count_are_refused(tmp_path, built):
    src, folder = built
    other_src = corpus(tmp_path / "other-corpus", {f"o{i}.txt": f"unrelated words number {i} here" for i in range(4)})
    other = tmp_path / "other"
    index_corpus(other_src, other, FakeEncoder())
    assert Manifest.load(other).counts["chunks"] == Manifest.load(folder).counts["chunks"]
    shutil.copy(data_file(other, "vecs"), data_file(folder, "vecs"))  # the vectors: their only copy
    with pytest.raises(IndexFormatError, match="copied from another index"):
        Retriever.load(folder, encoder=FakeEncoder())


def test_count_and_id_checks_catch_what_the_fingerprint_cannot_see(built):
    """An index without integrity records (as written before them) is still checked for counts."""
    src, folder = built
    raw = json.loads((folder / "manifest.json").read_text())
    raw["segments"][0]["integrity"] = None
    (folder / "manifest.json").write_text(json.dumps(raw))
    db = sqlite3.connect(data_file(folder, "docs"))
    db.execute("DELETE FROM chunks WHERE id = (SELECT MAX(id) FROM chunks)")
    db.commit()
    db.close()
    with pytest.raises(IndexFormatError, match="holds 3 chunks but the vector index 4"):
        Retriever.load(folder, encoder=FakeEncoder())


def test_opening_an_index_with_integrity_records_reads_no_id_list_or_count(built, monkeypatch):
    """Opening stays O(1) in the index's size: where the files' records were checked, the id set
    is not walked and SQLite does not count the chunks (both O(N)); without records they are."""
    from semsearch.store import integrity

    src, folder = built
    seen = []
    real = integrity.vector_ids
    monkeypatch.setattr(integrity, "vector_ids", lambda v: seen.append("ids") or real(v))
    traced: list[str] = []
    real_connect = sqlite3.connect

    def connect(*a, **kw):
        db = real_connect(*a, **kw)
        db.set_trace_callback(traced.append)
        return db

    monkeypatch.setattr(sqlite3, "connect", connect)
    assert Retriever.load(folder, encoder=FakeEncoder()).search("loan", k=2)
    assert seen == [] and not [q for q in traced if "COUNT(*)" in q.upper()]
    raw = json.loads((folder / "manifest.json").read_text())
    raw["segments"][0]["integrity"] = None
    (folder / "manifest.json").write_text(json.dumps(raw))
    assert Retriever.load(folder, encoder=FakeEncoder()).search("loan", k=2)
    assert [q for q in traced if "COUNT(*)" in q.upper()]


def test_verify_reads_every_byte(built, monkeypatch):
    from click.testing import CliRunner

    from semsearch.cli import main

    src, folder = built
    r = CliRunner().invoke(main, ["info", "--index", str(folder), "--verify"])
    assert r.exit_code == 0 and "is whole" in r.output
    # Damage the middle of a file too large for the load-time fingerprint to cover.
    monkeypatch.setattr(integrity, "EDGE", 64)
    index_corpus(src, folder, FakeEncoder(), rebuild=True)
    p = data_file(folder, "vecs")  # the vectors' only copy
    data = bytearray(p.read_bytes())
    assert len(data) > 4 * 64
    data[len(data) // 2] ^= 0xFF  # one byte in a vector: faiss would read it without a word
    p.write_bytes(bytes(data))
    Retriever.load(folder, encoder=FakeEncoder()).close()  # the cheap checks cannot see it...
    r = CliRunner().invoke(main, ["info", "--index", str(folder), "--verify"])
    assert r.exit_code == 1 and "sha256 does not match" in r.output and p.name in r.output  # ...--verify does
    assert "Traceback" not in r.output


def test_commit_fsyncs_data_files_and_the_folder_around_the_manifest_rename(tmp_path, monkeypatch):
    src = corpus(tmp_path / "corpus")
    folder = tmp_path / "idx"
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(a, b):
        events.append(("replace", str(b)))
        return real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    index_corpus(src, folder, FakeEncoder())
    m = Manifest.load(folder)
    names = [(op, Path(p).name if Path(p) != folder.resolve() else "<folder>") for op, p in events]
    at = names.index(("replace", "manifest.json"))
    before, after = names[:at], names[at + 1:]
    assert ("fsync", m.files["docs"]) in before and ("fsync", m.files["vectors"]) in before
    assert ("fsync", "<folder>") in before and ("fsync", "<folder>") in after


# ---- 5. change detection a restored mtime cannot fool --------------------------------------------
def test_same_size_edit_with_restored_mtime_is_picked_up(built):
    src, folder = built
    p = src / "space.txt"
    st = p.stat()
    new = TEXTS["space.txt"].replace("Meteor showers", "Volcano ashfal")
    assert len(new) == len(TEXTS["space.txt"])
    p.write_text(new)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # as cp -p, rsync -t and tar do
    assert (p.stat().st_size, p.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    rep = index_corpus(src, folder, FakeEncoder())
    assert (rep.updated, rep.unchanged) == (1, 3)
    assert "Volcano" in Retriever.load(folder, encoder=FakeEncoder()).search("volcano ashfall", k=1)[0].text


def test_checksum_hashes_files_whose_stat_is_unchanged(built):
    src, folder = built
    db = sqlite3.connect(data_file(folder, "docs"))
    db.execute("UPDATE files SET hash = 'stale' WHERE path LIKE '%space.txt'")  # content the stat cannot reveal
    db.commit()
    db.close()
    m = Manifest.load(folder)
    m.segments[0]["integrity"] = None  # this test edits a data file on purpose
    m.save(folder)
    enc = FakeEncoder()
    rep = index_corpus(src, folder, enc)
    assert (rep.updated, rep.unchanged, enc.calls) == (0, 4, 0)  # trusted: same size, times, inode
    rep = index_corpus(src, folder, enc, checksum=True)
    assert (rep.updated, rep.unchanged, enc.calls) == (1, 3, 1)


# ---- 6. --skip-errors skips any unreadable file ----------------------------------------------------
def test_skip_errors_skips_unreadable_files_of_any_format_and_lists_them(tmp_path):
    files = dict(TEXTS)
    files["broken.parquet"] = b"PAR1 this is not parquet at all PAR1"
    files["broken.json"] = '[{"text": "fine"}, {"text": "oops",}]'
    files["nested.json"] = "[" * 100_000 + "]" * 100_000  # too deep for the json module
    files["notes.jsonl"] = '{"text": "good line"}\n{"text": "good line two"}\n' + '{"no_text": 1}\n' * 60
    src = corpus(tmp_path / "corpus", files)
    folder = tmp_path / "idx"
    with pytest.raises(CorpusError):
        index_corpus(src, folder, FakeEncoder())
    assert not folder.exists() or not (folder / "manifest.json").exists()
    rep = index_corpus(src, folder, FakeEncoder(), read=ReadOptions(skip_errors=True))
    skipped = {Path(s.split(": ")[0]).name for s in rep.skipped_files}
    assert skipped == {"broken.parquet", "broken.json", "nested.json"}
    assert rep.added == 5 and sum(rep.skipped.values()) == 3
    assert "skipped" in rep.summary() or sum(rep.skipped.values()) == 3


def test_skip_errors_drops_what_a_file_had_added_before_its_error(tmp_path):
    rows = "\n".join(json.dumps({"text": f"record {i} about gardening"}) for i in range(300))
    bad = rows + "\n" + "[" * 100_000 + "\n"  # past the first flush: a deep line the parser cannot take
    src = corpus(tmp_path / "corpus", {"good.txt": "one good file", "bad.jsonl": bad})
    folder = tmp_path / "idx"
    rep = index_corpus(src, folder, FakeEncoder(), read=ReadOptions(skip_errors=True), flush_chunks=16)
    # the bad line alone is skipped (a line-level error), so the file stays: 300 records
    assert rep.added == 2 and Manifest.load(folder).counts["chunks"] == 301
    # a .json whose reading fails after some records were already embedded: the whole file goes
    src2 = corpus(tmp_path / "c2", {"good.txt": "one good file", "broken.parquet": b"PAR1" + os.urandom(500) + b"PAR1"})
    rep = index_corpus(src2, tmp_path / "idx2", FakeEncoder(), read=ReadOptions(skip_errors=True))
    assert rep.added == 1 and [Path(s.split(": ")[0]).name for s in rep.skipped_files] == ["broken.parquet"]
    _, v, d = open_index(tmp_path / "idx2")
    assert v.ntotal == d.counts()["chunks"] == 1
    d.close()


# ---- 2. large files: streamed, bounded memory, progress, resumable ------------------------------
def _random_text(rng: random.Random, n_words: int) -> str:
    words = ["loan", "credit", "soup", "comet", "naïve", "café", "x" * 30, "a-b", "it's", "1.5", "—", "日本"]
    out = []
    for _ in range(n_words):
        out.append(rng.choice(words))
        out.append(rng.choice([" ", " ", " ", "\n", "\n\n", "\t", "  ", "\r\n"]))
    return "".join(out)


@pytest.mark.parametrize("seed", range(6))
def test_streamed_chunks_equal_whole_text_chunks(tmp_path, seed, monkeypatch):
    import semsearch.corpus.streaming as streaming

    monkeypatch.setattr(streaming, "BLOCK_CHARS", 50)
    rng = random.Random(seed)
    text = _random_text(rng, rng.randint(0, 3000))
    if seed == 0:
        text = "\ufeff" + text  # a BOM is dropped by both
    p = tmp_path / "t.txt"
    p.write_bytes(text.encode())
    text = text.lstrip("\ufeff")
    enc = FakeEncoder()
    s = ChunkSettings(window=rng.randint(1, 20), overlap=0)
    s = ChunkSettings(s.window, rng.randint(0, s.window - 1))
    whole = [(c.text, c.start, c.end, c.n_tokens, line_of(text, c.start)) for c in chunk_text(text, enc.token_offsets, s)]
    for block in (7, 50, 4096):
        got = [(c.text, c.start, c.end, c.n_tokens, line)
               for c, line in chunk_stream(text_blocks(p, block_chars=block), enc.token_offsets, s)]
        assert got == whole


def test_streamed_chunks_with_the_real_tokenizer(tmp_path, real_encoder, monkeypatch):
    import semsearch.corpus.streaming as streaming

    monkeypatch.setattr(streaming, "BLOCK_CHARS", 1000)
    text = _random_text(random.Random(1), 6000)
    p = tmp_path / "t.txt"
    p.write_text(text)
    s = ChunkSettings(window=100, overlap=16)
    whole = [(c.text, c.start, c.end) for c in chunk_text(text, real_encoder.token_offsets, s)]
    got = [(c.text, c.start, c.end) for c, _ in chunk_stream(text_blocks(p, 1000), real_encoder.token_offsets, s)]
    assert got == whole and len(got) > 20


def test_a_large_text_file_is_chunked_in_bounded_memory_with_progress(tmp_path, monkeypatch):
    """Memory grows with the block, not the file (scripts/bench/bench_bigfile.py measures a 50 MB file's RSS)."""
    import semsearch.corpus.streaming as streaming
    from semsearch.engines.chunks import file_chunks

    monkeypatch.setattr(streaming, "BLOCK_CHARS", 1 << 17)
    p = tmp_path / "big.txt"
    line = "The bank approved the loan after checking the credit score of the applicant today.\n"
    p.write_text(line * (3_000_000 // len(line)))  # 3 MB, about 560,000 tokens
    seen: list[int] = []
    tracemalloc.start()
    n = 0
    for _, rows in file_chunks(p, FakeEncoder().token_offsets, ChunkSettings(254, 32), ReadOptions(), seen.append):
        n += len(rows)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert n > 2_000
    assert peak < 30e6, f"peak {peak / 1e6:.0f} MB"  # whole-text chunking peaked at ~100 MB here
    assert len(seen) >= 10 and sum(seen) == p.stat().st_size  # progress as the file is read


class Interrupting(FakeEncoder):
    def __init__(self, after: int):
        super().__init__()
        self.after = after

    def encode(self, texts, progress=None):
        if self.calls >= self.after:
            raise KeyboardInterrupt
        return super().encode(texts, progress)


def test_an_interrupted_run_resumes_what_it_had_embedded(tmp_path):
    text = " ".join(f"word{i}" for i in range(4000))
    src = corpus(tmp_path / "corpus", {"big.txt": text, "small.txt": "credit score loan"})
    folder = tmp_path / "idx"
    s = ChunkSettings(window=20, overlap=4)
    first = Interrupting(after=100)
    with pytest.raises(KeyboardInterrupt):
        index_corpus(src, folder, first, chunking=s, flush_chunks=25)
    assert not (folder / "manifest.json").exists()
    done = first.calls  # embedded before the interrupt (whole batches)
    enc = FakeEncoder()
    rep = index_corpus(src, folder, enc, chunking=s, flush_chunks=25)
    total = Manifest.load(folder).counts["chunks"]
    assert total > 200 and 100 <= done < total
    assert rep.resumed == done and enc.calls == total - done and f"resumed {done} chunk(s)" in rep.summary()
    assert not (folder / "resume.sqlite").exists()  # dropped once published
    clean = tmp_path / "clean"
    index_corpus(src, clean, FakeEncoder(), chunking=s)
    a = Retriever.load(folder, encoder=FakeEncoder()).search("word17 word3999", k=5)
    b = Retriever.load(clean, encoder=FakeEncoder()).search("word17 word3999", k=5)
    assert [(h.text, round(h.score, 5)) for h in a] == [(h.text, round(h.score, 5)) for h in b]


def test_a_resume_cache_of_the_row_a_vector_layout_is_dropped_and_its_work_done_again(tmp_path):
    """The cache keeps a row a batch; a file left by a run of the earlier layout (a row a vector)
    is not read as this one, nor an error: its chunks are embedded again, and the run publishes."""
    import sqlite3

    from semsearch.store.resume import encoder_key

    src = corpus(tmp_path / "corpus", {"a.txt": "credit score loan", "b.txt": "lentil soup recipe"})
    folder = tmp_path / "idx"
    folder.mkdir()
    db = sqlite3.connect(folder / "resume.sqlite")
    db.execute("CREATE TABLE meta (key TEXT NOT NULL)")
    db.execute("INSERT INTO meta VALUES (?)", (encoder_key(FakeEncoder()),))
    db.execute("CREATE TABLE vectors (h BLOB PRIMARY KEY, v BLOB NOT NULL, run TEXT)")
    db.execute("INSERT INTO vectors VALUES (?, ?, ?)", (b"k" * 16, np.zeros(FakeEncoder().out_dim, np.float32).tobytes(), "old"))
    db.commit()
    db.close()
    enc = FakeEncoder()
    rep = index_corpus(src, folder, enc)
    assert rep.resumed == 0 and enc.calls == Manifest.load(folder).counts["chunks"] == 2
    assert not (folder / "resume.sqlite").exists()


def test_a_damaged_resume_cache_is_dropped_with_a_warning_and_the_run_publishes(tmp_path, caplog):
    src = corpus(tmp_path / "corpus", {"a.txt": "credit score loan", "b.txt": "lentil soup recipe"})
    folder = tmp_path / "idx"
    folder.mkdir()
    (folder / "resume.sqlite").write_bytes(b"not a database" * 100)
    enc = FakeEncoder()
    with caplog.at_level("WARNING", logger="semsearch.store.resume"):
        rep = index_corpus(src, folder, enc)
    assert any("dropped a damaged resume cache" in r.getMessage() for r in caplog.records)
    assert rep.resumed == 0 and enc.calls == Manifest.load(folder).counts["chunks"] == 2
    assert not (folder / "resume.sqlite").exists()


def test_a_fresh_index_with_duplicate_chunks_reports_nothing_resumed(tmp_path):
    """Duplicate texts in one run meet their own vectors in the resume cache: that is not work
    resumed from an interrupted run, and the summary must not say so."""
    same = "the same paragraph about loans, credit scores and mortgage rates"
    src = corpus(tmp_path / "corpus", {f"copy{i}.txt": same for i in range(6)} | {"other.txt": "lentil soup"})
    rep = index_corpus(src, tmp_path / "idx", FakeEncoder(), flush_chunks=2)
    assert rep.resumed == 0 and "resumed" not in rep.summary()


# ---- 8. a long-lived Retriever picks up a new generation --------------------------------------
def test_retriever_refreshes_after_a_reindex(built):
    src, folder = built
    r = Retriever.load(folder, encoder=FakeEncoder())
    assert r.refresh() is False
    assert Path(r.search("meteor comet debris", k=1)[0].path).name == "space.txt"
    (src / "space.txt").unlink()
    index_corpus(src, folder, FakeEncoder())
    hits = r.search("meteor comet debris", k=10)  # the stat of manifest.json sees the new generation
    assert "space.txt" not in {Path(h.path).name for h in hits} and len(r) == 3
    (src / "space.txt").write_text(TEXTS["space.txt"])
    index_corpus(src, folder, FakeEncoder())
    r.auto_refresh = False
    assert len(r) == 3
    assert r.refresh() is True and len(r) == 4
    assert Path(r.search("meteor comet debris", k=1)[0].path).name == "space.txt"


# ---- 10. smaller items ----------------------------------------------------------------------------
def test_search_refuses_a_query_that_is_not_a_string(built):
    _, folder = built
    r = Retriever.load(folder, encoder=FakeEncoder())
    with pytest.raises(InputError, match="must be a string, got int"):
        r.search(123)
    with pytest.raises(InputError, match="query 2 must be a string"):
        r.search_batch(["ok", None])


def test_a_query_past_the_model_length_is_noticed(built, caplog):
    _, folder = built
    r = Retriever.load(folder, encoder=FakeEncoder())  # max length 40: 38 content tokens
    with caplog.at_level(logging.WARNING):
        r.search("word " * 30)
    assert not caplog.records
    with caplog.at_level(logging.WARNING):
        r.search("word " * 39)
    assert "longer than the model's 40 tokens: only its first 38 tokens are searched" in caplog.text


KILLED_CHILD = """
import sys, time
sys.path.insert(0, {tests!r})
from pathlib import Path
from conftest import FakeEncoder
from semsearch.corpus import ChunkSettings
from semsearch.indexing import index_corpus

class Slow(FakeEncoder):
    def encode(self, texts, progress=None):
        out = super().encode(texts, progress)
        print("encoded", self.calls, flush=True)
        time.sleep(0.2)
        return out

index_corpus(Path(sys.argv[1]), Path(sys.argv[2]), Slow(), chunking=ChunkSettings(20, 4), flush_chunks=16)
"""


def test_a_run_killed_with_sigkill_resumes_what_it_had_embedded(tmp_path):
    import subprocess
    import sys

    from conftest import REPO

    src = corpus(tmp_path / "corpus", {"big.txt": " ".join(f"word{i}" for i in range(6000))})
    folder = tmp_path / "idx"
    script = tmp_path / "child.py"
    script.write_text(KILLED_CHILD.format(tests=str(REPO / "tests")))
    p = subprocess.Popen([sys.executable, str(script), str(src), str(folder)], stdout=subprocess.PIPE, text=True)
    for line in p.stdout:  # let it embed a few batches, then kill -9 it mid-run
        if line.startswith("encoded") and int(line.split()[1]) >= 192:
            p.kill()
            break
    p.wait()
    assert p.returncode == -9 and not (folder / "manifest.json").exists()
    enc = FakeEncoder()
    rep = index_corpus(src, folder, enc, chunking=ChunkSettings(20, 4), flush_chunks=16)
    total = Manifest.load(folder).counts["chunks"]
    # Lost: the batch being embedded at the kill, and the one the build was writing (its vectors go
    # into the cache as it is written, in the build's thread, so that the encoding thread is not
    # kept from the next batch); every batch before them is resumed. Batches here are of 64 texts.
    assert rep.resumed >= 64 and enc.calls == total - rep.resumed


@pytest.mark.parametrize("how", ["emptied", "removed"])
def test_a_manifest_that_counts_chunks_but_names_no_segment_is_refused(built, how):
    """Segment list emptied or its key removed (hand edit, bad copy): a clear error, not an index
    that answers nothing. --rebuild over it still works (it reads the damaged manifest leniently)."""
    src, folder = built
    raw = json.loads((folder / "manifest.json").read_text())
    assert raw["counts"]["chunks"] > 0
    if how == "emptied":
        raw["segments"] = []
    else:
        del raw["segments"]
    (folder / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(IndexFormatError, match="names no segment"):
        Retriever.load(folder, encoder=FakeEncoder())


@pytest.mark.parametrize("value", [True, 3, None, 1.5, "x", [1, "a"], {"a": 1}])
def test_rebuild_over_a_manifest_with_a_mistyped_segment_list(built, value):
    """Fuzz finding: --rebuild over a manifest whose segments field had the wrong type raised
    TypeError while sorting out the folder's leftovers; it now rebuilds."""
    src, folder = built
    raw = json.loads((folder / "manifest.json").read_text())
    raw["segments"] = value
    (folder / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(IndexFormatError):
        Retriever.load(folder, encoder=FakeEncoder())
    index_corpus(src, folder, FakeEncoder(), rebuild=True)
    assert Manifest.load(folder).counts["chunks"] > 0
    assert Retriever.load(folder, encoder=FakeEncoder()).search("loan", k=3)
