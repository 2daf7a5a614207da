"""Trained query layers (`semsearch train`, default --train-layers 2): documents keep their vectors."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from semsearch.cli import main
from semsearch.encoder.heads import head_info, load_head
from semsearch.encoder.query_layers import QueryTower
from semsearch.training.query_tower import _hidden, save_tower

from test_train import write_beir


def _vectors(folder):
    from semsearch.search import Retriever

    r = Retriever.load(folder)
    return r, {int(i): v for ids, vs in r.docs.iter_vectors() for i, v in zip(ids, vs)}


def test_untrained_query_layers_give_the_base_vectors_and_round_trip(real_encoder, tmp_path):
    from semsearch.encoder import Encoder

    tower = QueryTower.from_base(real_encoder.model, 2)
    save_tower(tower, tmp_path / "h", {"base_model_fingerprint": real_encoder.fingerprint, "doc_pooling": "mean"}, None)
    assert head_info(tmp_path / "h")["kind"] == "query-layers"
    enc = Encoder(precision="fp32", device="cpu", head=load_head(tmp_path / "h", real_encoder.fingerprint))
    assert enc.query_tower is not None and enc.pooling == "mean" and enc.head is None
    texts = ["loan approval", "what is the boiling point of water at altitude?", "x"]
    np.testing.assert_allclose(enc.encode_queries(texts), real_encoder.encode(texts), atol=2e-5)
    # documents never go through the query layers
    np.testing.assert_array_equal(enc.encode(texts), real_encoder.encode(texts))
    many = enc.encode_many(texts, ["mean", "head"], queries=True)
    np.testing.assert_allclose(many["head"], many["mean"], atol=2e-5)


def test_every_other_labelled_positive_is_left_out_of_a_querys_softmax():
    positives = {0: {5, 6, 7}, 1: {6}, 2: {9}}
    batch = [(0, 5), (1, 6), (2, 9)]
    rows, cols = _hidden(batch, positives, None)  # full softmax: column j is passage j
    assert sorted(zip(rows, cols)) == [(0, 6), (0, 7)]
    # sampled columns: the batch's targets first, then a sample that repeats passages
    sample = torch.tensor([5, 6, 9, 7, 6, 1, 5])
    rows, cols = _hidden(batch, positives, sample)
    got = sorted(zip(rows, cols))
    # query 0: every column holding 5, 6 or 7 except its own target column 0; query 1: the other 6
    assert got == [(0, 1), (0, 3), (0, 4), (0, 6), (1, 4)]


def test_train_record_and_query_with_trained_query_layers(tmp_path):
    """index -> train --index (vectors from the index) -> index --head (nothing re-encoded) -> query, eval --head."""
    ds = write_beir(tmp_path / "ds")
    idx = tmp_path / "idx"
    common = ["--precision", "fp32", "--no-progress"]
    r = CliRunner().invoke(main, ["index", str(ds / "corpus.jsonl"), "--index", str(idx), "--text-column", "title,text", *common])
    assert r.exit_code == 0, r.output
    head = tmp_path / "h"
    r = CliRunner().invoke(main, ["train", "--beir", str(ds), "--index", str(idx), "--out", str(head), "--train-layers", "1",
                                  "--epochs", "2", "--batch-size", "8", "--lr", "1e-4", "--cache", str(tmp_path / "c"), "--force",
                                  "--mode", "hybrid", *common])
    assert r.exit_code == 0, r.output
    assert "vectors of 32 of 32 passages from" in r.output
    assert "+ 32 pseudo-queries from the corpus (titles)" in r.output
    assert not (tmp_path / "c").exists()  # no passage was encoded
    cfg = json.loads((head / "head.json").read_text())
    assert cfg["kind"] == "query-layers" and cfg["layers"] == 1 and cfg["first_layer"] == 5 and cfg["doc_pooling"] == "mean"
    assert cfg["metrics"]["pseudo_queries"] == 32 and cfg["metrics"]["dev_split"] == "documents"
    # trained and judged for hybrid search (--mode hybrid), dense figures beside
    met = cfg["metrics"]
    assert cfg["hyperparameters"]["mode"] == "hybrid" and met["mode"] == "hybrid" and "trained query layers, hybrid" in r.output
    assert {"dev_ndcg@10_base", "dense_dev_ndcg@10_base", "dense_dev_ndcg@10_head"} <= set(met)
    assert set(met["dev_ndcg@10_by_alpha"]) == {"0.3", "0.4", "0.5", "0.6", "0.7", "0.8"}
    # the corpus it was trained on: the index's 32 documents
    assert cfg["corpus"]["documents"] == 32 and len(cfg["corpus"]["sketch"]) == 32
    # the head folder lists the labelled positives it trained on, never the dev documents
    trained = set((head / "train_positives.txt").read_text().split())
    assert trained and len(trained) < 32

    before_r, before = _vectors(idx)
    gen = before_r.manifest.generation
    r = CliRunner().invoke(main, ["index", str(ds / "corpus.jsonl"), "--index", str(idx), "--head", str(head), *common])
    assert r.exit_code == 0, r.output
    after_r, after = _vectors(idx)
    assert after.keys() == before.keys() and all(np.array_equal(before[i], after[i]) for i in before)  # nothing re-encoded
    m = after_r.manifest
    assert m.generation > gen and m.pooling == "mean" and m.head["kind"] == "query-layers"
    assert after_r.encoder.query_tower is not None
    q = ["what about comet?"]
    assert np.abs(after_r.encoder.encode_queries(q) - before_r.encoder.encode(q)).max() > 1e-6  # queries do change
    r = CliRunner().invoke(main, ["query", "what about comet?", "--index", str(idx), "--json", "-k", "2", "--mode", "dense"])
    assert r.exit_code == 0, r.output
    hits = json.loads(r.output)["hits"]
    assert len(hits) == 2 and "comet" in hits[0]["text"]
    # a second run with the same head changes nothing
    r = CliRunner().invoke(main, ["index", str(ds / "corpus.jsonl"), "--index", str(idx), *common])
    assert r.exit_code == 0, r.output
    assert _vectors(idx)[0].manifest.head["fingerprint"] == m.head["fingerprint"]

    r = CliRunner().invoke(main, ["eval", str(ds), "--split", "train", "--head", str(head), "--precision", "fp32", "--mode", "dense", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)["results"]
    assert {row["pooling"] for row in rows} == {"mean", "head"}
    assert any(row.get("queries", "").startswith("unseen documents") for row in rows)
    # the index as it searches, with its head: rows for the queries about documents it never trained on too
    r = CliRunner().invoke(main, ["eval", str(ds), "--split", "train", "--index", str(idx), "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)["results"]
    unseen = [row for row in rows if row.get("queries", "").startswith("unseen documents")]
    assert {row["search"] for row in unseen} == {"index", "exact", "lexical", "hybrid"}
    n = int(unseen[0]["queries"].split("(")[1].rstrip(")"))
    assert 0 < n < 32 and all(0 <= row["ndcg@10"] <= 100 for row in unseen)


def test_the_gate_also_measures_queries_about_trained_documents(tmp_path):
    """--seen-fraction (default 0.1) holds out queries whose documents stay training positives:
    checks are ranked on the whole dev set, and the kept one is never below the base model on the
    held-out documents."""
    ds = write_beir(tmp_path / "ds", topics=20, more_queries=2)  # 40 documents, 3 train queries each
    args = ["train", "--beir", str(ds), "--out", str(tmp_path / "h"), "--train-layers", "1", "--epochs", "1", "--batch-size", "16",
            "--lr", "1e-4", "--cache", str(tmp_path / "c"), "--precision", "fp32", "--no-progress", "--force", "--mode", "hybrid"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    cfg = json.loads((tmp_path / "h" / "head.json").read_text())
    met = cfg["metrics"]
    assert met["dev_split"] == "documents" and met["seen_dev_queries"] == 12 and met["ranked_by"] == "dev"
    assert met["dev_queries"] == met["unseen_dev_queries"] + met["seen_dev_queries"] and met["train_queries"] == 120 - met["dev_queries"] + 40
    assert {"seen_ndcg@10_base", "dense_seen_ndcg@10_base"} <= set(met) and "about trained documents" in r.output
    assert all("seen_ndcg@10" in row for row in met["history"])
    kept = [row for row in met["history"] if row["epoch"] == met["best_epoch"]]
    # the kept check's gain over the base, query by query on the dev queries it is ranked on:
    # its mean is the two dev figures' difference, and it counts only beyond its standard error
    gain = met["dev_gain"]
    assert gain["queries"] == met["dev_queries"] and gain["se"] > 0
    assert gain["gain"] == pytest.approx(met["dev_ndcg@10_head"] - met["dev_ndcg@10_base"], abs=0.02)
    from semsearch.training.query_tower import passes_gate

    # ... and the best of the checks that could be kept gains that much by luck rarely enough (p)
    assert 0 < gain["p"] <= 1 and 1 <= gain["checks"] <= len(met["history"])
    assert cfg["improved_on_dev"] == (met["dev_ndcg@10_head"] > met["dev_ndcg@10_base"] and passes_gate(gain))
    assert f"paired standard error over {met['dev_queries']} queries" in r.output
    assert f"the best of {int(gain['checks'])} check(s) gains that much by luck" in r.output
    if cfg["improved_on_dev"]:  # a kept check: never below the base model on the held-out documents
        assert kept and kept[0]["unseen_ndcg@10"] >= met["unseen_ndcg@10_base"] and kept[0]["dev_ndcg@10"] == met["dev_ndcg@10_head"]
    # 0: judged on the held-out documents alone, as before
    r = CliRunner().invoke(main, args[:4] + [str(tmp_path / "h0")] + args[5:] + ["--seen-fraction", "0"])
    assert r.exit_code == 0, r.output
    met0 = json.loads((tmp_path / "h0" / "head.json").read_text())["metrics"]
    assert met0["seen_dev_queries"] == 0 and met0["ranked_by"] == "unseen" and "seen_ndcg@10_base" not in met0


def test_query_layers_that_do_not_beat_the_base_are_not_saved(tmp_path):
    ds = write_beir(tmp_path / "ds")
    args = ["train", "--beir", str(ds), "--out", str(tmp_path / "h"), "--train-layers", "2", "--epochs", "1", "--lr", "0",
            "--batch-size", "8", "--cache", str(tmp_path / "c"), "--precision", "fp32", "--no-progress"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code != 0 and "did not beat the base model" in r.output and "not saved" in r.output
    assert not (tmp_path / "h").exists()
    # the passages were encoded once and cached: a second run reads them
    assert any(p.name.startswith("vectors-") for p in (tmp_path / "c").iterdir())


def test_train_layers_beyond_the_model_is_a_clear_error(tmp_path):
    ds = write_beir(tmp_path / "ds")
    r = CliRunner().invoke(main, ["train", "--beir", str(ds), "--out", str(tmp_path / "h"), "--train-layers", "9",
                                  "--cache", str(tmp_path / "c"), "--precision", "fp32", "--no-progress"])
    assert r.exit_code != 0 and "--train-layers 9" in r.output and "6 layers" in r.output


def test_query_layers_train_on_an_index_alone(tmp_path):
    """No labels: the index's documents and their first sentences (titles) are the whole data."""
    ds = write_beir(tmp_path / "ds")
    idx = tmp_path / "idx"
    common = ["--precision", "fp32", "--no-progress"]
    assert CliRunner().invoke(main, ["index", str(ds / "corpus.jsonl"), "--index", str(idx), "--text-column", "title,text", *common]).exit_code == 0
    args = ["train", "--index", str(idx), "--out", str(tmp_path / "h"), "--train-layers", "1", "--epochs", "1", "--batch-size", "8", *common]
    # without --force nothing is saved, whatever the pseudo-query dev set says: it measures no real query
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1 and not (tmp_path / "h").exists(), r.output
    assert "of real queries: it had no labelled pairs" in r.output and "give labelled pairs with --beir or --pairs" in r.output
    r = CliRunner().invoke(main, args + ["--force"])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "h" / "head.json").read_text())["improved_on_dev"] is False
    assert "training on" in r.output and "(unlabelled): 0 queries, 0 pairs, 32 passages" in r.output
    assert "vectors of 32 of 32 passages from" in r.output and "+ 32 pseudo-queries from the corpus (first sentences)" in r.output
    assert json.loads((tmp_path / "h" / "head.json").read_text())["kind"] == "query-layers"


