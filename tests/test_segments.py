"""An index of segments: writes cost what they change, and results equal a fresh build.

The property test drives random sequences of document upserts and deletes, index runs over a
changing folder and merges, and after every step compares dense, lexical and hybrid results with
those of an index built from nothing over the same live documents: the same texts with the same
scores (within 1e-5), rank for rank. The kill -9 tests stop a writer inside a segment write, a
tombstone update and a merge: the published generation keeps answering, and the next write
completes.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, terms_into_docstore, vectors_into_docstore
from semsearch.documents import Document, create_index, delete_documents, upsert_documents
from semsearch.indexing import index_corpus
from semsearch.search import Retriever
from semsearch.store import FORMAT_VERSION, Manifest
from semsearch.store import merge as merge_
from semsearch.store.folder import compact, verify
from semsearch.store.vectors import MatrixIndex

WORDS = ("loan bank credit mortgage rate soup lentil onion cumin meteor comet debris orbit planet river delta "
         "forest canopy rain storm engine piston valve circuit signal noise").split()
QUERIES = ["loan credit rate", "comet orbit planet", "soup onion", "storm rain forest", "engine valve signal noise"]


def _text(rng: random.Random, n: int | None = None) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n or rng.randint(4, 30)))


def _results(r: Retriever, where=None) -> dict:
    out = {}
    for q in QUERIES:
        for mode in ("dense", "lexical", "hybrid"):
            out[(q, mode)] = [(h.text, h.score, h.metadata.get("tag")) for h in r.search(q, 10, mode=mode, where=where)]
    return out


def _same(a: list, b: list, what) -> None:
    """Equal scores rank for rank, and the same texts wherever the score is not tied at the cut."""
    assert len(a) == len(b), what
    sa, sb = np.array([x[1] for x in a]), np.array([x[1] for x in b])
    assert np.allclose(sa, sb, atol=1e-5, rtol=0), (what, sa, sb)
    if len(a):
        cut = sa[-1] + 1e-5
        assert sorted((round(x[1], 4), x[0], x[2]) for x in a if x[1] > cut) == \
            sorted((round(x[1], 4), x[0], x[2]) for x in b if x[1] > cut), what


def _fresh(tmp: Path, corpus: Path | None, docs: dict[str, tuple[str, dict]], enc, name: str) -> Retriever:
    folder = tmp / name
    if corpus is not None and any(corpus.iterdir()):
        index_corpus(corpus, folder, enc, progress=False)
    else:
        create_index(folder, enc)
    if docs:
        upsert_documents(folder, [Document(i, t, m) for i, (t, m) in docs.items()], enc)
    return Retriever.load(folder, encoder=enc)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_any_sequence_of_writes_equals_a_fresh_build(seed, tmp_path, fake_encoder, monkeypatch):
    monkeypatch.setattr(merge_, "FACTOR", 3)  # merges happen within a short sequence
    monkeypatch.setattr(merge_, "BASE", 8)
    rng = random.Random(seed)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    folder = tmp_path / "idx"
    create_index(folder, fake_encoder)
    live: dict[str, tuple[str, dict]] = {}
    ops = []
    for step in range(14):
        op = rng.choice(["upsert", "upsert", "replace", "delete", "index", "merge"])
        if op == "upsert" or (op in ("replace", "delete") and not live):
            batch = {f"d{seed}-{step}-{j}": (_text(rng), {"tag": rng.choice(["a", "b"]), "n": rng.randint(0, 9)})
                     for j in range(rng.randint(1, 3))}
            upsert_documents(folder, [Document(i, t, m) for i, (t, m) in batch.items()], fake_encoder)
            live.update(batch)
        elif op == "replace":
            i = rng.choice(sorted(live))
            live[i] = (_text(rng), {"tag": "c", "n": 5})
            upsert_documents(folder, [Document(i, *live[i])], fake_encoder)
        elif op == "delete":
            gone = rng.sample(sorted(live), min(len(live), rng.randint(1, 2)))
            delete_documents(folder, gone)
            for i in gone:
                del live[i]
        elif op == "index":  # files come, change and go
            for name in rng.sample([f"f{j}.txt" for j in range(6)], 2):
                p = corpus / name
                if p.exists() and rng.random() < 0.4:
                    p.unlink()
                else:
                    p.write_text(_text(rng, rng.randint(5, 60)) + "\n")
            if any(corpus.iterdir()):
                index_corpus(corpus, folder, fake_encoder, progress=False)
        else:
            compact(folder)
        ops.append(op)
        m = Manifest.load(folder)
        got = Retriever.load(folder, encoder=fake_encoder)
        files_indexed = any(e for e in got.docs.files() if not e.startswith("api:"))
        want = _fresh(tmp_path, corpus if files_indexed else None, live, fake_encoder, f"fresh{step}")
        assert len(got) == len(want) == m.counts["chunks"], ops
        # a one-shot reader searches these small flat segments with numpy, from the docstores' vectors
        light = Retriever.load(folder, encoder=fake_encoder, fast_start=True)
        assert all(isinstance(p.segment.vectors, MatrixIndex) for p in light.docs.parts)
        for where in (None, {"tag": "a"}, ["n>=5"]):
            a, b, c = _results(got, where), _results(want, where), _results(light, where)
            for key in a:
                _same(a[key], b[key], (ops, key, where, len(m.segments)))
                _same(c[key], a[key], ("light", ops, key, where, len(m.segments)))
        got.close()
        want.close()
        light.close()
    assert not verify(folder)


def test_bm25_statistics_span_segments(tmp_path, fake_encoder):
    """A term's idf and the average length are those of all live chunks, wherever they sit."""
    folder = tmp_path / "idx"
    create_index(folder, fake_encoder)
    upsert_documents(folder, [Document("a", "loan loan bank"), Document("b", "soup onion")], fake_encoder)
    upsert_documents(folder, [Document("c", "loan rate"), Document("d", "meteor comet orbit orbit")], fake_encoder)
    delete_documents(folder, ["b"])
    r = Retriever.load(folder, encoder=fake_encoder)
    assert len(Manifest.load(folder).segments) == 2
    lex = r.docs.lexical()
    assert lex.n == 3 and lex.average_length == pytest.approx((3 + 2 + 4) / 3)
    # idf of 'loan': in 2 of 3 live chunks
    idf = np.log1p((3 - 2 + 0.5) / (2 + 0.5))
    hits = {h.text: h.score for h in r.search("loan", 10, mode="lexical")}
    k1, b = 1.2, 0.75
    avg = 3.0
    assert hits["loan loan bank"] == pytest.approx(idf * 2 * (k1 + 1) / (2 + k1 * (1 - b + b * 3 / avg)), rel=1e-5)
    assert hits["loan rate"] == pytest.approx(idf * (k1 + 1) / (1 + k1 * (1 - b + b * 2 / avg)), rel=1e-5)


