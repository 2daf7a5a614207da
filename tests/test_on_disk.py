"""The index on disk, not in memory (format 4, 5): every segment's full vectors are stored once, in
`vectors.<s>.vec` (memory-mapped; an IVF fast-scan segment's faiss file holds only 4-bit codes
and re-ranks exactly from the map), not in the docstore; every segment's BM25 postings are in
`lexical.<s>.bin`, memory-mapped (since format 5 their only copy: the docstore keeps no terms).
Opening reads neither whole. `--vector-storage fp16` stores the full vectors at half the size. Format 2 indexes (vectors inside
faiss, postings in SQLite) and format 3 ones (vectors in the docstore) still open and answer."""
from __future__ import annotations

import functools
import json
import os
import sqlite3
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from semsearch.errors import IndexFormatError
from semsearch.indexing import VectorSettings, index_corpus
from semsearch.search import Retriever
from semsearch.store import FORMAT_VERSION, vecfile
from semsearch.store.vectors import VectorIndex

from conftest import REPO, FakeEncoder, mapped_rss, vectors_into_docstore

WORDS = [f"w{i}" for i in range(300)]


pytestmark = pytest.mark.xdist_group("test_on_disk")  # one worker sets the module fixtures up (pytest -n)


@pytest.fixture(scope="module")
def fastscan(tmp_path_factory):
    """A one-segment ivf-fastscan index of ~3,000 chunks (forced type), with the fake encoder."""
    root = tmp_path_factory.mktemp("on-disk")
    rng = np.random.default_rng(0)
    (root / "c").mkdir()
    rows = [{"text": " ".join(rng.choice(WORDS, 12)), "year": int(rng.integers(2000, 2025))} for _ in range(3000)]
    (root / "c" / "r.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    index_corpus(root / "c", root / "idx", FakeEncoder(), progress=False, vectors=VectorSettings(index_type="ivf-fastscan"))
    return root / "idx"


def test_a_fastscan_segment_keeps_codes_in_faiss_and_vectors_in_a_mapped_file(fastscan):
    m = json.loads((fastscan / "manifest.json").read_text())
    assert m["format_version"] == FORMAT_VERSION == 6
    [seg] = m["segments"]
    assert seg["index"]["type"] == "ivf-fastscan" and seg["index"]["params"]["refine"] == "file"
    assert seg["vecs"] == f"vectors.{seg['id']}.vec" and seg["postings"] == f"lexical.{seg['id']}.bin"
    assert {seg["vecs"], seg["postings"]} <= set(seg["integrity"]["files"])
    n, dim = seg["rows"], m["dim"]
    # the faiss file holds 4-bit codes: far less than the float32 vectors it used to carry
    assert (fastscan / seg["vectors"]).stat().st_size < n * dim * 4 / 4
    vf = vecfile.VectorFile(fastscan / seg["vecs"])
    r = Retriever.load(fastscan, encoder=FakeEncoder())
    ids, vecs = r.docs.get_vectors(vf.ids[:50])
    assert np.array_equal(ids, vf.ids[:50]) and np.array_equal(vecs, vf.matrix[:50])
    assert np.array_equal(r.vectors.reconstruct(vf.ids[[3, 7]]), vf.matrix[[3, 7]])
    # one stored copy: the docstore's vector column is empty
    db = sqlite3.connect(fastscan / seg["docs"])
    assert db.execute("SELECT COUNT(*) FROM chunks WHERE vector IS NOT NULL").fetchone()[0] == 0
    assert db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0] == n
    db.close()


def _as_format_3(folder):
    """Turn a format-4 index of flat segments into what format 3 wrote: each segment's vectors in
    its docstore's `vector` column, no vector file."""
    m = json.loads((folder / "manifest.json").read_text())
    for seg in m["segments"]:
        vectors_into_docstore(folder, seg)
    m["format_version"] = 3
    (folder / "manifest.json").write_text(json.dumps(m))