# ---- a head records the corpus it was trained on ----------------------------------------------
def _head_for(real_encoder, folder, corpus):
    tower = QueryTower.from_base(real_encoder.model, 1)
    save_tower(tower, folder, {"base_model_fingerprint": real_encoder.fingerprint, "doc_pooling": "mean",
                               "training_data": "a test corpus", **({"corpus": corpus} if corpus else {})}, None)
    return folder


def _index(corpus_file, idx, head=None, force=False):
    from semsearch.corpus import ReadOptions
    from semsearch.indexing import encoder_for_index, index_corpus, load_base

    enc = encoder_for_index(load_base(idx, False), head=head, device="cpu", precision="fp32")
    return index_corpus(corpus_file, idx, enc, read=ReadOptions(text_column="title,text"), progress=False, force=force)


def test_a_beir_corpus_and_its_index_have_the_same_corpus_record(tmp_path, real_encoder):
    from semsearch.training.data import from_beir
    from semsearch.training.query_tower import index_vectors

    ds = write_beir(tmp_path / "ds")
    _index(ds / "corpus.jsonl", tmp_path / "idx")
    data = from_beir(ds)
    beir = data.corpus
    assert beir["documents"] == 32 and len(beir["sketch"]) == 32
    index_vectors(tmp_path / "idx", data, real_encoder)
    assert data.corpus == beir  # documents keyed by their `_id` on both sides