def test_a_write_touches_only_what_it_changes(tmp_path, fake_encoder):
    folder = tmp_path / "idx"
    create_index(folder, fake_encoder)
    upsert_documents(folder, [Document(f"d{i}", _text(random.Random(i), 40)) for i in range(200)], fake_encoder)
    m0 = Manifest.load(folder)
    big = m0.segments[0]
    stat = {n: os.stat(folder / n).st_mtime_ns for n in (big["docs"], big["vectors"])}
    d3 = sum(1 for row in Retriever.load(folder, encoder=fake_encoder).docs.select("f.path") if row[1] == "api:d3")
    upsert_documents(folder, [Document("new", "a brand new document about loans")], fake_encoder)
    delete_documents(folder, ["d3"])
    m = Manifest.load(folder)
    assert m.segments[0]["docs"] == big["docs"] and m.segments[0]["deletes"]  # the big segment stays, with a tombstone
    assert {n: os.stat(folder / n).st_mtime_ns for n in stat} == stat  # never rewritten
    assert m.counts["chunks"] == m0.counts["chunks"] + 1 - d3 and m.generation == m0.generation + 2
    r = Retriever.load(folder, encoder=fake_encoder)
    assert "d3" not in {h.path for h in r.search("loan", 200, mode="lexical")}
    # compact merges everything into one segment without the deleted chunk
    out = compact(folder)
    m = Manifest.load(folder)
    assert out["segments"] == 1 and len(m.segments) == 1 and m.segments[0]["rows"] == m.counts["chunks"]
    assert not verify(folder)


def test_merge_policy_bounds_segments():
    entries = [{"rows": 100_000, "live": 100_000}] + [{"rows": 3, "live": 3} for _ in range(9)]
    assert merge_.plan(entries) == []  # nine small ones: below the factor
    entries.append({"rows": 3, "live": 3})
    assert merge_.plan(entries) == [(1, 11)]  # the tenth: the small ones become one
    many = [{"rows": 3, "live": 3, "i": i} for i in range(1000)]
    plan = merge_.plan(many)
    assert all(b0 <= a1 for (_, b0), (a1, _) in zip(plan, plan[1:]))  # adjacent runs, in order, disjoint
    assert 1000 - sum(b - a for a, b in plan) + len(plan) < 2 * merge_.FACTOR  # fewer than FACTOR a level
    assert len(merge_.plan([{"rows": 10_000, "live": 6_000}])) == 1  # 40% deleted: rewritten
    assert merge_.plan([{"rows": 10_000, "live": 9_000}]) == []


def test_format_1_index_opens_as_one_segment(tmp_path, fake_encoder, small_corpus):
    """An index written before segments (format 1) opens, answers, and is upgraded by its next write."""
    folder = tmp_path / "idx"
    index_corpus(small_corpus, folder, fake_encoder, progress=False)
    before = _results(Retriever.load(folder, encoder=fake_encoder))
    raw = json.loads((folder / "manifest.json").read_text())
    seg = raw.pop("segments")[0]
    raw.pop("next_ids")
    # format 1 had no posting files: its lexical side is read from the docstore's chunk rows
    terms_into_docstore(folder, seg)
    seg["integrity"]["files"].pop(seg.pop("postings"))
    vectors_into_docstore(folder, seg)  # nor vector files
    raw.update(format_version=1, files={"docs": seg["docs"], "vectors": seg["vectors"]}, integrity=seg["integrity"])
    (folder / "manifest.json").write_text(json.dumps(raw))
    r = Retriever.load(folder, encoder=fake_encoder)
    assert _results(r) == before and r.manifest.format_version == FORMAT_VERSION
    upsert_documents(folder, [Document("x", "comet orbit")], fake_encoder)
    m = json.loads((folder / "manifest.json").read_text())
    assert m["format_version"] == FORMAT_VERSION and len(m["segments"]) == 2 and m["next_ids"]["chunk"] > seg["max_id"]
    assert Retriever.load(folder, encoder=fake_encoder).search("comet orbit", 1, mode="lexical")[0].text == "comet orbit"
    # The old segment's terms (docstore rows) and the new one's posting file, merged into one
    # posting file: the docstore keeps no copy, and every lexical answer is the one before.
    after = _results(Retriever.load(folder, encoder=fake_encoder))
    compact(folder)
    m = json.loads((folder / "manifest.json").read_text())
    assert len(m["segments"]) == 1 and m["segments"][0]["postings"]
    db = sqlite3.connect(folder / m["segments"][0]["docs"])
    assert db.execute("SELECT COUNT(*) FROM chunks WHERE lex IS NOT NULL").fetchone()[0] == 0
    db.close()
    assert _results(Retriever.load(folder, encoder=fake_encoder)) == after


