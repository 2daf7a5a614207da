"""Posting files: version 2 (compressed) holds exactly the arrays it was written from, version 1
files (what existing indexes hold) still open, both score the same bit for bit, and a merge of
segments' posting files written term range by term range (write_merged) is byte for byte the file
written from the merged rows inverted afresh, in memory bounded by its batch, not by its input."""
from __future__ import annotations

import os
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import mapped_rss
from semsearch.store import lexical
from semsearch.store.lexical import LexicalIndex, PackedPostings, Postings

V = 400
ZIPF = (1 / np.arange(1, V + 1)) / (1 / np.arange(1, V + 1)).sum()
ARRAYS = ("ids", "lengths", "vocab", "indptr", "postings", "tfs")


def rows(rng, n: int, first_id: int, long: bool = False):
    """(ids, term blobs, lengths) of n rows: Zipf terms, some rows empty, some large counts
    (past the nibble's escape), gaps between ids."""
    blobs, lens = [], []
    for _ in range(n):
        length = int(rng.integers(0, 300 if long else 60))
        u, c = np.unique(rng.choice(V, length, p=ZIPF).astype(np.int64), return_counts=True)
        c = np.where(rng.random(len(c)) < 0.03, rng.integers(14, 70000, len(c)), c)
        blobs.append(u.tobytes() + c.astype(np.int32).tobytes() if length else None)
        lens.append(length if rng.random() < 0.95 else length + 0.5)
    return first_id + 2 * np.arange(n), blobs, np.array(lens, np.float32)


def same_arrays(a: Postings, b: Postings) -> None:
    for k in ARRAYS:
        assert np.array_equal(getattr(a, k), getattr(b, k)), k
    for x, y in zip(a.blocks(), b.blocks()):
        assert np.array_equal(x, y)
    assert int(a.total_length) == b.total_length  # a file records it as an integer, as lengths are


@pytest.mark.parametrize("n", [0, 1, 130, 2000])
def test_version_2_holds_the_arrays_it_was_written_from(tmp_path, n):
    rng = np.random.default_rng(n)
    p = Postings.from_rows(*rows(rng, n, 5, long=True))
    lexical.write_file(tmp_path / "p.bin", p)
    got = lexical.open_file(tmp_path / "p.bin")
    assert isinstance(got, PackedPostings)
    same_arrays(p, got)
    assert (tmp_path / "p.bin").read_bytes()[:8] == lexical.FILE_MAGIC


@pytest.mark.parametrize("span", [128, 1 << 18])  # 128: lists whose blocks have several widths
def test_version_1_and_2_files_score_the_same_bit_for_bit(tmp_path, monkeypatch, span):
    """Across segments with deletions and filters: top_k (pruned and whole), score_all,
    scores_of and explain_terms are equal whichever file version the segments were read from."""
    monkeypatch.setattr(lexical.writing, "SPAN", span)
    rng = np.random.default_rng(3)
    parts = [Postings.from_rows(*rows(rng, n, first, long=True)) for n, first in ((900, 0), (300, 5000), (700, 9000))]
    deleted = [np.array([0, 3, 17, 600]), None, np.arange(0, 700, 4)]
    opened = {}
    for version, write in (("v1", lexical.write_file_v1), ("v2", lexical.write_file)):
        got = []
        for i, p in enumerate(parts):
            write(tmp_path / f"{version}.{i}.bin", p)
            got.append(lexical.open_file(tmp_path / f"{version}.{i}.bin"))
        opened[version] = LexicalIndex(got, deleted)
    assert not isinstance(opened["v1"].parts[0], PackedPostings) and isinstance(opened["v2"].parts[0], PackedPostings)
    one, two = opened["v1"], opened["v2"]
    for sparse_max in (0, lexical.SPARSE_MAX):
        monkeypatch.setattr(lexical.scoring, "SPARSE_MAX", sparse_max)
        for q in range(60):
            h = np.unique(rng.choice(V, int(rng.integers(1, 9)), p=ZIPF)).astype(np.int64)
            rng.shuffle(h)
            mask = rng.random(len(one.ids)) < 0.4 if q % 3 == 0 else None
            assert np.array_equal(one.score_all(h), two.score_all(h))
            for n in (1, 10, 100, 3000):
                a, b = one.top_k(h, n, mask), two.top_k(h, n, mask)
                assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
            ids = np.sort(rng.choice(one.ids, 40))
            assert np.array_equal(one.scores_of(h, ids), two.scores_of(h, ids))
            assert one.explain_terms(h, ids) == two.explain_terms(h, ids)
            few = np.sort(rng.choice(one.ids, 3))  # look-ups that decode a few blocks only
            assert np.array_equal(one.scores_of(h, few), two.scores_of(h, few))