def test_a_head_for_another_corpus_is_refused_unless_forced(tmp_path, real_encoder, small_corpus, caplog):
    from semsearch.encoder.heads import corpus_record, document_key
    from semsearch.errors import HeadCorpusMismatch, SettingsMismatch
    from semsearch.store import Manifest

    ds = write_beir(tmp_path / "ds")
    ids = [f"d{k}-{j}" for k in range(16) for j in range(2)]
    head = _head_for(real_encoder, tmp_path / "h", corpus_record(document_key(i, "") for i in ids))

    # its own corpus: recorded, nothing re-encoded
    own = tmp_path / "own"
    _index(ds / "corpus.jsonl", own)
    assert _index(ds / "corpus.jsonl", own, head).added == 0
    assert Manifest.load(own).head["kind"] == "query-layers"

    # another corpus (three text files): refused, with the reason, and the index is left as it was
    other = tmp_path / "other"
    _index(small_corpus, other)
    gen = Manifest.load(other).generation
    with pytest.raises(HeadCorpusMismatch, match=r"another corpus \(a test corpus\): about 0% of the 32 training documents") as e:
        _index(small_corpus, other, head)
    assert isinstance(e.value, SettingsMismatch) and "--force" in str(e.value)
    assert Manifest.load(other).generation == gen and Manifest.load(other).head is None
    # a new index of it too: nothing is published
    with pytest.raises(HeadCorpusMismatch):
        _index(small_corpus, tmp_path / "fresh", head)
    assert not (tmp_path / "fresh" / "manifest.json").exists()
    # forced: recorded, with the warning logged
    with caplog.at_level("WARNING"):
        _index(small_corpus, other, head, force=True)
    assert Manifest.load(other).head["kind"] == "query-layers"
    assert any("another corpus" in r.getMessage() and "forced" in r.getMessage() for r in caplog.records)
    # once recorded, later updates do not ask again
    (small_corpus / "extra.txt").write_text("A further note about tides and the moon.")
    assert _index(small_corpus, other).added == 1