def test_a_format_3_index_answers_and_its_next_writes_store_vectors_once(tmp_path):
    from semsearch.documents import Document, upsert_documents
    from semsearch.store.folder import compact

    rng = np.random.default_rng(3)
    (tmp_path / "c").mkdir()
    for f in range(3):
        (tmp_path / "c" / f"f{f}.jsonl").write_text(
            "\n".join(json.dumps({"text": " ".join(rng.choice(WORDS, 10))}) for _ in range(40)))
    idx = tmp_path / "idx"
    index_corpus(tmp_path / "c", idx, FakeEncoder(), progress=False)
    queries = [" ".join(rng.choice(WORDS, 3)) for _ in range(5)]

    def answers():
        r = Retriever.load(idx, encoder=FakeEncoder())
        return [[(h.id, round(h.score, 5)) for h in r.search(q, k=8, mode=mode)] for q in queries for mode in ("dense", "hybrid")]

    want = answers()
    _as_format_3(idx)
    assert json.loads((idx / "manifest.json").read_text())["format_version"] == 3
    assert answers() == want  # vectors read from the docstore
    from semsearch.formatting import _segments
    from semsearch.store import Manifest

    assert "1 written before format 4" in _segments(Manifest.load(idx)) and "compact` rewrites it" in _segments(Manifest.load(idx))
    r = Retriever.load(idx, encoder=FakeEncoder())
    some = [h.id for h in r.search(queries[0], k=3, mode="dense")]
    ids, vecs = r.docs.get_vectors(some)
    assert sorted(some) == ids.tolist() and vecs.shape == (3, FakeEncoder().dim)
    upsert_documents(idx, [Document("extra", "w1 w2 w3 w4", {})], FakeEncoder())
    m = json.loads((idx / "manifest.json").read_text())
    assert m["format_version"] == FORMAT_VERSION and sum("vecs" in s for s in m["segments"]) == 1  # only the new segment
    extra = next(s["min_id"] for s in m["segments"] if "vecs" in s)
    compact(idx)
    m = json.loads((idx / "manifest.json").read_text())
    [seg] = m["segments"]
    assert seg["vecs"] == f"vectors.{seg['id']}.vec" and "format 4" not in _segments(Manifest.load(idx))
    db = sqlite3.connect(idx / seg["docs"])
    assert db.execute("SELECT COUNT(*) FROM chunks WHERE vector IS NOT NULL").fetchone()[0] == 0
    db.close()
    # dense answers are the same chunks and scores, the new chunk aside (hybrid's BM25 statistics moved)
    got = answers()
    for a, b in zip(got[::2], want[::2]):
        a = [x for x in a if x[0] != extra]
        assert a == b[: len(a)] and len(a) >= 7
    r = Retriever.load(idx, encoder=FakeEncoder())
    assert r.search("w1 w2 w3 w4", k=1, mode="lexical")[0].text == "w1 w2 w3 w4"


def test_dense_search_re_ranks_exactly_from_the_file(fastscan):
    r = Retriever.load(fastscan, encoder=FakeEncoder())
    vf = vecfile.VectorFile(next(fastscan.glob("vectors.*.vec")))
    rng = np.random.default_rng(1)
    found = 0
    for _ in range(20):
        text = " ".join(rng.choice(WORDS, 5))
        hits = r.search(text, k=10, mode="dense")
        q = FakeEncoder().encode([text])[0]
        exact = vf.matrix @ q
        kth = np.sort(exact)[-10]  # the fake encoder's cosines tie often: any chunk at least this good counts
        found += sum(float(exact[np.searchsorted(vf.ids, h.id)]) >= kth - 1e-6 for h in hits)
        for h in hits:  # each score is the exact cosine from the file
            assert h.score == pytest.approx(float(exact[np.searchsorted(vf.ids, h.id)]), abs=1e-5)
    assert found / 200 >= 0.9  # recall@10 against exact search
    hits = r.search("w1 w2", k=5, where={"year": {">=": 2020}}, mode="dense")
    assert hits and all(h.metadata["year"] >= 2020 for h in hits)


@pytest.mark.parametrize("name", ["vectors.{s}.vec", "lexical.{s}.bin"])
def test_a_damaged_mapped_file_is_named(fastscan, tmp_path, name):
    import shutil

    idx = tmp_path / "idx"
    shutil.copytree(fastscan, idx)
    seg = json.loads((idx / "manifest.json").read_text())["segments"][0]
    f = idx / name.format(s=seg["id"])
    with open(f, "r+b") as fh:
        fh.truncate(f.stat().st_size - 8)
    with pytest.raises(IndexFormatError, match=f.name):
        r = Retriever.load(idx, encoder=FakeEncoder())
        r.search("w1 w2", k=3, mode="hybrid")


