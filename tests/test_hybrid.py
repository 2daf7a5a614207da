"""Lexical (BM25) index, hybrid fusion, search modes and the eval of all three."""
from __future__ import annotations

import json
import math
import sqlite3

import numpy as np
import pytest
from click.testing import CliRunner

from semsearch import fusion
from semsearch.cli import main
from semsearch.errors import InputError
from semsearch.eval import evaluate_beir, load_beir
from semsearch.corpus import ChunkSettings
from semsearch.indexing import index_corpus
from semsearch.search import Retriever
from semsearch.store import lexical
from semsearch.store.docstore import ChunkRow
from semsearch.store.lexical import LexicalIndex, encode_terms
from semsearch.corpus.titles import chunk_context

from conftest import SCIFACT, FakeEncoder
from test_eval import write_beir

needs_scifact = pytest.mark.skipif(not SCIFACT.exists(), reason="SciFact not found beside the repo (../shared/data/beir/scifact)")

TEXTS = [
    "The bank approved the loan after checking the credit score.",
    "Loans and mortgages: the bank lends money; loan approval takes a week.",
    "Simmer lentils with onion and cumin for twenty minutes.",
    "Meteor showers happen when Earth crosses a comet's debris trail.",
]


def reference_bm25(texts, query, k1=lexical.K1, b=lexical.B):
    """BM25 written out term by term (Lucene's IDF), over the same analysed terms."""
    docs = [lexical.terms(t) for t in texts]
    n, avg = len(docs), sum(map(len, docs)) / len(docs)
    out = {}
    for i, d in enumerate(docs):
        s = 0.0
        for t in dict.fromkeys(lexical.terms(query)):
            tf = d.count(t)
            if tf:
                df = sum(t in x for x in docs)
                idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
                s += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(d) / avg))
        if s:
            out[i] = s
    return out


def test_bm25_matches_reference_and_stems():
    li = LexicalIndex.from_texts(TEXTS)
    for q in ["loan approval", "bank loans", "lentils", "comet debris showers", "the of and"]:
        ref = reference_bm25(TEXTS, q)
        got = dict(li.search(q, 10))
        assert got.keys() == ref.keys(), q
        for i in ref:
            assert got[i] == pytest.approx(ref[i], rel=1e-5)
        assert li.scores_for(q, range(len(TEXTS))) == pytest.approx({i: ref.get(i, 0.0) for i in range(len(TEXTS))}, rel=1e-5)
    # Porter2 stemming: "loans"/"loan", "approved"/"approval" share stems only where Snowball says so.
    assert dict(li.search("loans", 10)).keys() == {0, 1}
    assert li.search("zebra", 10) == [] and li.search("", 10) == []


@pytest.mark.parametrize("query", ['"unbalanced quote', "loan*", "NEAR(loan bank)", "-loan", "bank OR", "AND",
                                   "col:loan", "ünïcödé 銀行 loan", "'; DROP TABLE chunks; --", "\x00\x01", "loan " * 25_000])
def test_any_query_text_is_safe(query, small_corpus, tmp_path, fake_encoder):
    index_corpus(small_corpus, tmp_path / "idx", fake_encoder, progress=False)
    r = Retriever.load(tmp_path / "idx", encoder=fake_encoder)
    for mode in ("lexical", "hybrid", "dense"):
        if not query.strip("\x00\x01"):  # nothing but control characters: refused as an empty query
            with pytest.raises(InputError, match="the query is empty"):
                r.search(query, 3, mode=mode)
            continue
        hits = r.search(query, 3, mode=mode)
        assert all(h.mode == mode for h in hits)
    if "loan" in query.lower():
        assert r.search(query, 1, mode="lexical")[0].source.endswith("bank.txt")