def test_a_changed_index_of_the_same_corpus_passes_and_an_older_head_is_accepted(tmp_path, real_encoder, small_corpus):
    from semsearch.encoder.heads import corpus_record, document_key
    from semsearch.errors import HeadCorpusMismatch
    from semsearch.store import Manifest

    ds = write_beir(tmp_path / "ds", topics=10)  # 20 of the 32 documents the head records: 62%
    ids = [f"d{k}-{j}" for k in range(16) for j in range(2)]
    head = _head_for(real_encoder, tmp_path / "h", corpus_record(document_key(i, "") for i in ids))
    _index(ds / "corpus.jsonl", tmp_path / "idx", head)
    assert Manifest.load(tmp_path / "idx").head["kind"] == "query-layers"
    small = write_beir(tmp_path / "ds4", topics=4)  # 8 of 32: 25%
    with pytest.raises(HeadCorpusMismatch, match="about 25% of the 32"):
        _index(small / "corpus.jsonl", tmp_path / "idx4", head)
    # a head without the record (written before it existed) is accepted anywhere, silently
    old = _head_for(real_encoder, tmp_path / "old", None)
    assert "corpus" not in json.loads((old / "head.json").read_text())
    _index(small_corpus, tmp_path / "any", old)
    assert Manifest.load(tmp_path / "any").head["kind"] == "query-layers"