def test_a_format_2_fastscan_file_with_vectors_inside_still_answers(tmp_path):
    """Format 2 kept the full vectors inside the faiss file (IDMap2 over IVF-PQ fast scan + RFlat)."""
    import faiss

    rng = np.random.default_rng(2)
    x = rng.standard_normal((4000, 32)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ids = np.arange(4000, dtype=np.int64) * 2 + 5
    old = faiss.IndexIDMap2(faiss.index_factory(32, "IVF16,PQ8x4fs,RFlat", faiss.METRIC_INNER_PRODUCT))
    old.train(x)
    old.add_with_ids(x, ids)
    faiss.write_index(old, str(tmp_path / "vectors.1.faiss"))
    vi = VectorIndex.load(tmp_path / "vectors.1.faiss", "ivf-fastscan", {"nlist": 16, "nprobe": 16, "k_factor": 50})
    assert vi.refine is None and not vi.external_refine
    s, got = vi.search(x[:3], 5)
    assert got[:, 0].tolist() == ids[:3].tolist() and s[:, 0] == pytest.approx(1.0, abs=1e-5)
    assert np.allclose(vi.reconstruct(ids[:2]), x[:2])


def test_opening_a_200k_chunk_index_does_not_read_it(tmp_path):
    """RSS growth of Retriever.load, and after queries, against the index's size on disk: load
    reads nothing whole, and queries leave only the pages of the maps they touched resident. Built with the benchmarks' synthetic builder (dim 32), in a child
    process so the measurement is its own."""
    code = textwrap.dedent(f"""
        import json, sys, numpy as np
        from pathlib import Path
        sys.path.insert(0, {str(REPO / 'scripts' / 'bench')!r}); sys.path.insert(0, {str(REPO / 'tests')!r})
        import bench_filters
        from conftest import FakeEncoder
        def rss(kind="VmRSS"):
            return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(kind + ":"))
        folder = Path(sys.argv[1])
        bench_filters.build(folder, 200_000, 32, np.random.default_rng(0))
        import faiss  # imported before the first measurement: its own pages are not the index's
        from semsearch.search import Retriever
        disk = sum(p.stat().st_size for p in folder.iterdir())
        maps = sum(p.stat().st_size for p in folder.iterdir() if p.suffix in (".vec", ".bin"))
        enc = FakeEncoder(dim=32); enc.name, enc.fingerprint = "stand-in", "standin01"
        r0, a0, f0 = rss(), rss("RssAnon"), rss("RssFile")
        r = Retriever.load(folder, encoder=enc)
        r1 = rss()
        rng = np.random.default_rng(1)
        for _ in range(50):
            r.search(" ".join(f"w{{x}}" for x in rng.zipf(1.3, 4) % 5000), k=10)
        print(json.dumps({{"disk": disk, "maps": maps, "load": r1 - r0, "queries": rss() - r0, "anon": rss("RssAnon") - a0,
                          "file": rss("RssFile") - f0}}))
    """)
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "idx")], capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\n200k chunks: {got['disk'] / 1e6:.0f} MB on disk; RSS +{got['load'] / 1e6:.1f} MB after load, "
          f"+{got['queries'] / 1e6:.1f} MB after 50 hybrid queries (heap +{got['anon'] / 1e6:.1f} MB, "
          f"mapped file pages +{got['file'] / 1e6:.1f} MB)")
    assert got["load"] < 0.1 * got["disk"]
    # The docstore (texts and metadata) is read by SQLite for the hits only, never mapped: resident
    # file pages are those of the vector and posting maps that queries touched (at dim 32 a page
    # holds 32 rows, so 50 queries re-ranking 1,000 candidates each touch most of them).
    assert got["file"] <= 1.05 * got["maps"] < 0.8 * got["disk"]
    # the heap holds compact structures only: ids, codes, statistics (~100 bytes a chunk)
    assert got["anon"] < 200 * 200_000