def test_damaged_headers_are_refused(tmp_path):
    p = Postings.from_rows(*rows(np.random.default_rng(1), 50, 0))
    lexical.write_file(tmp_path / "p.bin", p)
    data = (tmp_path / "p.bin").read_bytes()
    (tmp_path / "short.bin").write_bytes(data[:-1])
    (tmp_path / "magic.bin").write_bytes(b"X" + data[1:])
    for name in ("short.bin", "magic.bin"):
        with pytest.raises(ValueError):
            lexical.open_file(tmp_path / name)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), batch=st.sampled_from([128, 256, 1000, 1 << 19]), span=st.sampled_from([128, 256, 1 << 18]),
       sizes=st.lists(st.integers(0, 400), min_size=1, max_size=4), interleave=st.booleans(), data=st.data())
def test_write_merged_is_the_file_of_the_merged_rows(tmp_path, monkeypatch, seed, batch, span, sizes, interleave, data):
    """Random segments (as opened from their files, or arrays) with random deletions (none, some,
    all): write_merged's file is byte for byte write_file(Postings.from_rows(the live rows)), as
    `invert` of the merged docstore gives them; rows renumber, terms left without postings go.
    `interleave`: the parts' ids interleave (partitions of an index partitioned by document,
    merged across): the merged rows are in id order all the same."""
    monkeypatch.setattr(lexical.writing, "BATCH", batch)
    monkeypatch.setattr(lexical.writing, "SPAN", span)  # small: long lists of several widths, written in pieces
    rng = np.random.default_rng(seed)
    parts, live_ids, live_blobs, live_lens = [], [], [], []
    first = 0
    for j, n in enumerate(sizes):
        ids, blobs, lens = rows(rng, n, first)
        first += 2 * n + 10
        if interleave:  # part j holds ids j, j + k, j + 2k, ...: every part's range spans the others'
            ids = j + (len(sizes) + 1) * np.arange(n)
        p = Postings.from_rows(ids, blobs, lens)
        if data.draw(st.booleans(), "from its file"):
            lexical.write_file(tmp_path / f"part{j}.bin", p)
            p = lexical.open_file(tmp_path / f"part{j}.bin")
        kind = data.draw(st.sampled_from(["none", "some", "all"]), "deleted")
        dead = {"none": np.zeros(0, np.int64), "all": ids.copy(),
                "some": np.sort(rng.choice(ids, int(rng.integers(0, n + 1)), replace=False)) if n else np.zeros(0, np.int64)}[kind]
        dead = np.concatenate([dead, [first + 1]]) if kind == "some" else dead  # an id the part does not hold: ignored
        parts.append((p, dead))
        keep = ~np.isin(ids, dead)
        live_ids.append(ids[keep])
        live_blobs += [b for b, k in zip(blobs, keep) if k]
        live_lens.append(lens[keep])
    every = np.concatenate(live_ids)
    order = np.argsort(every, kind="stable")
    fresh = Postings.from_rows(every[order], [live_blobs[i] for i in order], np.concatenate(live_lens)[order])
    lexical.write_file(tmp_path / "fresh.bin", fresh)
    lexical.write_merged(tmp_path / "merged.bin", parts)
    assert (tmp_path / "merged.bin").read_bytes() == (tmp_path / "fresh.bin").read_bytes()
    same_arrays(fresh, lexical.open_file(tmp_path / "merged.bin"))


