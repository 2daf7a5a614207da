"""BM25 with rank-safe pruning (LexicalIndex.top_k, MaxScore) gives exactly what the exhaustive
scorer gives: the same chunks in the same order, the same float32 scores bit for bit, across
segments, with deleted rows and filter masks, for k from 1 to past the number of matches; and
scores_of() and top_k_and() equal lookup(score_all()). scripts/bench/bench_bm25.py measures the same at 1M chunks."""
from __future__ import annotations

import numpy as np
import pytest

from semsearch.store import lexical
from semsearch.store.lexical import LexicalIndex, Postings

V = 5000
ZIPF = (1 / np.arange(1, V + 1)) / (1 / np.arange(1, V + 1)).sum()


def part(rng, n: int, first_id: int) -> Postings:
    blobs, lens = [], []
    for _ in range(n):
        length = int(rng.integers(3, 80))
        u, c = np.unique(rng.choice(V, length, p=ZIPF).astype(np.int64), return_counts=True)
        blobs.append(u.tobytes() + c.astype(np.int32).tobytes())
        lens.append(length)
    return Postings.from_rows(np.arange(first_id, first_id + n), blobs, np.array(lens, np.float32))


def exhaustive(li: LexicalIndex, hashes: np.ndarray, n: int, mask=None):
    return li.top(li.score_all(hashes), n, mask)


def held_terms(li: LexicalIndex, hashes: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """How many of the terms each id holds, one term at a time (0 for ids no live row holds)."""
    return sum((li.lookup(li.score_all(np.array([t])), ids) > 0).astype(np.int32) for t in hashes)


@pytest.fixture(scope="module")
def index():
    rng = np.random.default_rng(7)
    parts = [part(rng, 1500, 0), part(rng, 300, 4000), part(rng, 1200, 9000)]
    deleted = [np.array([0, 3, 17, 600]), None, np.arange(0, 1200, 4)]
    return LexicalIndex(parts, deleted)


@pytest.mark.parametrize("sparse_max", [0, lexical.SPARSE_MAX])  # MaxScore on every query, and the default
def test_pruned_top_k_equals_the_exhaustive_top(index, monkeypatch, sparse_max):
    monkeypatch.setattr(lexical.scoring, "SPARSE_MAX", sparse_max)
    rng = np.random.default_rng(1)
    checked = 0
    for q in range(150):
        h = np.unique(rng.choice(V, int(rng.integers(1, 9)), p=ZIPF)).astype(np.int64)
        rng.shuffle(h)
        mask = rng.random(len(index.ids)) < 0.4 if q % 3 == 0 else None
        for n in (1, 10, 100, 5000):
            e_ids, e_s = exhaustive(index, h, n, mask)
            p_ids, p_s = index.top_k(h, n, mask)
            assert np.array_equal(e_ids, p_ids) and np.array_equal(e_s, p_s), (q, n)
            checked += 1
        ids = rng.choice(index.ids, 40)
        assert np.array_equal(index.lookup(index.score_all(h), ids), index.scores_of(h, ids))
        # one pass for both (hybrid search): the top as top_k gives it, and the other side's ids
        # (some deleted, some no row holds, some repeated) scored as scores_of gives them
        also = np.concatenate([ids, [-5, 1_000_000, 3, 17], ids[:3]])
        for n in (1, 10, 100):
            a_ids, a_s, a_also = index.top_k_and(h, n, mask, also)
            e_ids, e_s = exhaustive(index, h, n, mask)
            assert np.array_equal(e_ids, a_ids) and np.array_equal(e_s, a_s), (q, n)
            assert np.array_equal(index.lookup(index.score_all(h), also), a_also), (q, n)
            # how many of the query's terms each id holds, counted in the same pass
            p = index.prune(h, n, mask)
            t_ids, t_s, t_also, t_held, t_also_held = index.finish(p, also, terms=True)
            assert np.array_equal(t_ids, a_ids) and np.array_equal(t_also, a_also)
            for got, which in ((t_held, t_ids), (t_also_held, also)):
                assert np.array_equal(got, held_terms(index, h, which)), (q, n)
                assert np.array_equal(got, index.terms_of(h, which)), (q, n)
            assert p.n_terms == sum(index.score_all(np.array([t])).any() for t in h)
    assert checked == 600


def test_ties_at_the_cut_go_to_the_lower_id():
    # six rows with the same text: every score ties; the top 3 are the three lowest ids
    blob = np.array([11, 12], np.int64).tobytes() + np.array([1, 1], np.int32).tobytes()
    other = np.array([13], np.int64).tobytes() + np.array([1], np.int32).tobytes()
    li = LexicalIndex([Postings.from_rows(np.arange(10, 17), [blob] * 6 + [other], np.full(7, 2, np.float32))])
    for fn in (lambda: exhaustive(li, np.array([11, 12]), 3), lambda: li.top_k(np.array([11, 12]), 3)):
        ids, s = fn()
        assert ids.tolist() == [10, 11, 12] and len(set(s.tolist())) == 1


def test_bounds_hold_for_every_posting(index):
    """The pruning bound of a term is at least each of its real weights (else pruning could drop a winner)."""
    vocab = np.unique(np.concatenate([p.vocab for p in index.parts]))
    for _, idf, spans in index._terms(vocab):
        bound = index._bound(idf, spans)
        assert max(float(index._weights(j, lo, hi, idf).max()) for j, lo, hi in spans) <= bound


def test_retriever_lexical_and_hybrid_equal_the_exhaustive_scorer(tmp_path):
    """Through an index with several segments and deletions: lexical hits are the exhaustive top."""
    from conftest import FakeEncoder
    from semsearch.documents import Document, delete_documents, upsert_documents
    from semsearch.indexing import index_corpus
    from semsearch.search import Retriever

    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(400)]
    p = (1 / np.arange(1, 401)) / (1 / np.arange(1, 401)).sum()
    (tmp_path / "c").mkdir()
    for f in range(6):
        (tmp_path / "c" / f"{f}.txt").write_text("\n\n".join(" ".join(rng.choice(words, 30, p=p)) for _ in range(5)))
    idx = tmp_path / "idx"
    index_corpus(tmp_path / "c", idx, FakeEncoder(), progress=False)
    enc = FakeEncoder()
    for b in range(3):  # more segments
        upsert_documents(idx, [Document(f"d{b}-{i}", " ".join(rng.choice(words, 25, p=p))) for i in range(20)], enc)
    delete_documents(idx, [f"d1-{i}" for i in range(0, 20, 3)])
    r = Retriever.load(idx, encoder=enc)
    lex = r._gen.lexical(r.folder)
    assert len(r.docs.parts) > 1
    for q in range(40):
        text = " ".join(rng.choice(words, int(rng.integers(1, 6)), p=p))
        e_ids, e_s = lex.top(lex.score_all(text), 10)
        hits = r.search(text, k=10, mode="lexical")
        assert [h.id for h in hits] == e_ids.tolist()
        assert [h.score for h in hits] == pytest.approx(e_s.tolist(), abs=0)