def test_fp16_vector_storage_halves_the_vector_files_and_stays_through_writes(tmp_path, fastscan, monkeypatch):
    """`--vector-storage fp16`: every vector file the index writes (its build, an upsert's
    segment, a merge) holds float16 rows, half the size of float32's; readers get float32, and
    the answers are the fp32 index's (the same rows, to fp16's precision)."""
    from semsearch.documents import Document, upsert_documents
    from semsearch.store.folder import compact

    rows = [json.loads(x) for x in (fastscan.parent / "c" / "r.jsonl").read_text().splitlines()]
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "r.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    idx = tmp_path / "idx"
    index_corpus(tmp_path / "c", idx, FakeEncoder(), progress=False,
                 vectors=VectorSettings(index_type="ivf-fastscan", storage="fp16"))
    m32, m16 = (json.loads((f / "manifest.json").read_text()) for f in (fastscan, idx))
    assert m16["index"]["storage"] == "fp16" and "storage" not in m32["index"]
    [s32], [s16] = m32["segments"], m16["segments"]
    v32, v16 = vecfile.VectorFile(fastscan / s32["vecs"]), vecfile.VectorFile(idx / s16["vecs"])
    assert (v32.storage, v16.storage) == ("fp32", "fp16") and v16.matrix.dtype == np.float16
    n, dim = len(v32.ids), v32.dim
    head = vecfile._vectors_at(n, ordered=True)  # the header, the ids and their rows (list order)
    assert (idx / s16["vecs"]).stat().st_size - head == 2 * n * dim == ((fastscan / s32["vecs"]).stat().st_size - head) / 2
    assert np.array_equal(v16.ids, v32.ids)
    got = v16.get(v16.ids[:100])
    assert got.dtype == np.float32 and np.abs(got - v32.get(v32.ids[:100])).max() < 1e-3
    a, b = Retriever.load(fastscan, encoder=FakeEncoder()), Retriever.load(idx, encoder=FakeEncoder())
    for q in ("w1 w2 w3", "w10 w200", "w42"):
        ha, hb = a.search(q, 10, mode="dense"), b.search(q, 10, mode="dense")
        assert [h.score for h in hb] == pytest.approx([h.score for h in ha], abs=2e-3)
        assert len({h.id for h in ha} & {h.id for h in hb}) >= 8
    a.close(), b.close()
    # an upsert (nothing asked) keeps the index's storage, and so does a merge of everything
    upsert_documents(idx, [Document("extra", "w1 w2 w3 w4", {})], FakeEncoder())
    m = json.loads((idx / "manifest.json").read_text())
    assert m["index"]["storage"] == "fp16" and all(vecfile.VectorFile(idx / s["vecs"]).storage == "fp16" for s in m["segments"])
    compact(idx)
    m = json.loads((idx / "manifest.json").read_text())
    assert len(m["segments"]) == 1 and vecfile.VectorFile(idx / m["segments"][0]["vecs"]).storage == "fp16"
    assert m["index"]["storage"] == "fp16"
    assert Retriever.load(idx, encoder=FakeEncoder()).search("w1 w2 w3 w4", 1, mode="lexical")[0].text == "w1 w2 w3 w4"
    # a long run's segments, published as it goes, are stored so too
    seen, real = [], vecfile.write_batches
    monkeypatch.setattr(vecfile, "write_batches", lambda path, ids, dim, b, storage=None: (seen.append(storage), real(path, ids, dim, b, storage))[1])
    (tmp_path / "c" / "r.jsonl").unlink()
    for j in range(3):
        (tmp_path / "c" / f"r{j}.jsonl").write_text("\n".join(json.dumps(r) for r in rows[j * 1000 : (j + 1) * 1000]))
    index_corpus(tmp_path / "c", tmp_path / "rolled", FakeEncoder(), progress=False, segment_chunks=900,
                 vectors=VectorSettings(storage="fp16"))
    assert len(seen) >= 3 and set(seen) == {"fp16"}  # segments published as the run went
    merged = json.loads((tmp_path / "rolled" / "manifest.json").read_text())["segments"]
    assert len(merged) == 1 and vecfile.VectorFile(tmp_path / "rolled" / merged[0]["vecs"]).storage == "fp16"  # and their merge


def test_a_vector_file_of_the_wrong_size_for_its_type_is_refused(tmp_path):
    x = np.random.default_rng(0).standard_normal((20, 8)).astype(np.float32)
    vecfile.write(tmp_path / "a.vec", np.arange(20), x, "fp16")
    assert np.allclose(vecfile.VectorFile(tmp_path / "a.vec").get(np.arange(20)), x, atol=2e-3)
    raw = bytearray((tmp_path / "a.vec").read_bytes())
    raw[:8] = vecfile.MAGIC  # fp16 rows under the fp32 magic: half the size it says
    (tmp_path / "b.vec").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="truncated or damaged"):
        vecfile.VectorFile(tmp_path / "b.vec")


def test_an_fp32_index_turns_fp16_by_a_run_with_the_setting_then_compact(tmp_path, fastscan):
    """An unchanged corpus indexed again with --vector-storage fp16 records the setting (no file
    re-encoded); `compact` then rewrites the stored vectors in it."""
    import shutil

    from semsearch.store.folder import compact

    idx = tmp_path / "idx"
    shutil.copytree(fastscan, idx)
    enc = FakeEncoder()
    rep = index_corpus(fastscan.parent / "c", idx, enc, progress=False, vectors=VectorSettings(storage="fp16"))
    assert rep.added == 0 and enc.calls == 0
    assert json.loads((idx / "manifest.json").read_text())["index"]["storage"] == "fp16"
    compact(idx)
    m = json.loads((idx / "manifest.json").read_text())
    assert [vecfile.VectorFile(idx / s["vecs"]).storage for s in m["segments"]] == ["fp16"]
    a, b = Retriever.load(fastscan, encoder=enc), Retriever.load(idx, encoder=enc)
    assert [h.id for h in a.search("w5 w6 w7", 5, mode="lexical")] == [h.id for h in b.search("w5 w6 w7", 5, mode="lexical")]