@pytest.mark.parametrize("batch,span", [(128, 128), (1000, 256), (1 << 18, 1 << 18)])
def test_a_merge_of_disjoint_parts_without_deletions_places_each_posting_and_writes_the_same_file(
        tmp_path, monkeypatch, batch, span):
    """A long run's final merge (segments in increasing id ranges, nothing deleted) places each
    posting by the counts (_Merge._placed) instead of sorting by term: byte for byte the file of
    the merged rows inverted afresh, whatever the batch and span (long lists written in pieces)."""
    monkeypatch.setattr(lexical.writing, "BATCH", batch)
    monkeypatch.setattr(lexical.writing, "SPAN", span)
    placed, real = [], lexical.writing._Merge._placed
    monkeypatch.setattr(lexical.writing._Merge, "_placed", lambda self, w, pieces: placed.append(len(pieces)) or real(self, w, pieces))
    rng = np.random.default_rng(batch)
    parts, every = [], []
    first = 0
    for j, n in enumerate((700, 1, 0, 1500, 300)):
        ids, blobs, lens = rows(rng, n, first, long=j == 3)
        first += 2 * n + 3
        every.append((ids, blobs, lens))
        p = Postings.from_rows(ids, blobs, lens)
        lexical.write_file(tmp_path / f"part{j}.bin", p)
        parts.append((lexical.open_file(tmp_path / f"part{j}.bin"), np.zeros(0, np.int64)))
    fresh = Postings.from_rows(np.concatenate([i for i, _, _ in every]), [b for _, bs, _ in every for b in bs],
                               np.concatenate([x for _, _, x in every]))
    lexical.write_file(tmp_path / "fresh.bin", fresh)
    lexical.write_merged(tmp_path / "merged.bin", parts)
    assert placed and max(placed) > 1  # the steps placed postings of several parts
    assert (tmp_path / "merged.bin").read_bytes() == (tmp_path / "fresh.bin").read_bytes()


def synthetic(rng, n: int, terms: int, nnz: int, first_id: int) -> Postings:
    """Posting arrays of n rows with about nnz postings, built directly (a Zipf-like spread)."""
    p = 1 / np.arange(1, terms + 1) ** 0.8
    t = rng.choice(terms, nnz, p=p / p.sum()).astype(np.int64)
    key = np.unique(t * n + rng.integers(0, n, nnz))
    term, row = key // n, (key % n).astype(np.int32)
    vocab, starts = np.unique(term, return_index=True)
    tfs = np.minimum(rng.geometric(0.6, len(key)), 40).astype(np.int32)
    return Postings(first_id + np.arange(n, dtype=np.int64), rng.integers(50, 400, n).astype(np.float32),
                    (vocab * 7919 + 13).astype(np.int64), np.append(starts, len(key)).astype(np.int64), row, tfs)