# ---- kill -9 ----------------------------------------------------------------------------------
CHILD = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    from conftest import FakeEncoder
    from semsearch.documents import Document, upsert_documents, delete_documents
    from semsearch.store import merge, segments, vectors
    where = sys.argv[1]

    def die(*a, **k):
        os.kill(os.getpid(), signal.SIGKILL)

    if where == "segment":  # the new segment's docstore is written, its vector index half saved
        real = vectors.VectorIndex.save
        def save(self, path, **kw):
            real(self, path, **kw)
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) // 2)
            die()
        vectors.VectorIndex.save = save
        upsert_documents({folder!r}, [Document("k1", "kill during a segment write")], FakeEncoder())
    elif where == "tombstone":  # the tombstone file is written, the manifest not yet
        real = segments.Tombstones.save
        def save(self, path):
            real(self, path)
            die()
        segments.Tombstones.save = save
        delete_documents({folder!r}, ["d1"])
    else:  # a merge: one input copied into the merged segment
        real = merge.copy_live
        def copy(*a, **k):
            real(*a, **k)
            die()
        merge.copy_live = copy
        from semsearch.store.folder import compact
        compact({folder!r})
""")


@pytest.mark.parametrize("where", ["segment", "tombstone", "merge"])
def test_kill_9_during_a_write_loses_nothing_published(where, tmp_path, fake_encoder):
    folder = tmp_path / "idx"
    create_index(folder, fake_encoder)
    upsert_documents(folder, [Document(f"d{i}", _text(random.Random(i))) for i in range(6)], fake_encoder)
    upsert_documents(folder, [Document("e", "a second segment about comets")], fake_encoder)
    before = _results(Retriever.load(folder, encoder=fake_encoder))
    m0 = Manifest.load(folder)
    code = CHILD.format(tests=str(Path(__file__).parent), folder=str(folder))
    p = subprocess.run([sys.executable, "-c", code, where], capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert Manifest.load(folder).generation == m0.generation  # nothing was published
    assert _results(Retriever.load(folder, encoder=fake_encoder)) == before  # the last generation answers
    # the next write completes, over the leftovers
    if where == "tombstone":
        delete_documents(folder, ["d1"])
        assert "d1" not in {h.path for h in Retriever.load(folder, encoder=fake_encoder).search("comet", 50, mode="dense")}
    elif where == "segment":
        upsert_documents(folder, [Document("k1", "kill during a segment write")], fake_encoder)
        assert Retriever.load(folder, encoder=fake_encoder).search("kill segment write", 1, mode="lexical")[0].text.startswith("kill")
    else:
        compact(folder)
        assert len(Manifest.load(folder).segments) == 1
    assert not verify(folder)
    m = Manifest.load(folder)
    assert {p.name for p in folder.iterdir() if p.name[0] != "." and p.name != "manifest.json"} == m.data_files()


# ---- a long run publishes segments as it goes ---------------------------------------------------
def _corpus(root: Path, n: int = 12) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (root / f"f{i:02d}.txt").write_text(_text(random.Random(100 + i), 40) + "\n")
    return root


def test_a_long_run_publishes_segments_and_ends_as_one(tmp_path, fake_encoder):
    from test_engines import assert_same_index

    src = _corpus(tmp_path / "c")
    index_corpus(src, tmp_path / "once", fake_encoder, progress=False, segment_chunks=None)
    seen = []
    real = Manifest.save

    def save(self, folder):  # every generation the run publishes
        real(self, folder)
        seen.append((len(self.segments), self.counts["chunks"], bool(self.last_run.get("partial"))))

    Manifest.save = save
    try:
        index_corpus(src, tmp_path / "rolled", fake_encoder, progress=False, segment_chunks=5)
    finally:
        Manifest.save = real
    assert len(seen) > 2 and all(p for *_, p in seen[:-1]) and not seen[-1][2]  # partial generations, then the whole
    assert [c for _, c, _ in seen] == sorted(c for _, c, _ in seen)  # each holds more
    assert len(Manifest.load(tmp_path / "rolled").segments) == 1  # merged at the end
    assert_same_index(tmp_path / "once", tmp_path / "rolled")


def test_a_roll_reads_and_encodes_the_next_file_meanwhile_and_the_index_is_the_same(tmp_path, fake_encoder, monkeypatch):
    """While a long run publishes a segment (a roll), the next file is read and its chunks
    encoded in a thread (engines/lookahead.py); the run then takes those vectors rather than
    encoding the texts again: every chunk encoded once, the index a run in one go builds. A bad
    record met ahead is met where the run reads it: the line skipped with the reading options
    that skip, the run stopped without them."""
    import threading
    import time

    from semsearch.corpus.readers import ReadOptions
    from semsearch.store.folder import IndexWriter
    from test_engines import assert_same_index

    src = _corpus(tmp_path / "c", 10)
    index_corpus(src, tmp_path / "once", fake_encoder, progress=False, segment_chunks=None)
    encoded, real_encode = [], type(fake_encoder).encode

    def encode(self, texts, progress=None):
        encoded.append((threading.current_thread().name, len(texts)))
        return real_encode(self, texts, progress)

    real_commit = IndexWriter.commit

    def commit(self, manifest, merge="auto", rolled=False, trained=None):
        if rolled:
            time.sleep(0.3)  # a roll takes a while: the look-ahead reads the next file meanwhile
        return real_commit(self, manifest, merge, rolled, trained)

    monkeypatch.setattr(type(fake_encoder), "encode", encode)
    monkeypatch.setattr(IndexWriter, "commit", commit)
    rep = index_corpus(src, tmp_path / "rolled", fake_encoder, progress=False, segment_chunks=5)
    ahead = sum(n for name, n in encoded if name == "semsearch-lookahead")
    assert ahead > 0 and sum(n for _, n in encoded) == rep.chunks  # each chunk encoded once
    assert not [t for t in threading.enumerate() if t.name == "semsearch-lookahead"]  # ended with the run
    assert_same_index(tmp_path / "once", tmp_path / "rolled")
    # a bad record in the file read ahead: skipped where asked, else the run stops
    bad = tmp_path / "bad"
    bad.mkdir()
    for i in range(6):
        lines = [json.dumps({"text": _text(random.Random(500 + i * 10 + j), 30)}) for j in range(3)]
        if i == 3:
            lines.insert(1, "{not json")
        (bad / f"r{i}.jsonl").write_text("\n".join(lines) + "\n")
    encoded.clear()
    skip = ReadOptions(skip_errors=True)
    index_corpus(bad, tmp_path / "skipping", fake_encoder, progress=False, segment_chunks=2, read=skip)
    assert any(name == "semsearch-lookahead" for name, _ in encoded)
    index_corpus(bad, tmp_path / "skipping-once", fake_encoder, progress=False, segment_chunks=None, read=skip)
    assert_same_index(tmp_path / "skipping-once", tmp_path / "skipping")
    assert Manifest.load(tmp_path / "skipping").counts["chunks"] == 18  # r3.jsonl's bad line alone skipped
    from semsearch.errors import CorpusError

    with pytest.raises(CorpusError, match="r3.jsonl"):
        index_corpus(bad, tmp_path / "stopping", fake_encoder, progress=False, segment_chunks=2)


def test_a_long_run_keeps_its_segments_docstores_in_place_and_every_read_and_write_works_on_them(tmp_path, fake_encoder):
    """The merge at a long run's end keeps the rolled segments' docstores where they are (format
    8: no copy of the text beside them) and builds one vector index and posting file over them;
    searches, filters, an incremental run's changes and deletions, verify and compact work on
    that segment as on one docstore."""
    from test_engines import assert_same_index

    src = _corpus(tmp_path / "c", 14)
    once, rolled = tmp_path / "once", tmp_path / "rolled"
    index_corpus(src, once, fake_encoder, progress=False, segment_chunks=None)
    index_corpus(src, rolled, fake_encoder, progress=False, segment_chunks=5)
    m = Manifest.load(rolled)
    assert m.format_version == 8 and len(m.segments) == 1
    seg = m.segments[0]
    kept = [seg["docs"], *seg["docs_more"]]
    assert len(kept) > 3 and f"docs.{seg['id']}.sqlite" not in kept  # the rolled segments' own files, no new one
    assert sorted(p.name for p in rolled.glob("docs.*.sqlite")) == sorted(kept)
    assert_same_index(once, rolled)
    from semsearch.store import docstore
    a, b = docstore.open_docs(rolled, seg), docstore.open_docs(rolled, seg)
    assert a._shared is b._shared and a.counts() == {k: seg[k] for k in ("files", "documents")} | {"chunks": seg["rows"]}
    a.close()
    a.close()  # (once per opener)
    assert b._shared._users == 1
    b.close()  # idle, kept open for the next write or reader of the same files
    c = docstore.open_docs(rolled, seg)
    assert c._shared is a._shared and len(c.get_chunks([seg["min_id"], seg["max_id"]])) == 2
    c.close()
    filters = [None, ["path:*f0[1-4].txt"], ["path:*f1*"]]

    def same_answers() -> None:
        a, b = Retriever.load(once, encoder=fake_encoder), Retriever.load(rolled, encoder=fake_encoder)
        try:
            for where in filters:
                ra, rb = _results(a, where), _results(b, where)
                for key in ra:
                    _same(ra[key], rb[key], (key, where))
        finally:
            a.close()
            b.close()

    same_answers()
    (src / "f03.txt").write_text(_text(random.Random(7), 40) + " comet orbit\n")  # a file in a middle docstore
    (src / "f09.txt").unlink()
    for folder in (once, rolled):
        index_corpus(src, folder, fake_encoder, progress=False)
    assert Manifest.load(rolled).segments[0].get("docs_more")  # tombstones on the kept segment, not a copy
    same_answers()
    assert verify(rolled) == []
    parted = tmp_path / "parted"
    shutil.copytree(rolled, parted)
    compact(parted, shards=2)  # partitioned anew from the kept docstores
    assert sum(e["live"] for e in Manifest.load(parted).segments) == Manifest.load(once).counts["chunks"]
    b = Retriever.load(parted, encoder=fake_encoder)
    assert sorted(h.text for h in b.search("comet orbit", 50, mode="lexical")) == \
        sorted(h.text for h in Retriever.load(once, encoder=fake_encoder).search("comet orbit", 50, mode="lexical"))
    held = docstore.open_docs(rolled, Manifest.load(rolled).segments[0])  # (a reader of the old generation)
    compact(rolled)
    m = Manifest.load(rolled)
    assert len(m.segments) == 1 and not m.segments[0].get("docs_more") and m.format_version == FORMAT_VERSION
    assert len(held.get_chunks([seg["min_id"]])) == 1  # still readable from its open files
    held.close()  # the last user of files compact removed: closed, not kept open (their space given back)
    assert held._shared._key not in docstore._OPEN and all(not m._conns for m in held._shared.members)
    assert [p.name for p in rolled.glob("docs.*.sqlite")] == [m.segments[0]["docs"]]
    same_answers()
    assert verify(rolled) == []


def test_kept_docstores_answer_many_threads_and_asyncio_while_a_writer_writes_in_the_same_process(tmp_path, fake_encoder):
    """One process holds a segment of several docstores open for its readers (a Retriever
    refreshing on every call, from 6 threads and an asyncio loop) while its writer upserts and
    deletes documents, opening the same docstores (open_docs shares them): no error, every
    answer whole, and the last generation answers as a fresh Retriever does."""
    import asyncio
    import threading

    src = _corpus(tmp_path / "c", 14)
    folder = tmp_path / "rolled"
    index_corpus(src, folder, fake_encoder, progress=False, segment_chunks=5)
    assert Manifest.load(folder).segments[0].get("docs_more")
    r = Retriever.load(folder, encoder=fake_encoder)
    stop, errors, answered = threading.Event(), [], [0]

    def ask(i: int) -> None:
        q, mode = QUERIES[i % len(QUERIES)], ("dense", "lexical", "hybrid")[i % 3]
        hits = r.search(q, 5, mode=mode, where=["path:*f0*"] if i % 2 else None)
        assert all(h.text for h in hits)
        answered[0] += 1

    def reader(j: int) -> None:
        i = j
        while not stop.is_set():
            try:
                ask(i)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))
            i += 1

    async def loop_reader() -> None:
        i = 0
        while not stop.is_set():
            try:
                await asyncio.to_thread(ask, i)
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))
            i += 1

    threads = [threading.Thread(target=reader, args=(j,)) for j in range(6)]
    threads.append(threading.Thread(target=lambda: asyncio.run(loop_reader())))
    for t in threads:
        t.start()
    try:
        rng = random.Random(5)
        for n in range(12):
            upsert_documents(folder, [Document(f"d{n}", _text(rng, 30) + " comet orbit", {"tag": "w"})], fake_encoder)
            if n % 3 == 2:
                delete_documents(folder, [f"d{n - 1}"])
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[:3]
    assert answered[0] > 20
    fresh = Retriever.load(folder, encoder=fake_encoder)
    got, want = _results(r), _results(fresh)
    for key in want:
        _same(got[key], want[key], key)
    r.close()
    fresh.close()


def test_a_long_runs_merge_that_fails_beside_its_postings_thread_leaves_the_run_resumable(tmp_path, fake_encoder, monkeypatch):
    """The vector side of the run's final merge fails while the posting file is merged in its
    thread: the error reaches the caller once that thread is done, and the next run ends with the
    index a run without failure builds, no posting file left over."""
    from test_engines import assert_same_index

    src = _corpus(tmp_path / "c", 14)
    index_corpus(src, tmp_path / "once", fake_encoder, progress=False, segment_chunks=None)
    folder = tmp_path / "rolled"

    def broken(*a, **k):
        raise RuntimeError("the vector side failed")

    monkeypatch.setattr(merge_, "build_vectors", broken)
    with pytest.raises(RuntimeError, match="the vector side failed"):
        index_corpus(src, folder, fake_encoder, progress=False, segment_chunks=5)
    monkeypatch.undo()
    index_corpus(src, folder, fake_encoder, progress=False, segment_chunks=5)
    assert not list(folder.glob("*.tmp")) and len(Manifest.load(folder).segments) == 1
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith("lexical.")) == [Manifest.load(folder).segments[0]["postings"]]
    assert_same_index(tmp_path / "once", folder)


def _fast_scan_once(tmp_path, encoder):
    """A corpus of 24 files and its fast-scan index built in one go (tmp_path/once), with its
    settings: what a long run of the same corpus is compared with."""
    from semsearch.indexing import VectorSettings

    src = tmp_path / "c"
    src.mkdir()
    for i in range(24):
        (src / f"f{i:02d}.txt").write_text(_text(random.Random(300 + i), 300) + "\n")
    fs = VectorSettings(index_type="ivf-fastscan", storage="fp16")
    index_corpus(src, tmp_path / "once", encoder, progress=False, segment_chunks=None, vectors=fs)
    return src, fs


@pytest.mark.parametrize("fail", ["tuning", "a vector file"])
def test_a_long_runs_merge_keeps_its_segments_vector_files_in_list_order_and_a_failure_leaves_the_run_resumable(
        tmp_path, fake_encoder, monkeypatch, fail):
    """The run's final merge rewrites each of its segments' vector files in the merged index's
    list order, one at a time (the published manifest names each new file before the old one
    goes: the folder never holds more than one file twice), finds the tuning's exact neighbours
    in the same sweep and tunes against the kept files, which the merged segment names. Where the
    rewriting or the tuning fails, the index published on the way opens and answers, and the
    next run ends with the index a run without failure builds, no file left over."""
    from semsearch.store import vecfile
    from semsearch.store.folder import open_index
    from test_engines import assert_same_index

    src, fs = _fast_scan_once(tmp_path, fake_encoder)
    folder = tmp_path / "rolled"
    real_rewrite, real_tune = vecfile.rewrite, merge_.tune
    held, tuned_against = [], []

    def gone_but_mapped() -> int:  # vector files removed whose pages this process still maps (their disk not free)
        if not os.path.exists("/proc/self/maps"):
            return 0
        with open("/proc/self/maps") as fh:
            return len({line.split(None, 5)[-1] for line in fh if ".vec (deleted)" in line})

    def rewrite(vf, rows, path, order):
        held.append(len(list(folder.glob("vectors.*.vec"))) + gone_but_mapped())  # before this one's new file
        if fail == "a vector file" and len(held) == 2:
            raise RuntimeError("a vector file failed")
        return real_rewrite(vf, rows, path, order)

    def tune(vi, *a, **k):
        tuned_against.append([getattr(getattr(f, "path", None), "name", None) for f in getattr(vi.refine, "files", [vi.refine])])
        if fail == "tuning":
            raise RuntimeError("the tuning failed")
        return real_tune(vi, *a, **k)

    monkeypatch.setattr(vecfile, "rewrite", rewrite)
    monkeypatch.setattr(merge_, "tune", tune)
    with pytest.raises(RuntimeError, match=f"{fail} failed"):
        index_corpus(src, folder, fake_encoder, progress=False, segment_chunks=60, vectors=fs)
    partial = Manifest.load(folder)
    assert len(partial.segments) > 2 and any(e["vecs"] != f"vectors.{e['id']}.vec" for e in partial.segments)
    assert not verify(folder)  # the segments published on the way, one or all with a file rewritten
    got = Retriever.load(folder, encoder=fake_encoder).search("alpha beta", k=5)
    assert len(got) == 5
    fail, held[:] = None, []
    index_corpus(src, folder, fake_encoder, progress=False, segment_chunks=60, vectors=fs)
    m = Manifest.load(folder)
    seg = m.segments[0]
    names = vecfile.file_names(seg)
    assert len(m.segments) == 1 and len(names) == len(seg["docs_more"]) + 1 > 2
    assert tuned_against[-1] == names  # the trials re-ranked from the kept files
    assert max(held) <= len(names) and not gone_but_mapped()  # one file twice at most, on disk
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith("vectors.")) == sorted(names + [seg["vectors"]])
    assert m.format_version == 10 and not list(folder.glob("*.tmp"))
    idx = seg["index"]
    assert idx["type"] == "ivf-fastscan" and idx["recall"]["lower"] <= idx["recall"]["recall"]
    assert (idx["params"]["nprobe"], idx["params"]["k_factor"]) == (idx["recall"]["value"], idx["recall"]["k_factor"])
    _, _, docs = open_index(folder)
    s = next(iter(docs.segments().values()))
    lists = s.vectors.lists()
    for f in s.vecs.files:  # each file's rows list by list, as the index holds them
        mine = [x[(x >= f.ids[0]) & (x <= f.ids[-1])] for x in lists]
        assert vecfile.in_order(f, vecfile.list_order(f.ids, mine)) and f.storage == "fp16"
    docs.close()
    assert not verify(folder)
    assert_same_index(tmp_path / "once", folder)


def test_a_long_runs_fast_scan_vectors_stay_in_its_segments_files_and_answer_as_one_file(tmp_path, fake_encoder, monkeypatch):
    """The run's end indexes its segments' vector files read as one (vecfile.Stacked) and keeps
    them: no merged vector file is written, in id order or any other. Same index, same answers
    (search, filters, explain's vectors) as a run that published nothing on the way."""
    from semsearch.store import vecfile
    from test_engines import assert_same_index

    src, fs = _fast_scan_once(tmp_path, fake_encoder)
    written = []
    for name in ("write_batches", "write_ordered"):
        real = getattr(vecfile, name)
        monkeypatch.setattr(vecfile, name, lambda *a, _real=real, **k: written.append(Path(a[0]).name) or _real(*a, **k))
    index_corpus(src, tmp_path / "rolled", fake_encoder, progress=False, segment_chunks=60, vectors=fs)
    seg = Manifest.load(tmp_path / "rolled").segments[0]
    assert seg["index"]["type"] == "ivf-fastscan" and len(seg["docs_more"]) > 2 and len(seg["vecs_more"]) > 2
    assert vecfile.file_name(seg["id"]) not in written  # no merged file
    assert set(vecfile.file_names(seg)) <= set(written)  # each segment's own, rewritten in list order
    assert_same_index(tmp_path / "once", tmp_path / "rolled")
    a, b = Retriever.load(tmp_path / "once", encoder=fake_encoder), Retriever.load(tmp_path / "rolled", encoder=fake_encoder)
    ra, rb = _results(a), _results(b)
    for key in ra:
        _same(ra[key], rb[key], key)
    assert verify(tmp_path / "rolled") == []


def test_a_long_run_trains_its_vector_index_once_and_publishes_nothing_after_its_last_file(tmp_path, fake_encoder, monkeypatch):
    """A run that publishes segments as it goes merges them at its end: the approximate index is
    trained once, by that merge (not first for the run's last segment alone), and no segment is
    published after the last file only to be merged at once."""
    from semsearch.indexing import VectorSettings
    from semsearch.store.vectors import VectorIndex
    from test_engines import assert_same_index

    src = tmp_path / "c"
    src.mkdir()
    for i in range(30):
        (src / f"f{i:02d}.txt").write_text(_text(random.Random(200 + i), 400) + "\n")
    ivf = VectorSettings(index_type="ivf")
    index_corpus(src, tmp_path / "once", fake_encoder, progress=False, segment_chunks=None, vectors=ivf)
    trained, commits = [], []
    real_train, real_save = VectorIndex.train, Manifest.save
    monkeypatch.setattr(VectorIndex, "train", lambda self, *a, **kw: (trained.append(self.kind), real_train(self, *a, **kw))[1])
    monkeypatch.setattr(Manifest, "save", lambda self, folder: (commits.append(len(self.segments)), real_save(self, folder))[1])
    chunks = Manifest.load(tmp_path / "once").counts["chunks"]
    per = chunks // 3 + 1  # three segments' worth: two published as it goes, the rest at its end
    index_corpus(src, tmp_path / "rolled", fake_encoder, progress=False, segment_chunks=per, vectors=ivf)
    m = Manifest.load(tmp_path / "rolled")
    assert len(m.segments) == 1 and m.segments[0]["index"]["type"] == "ivf" and chunks >= 3 * 50
    assert trained == ["ivf"]  # by the final merge only
    assert len(commits) == 3  # two segments published as it went, then the whole
    assert_same_index(tmp_path / "once", tmp_path / "rolled")
    commits.clear()
    index_corpus(src, tmp_path / "each", fake_encoder, progress=False, segment_chunks=1, vectors=ivf)
    assert len(commits) == 30  # a segment after every file but the last, then the whole
    assert_same_index(tmp_path / "once", tmp_path / "each")


def test_a_run_that_published_one_segment_and_found_the_rest_unchanged_indexes_it(tmp_path, fake_encoder):
    """An update whose changed file fills a published segment, the files after it unchanged: the
    run ends with that one segment, published flat; it is rewritten with the index type its size
    asks for (here the forced ivf), not left to be searched exactly."""
    from semsearch.indexing import VectorSettings

    src = tmp_path / "c"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}.txt").write_text(_text(random.Random(300 + i), 600) + "\n")
    ivf = VectorSettings(index_type="ivf")
    folder = tmp_path / "idx"
    index_corpus(src, folder, fake_encoder, progress=False, vectors=ivf)
    (src / "f0.txt").write_text(_text(random.Random(400), 600) + "\n")  # changed; f1, f2 not
    rep = index_corpus(src, folder, fake_encoder, progress=False, segment_chunks=10, vectors=ivf)
    assert rep.updated == 1 and rep.unchanged == 2
    m = Manifest.load(folder)
    new = max(m.segments, key=lambda e: e["id"])
    assert new["live"] >= 50 and new["index"]["type"] == "ivf" and not new.get("rolled"), new
    assert not verify(folder)
    r = Retriever.load(folder, encoder=fake_encoder)
    assert len(r) == m.counts["chunks"] and r.search(_text(random.Random(400), 6), 3, mode="dense")