@pytest.mark.parametrize("ids", [np.arange(5, 205), np.arange(5, 405, 2), np.array([7]), np.r_[np.arange(3, 100), 101]])
def test_a_vector_file_finds_rows_by_offset_or_by_search_the_same(tmp_path, ids):
    """Consecutive ids are found by their offset from the first, others by binary search: the
    same rows and the same answer for ids the file does not hold."""
    x = np.random.default_rng(1).standard_normal((len(ids), 4)).astype(np.float32)
    vecfile.write(tmp_path / "v.vec", ids, x)
    vf = vecfile.VectorFile(tmp_path / "v.vec")
    assert (vf._first is not None) == (ids[-1] - ids[0] == len(ids) - 1)
    ask = np.r_[ids[::-1], ids[0] - 1, ids[-1] + 1, 102, 0, -5, 10**12]
    at, held = vf.rows(ask)
    want = np.searchsorted(ids, ask).clip(0, len(ids) - 1)
    assert np.array_equal(held, ids[want] == ask) and np.array_equal(at[held], want[ids[want] == ask])
    assert np.array_equal(vf.get(ids[::-1]), x[::-1]) and vf.get(np.array([ids[-1] + 1])) is None


@pytest.mark.parametrize("storage", ["fp32", "fp16"])
@pytest.mark.parametrize("ids", [np.arange(5, 2005), np.arange(5, 4005, 2)])
def test_a_vector_file_in_list_order_reads_like_one_in_id_order(tmp_path, ids, storage):
    """Rows kept list by list (an IVF segment's order) give every reader the same vectors as the
    id-ordered file: by id, in batches, in the order stored, sampled, gathered for re-ranking (in
    file order)."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((len(ids), 8)).astype(np.float32)
    lists = np.array_split(rng.permutation(ids), 37)
    vecfile.write(tmp_path / "a.vec", ids, x, storage)
    vecfile.write(tmp_path / "b.vec", ids, x, storage, order=vecfile.list_order(ids, lists))
    a, b = vecfile.VectorFile(tmp_path / "a.vec"), vecfile.VectorFile(tmp_path / "b.vec")
    assert (a.ordered, b.ordered, b.storage) == (False, True, storage)
    assert (tmp_path / "b.vec").stat().st_size - (tmp_path / "a.vec").stat().st_size <= 4 * len(ids) + 64
    # the rows on disk follow the lists: the first list's ids, ascending, are the first rows
    first = np.sort(lists[0])
    assert np.array_equal(b._rows[: len(first)], a.get(first).astype(b._rows.dtype))
    assert np.array_equal(a.matrix, b.matrix) and np.array_equal(a.ids, b.ids)
    ask = rng.choice(ids, 300)
    assert np.array_equal(a.get(ask), b.get(ask))
    assert b.get(np.r_[ask, ids[-1] + 1]) is None
    fa, fb = a.found(np.r_[ask, -3]), b.found(np.r_[ask, -3])
    assert all(np.array_equal(u, v) for u, v in zip(fa, fb))
    for (ia, va), (ib, vb) in zip(a.iter(333, keep=lambda i: i % 3 != 0), b.iter(333, keep=lambda i: i % 3 != 0)):
        assert np.array_equal(ia, ib) and np.array_equal(va, vb)
    assert all(np.array_equal(u, v) for u, v in zip(a.sample(50, seed=4), b.sample(50, seed=4)))
    # every row once in the order stored (exact search's ground truth): the rows on disk in turn
    stored = list(b.iter_stored(333))
    sid, sv = np.concatenate([i for i, _ in stored]), np.concatenate([v for _, v in stored])
    assert np.array_equal(sid[: len(first)], first) and np.array_equal(np.sort(sid), ids)
    assert np.array_equal(sv, a.get(sid)) and all(len(i) <= 333 for i, _ in stored)
    got_ids, got = b.get_file_order(ask)
    rows, _ = b.rows(got_ids)
    assert (np.diff(rows) >= 0).all() and np.array_equal(got, a.get(got_ids))
    assert sorted(got_ids.tolist()) == sorted(ask.tolist())
    with pytest.raises(ValueError):
        vecfile.list_order(ids, lists[1:])  # a list missing: refused, nothing written
    # reorder() rewrites an id-ordered file in place
    c = vecfile.reorder(tmp_path / "a.vec", lists)
    assert c.ordered and np.array_equal(c.get(ask), b.get(ask)) and not (tmp_path / "a.vec.tmp").exists()


@pytest.mark.parametrize("storage", ["fp32", "fp16"])
@pytest.mark.parametrize("consecutive", [False, True])
def test_vector_files_read_as_one_answer_like_one_file(tmp_path, storage, consecutive):
    """Several files of increasing id ranges, some in id order, some list by list, some rewritten
    from another's rows (vecfile.Stacked: a long run's merged segment, format 10) give every
    reader what one file of all the rows gives: by id, found, gathered for re-ranking, in
    batches, sampled, in the order stored; a file is replaced only by one of the same ids."""
    rng = np.random.default_rng(5)
    ids = np.arange(40, 3040) if consecutive else np.sort(rng.choice(100_000, 3000, replace=False)).astype(np.int64)
    x = rng.standard_normal((len(ids), 8)).astype(np.float32)
    vecfile.write(tmp_path / "all.vec", ids, x, storage)
    one = vecfile.VectorFile(tmp_path / "all.vec")
    cuts = [0, 700, 701, 2100, 3000]
    files = []
    for j, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        order = vecfile.list_order(ids[a:b], np.array_split(rng.permutation(ids[a:b]), 7)) if j % 2 else None
        vecfile.write(tmp_path / f"vectors.{j + 1}.vec", ids[a:b], x[a:b], storage, order=order)
        files.append(vecfile.VectorFile(tmp_path / f"vectors.{j + 1}.vec"))
    st = vecfile.Stacked(files)
    assert len(st) == len(one) and np.array_equal(st.ids, one.ids) and st.bounds(2) == (701, 2100)
    ask = rng.choice(ids, 500)
    assert np.array_equal(st.get(ask), one.get(ask)) and st.get(np.r_[ask, 100_001]) is None and st.get(np.r_[ask, -1]) is None
    assert (st._first is not None) == consecutive
    pos = rng.choice(len(ids), 400)
    assert np.array_equal(st.at_positions(pos), one.at_positions(pos))
    assert all(np.array_equal(u, v) for u, v in zip(st.found(np.r_[ask, -3]), one.found(np.r_[ask, -3])))
    for asked in (ask, ask[:1], np.sort(ask)[:300]):  # scattered, one, runs of close rows
        got_ids, got = st.get_file_order(asked)
        assert sorted(got_ids.tolist()) == sorted(asked.tolist()) and np.array_equal(got, one.get(got_ids))
    assert st.get_file_order(np.r_[ask, 100_001]) is None
    (ia, va), (ib, vb) = ([np.concatenate(x) for x in zip(*src.iter(333))] for src in (st, one))
    assert np.array_equal(ia, ib) and np.array_equal(va, vb)  # (batches end where a file does)
    stored = list(st.iter_stored(333))
    sid = np.concatenate([i for i, _ in stored])
    assert np.array_equal(np.sort(sid), ids) and np.array_equal(np.concatenate([v for _, v in stored]), one.get(sid))
    # file 3 rewritten from its rows read whole, list by list
    f = files[2]
    order = vecfile.list_order(f.ids, np.array_split(rng.permutation(f.ids), 5))
    assert not vecfile.in_order(f, order)
    got_ids, rows = vecfile.read_whole(f)
    assert np.array_equal(np.sort(got_ids), f.ids)
    vecfile.rewrite(f, rows, tmp_path / vecfile.kept_name(f.path.name, 9), order)
    new = vecfile.VectorFile(tmp_path / "vectors.3.9.vec")
    assert vecfile.in_order(new, order) and new.storage == storage
    st.replace(2, new)
    assert np.array_equal(st.get(ask), one.get(ask)) and st.files[2] is new
    with pytest.raises(ValueError):
        st.replace(1, new)  # other ids: refused


def test_a_fastscan_segment_keeps_each_lists_rows_together(fastscan):
    """The vector file of an IVF fast-scan segment is written list by list: the candidates one
    probed list gives a re-ranking are one run of rows."""
    m = json.loads((fastscan / "manifest.json").read_text())
    [seg] = m["segments"]
    vf = vecfile.VectorFile(fastscan / seg["vecs"])
    assert vf.ordered
    vi = VectorIndex.load(fastscan / seg["vectors"], "ivf-fastscan", seg["index"]["params"], refine=vf)
    at = 0
    for ids in vi.lists():
        rows, held = vf.rows(ids)
        assert held.all() and np.array_equal(np.sort(rows), np.arange(at, at + len(ids)))
        at += len(ids)
    assert at == len(vf)


@pytest.mark.parametrize("storage", ["fp32", "fp16"])
def test_rows_read_in_runs_equal_the_mapped_rows(tmp_path, storage):
    """read_rows: rows in a few runs are read with pread, scattered ones gathered from the map;
    both give the rows the map holds."""
    rng = np.random.default_rng(3)
    ids = np.arange(10, 5010)
    x = rng.standard_normal((len(ids), 16)).astype(np.float32)
    lists = np.array_split(rng.permutation(ids), 20)
    vecfile.write(tmp_path / "v.vec", ids, x, storage, order=vecfile.list_order(ids, lists))
    vf = vecfile.VectorFile(tmp_path / "v.vec")
    want = np.asarray(vf._rows, np.float32)
    for rows in (np.arange(100, 400), np.r_[3, 4, 5, 30, 31, 4000, 4001, 4999], np.sort(rng.choice(5000, 900, replace=False)),
                 np.r_[0], np.r_[7, 7, 8]):
        assert np.array_equal(vf.read_rows(rows), want[rows])
    got_ids, got = vf.get_file_order(np.asarray(lists[3]))
    assert np.array_equal(got, x[got_ids - 10].astype(vf._rows.dtype).astype(np.float32))


@pytest.mark.parametrize("with_torch", [False, True])
def test_widening_fp16_rows_is_exact(monkeypatch, with_torch):
    """vecfile.widen gives numpy's own cast for every finite fp16 value (subnormals, signed
    zeros), by its bit operations or by torch's cast where torch is loaded."""
    import sys

    if with_torch:
        import torch  # noqa: F401
    else:
        monkeypatch.delitem(sys.modules, "torch", raising=False)
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    h = h[np.isfinite(h)]
    rows = np.resize(h, (len(h) // 64, 64))
    got, want = vecfile.widen(rows), rows.astype(np.float32)
    assert got.dtype == np.float32 and np.array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))
    ro = np.frombuffer(rows.tobytes(), np.float16).reshape(rows.shape)  # read-only, as a map is
    assert np.array_equal(vecfile.widen(ro), want) and np.array_equal(vecfile.widen(want), want)