def test_a_pooling_head_records_its_corpus_too(tmp_path):
    from semsearch.encoder.heads import check_head_corpus, corpus_record, document_key
    from semsearch.encoder.pooling import AttentionHead
    from semsearch.errors import HeadCorpusMismatch
    from semsearch.training.data import from_beir
    from semsearch.training.head import save_head

    data = from_beir(write_beir(tmp_path / "ds"))
    head = AttentionHead(8, 8)
    head.corpus = data.corpus  # as train_head leaves it
    save_head(head, tmp_path / "h", {"base_model_fingerprint": "abc"})
    rec = json.loads((tmp_path / "h" / "head.json").read_text())["corpus"]
    assert rec == corpus_record(document_key(i, "") for i in data.passage_ids) and rec["documents"] == 32
    assert check_head_corpus(tmp_path / "h", [document_key(i, "") for i in data.passage_ids]) == 1.0
    with pytest.raises(HeadCorpusMismatch, match="pooling head .* was trained on another corpus"):
        check_head_corpus(tmp_path / "h", [document_key(None, "some other text")])


def test_the_hybrid_loss_ranks_as_hybrid_search_fuses(real_encoder, monkeypatch):
    """The training logits with BM25's fixed part added are an increasing affine map of the fused
    score `semsearch query` ranks by (semsearch/fusion.py) for the base model, query by query; the
    dev gate's hybrid nDCG@10 is that ranking's."""
    from conftest import REPO
    from semsearch import fusion
    from semsearch.eval import trec_metrics
    from semsearch.training.data import from_beir
    from semsearch.training.query_tower import _LexicalBias, hybrid_ndcg10

    passages = from_beir(REPO / "data" / "tiny-beir", "train").passages  # topic k: passages 2k and 2k + 1
    words = ["loan", "soup", "comet", "tomato", "train", "sleep", "index", "mortgage", "fraud", "bread", "orbit", "garden",
             "violin", "glacier", "tax", "volcano"]
    queries = [f"{w} questions" for w in words] + [f"{a} or {b} number 1" for a, b in zip(words, words[3:])]
    positives = {q: {2 * (q % 16), 2 * (q % 16) + 1} for q in range(len(queries))}
    pv, qv = real_encoder.encode(passages), real_encoder.encode(queries)
    assert len(passages) < fusion.DEPTH  # every passage is a candidate of every query
    scale, alpha = 20.0, 0.5
    bias = _LexicalBias(passages, queries, scale, alpha)
    bias.set_ranges(qv, pv)
    rows = bias.rows(list(range(len(queries))), None, len(passages)).numpy()
    some = bias.rows([0, 20], np.array([5, 0, 31, 2]), len(passages)).numpy()  # sampled columns: the same values
    assert np.allclose(some, rows[[0, 20]][:, [5, 0, 31, 2]]) and some.any()
    checked = 0
    run = {}
    for q, text in enumerate(queries):
        cos = pv @ qv[q]
        acc = bias.lex.score_all(text)
        fused = fusion.fuse(cos, acc, "convex", alpha)
        run[str(q)] = {str(int(j)): float(fused[j]) for j in fusion.top(np.arange(len(cos)), fused, 10)}
        logits = scale * cos + rows[q]
        mapped = (logits - scale * cos.min()) * alpha / (scale * (cos.max() - cos.min()))
        np.testing.assert_allclose(mapped, fused, atol=1e-5)
        checked += 1
    assert checked == len(queries)
    want = trec_metrics({str(q): {str(p): 1 for p in positives[q]} for q in range(len(queries))}, run, [10])["ndcg@10"]
    got = hybrid_ndcg10(qv, pv, list(range(len(queries))), queries, bias.lex, positives, alpha)
    assert got == pytest.approx(want) and 0 < got < 100
    # in blocks of a few queries (as for a large corpus): the same
    import semsearch.training.query_tower as qt

    monkeypatch.setattr(qt, "_rows_per_block", lambda n: 3)
    assert hybrid_ndcg10(qv, pv, list(range(len(queries))), queries, bias.lex, positives, alpha) == pytest.approx(got)
    again = _LexicalBias(passages, queries, scale, alpha)
    again.set_ranges(qv, pv)
    # the same to float32 rounding: a matrix product of 3 rows and one of 29 may round differently
    # (on AVX2 they do, in the last bit)
    np.testing.assert_allclose(again.rows(list(range(len(queries))), None, len(passages)).numpy(), rows, rtol=1e-6, atol=1e-6)