def test_modes_and_hybrid_scores(small_corpus, tmp_path, fake_encoder):
    index_corpus(small_corpus, tmp_path / "idx", fake_encoder, progress=False)
    r = Retriever.load(tmp_path / "idx", encoder=fake_encoder)
    assert r.default_mode == "hybrid"
    lex = r.search("mortgage rates", 3, mode="lexical")
    assert [h.source.rsplit("/", 1)[-1] for h in lex] == ["bank.txt"] and lex[0].dense_score is None
    hyb = r.search("mortgage rates", 3, mode="hybrid")
    assert len(hyb) == 3 and hyb[0].source.endswith("bank.txt")
    # The fused score is the convex combination of both parts, min-max normalised over the candidates.
    d = np.array([h.dense_score for h in hyb])
    b = np.array([h.lexical_score for h in hyb])
    assert [h.score for h in hyb] == pytest.approx(list(fusion.fuse(d, b, "convex", fusion.ALPHA)))
    assert [h.score for h in hyb] == sorted([h.score for h in hyb], reverse=True)
    rrf = r.search("mortgage rates", 3, fusion="rrf")
    assert rrf[0].score == pytest.approx(2 / 61)  # best on both sides
    dense = r.search("mortgage rates", 3, mode="dense")
    assert [h.score for h in dense] == [h.dense_score for h in dense]
    with pytest.raises(InputError, match="valid modes are: dense, lexical, hybrid"):
        r.search("x", 3, mode="sparse")
    with pytest.raises(InputError, match="must be a string"):
        r.search(123)


def test_fusion_functions():
    assert list(fusion.minmax(np.array([1.0, 3.0, 2.0]))) == [0.0, 1.0, 0.5]
    assert list(fusion.minmax(np.array([2.0, 2.0]))) == [1.0, 1.0] and list(fusion.minmax(np.array([0.0]))) == [0.0]
    assert list(fusion.ranks(np.array([0.1, 0.9, 0.5]))) == [3, 1, 2]
    f = fusion.fuse(np.array([0.9, 0.1]), np.array([0.0, 10.0]), "convex", 0.3)
    assert list(f) == pytest.approx([0.3, 0.7])
    with pytest.raises(InputError):
        fusion.fuse(np.array([1.0]), np.array([1.0]), "convex", 1.5)


def test_update_and_delete_keep_both_sides_in_step(small_corpus, tmp_path, fake_encoder):
    folder = tmp_path / "idx"
    index_corpus(small_corpus, folder, fake_encoder, progress=False)
    (small_corpus / "space.txt").unlink()
    (small_corpus / "bank.txt").write_text("Quarterly dividends were paid to shareholders.\n")
    index_corpus(small_corpus, folder, fake_encoder, progress=False)
    r = Retriever.load(folder, encoder=fake_encoder)
    for mode in ("lexical", "hybrid", "dense"):
        for gone in ("meteor comet debris", "mortgage loan credit"):
            assert not any("meteor" in h.text.lower() or "mortgage" in h.text.lower() for h in r.search(gone, 10, mode=mode)), (mode, gone)
    assert r.search("dividends shareholders", 1, mode="lexical")[0].source.endswith("bank.txt")
    # The stored posting arrays are the current generation's: the same as analysing the live
    # chunks again (their context, then their text), and the docstore keeps no copy of the terms.
    stored = r.docs.lexical()
    titles = ChunkSettings.of_index(r.manifest.chunking).titles
    rows = list(r.docs.select("f.path, c.metadata, c.text, c.lex"))
    assert rows and all(x[4] is None for x in rows)
    texts = [ChunkRow(0, None, 0, 0, 0, None, x[3], {}, context=chunk_context(x[1], json.loads(x[2] or "{}"), titles)).lexical_text
             for x in rows]
    terms = [encode_terms(t) for t in texts]
    fresh = LexicalIndex.from_rows(np.array([x[0] for x in rows]), [t[0] for t in terms], np.array([t[1] for t in terms]))
    assert list(stored.ids[stored.live if stored.live is not None else slice(None)]) == list(fresh.ids)
    assert stored.n == fresh.n and stored.average_length == fresh.average_length
    for q in ("dividends lentils", "loan credit", "soup onion cumin"):
        assert stored.search(q, 5) == fresh.search(q, 5)