def test_a_vector_file_rewrite_left_by_a_crash_is_removed_by_the_next_write(tmp_path, fastscan):
    """vecfile.reorder writes `<file>.tmp` then renames it: one left by a killed merge is removed
    with the other leftovers of an interrupted run, and the index answers as before."""
    import shutil

    from semsearch.documents import Document, upsert_documents

    idx = tmp_path / "idx"
    shutil.copytree(fastscan, idx)
    (idx / "vectors.99.vec.tmp").write_bytes(b"half a rewrite")
    (idx / "notes.tmp").write_text("not ours")
    before = [h.id for h in Retriever.load(idx, encoder=FakeEncoder()).search("w5 w6", 5, mode="dense")]
    upsert_documents(idx, [Document("new", "w1 w2 w3")], FakeEncoder())
    assert not (idx / "vectors.99.vec.tmp").exists() and (idx / "notes.tmp").exists()
    after = Retriever.load(idx, encoder=FakeEncoder()).search("w5 w6", 6, mode="dense")
    assert [h.id for h in after if h.text != "w1 w2 w3"][:5] == before


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps") or not hasattr(__import__("mmap"), "MADV_DONTNEED"),
                    reason="needs Linux's /proc/self/smaps and madvise")
@pytest.mark.parametrize("storage", ["fp32", "fp16"])
def test_sweeps_over_a_vector_file_leave_its_pages_unmapped(tmp_path, storage):
    """A merge's copy, the IVF build's sample and fill and the rewrite in list order read the
    whole vector file through its map; each lets the pages go as it goes (VectorFile.release),
    so a build's memory does not grow with the file (it did: 0.77-1.5 GB at 1M chunks). The
    rows read are the rows written."""
    rng = np.random.default_rng(0)
    n, dim = 40_000, 96
    ids = np.arange(5, 5 + n, dtype=np.int64)
    vecs = rng.standard_normal((n, dim)).astype(np.float32)
    path = tmp_path / "vectors.1.vec"
    vecfile.write(path, ids, vecs, storage=None if storage == "fp32" else storage)
    want = vecs if storage == "fp32" else vecs.astype(np.float16).astype(np.float32)
    size = path.stat().st_size
    vf = vecfile.VectorFile(path)
    got = np.concatenate([v for _, v in vf.iter(4096)])
    np.testing.assert_array_equal(got, want)
    assert mapped_rss(path) < size // 8, (mapped_rss(path), size)
    sid, sv = vf.sample(n // 2, seed=1)
    np.testing.assert_array_equal(sv, want[sid - 5])
    assert mapped_rss(path) < size // 8
    perm = rng.permutation(ids)  # the ids, dealt into 7 lists
    lists = [np.sort(perm[i::7]) for i in range(7)]
    vf2 = vecfile.reorder(path, lists)
    assert vf2.ordered
    assert mapped_rss(path) < size // 8
    got2 = {int(i): v for i, v in zip(*[np.concatenate(x) for x in zip(*vf2.iter(5000))])}
    assert len(got2) == n and all(np.array_equal(got2[int(i)], want[int(i) - 5]) for i in ids[::997])
    assert mapped_rss(path) < size // 8


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps") or not hasattr(os, "preadv"),
                    reason="needs Linux's /proc/self/smaps and preadv")