def test_merge_memory_is_bounded_by_the_batch_not_the_input(tmp_path, monkeypatch):
    """About 3.3M postings in three segment files (26 MB as arrays) merged 16k postings at a
    time: the heap's peak (tracemalloc; mapped files are page cache) is a few hundred bytes per
    batch posting, a fraction of the input, whatever its size."""
    monkeypatch.setattr(lexical.writing, "BATCH", 1 << 14)
    rng = np.random.default_rng(0)
    parts, first, nnz = [], 0, 0
    for j, n in enumerate((60_000, 30_000, 50_000)):
        p = synthetic(rng, n, 3000, 1_500_000 * n // 60_000, first)
        first += n
        nnz += len(p.postings)
        lexical.write_file(tmp_path / f"part{j}.bin", p)
        dead = np.sort(rng.choice(p.ids, n // 5, replace=False)) if j != 1 else np.zeros(0, np.int64)
        parts.append((lexical.open_file(tmp_path / f"part{j}.bin"), dead))
    assert nnz > 3_000_000
    tracemalloc.start()
    try:
        lexical.write_merged(tmp_path / "merged.bin", parts)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < min(8 * nnz / 4, 400 * lexical.BATCH), f"peak {peak / 1e6:.1f} MB for {8 * nnz / 1e6:.1f} MB of postings"
    merged = lexical.open_file(tmp_path / "merged.bin")
    assert len(merged) == sum(len(p) - len(d) for p, d in parts)
    # spot check against the live rows merged in memory
    li = LexicalIndex([p for p, _ in parts], [np.searchsorted(p.ids, d) for p, d in parts])
    one = LexicalIndex([merged])
    for h in merged.vocab[:: max(len(merged.vocab) // 20, 1)]:
        a, b = li.top_k(np.array([h]), 50), one.top_k(np.array([h]), 50)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")
def test_merge_lets_the_pages_of_the_files_it_read_go(tmp_path, monkeypatch):
    """A merge reads each source posting file from end to end through its map, term range by
    term range; it lets the pages go as it goes (lexical.release), so a build's final merge does
    not end with every source file mapped (0.4 GB at 1M chunks, ~4 GB at 10M). The merged file
    is still the merge of the sources."""
    monkeypatch.setattr(lexical.writing, "BATCH", 1 << 14)
    rng = np.random.default_rng(1)
    parts, first = [], 0
    for j, n in enumerate((40_000, 40_000)):
        p = synthetic(rng, n, 3000, 1_000_000, first)
        first += n
        lexical.write_file(tmp_path / f"part{j}.bin", p)
        parts.append((lexical.open_file(tmp_path / f"part{j}.bin"), np.zeros(0, np.int64)))
    lexical.write_merged(tmp_path / "merged.bin", parts)
    for j in range(2):
        size = (tmp_path / f"part{j}.bin").stat().st_size
        assert size > 1_000_000 and mapped_rss(tmp_path / f"part{j}.bin") < size // 8, (j, size)
    merged = lexical.open_file(tmp_path / "merged.bin")
    assert len(merged) == 80_000 and len(merged.postings) == sum(len(p.postings) for p, _ in parts)


@pytest.mark.parametrize("seed", range(3))
def test_a_segment_file_with_carried_parts_is_the_file_of_all_its_rows(tmp_path, seed):
    """write_segment_file: rows inverted from their terms between and around carried posting
    files (a merge or re-pooling write taking segments in whole, with their deletions), given in
    any order: byte for byte the file of all the live rows inverted afresh."""
    rng = np.random.default_rng(seed)
    parts = [rows(rng, n, first) for n, first in ((30, 1), (40, 1000), (20, 2000), (50, 3000), (10, 5000))]
    carried = []
    for j in (3, 1):  # out of order
        ids, blobs, lens = parts[j]
        lexical.write_file(tmp_path / f"c{j}.bin", Postings.from_rows(ids, blobs, lens))
        carried.append((lexical.open_file(tmp_path / f"c{j}.bin"), rng.choice(ids, 5, replace=False)))
    dead = set(np.concatenate([d for _, d in carried]).tolist())
    fresh = [k for j in (4, 0, 2) for k in zip(*parts[j])]  # out of order too
    n = lexical.write_segment_file(tmp_path / "got.bin", np.array([f[0] for f in fresh]), [f[1] for f in fresh],
                                   np.array([f[2] for f in fresh], np.float32), carried)
    live = sorted((k for p in parts for k in zip(*p) if int(k[0]) not in dead), key=lambda k: int(k[0]))
    lexical.write_file(tmp_path / "want.bin", Postings.from_rows(np.array([k[0] for k in live]), [k[1] for k in live],
                                                                 np.array([k[2] for k in live], np.float32)))
    assert n == len(live) == sum(len(p[0]) for p in parts) - 10
    assert (tmp_path / "got.bin").read_bytes() == (tmp_path / "want.bin").read_bytes()
    with pytest.raises(ValueError, match="row 1010 falls inside"):  # segments hold disjoint id ranges
        lexical.write_segment_file(tmp_path / "bad.bin", np.array([1010]), [parts[0][1][0]], np.array([1.0], np.float32), carried)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list("aZq_09 \t\n.,-'é\u00dfÜ\u0130\u212a\x00~") + ["the", "Running", "runs", " of "]),
                max_size=60).map("".join))
def test_the_fast_analysis_is_the_regular_expression_s(text):
    """encode_terms (C-level passes; ASCII texts split after one translate) counts the terms
    that the plain definition, terms() over _WORD.findall(text.lower()), gives."""
    from collections import Counter

    assert lexical.analysis._words(text) == lexical.analysis._WORD.findall(text.lower())
    counts = Counter(lexical.analysis._term(w) for w in lexical.analysis._WORD.findall(text.lower()) if w not in lexical.STOPWORDS)
    h = np.array(sorted(counts), np.int64)
    want = h.tobytes() + np.array([counts[x] for x in h.tolist()], np.int32).tobytes()
    assert lexical.encode_terms(text) == (want, sum(counts.values()))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.sampled_from(["the", "a", "and", "running", "runs", "run", "Loan", "loans", "x1", "_u", "42",
                                          "Café", "naïve", "über", "ÉCOLE", "données", "is", "of", "w1", "w2", "w3",
                                          " ", "\n", ",", "—", "é"]), max_size=40).map(" ".join),
                max_size=30))