ROLL_KILL = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    from conftest import FakeEncoder
    from semsearch.indexing import index_corpus
    from semsearch.store import folder
    real, n = folder.IndexWriter.commit, [0]
    def commit(self, manifest, merge="auto", rolled=False, **kw):
        real(self, manifest, merge, rolled, **kw)
        n[0] += 1
        if n[0] == 2:
            os.kill(os.getpid(), signal.SIGKILL)  # after two segments were published
    folder.IndexWriter.commit = commit
    index_corpus({src!r}, {folder!r}, FakeEncoder(), progress=False, segment_chunks=5)
""")


def test_a_killed_long_run_resumes_from_its_last_segment(tmp_path, fake_encoder):
    from test_engines import assert_same_index

    src = _corpus(tmp_path / "c")
    index_corpus(src, tmp_path / "once", fake_encoder, progress=False, segment_chunks=None)
    folder = tmp_path / "idx"
    code = ROLL_KILL.format(tests=str(Path(__file__).parent), src=str(src), folder=str(folder))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr
    m = Manifest.load(folder)
    done = m.counts["files"]
    assert 0 < done < 12 and m.last_run.get("partial")  # two segments' worth of files were published
    r = Retriever.load(folder, encoder=fake_encoder)
    assert len(r) == m.counts["chunks"]  # and answer queries meanwhile
    r.close()
    rep = index_corpus(src, folder, fake_encoder, progress=False, segment_chunks=5)
    assert rep.unchanged == done and rep.added == 12 - done  # resumed: the published files are not read again
    assert len(Manifest.load(folder).segments) == 1
    assert_same_index(tmp_path / "once", folder)
    assert not verify(folder)


def test_a_long_run_keeps_one_segment_of_vectors_in_its_resume_cache(tmp_path, fake_encoder, monkeypatch):
    """The resume cache serves a run killed before it publishes; a long run publishes a segment at
    a time, and what it published is not embedded again on resume: the cache drops it, so it holds
    at most one segment's vectors, not the whole run's."""
    import sqlite3

    from semsearch.store import folder as folder_

    src = _corpus(tmp_path / "c")
    real, held = folder_.IndexWriter.commit, []

    def commit(self, manifest, merge="auto", rolled=False, **kw):
        path = self.folder / "resume.sqlite"
        if path.exists():
            db = sqlite3.connect(path)
            held.append((db.execute("SELECT COALESCE(SUM(n), 0) FROM batches").fetchone()[0], self.docs.new.counts()["chunks"]))
            db.close()
        return real(self, manifest, merge, rolled, **kw)

    monkeypatch.setattr(folder_.IndexWriter, "commit", commit)
    index_corpus(src, tmp_path / "idx", fake_encoder, progress=False, segment_chunks=5)
    assert len(held) >= 3
    assert all(cached == mine for cached, mine in held)  # the segment being published, and nothing before it


def test_tombstones_round_trip_detect_damage_and_build_no_ast(tmp_path):
    """Readers load tombstones from many threads; numpy's .npy reader builds an AST for each header
    (ast.literal_eval), which can fail with SystemError when two threads do it at once on CPython
    3.11. The file is read without one, and a damaged file is named, not misread."""
    from semsearch.errors import IndexFormatError
    from semsearch.store.segments import Tombstones

    path = tmp_path / "del.3.7.bin"
    t = Tombstones(np.array([9, 4, 4, 7]), np.array([2]), {5: (10, 11, 12, 13)})
    t.save(path)
    back = Tombstones.load(path)
    assert back.chunks.tolist() == [4, 7, 9] and back.files.tolist() == [2] and back.stats == {5: (10, 11, 12, 13)}
    Tombstones().save(tmp_path / "empty.bin")
    assert not Tombstones.load(tmp_path / "empty.bin")

    code = textwrap.dedent(f"""
        import sys
        from semsearch.store.segments import Tombstones
        built = []
        sys.addaudithook(lambda ev, args: built.append(args[1]) if ev == "compile" else None)
        Tombstones.load(__import__("pathlib").Path({str(path)!r}))
        assert not built, built
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 0, p.stderr

    raw = path.read_bytes()
    for name, data in [("flipped", raw[:40] + bytes([raw[40] ^ 1]) + raw[41:]), ("short", raw[:-3]), ("other", b"PK\x03\x04" + raw[4:])]:
        (tmp_path / name).write_bytes(data)
        with pytest.raises(IndexFormatError, match=name):
            Tombstones.load(tmp_path / name)