def test_index_from_before_lexical_search(small_corpus, tmp_path, fake_encoder):
    folder = tmp_path / "idx"
    index_corpus(small_corpus, folder, fake_encoder, progress=False)
    m = json.loads((folder / "manifest.json").read_text())
    db = sqlite3.connect(folder / m["segments"][0]["docs"])  # make it look like an older index
    db.executescript("DROP TABLE IF EXISTS lexical; ALTER TABLE chunks DROP COLUMN lex; ALTER TABLE chunks DROP COLUMN lex_len;")
    db.commit()
    db.close()
    (folder / m["segments"][0].pop("postings")).unlink()
    m["segments"][0].pop("lexical", None)  # written before lexical search: the segment does not claim it
    m["segments"][0].pop("integrity", None)  # an index that old also predates the manifest's integrity records
    (folder / "manifest.json").write_text(json.dumps(m))
    r = Retriever.load(folder, encoder=fake_encoder)
    assert r.default_mode == "dense" and r.search("lentils", 1)[0].mode == "dense"
    with pytest.raises(InputError, match="built before lexical search; run `semsearch index CORPUS"):
        r.search("lentils", 1, mode="lexical")
    r.close()
    calls = fake_encoder.calls
    index_corpus(small_corpus, folder, fake_encoder, progress=False)  # adds the lexical side, re-encodes nothing
    assert fake_encoder.calls == calls
    r = Retriever.load(folder, encoder=fake_encoder)
    assert r.default_mode == "hybrid" and r.search("lentils", 1, mode="lexical")[0].source.endswith("cook.md")


def test_query_cli_modes_json_carries_both_parts(small_corpus, tmp_path, real_encoder):
    folder = tmp_path / "idx"
    index_corpus(small_corpus, folder, real_encoder, progress=False)
    run = CliRunner().invoke(main, ["query", "mortgage rates", "--index", str(folder), "--json", "-k", "2"])
    assert run.exit_code == 0, run.output
    hits = json.loads(run.output)["hits"]
    assert hits[0]["mode"] == "hybrid" and hits[0]["source"].endswith("bank.txt")
    assert 0 <= hits[0]["score"] <= 1 and hits[0]["dense_score"] > 0 and hits[0]["lexical_score"] > 0
    run = CliRunner().invoke(main, ["query", "mortgage", "--index", str(folder), "--mode", "lexical", "--json"])
    assert [h["mode"] for h in json.loads(run.output)["hits"]] == ["lexical"]
    run = CliRunner().invoke(main, ["query", "x", "--index", str(folder), "--mode", "bm25"])
    assert run.exit_code == 2 and "'bm25' is not one of" in run.output


def test_eval_modes_side_by_side_and_zero_queries(tmp_path, real_encoder):
    qrels = "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\nq3\tgone\t1\n"
    root = write_beir(tmp_path / "ds", qrels)
    data = load_beir(root)
    assert data.zero_queries == 1 and data.query_ids == ["q1", "q2"]  # q3 is judged only on a missing doc
    rep = evaluate_beir(data, real_encoder, ["mean"], ks=[1, 10], modes=["dense", "lexical", "hybrid"], per_query=True)
    rows = {r["mode"]: r for r in rep.rows}
    assert set(rows) == {"dense", "lexical", "hybrid"}
    for r in rows.values():  # both answerable queries find their document first; q3 counts as 0
        assert r["ndcg@10"] == pytest.approx(200 / 3, abs=0.01)
    assert rep.settings["zero_queries"] == 1 and rep.settings["queries"] == 3 and rep.settings["ignore_identical_ids"]
    assert rep.per_query["hybrid/mean"]["q1"]["ndcg@10"] == 100.0
    out = CliRunner().invoke(main, ["eval", str(root), "--mode", "lexical,hybrid", "--json", "--per-query"])
    assert out.exit_code == 0, out.output
    j = json.loads(out.output)
    assert [r["mode"] for r in j["results"]] == ["lexical", "hybrid"] and "per_query" in j


@needs_scifact
def test_scifact_lexical_close_to_published_bm25():
    """BM25 of the lexical index on SciFact test (published Lucene BM25: 67.9 nDCG@10)."""
    data = load_beir(SCIFACT, "test")
    rep = evaluate_beir(data, _NoEncoder(), [], ks=[10, 100], modes=["lexical"])
    ndcg = rep.rows[0]["ndcg@10"]
    assert abs(ndcg - 67.9) <= 2.0, ndcg