def test_terms_encoded_as_a_batch_are_the_terms_encoded_one_by_one(texts):
    """A batch through Arrow (encode_terms_many of a build's batches) gives each text the bytes
    and count encode_terms gives it alone: stop words dropped, the words of one stem merged,
    hashes sorted, ASCII and not, empty texts included."""
    from semsearch.store.lexical.analysis import _encode_batch

    assert _encode_batch(texts) == [lexical.encode_terms(t) for t in texts]


def test_a_docstore_batch_takes_the_ids_autoincrement_would_and_never_reuses_one(tmp_path):
    """add_chunks inserts a batch with the ids SQLite's AUTOINCREMENT would give one by one:
    after the rows with the highest ids are deleted, the next batch still starts past them."""
    from semsearch.store.docstore import ChunkRow, DocStore

    store = DocStore(tmp_path / "d.sqlite")
    f = store.add_file("/x.txt", "h", 1, 1, "now")
    rows = [ChunkRow(f, i, i, 0, 5, None, f"text {i} of the loans", {"n": i} if i % 2 else {}) for i in range(5)]
    first = store.add_chunks(rows)
    assert first.tolist() == [1, 2, 3, 4, 5]
    store.db.execute("DELETE FROM chunks WHERE id >= 4")
    second = store.add_chunks(rows[:2])
    assert second.tolist() == [6, 7]
    # the same as SQLite's own next id
    cur = store.db.execute("INSERT INTO chunks (file_id, row, ord, start, end, text) VALUES (?, 9, 9, 0, 1, 'x')", (f,))
    assert cur.lastrowid == 8
    got = store.get_chunks([1, 3, 6])
    assert got[1]["metadata"] == {} and got[6]["metadata"] == {} and got[3]["text"] == "text 2 of the loans"
    assert [t[0] for t in store.terms] == [1, 2, 3, 4, 5, 6, 7]
    assert store.terms[2][1:] == lexical.encode_terms("text 2 of the loans")


def test_batch_analysis_is_exact_when_word_keys_collide(monkeypatch):
    """encode_terms_many keys the words of a batch by a 64-bit mix of their bytes and checks the
    bytes themselves: with a mix that gives every word the same key (every word collides), and
    after words were remembered under other keys, the bytes are still each text's own."""
    from semsearch.store.lexical import analysis

    texts = ["Loans and loan approval in one business day", "running runs ran", "x" * 40 + " short words", "",
             "the of and", "naïve café loans"]
    want = [lexical.encode_terms(t) for t in texts]
    batch = analysis._encode_batch  # (what encode_terms_many runs for a build's batches)
    assert batch(texts) == want  # the table now holds these words under their real keys
    monkeypatch.setattr(analysis, "_MIX", (np.uint64(0), np.uint64(0)))
    assert batch(texts) == want
    assert batch(texts[1:2]) == want[1:2]  # a batch whose words are all new to key 0
    monkeypatch.setattr(analysis, "_TABLE", analysis._WordTable())
    assert batch(["loans loans loan"]) == [lexical.encode_terms("loans loans loan")]  # one word, one key
    assert batch(["approval", "day"]) == [lexical.encode_terms("approval"), lexical.encode_terms("day")]
    assert lexical.encode_terms_many(texts * 20) == want * 20  # (past SMALL_BATCH: the batch path)


@pytest.mark.parametrize("n", [0, 1, 7, 5000, 200_000])  # (past SMALL_SORT: pandas ranks the terms)
def test_postings_put_term_by_term_as_a_stable_sort_would(n):
    """from_rows' ordering (pandas ranks the terms, one sort of (rank, position) keys) gives the
    terms, their offsets and the order that a stable argsort of the hashes gives, extremes of
    int64 and repeated terms included."""
    from semsearch.store.lexical.postings import _by_term

    rng = np.random.default_rng(n)
    pool = np.array([np.iinfo(np.int64).min, -1, 0, 1, np.iinfo(np.int64).max, 2**62, -(2**61)], np.int64)
    h = pool[rng.integers(0, len(pool), n)]
    vocab, indptr, order = _by_term(h)
    want = np.argsort(h, kind="stable")
    terms, starts = np.unique(h[want], return_index=True)
    assert np.array_equal(order, want)
    assert np.array_equal(vocab, terms) and vocab.dtype == np.int64
    assert np.array_equal(indptr, np.append(starts, n))