def test_building_a_segments_vector_index_leaves_its_file_unmapped(tmp_path, monkeypatch):
    """A new segment's IVF is trained, filled and tuned against its vector file: the tuning
    re-ranks 500 queries' candidates, scattered over the file, which gathered from the map left
    the whole file mapped in the build (0.77 GB at 1M chunks, 7.7 GB at 10M). The reads are
    sweeps (pread) and the pages go at the end; the tuning reaches the same recall. A file of at
    most SWEEP_IN_MEMORY bytes, as this one, is read whole with one pread (a larger one is read
    run by run, as test_scattered_sweeps_read_their_rows_without_mapping_them reads)."""
    from semsearch.store import merge

    rng = np.random.default_rng(0)
    n, dim = 60_000, 64
    centres = rng.standard_normal((200, dim)).astype(np.float32)
    vecs = centres[rng.integers(0, 200, n)] + 0.3 * rng.standard_normal((n, dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    path = tmp_path / "vectors.1.vec"
    vecfile.write(path, np.arange(n, dtype=np.int64), vecs, storage="fp16")
    vf = vecfile.VectorFile(path)
    reads = []
    monkeypatch.setattr(vf, "_read_all", lambda real=vf._read_all: reads.append(1) or real())
    vi, entry = merge.build_vectors(vf, dim, "ivf-fastscan", n, 0.95)
    assert entry["type"] == "ivf-fastscan" and entry["recall"]["recall"] >= 0.95
    assert reads == [1] and getattr(vf, "_held", None) is None  # read whole once; the buffer goes with the sweep
    assert mapped_rss(path) < path.stat().st_size // 16, (mapped_rss(path), path.stat().st_size)
    q = vecs[:5]
    _, ids = vi.search(q, 10)
    assert (ids[:, 0] == np.arange(5)).all()  # each row's nearest is itself, re-ranked from the file


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps") or not hasattr(os, "preadv"),
                    reason="needs Linux's /proc/self/smaps and preadv")
def test_scattered_sweeps_read_their_rows_without_mapping_them(tmp_path, monkeypatch):
    """The IVF build's training sample and the rewrite in list order read rows scattered all
    over the file, a batch at a time: gathered through the map, one batch faults in nearly every
    page (folio) of it, whatever release() does after (1.5 GB mapped at once at 1M chunks). They
    read with pread: with release() doing nothing, the rows' pages never enter the process."""
    monkeypatch.setattr(vecfile.VectorFile, "release", lambda self: None)
    rng = np.random.default_rng(3)
    n, dim = 40_000, 96
    ids = np.arange(n, dtype=np.int64)
    vecs = rng.standard_normal((n, dim)).astype(np.float32)
    path = tmp_path / "vectors.1.vec"
    vecfile.write(path, ids, vecs, storage="fp16")
    want = vecs.astype(np.float16).astype(np.float32)
    size = path.stat().st_size
    vf = vecfile.VectorFile(path)
    sid, sv = vf.sample(n // 40, seed=2)  # ~40 rows apart: more runs than a re-ranking reads
    np.testing.assert_array_equal(sv, want[sid])
    assert mapped_rss(path) < size // 16, (mapped_rss(path), size)  # the ids it looked at, not the rows
    lists = [np.sort(x) for x in np.array_split(rng.permutation(ids), 9)]
    # batches of 1,000 rows, ~40 apart (as a 1M-row file's rewrite reads them, 65,536 at a time)
    monkeypatch.setattr(vecfile, "write_ordered", functools.partial(vecfile.write_ordered, batch=1000))
    vf2 = vecfile.reorder(path, lists)
    assert mapped_rss(path) < size // 16, (mapped_rss(path), size)
    for i in (0, 4, 8):  # each list's rows, read back together, are the rows written
        got = vf2.get(lists[i])
        np.testing.assert_array_equal(got, want[lists[i]])


def test_a_sweep_over_a_small_file_reads_it_whole_and_gives_the_rows_of_the_map(tmp_path):
    """sweeping() on a file of at most SWEEP_IN_MEMORY bytes: one pread of every row, reads
    inside the block come from that buffer (the rows of the map, fp16 widened), and the buffer
    goes at the end of the block; a sweep inside a sweep keeps the outer one's buffer."""
    rng = np.random.default_rng(5)
    ids = np.arange(100, 1100, dtype=np.int64)
    vecs = rng.standard_normal((1000, 24)).astype(np.float32)
    for storage in ("fp32", "fp16"):
        path = tmp_path / f"v-{storage}.vec"
        vecfile.write(path, ids, vecs, storage=None if storage == "fp32" else storage)
        vf = vecfile.VectorFile(path)
        want = vf.get(ids[::7])
        with vf.sweeping():
            assert vf._held is not None and vf._held.dtype == vf._rows.dtype
            np.testing.assert_array_equal(vf.get(ids[::7]), want)
            got_ids, got = vf.get_file_order(ids[[900, 3, 500]])
            np.testing.assert_array_equal(got, vf.matrix[got_ids - 100].astype(np.float32))
            with vf.sweeping():
                inner = vf._held
            assert vf._held is inner
        assert vf._held is None
        np.testing.assert_array_equal(vf.get(ids[::7]), want)