class _NoEncoder:
    """Lexical-only evaluation needs no model: this stands in for its settings only."""

    name, fingerprint, max_length, precision = "none", "none", 0, "fp32"


def test_dense_side_beside_the_lexical_side_answers_the_same(tmp_path, fake_encoder, monkeypatch):
    """A large index runs a hybrid query's dense side on a worker while the caller prunes the
    lexical side: the same hits and scores as in turn, from many threads and asyncio tasks at once, filtered or not,
    with a worker free or not, and a failure on the dense side reaches the caller."""
    import os
    import threading
    import time

    from semsearch import search as search_mod

    rng = np.random.default_rng(5)
    words = [f"w{i}" for i in range(300)]
    corpus = tmp_path / "c"
    corpus.mkdir()
    for f in range(40):
        (corpus / f"f{f}.txt").write_text("\n\n".join(" ".join(rng.choice(words, 30, p=None)) for _ in range(4)))
    index_corpus(corpus, tmp_path / "idx", fake_encoder, ChunkSettings(window=30, overlap=0), progress=False)
    r = Retriever.load(tmp_path / "idx", encoder=fake_encoder)
    queries = [" ".join(rng.choice(words, int(rng.integers(1, 6)))) for _ in range(30)]
    wheres = [None, "path:*/f1*.txt"]

    def answers():
        return [[(h.id, h.score, h.dense_score, h.lexical_score) for h in r.search(q, 7, mode="hybrid", where=w)]
                for w in wheres for q in queries]

    monkeypatch.setattr(search_mod, "BESIDE_MIN", 10**12)
    in_turn = answers()
    assert sum(map(len, in_turn)) > 100
    assert {h.path.rsplit("/", 1)[-1][:2] for h in r.search(queries[0], 7, where=wheres[1])} == {"f1"}
    beside = search_mod._Beside(workers=2)  # whatever this machine's cores: the path is taken
    sent = []
    real_submit = beside.submit
    monkeypatch.setattr(beside, "submit", lambda fn: sent.append(1) or real_submit(fn))
    monkeypatch.setattr(search_mod, "_BESIDE", beside)
    monkeypatch.setattr(search_mod, "BESIDE_MIN", 0)
    got, errors = [], []

    def run():
        try:
            got.append(answers())
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and len(got) == 8
    assert all(g == in_turn for g in got)
    assert len(sent) == 8 * len(in_turn)
    # and from asyncio: six tasks at once on the default executor, with this thread's event loop
    import asyncio

    async def from_tasks():
        return await asyncio.wait_for(asyncio.gather(*(asyncio.to_thread(answers) for _ in range(6))), 120)

    assert asyncio.run(from_tasks()) == [in_turn] * 6
    # a process forked after the workers started has none of them: it starts its own (each
    # _Beside resets itself in a forked child)
    if hasattr(os, "fork"):
        pid = os.fork()
        if pid == 0:  # the child: one search through a worker, then out without pytest's teardown
            ok = False
            try:
                ok = answers()[:3] == in_turn[:3]
            finally:
                os._exit(0 if ok else 1)
        deadline = time.monotonic() + 120
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if done[0] == 0:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise AssertionError("a forked child's hybrid search hung")
        assert os.waitstatus_to_exitcode(done[1]) == 0
    # no worker free: the caller runs both sides itself
    busy = search_mod._Beside(workers=0)
    monkeypatch.setattr(search_mod, "_BESIDE", busy)
    assert busy.submit(lambda: 1) is None and answers() == in_turn
    # the dense side's failure is the caller's
    monkeypatch.setattr(search_mod, "_BESIDE", search_mod._Beside(workers=1))
    monkeypatch.setattr(search_mod, "_dense", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("dense side failed")))
    with pytest.raises(RuntimeError, match="dense side failed"):
        r.search(queries[0], 7, mode="hybrid")
    r.close()