def test_dense_mode_trains_and_judges_the_dense_ranking_and_lexical_is_refused(tmp_path):
    ds = write_beir(tmp_path / "ds")
    common = ["--beir", str(ds), "--train-layers", "1", "--epochs", "1", "--batch-size", "8", "--precision", "fp32",
              "--no-progress", "--force", "--cache", str(tmp_path / "c")]
    r = CliRunner().invoke(main, ["train", "--out", str(tmp_path / "h"), *common])  # dense: the default
    assert r.exit_code == 0, r.output
    cfg = json.loads((tmp_path / "h" / "head.json").read_text())
    met = cfg["metrics"]
    assert cfg["hyperparameters"]["mode"] == "dense" and met["mode"] == "dense" and "dev_ndcg@10_base" in met
    assert not any(k.startswith("dense_") for k in met) and "dev_ndcg@10_by_alpha" not in met
    r = CliRunner().invoke(main, ["train", "--out", str(tmp_path / "h2"), "--mode", "lexical", *common])
    assert r.exit_code == 2 and "--mode" in r.output and not (tmp_path / "h2").exists()


def test_the_best_of_several_noisy_checks_is_not_taken_for_a_gain():
    """The gate's p value counts the kept check as the best of several: of ten checks of noise, the
    best beats the base model by 1.9 standard errors (NOISE_Z alone would save it, and alone it
    would be a 3% fluke), yet as the best of ten its p value is above GATE_P; the same checks with
    a real gain get one far below it."""
    from semsearch.training.query_tower import GATE_P, NOISE_Z, best_check_p

    rng = np.random.default_rng(3)
    gains = rng.normal(0, 20, size=(10, 200)) + rng.normal(0, 5, size=200)  # per-query gains, a shared part
    gains -= gains.mean(axis=1, keepdims=True)  # every check's mean 0 ...
    se = gains.std(axis=1, ddof=1) / np.sqrt(200)
    gains[7] += 1.9 * se[7]  # ... but one, 1.9 standard errors up: the best, kept check
    gains[:7] += rng.uniform(-1, 1, size=(7, 1)) * se[:7, None]
    assert gains.mean(axis=1).argmax() == 7 and gains[7].mean() > NOISE_Z * se[7]
    alone, of_ten = best_check_p(gains[7:8]), best_check_p(gains)
    assert alone < GATE_P < of_ten, (alone, of_ten)
    assert best_check_p(gains + 6.0) < 0.01  # every check ~6 points up, ~4 standard errors: a gain
    assert best_check_p(gains) == of_ten  # the flips are seeded: the same verdict every run