def test_a_long_run_trains_its_quantizer_and_adds_its_published_segments_beside_the_build(tmp_path, fake_encoder, monkeypatch):
    """A long run whose final index is IVF (forced here; 50k+ chunks choose it): once its published
    segments hold the quantizer's sample, the quantizer is trained once, in a thread beside the run,
    which then adds each published segment's vectors (here the stream waits for it at each
    segment; in a build it stops where the stream ends); the final merge adds only the rest. The index holds every chunk once with its id and
    vector, as a run that published nothing does, and its recall is tuned to the target. A
    partitioned run (`--shards 3`) trains one quantizer beside it too, for a partition's size, and
    each partition's merge fills a copy of it (nothing added beside: its segments are not split yet)."""
    import threading

    import semsearch.indexing as indexing
    from semsearch.store import vectors as vectors_
    from test_engines import assert_same_index

    monkeypatch.setattr(indexing, "AHEAD_SAMPLE", 60)
    for module in (vectors_, merge_):  # 4 lists: the sample (39 a list) is there after two segments
        monkeypatch.setattr(module, "default_nlist", lambda n: 4)
    added, trainings = [], []
    real_add, real_trained = vectors_.VectorIndex.add, vectors_.VectorIndex.trained.__func__

    def add(self, ids, vecs, refine=True):
        if self.kind == "ivf-fastscan":
            added.append((threading.current_thread().name, len(ids)))
        return real_add(self, ids, vecs, refine)

    def trained(cls, *a, **k):
        trainings.append(threading.current_thread().name)
        return real_trained(cls, *a, **k)

    monkeypatch.setattr(vectors_.VectorIndex, "add", add)
    monkeypatch.setattr(vectors_.VectorIndex, "trained", classmethod(trained))
    real_roll = indexing._Run.roll

    def roll(self, w, done=0.0):  # the thread catches up with each segment before the stream goes on
        out = real_roll(self, w, done)
        if self.ahead is not None:
            self.ahead.wait()
        return out

    src = tmp_path / "c"
    src.mkdir()
    for i in range(40):
        (src / f"f{i:02d}.txt").write_text(_text(random.Random(100 + i), 400) + "\n")
    vs = indexing.VectorSettings(index_type="ivf-fastscan")
    index_corpus(src, tmp_path / "once", fake_encoder, progress=False, segment_chunks=None, vectors=vs)
    assert trainings == ["MainThread"] and {t for t, _ in added} == {"MainThread"}
    added.clear()
    trainings.clear()
    monkeypatch.setattr(indexing._Run, "roll", roll)
    index_corpus(src, tmp_path / "idx", fake_encoder, progress=False, segment_chunks=100, vectors=vs)
    assert_same_index(tmp_path / "once", tmp_path / "idx")  # every chunk once, its id, vector and faiss id
    m = Manifest.load(tmp_path / "idx")
    total = m.counts["chunks"]
    assert total > 300 and len(m.segments) == 1 and m.segments[0]["index"]["type"] == "ivf-fastscan"
    beside = sum(n for t, n in added if t == "semsearch-quantizer")
    in_merge = sum(n for t, n in added if t == "MainThread")
    assert trainings == ["semsearch-quantizer"]  # once, beside the run: the merge trained nothing
    assert beside + in_merge == total and beside > total // 2 and 0 < in_merge <= 200, (beside, in_merge, total)
    assert m.segments[0]["index"]["recall"]["recall"] >= 0.95
    r = Retriever.load(tmp_path / "idx", encoder=fake_encoder)
    assert r.search(open(src / "f07.txt").read()[:200], 1, mode="dense")[0].path.endswith("f07.txt")

    added.clear()
    trainings.clear()
    index_corpus(src, tmp_path / "parted", fake_encoder, progress=False, segment_chunks=100, vectors=vs, shards=3)
    assert_same_index(tmp_path / "once", tmp_path / "parted")
    m = Manifest.load(tmp_path / "parted")
    assert sorted(e["part"] for e in m.segments) == [0, 1, 2]
    assert all(e["index"]["type"] == "ivf-fastscan" and e["index"]["recall"]["recall"] >= 0.95 for e in m.segments)
    assert trainings == ["semsearch-quantizer"]  # once, beside the run: no partition trained its own
    assert {t for t, _ in added} == {"MainThread"} and sum(n for _, n in added) == total