class _LovesDecoys(FakeEncoder):
    """Chunks that say "decoy" point where every query points; the rest elsewhere: a dense side
    that cannot place the verbatim words of a query."""

    def encode(self, texts, progress=None):
        texts = [texts] if isinstance(texts, str) else texts
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            out[i, 0 if "decoy" in t.lower() else 1] = 1.0
        return out

    def encode_queries(self, texts, progress=None):
        out = np.zeros((len(texts), self.dim), np.float32)
        out[:, 0] = 1.0
        return out


def test_a_long_query_whose_every_term_a_chunk_holds_ranks_it_first(tmp_path, monkeypatch):
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "target.txt").write_text("The flux capacitor needs exactly one point twenty one gigawatts of power to travel.\n")
    for i in range(6):
        (corpus / f"decoy{i}.txt").write_text(f"Decoy note {i}: the flux capacitor and its power supply, gigawatts and travel plans.\n")
    (corpus / "other.txt").write_text("Lentils simmer with onion and cumin.\n")
    enc = _LovesDecoys()
    index_corpus(corpus, tmp_path / "idx", enc, progress=False)
    r = Retriever.load(tmp_path / "idx", encoder=enc)
    long_q = "flux capacitor needs one point twenty one gigawatts"  # 7 distinct terms, all in target.txt
    for fusion_name in ("convex", "rrf"):
        hits = r.search(long_q, 3, fusion=fusion_name, explain=True)
        assert hits[0].source.endswith("target.txt"), (fusion_name, [h.source for h in hits])
        f = hits[0].explanation["fusion"]
        assert f["all_terms"] is True and f["fused"] == pytest.approx(hits[0].score) and hits[0].score > 1
        assert all(h.explanation["fusion"]["all_terms"] is False and h.score < 1 for h in hits[1:])
    # the dense side alone would not have it first, nor hybrid without the rule
    assert r.search(long_q, 1, mode="dense")[0].source.split("/")[-1].startswith("decoy")
    monkeypatch.setattr(fusion, "ALL_TERMS_MIN", 100)
    assert r.search(long_q, 1)[0].source.split("/")[-1].startswith("decoy")
    monkeypatch.undo()
    # a short query is left to the fusion: every decoy holds its terms too, and the dense side likes them
    short = r.search("flux capacitor gigawatts", 2, explain=True)
    assert short[0].source.split("/")[-1].startswith("decoy") and not short[0].explanation["fusion"]["all_terms"]
    # the evaluation harness fuses as search does: the long query finds the target first there too
    from semsearch.eval import BeirData

    texts = [p.read_text() for p in sorted(corpus.iterdir())]
    names = [p.name for p in sorted(corpus.iterdir())]
    data = BeirData(folder=tmp_path, split="test", doc_ids=names, doc_texts=texts, query_ids=["q"], query_texts=[long_q],
                    qrels={"q": {"target.txt": 1}})
    lex = LexicalIndex.from_texts(texts)
    qv, dv = enc.encode_queries([long_q]), enc.encode(texts)
    from semsearch.eval import exact_search, hybrid_run

    scores, idx = exact_search(qv, dv, 10)
    run = hybrid_run(data, qv, dv, scores, idx, lex, 10, "convex", fusion.ALPHA)
    assert max(run["q"], key=run["q"].get) == "target.txt"
    r.close()


def test_question_words_are_not_terms_a_chunk_must_hold(tmp_path):
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "target.txt").write_text("The flux capacitor needs exactly one point twenty one gigawatts of power to travel.\n")
    for i in range(6):
        (corpus / f"decoy{i}.txt").write_text(f"Decoy note {i}: how the flux capacitor and its power supply, gigawatts and travel.\n")
    enc = _LovesDecoys()
    index_corpus(corpus, tmp_path / "idx", enc, progress=False)
    r = Retriever.load(tmp_path / "idx", encoder=enc)
    # "how" and "can" phrase the question: the target holds its five other terms, no decoy does
    hit = r.search("how can the flux capacitor need twenty gigawatts", 1, explain=True)[0]
    assert hit.source.endswith("target.txt") and hit.explanation["fusion"]["all_terms"]
    assert lexical.counted(lexical.terms("capacitor")[0]) and not lexical.counted(lexical.terms("how")[0])
    r.close()