def test_a_gain_luck_gives_the_best_check_is_refused_and_says_why():
    """A check past NOISE_Z on enough queries whose gain the best of its checks reaches by luck in
    more than GATE_P of sign flips is not saved, and the refusal says how often luck gives it."""
    from semsearch.api import NotImproved, _gate
    from semsearch.training.query_tower import GATE_P, MIN_DEV_QUERIES, TowerResult, passes_gate
    from semsearch.training.split import DevSplit

    split = DevSplit(train=list(range(40)), dev=list(range(40, 240)), unseen=list(range(40, 240)), kind="documents")
    noise = {"gain": 0.60, "se": 0.37, "queries": float(MIN_DEV_QUERIES + 120), "p": 0.21, "checks": 9.0}
    res = TowerResult(tower=None, improved=passes_gate(noise), split=split, gate="unseen", rank="unseen", base={"unseen": 5.19},
                      best={"unseen": 5.79}, best_epoch=1.0, noise=noise)
    assert not res.improved and res.within_noise()
    with pytest.raises(NotImproved) as e:
        _gate(res, False, lambda s: None, "the trained query layers", "the base model", "they were", "them")
    assert "the best of 9 check(s) gains that much by luck in 21.0% of sign flips" in str(e.value)
    assert f"saved at {GATE_P:.0%} or less" in str(e.value)
    assert passes_gate(dict(noise, p=GATE_P / 2)) and not passes_gate(dict(noise, p=GATE_P * 2))


def test_a_dev_gain_within_its_own_noise_is_refused_and_says_why():
    """A check above the base model on a dozen dev queries by less than the gain's paired standard
    error is not saved: the refusal names the gain, its error and the number of queries; a gain
    beyond its error passes."""
    from semsearch.api import NotImproved, _forced_note, _gate
    from semsearch.training.query_tower import MIN_DEV_QUERIES, TowerResult, passes_gate
    from semsearch.training.split import DevSplit

    split = DevSplit(train=list(range(40)), dev=list(range(40, 52)), unseen=list(range(40, 52)), kind="documents")

    def result(gain: float, se: float, queries: float = 60.0) -> TowerResult:
        noise = {"gain": gain, "se": se, "queries": queries}
        return TowerResult(tower=None, improved=passes_gate(noise), split=split, gate="unseen", rank="unseen", base={"unseen": 50.0},
                           best={"unseen": 50.0 + gain}, best_epoch=1.0, noise=noise)

    noisy = result(2.5, 3.1, 12.0)
    assert noisy.within_noise() and not noisy.improved
    with pytest.raises(NotImproved) as e:
        _gate(noisy, False, lambda s: None, "the trained query layers", "the base model", "they were", "them")
    msg = str(e.value)
    assert "by more than the gain's own noise" in msg and "+2.50 +/- 3.10" in msg and "over 12 queries" in msg
    assert "within its noise" in _forced_note(noisy, "the trained query layers", "the base model", "they were")
    clear = result(4.0, 1.5)
    assert not clear.within_noise() and clear.improved
    _gate(clear, False, lambda s: None, "the trained query layers", "the base model", "they were", "them")  # no refusal
    assert "within its noise" not in clear.verdict() and "+4.00 +/- 1.50" in clear.verdict()
    # beyond its error but ranked on too few dev queries (200 NFCorpus pairs left 32): refused, saying so
    few = result(4.0, 1.5, MIN_DEV_QUERIES - 18)
    assert not few.improved and few.too_few() and not few.within_noise()
    with pytest.raises(NotImproved) as e:
        _gate(few, False, lambda s: None, "the trained query layers", "the base model", "they were", "them")
    assert "on enough dev queries to tell" in str(e.value) and f"a head is saved only when {MIN_DEV_QUERIES} or more" in str(e.value)
