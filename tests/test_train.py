"""The pooling head (`train --train-layers 0`): init equals mean pooling, loss, training end to end, gate, save/load, re-pool."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from semsearch.cli import main
from semsearch.encoder.pooling import AttentionHead, mean_pool
from semsearch.training.data import PairData
from semsearch.encoder.heads import load_head
from semsearch.training.head import save_head
from semsearch.training.loss import mnr_loss
from semsearch.training.trainer import TrainConfig, _batches, train_head

from conftest import NO_SCIFACT, SAMPLE, SCIFACT

needs_scifact = pytest.mark.skipif(not SCIFACT.exists(), reason=NO_SCIFACT)


def test_untrained_head_reproduces_mean_pooling_on_the_real_encoder(real_encoder):
    texts = ["loan approval", "Mortgage rates rose sharply this quarter.", "a much longer text " * 30]
    head = AttentionHead(real_encoder.dim, real_encoder.dim)
    out = real_encoder.encode_many(texts, ["mean"])["mean"]
    real_encoder.head = head
    try:
        via_head = real_encoder.encode_many(texts, ["head"])["head"]
    finally:
        real_encoder.head = None
    assert np.abs(via_head - out).max() < 1e-6


def test_loss_decreases_on_toy_set():
    torch.manual_seed(0)
    B, T, D = 16, 6, 8
    q_states, p_states = torch.randn(B, T, D), torch.randn(B, T, D)
    # Make each passage share a direction with its query so there is something to learn.
    p_states = p_states + 2 * q_states
    mask = torch.ones(B, T, dtype=torch.long)
    head = AttentionHead(D, D)
    opt = torch.optim.Adam(head.parameters(), lr=0.05)
    losses = []
    for _ in range(40):
        loss = mnr_loss(head(q_states, mask), head(p_states, mask), scale=20.0, symmetric=True)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_loss_is_cross_entropy_over_scaled_cosines():
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    d = torch.tensor([[2.0, 0.0], [0.0, 3.0], [1.0, 1.0]])  # two positives, one hard negative
    logits = 20 * torch.nn.functional.normalize(q, dim=-1) @ torch.nn.functional.normalize(d, dim=-1).T
    expected = torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1]))
    assert torch.allclose(mnr_loss(q, d, 20.0), expected)


def test_batches_never_repeat_a_passage_or_query():
    pairs = [(0, 1), (1, 1), (2, 2), (2, 3), (3, 4), (4, 4), (5, 5)]
    batches = _batches(pairs, 4, np.random.default_rng(0))
    assert sorted(p for b in batches for p in b) == sorted(pairs)
    for b in batches:
        assert len({q for q, _ in b}) == len(b) and len({p for _, p in b}) == len(b)


def test_save_load_round_trip_gives_identical_vectors(tmp_path):
    torch.manual_seed(0)
    head = AttentionHead(8, 8)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    info = save_head(head, tmp_path / "h", {"base_model_fingerprint": "abc"})
    again = load_head(tmp_path / "h", "abc")
    states, mask = torch.randn(3, 5, 8), torch.tensor([[1, 1, 1, 0, 0]] * 3)
    assert torch.equal(head(states, mask), again(states, mask))
    assert len(info["fingerprint"]) == 16
    from semsearch.errors import SettingsMismatch

    with pytest.raises(SettingsMismatch, match="trained on model weights abc"):
        load_head(tmp_path / "h", "other")


def toy_data(n=24):
    """Queries whose relevant passage shares a topic word; passages sharing words confuse mean pooling."""
    topics = ["loan", "soup", "comet", "tomato", "train", "sleep", "index", "mortgage", "fraud", "bread", "orbit", "garden"]
    queries, passages, positives = [], [], {}
    for i in range(n):
        t = topics[i % len(topics)]
        queries.append(f"question {i} about {t}")
        passages.append(f"passage {i}: all about {t} and nothing else {i}")
        positives[i] = {i}
    return PairData(queries, passages, positives, checksum=f"toy{n}")


def test_gate_refuses_a_head_that_does_not_help(real_encoder, tmp_path):
    data = toy_data()
    res = train_head(data, real_encoder, TrainConfig(epochs=2, lr=0.0, batch_size=8, dev_fraction=0.25), cache_dir=tmp_path / "cache")
    # lr 0: the head never moves from mean pooling, so it cannot beat it; the best *trained*
    # epoch is reported (never the untrained head as "epoch -1").
    assert not res.improved and res.best_epoch == 0
    assert res.best[res.gate] == pytest.approx(res.base[res.gate])
    assert "best trained epoch 0" in res.verdict()
    assert any(p.name.startswith("passages-") for p in (tmp_path / "cache").iterdir())  # states cached


def test_training_is_deterministic(real_encoder, tmp_path):
    data = toy_data()
    cfg = TrainConfig(epochs=2, batch_size=8, dev_fraction=0.25)
    a = train_head(data, real_encoder, cfg, cache_dir=tmp_path / "c")
    b = train_head(data, real_encoder, cfg, cache_dir=tmp_path / "c")
    assert a.history == b.history
    for k, v in a.head.state_dict().items():
        assert torch.equal(v, b.head.state_dict()[k])


@needs_scifact
def test_tiny_training_run_through_cli(tmp_path):
    """Pairs file -> train -> eval --head -> index --head -> query, all through the CLI."""
    from semsearch.eval import load_beir

    d = load_beir(SCIFACT, "train").subset(60)
    doc_text = dict(zip(d.doc_ids, d.doc_texts))
    pairs = tmp_path / "pairs.csv"
    with open(pairs, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["query", "positive"])
        for q, text in zip(d.query_ids, d.query_texts):
            for doc in d.qrels[q]:
                w.writerow([text, doc_text[doc]])
    out = tmp_path / "head"
    r = CliRunner().invoke(main, ["train", "--train-layers", "0", "--pairs", str(pairs), "--out", str(out), "--epochs", "3", "--batch-size", "16",
                                  "--cache", str(tmp_path / "cache"), "--force", "--no-progress"])
    assert r.exit_code == 0, r.output
    cfg = json.loads((out / "head.json").read_text())
    assert cfg["format"] == "semsearch-head v1" and cfg["hyperparameters"]["epochs"] == 3
    assert "dev_ndcg@10_head" in cfg["metrics"] and cfg["training_data_checksum"]

    # Index with kept token states, then apply the head by re-pooling (no transformer pass).
    idx = tmp_path / "idx"
    assert CliRunner().invoke(main, ["index", str(SAMPLE), "--index", str(idx), "--keep-states", "--precision", "fp32", "--no-progress"]).exit_code == 0
    r = CliRunner().invoke(main, ["index", str(SAMPLE), "--index", str(idx), "--head", str(out), "--precision", "fp32", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "re-pooled" in r.output
    direct = tmp_path / "direct"
    assert CliRunner().invoke(main, ["index", str(SAMPLE), "--index", str(direct), "--head", str(out), "--precision", "fp32", "--no-progress"]).exit_code == 0
    from semsearch.search import Retriever

    a, b = Retriever.load(idx), Retriever.load(direct)
    va = dict((int(i), v) for ids, vs in a.docs.iter_vectors() for i, v in zip(ids, vs))
    vb = dict((int(i), v) for ids, vs in b.docs.iter_vectors() for i, v in zip(ids, vs))
    assert va.keys() == vb.keys()
    assert max(float(np.abs(va[i] - vb[i]).max()) for i in va) < 2e-3  # fp16 kept states
    assert a.manifest.pooling == "head" and a.manifest.head["path"] == str(out.resolve())
    # Re-pooling carries the segments' posting files over (nothing analysed again): the lexical
    # side answers as the directly built index does
    for q in ("loan approval", "interest rates mortgage", "meteor comet", "soup"):
        assert [(h.id, round(h.score, 5)) for h in a.search(q, 5, mode="lexical")] == \
               [(h.id, round(h.score, 5)) for h in b.search(q, 5, mode="lexical")], q
    r = CliRunner().invoke(main, ["query", "loan approval", "--index", str(idx), "--json", "-k", "3"])
    assert r.exit_code == 0 and len(json.loads(r.output)["hits"]) == 3


def test_new_pooling_without_kept_states_is_refused_with_cost(small_corpus, tmp_path):
    idx = tmp_path / "idx"
    assert CliRunner().invoke(main, ["index", str(small_corpus), "--index", str(idx), "--no-progress"]).exit_code == 0
    r = CliRunner().invoke(main, ["index", str(small_corpus), "--index", str(idx), "--pooling", "max", "--no-progress"])
    assert r.exit_code != 0
    assert "pooling 'max' vs the index's 'mean'" in r.output and "--keep-states" in r.output and "MB" in r.output


# ---- dev split on held-out documents ----------------------------------------------------
def test_document_split_keeps_dev_documents_out_of_training():
    from semsearch.training.split import split_queries

    rng = np.random.default_rng(0)
    # 60 queries; queries 3k, 3k+1, 3k+2 share document k (groups), plus a few shared across groups.
    positives = {q: {q // 3} for q in range(60)}
    positives[5] |= {7}  # links group 1 and group 7
    s = split_queries(positives, 0.2, rng, n_passages=20)
    assert s.kind == "documents" and 10 <= len(s.dev) <= 14
    train_docs = {p for q in s.train for p in positives[q]}
    assert all(not (positives[q] & train_docs) for q in s.dev)
    assert s.unseen == s.dev and sorted(s.train + s.dev) == list(range(60))
    assert ({3, 4, 5} <= set(s.dev)) == ({21, 22, 23} <= set(s.dev))  # linked groups move together


def test_seen_dev_queries_keep_their_documents_in_training():
    from semsearch.training.split import hold_out_seen, split_queries

    # 90 queries: documents 0-29 have three queries each, documents 30-59 one each (q 90-119).
    positives = {q: {q // 3} for q in range(90)} | {q: {q - 60} for q in range(90, 120)}
    s = split_queries(positives, 0.2, np.random.default_rng(0), n_passages=60)
    unseen, dev0 = list(s.unseen), list(s.dev)
    s = hold_out_seen(s, positives, 0.1, np.random.default_rng(1))
    assert s.unseen == unseen and len(s.seen) == 12 and sorted(s.dev) == sorted(dev0 + s.seen)
    assert not set(s.seen) & set(s.train) and sorted(s.train + s.dev) == list(range(120))
    train_docs = {p for q in s.train for p in positives[q]}
    assert all(positives[q] <= train_docs for q in s.seen)  # each seen query's documents are still trained on
    assert all(not (positives[q] & train_docs) for q in s.unseen)  # and the unseen ones' still are not
    assert all(q < 90 for q in s.seen)  # a document's only query is never held out as "seen"
    assert "12 about trained documents" in s.describe()
    # nothing to hold out: a split that is not by documents, or a zero fraction
    assert hold_out_seen(split_queries(positives, 0.0, np.random.default_rng(0)), positives, 0.1, np.random.default_rng(0)).seen == []
    assert hold_out_seen(split_queries(positives, 0.2, np.random.default_rng(0)), positives, 0.0, np.random.default_rng(0)).seen == []


def test_split_falls_back_to_queries_when_positives_link_everything():
    from semsearch.training.split import split_queries

    positives = {q: {0, q + 1} for q in range(50)}  # every query shares document 0
    s = split_queries(positives, 0.2, np.random.default_rng(0), n_passages=51)
    assert s.kind == "queries" and len(s.dev) == 10 and s.unseen == []
    assert "link 50 of 50 queries" in s.note and "51 documents" in s.note


def test_dev_fraction_zero_holds_out_nothing():
    from semsearch.training.split import split_queries

    s = split_queries({q: {q} for q in range(10)}, 0.0, np.random.default_rng(0))
    assert s.kind == "none" and s.dev == [] and len(s.train) == 10


# ---- false negatives: other positives of the same query are masked out ------------------
def test_positive_mask_marks_other_positives_of_the_same_query():
    from semsearch.training.loss import positive_mask

    # query 0 has positives {10, 11}, query 1 has {11, 12}; batch targets 10 and 12, negatives 11, 13.
    m = positive_mask([0, 1], [10, 12, 11, 13], {0: {10, 11}, 1: {11, 12}})
    assert m.tolist() == [[False, False, True, False], [False, False, True, False]]
    m = positive_mask([0, 1], [10, 11], {0: {10, 11}, 1: {11}})
    assert m.tolist() == [[False, True], [False, False]]  # 11 is query 1's target, and query 0's positive


def test_masked_positive_gets_no_gradient_and_loss_ignores_it():
    torch.manual_seed(0)
    q = torch.randn(2, 8)
    d = torch.randn(3, 8, requires_grad=True)  # d[2] is another positive of query 0 (a hard negative slot)
    exclude = torch.tensor([[False, False, True], [False, False, False]])
    mnr_loss(q[:1], d, 20.0, exclude=exclude[:1]).backward()
    assert torch.equal(d.grad[2], torch.zeros(8))  # nothing pushes the other positive away
    # and the loss equals the loss without that passage
    d2 = d.detach()[:2]
    assert torch.allclose(mnr_loss(q[:1], d.detach(), 20.0, exclude=exclude[:1]), mnr_loss(q[:1], d2, 20.0))
    with pytest.raises(AssertionError):
        assert torch.allclose(mnr_loss(q[:1], d.detach(), 20.0), mnr_loss(q[:1], d2, 20.0))


def multi_positive_data():
    """12 topics x 4 passages each; every query is relevant to all 4 passages of its topic."""
    topics = ["loan", "soup", "comet", "tomato", "train", "sleep", "index", "mortgage", "fraud", "bread", "orbit", "garden"]
    passages = [f"note {j} on {t}: {t} facts number {j}" for t in topics for j in range(4)]
    queries = [f"tell me about {t}" for t in topics for _ in range(3)]
    positives = {i: {4 * (i // 3) + j for j in range(4)} for i in range(len(queries))}
    return PairData(queries, passages, positives, checksum="multi")


def test_training_on_a_multi_positive_set_never_uses_a_positive_as_negative(real_encoder, tmp_path, monkeypatch):
    import semsearch.training.trainer as trainer

    data = multi_positive_data()
    seen = {"rows": 0, "masked": 0}
    real_loss = trainer.mnr_loss

    def checking_loss(q, d, scale, symmetric, exclude):
        # every in-batch or mined passage that is a labelled positive of row i (other than its
        # target) must be masked for row i
        B = q.shape[0]
        qs, ps = checking_loss.batch
        for i in range(B):
            for j, p in enumerate(ps):
                if j != i and p in data.positives[qs[i]]:
                    assert exclude[i, j]
                    seen["masked"] += 1
        seen["rows"] += B
        return real_loss(q, d, scale, symmetric, exclude)

    real_mask = trainer.positive_mask

    def spy_mask(qs, ps, positives):
        checking_loss.batch = (qs, ps)
        return real_mask(qs, ps, positives)

    monkeypatch.setattr(trainer, "mnr_loss", checking_loss)
    monkeypatch.setattr(trainer, "positive_mask", spy_mask)
    res = train_head(data, real_encoder, TrainConfig(epochs=2, batch_size=16, positives_per_query=4, dev_fraction=0.25,
                                                     hard_negatives=2, neg_skip=0), cache_dir=tmp_path / "c")
    assert seen["rows"] > 0 and seen["masked"] > 0  # the batches really held other positives of a query
    assert res.split.kind == "documents"  # whole topics are held out
    assert all(np.isfinite(r["loss"]) for r in res.history)


def test_positives_per_query_bounds_an_epoch():
    from semsearch.training.trainer import epoch_pairs

    positives = {0: set(range(40)), 1: {50}}
    pairs = epoch_pairs([0, 1], positives, 2, np.random.default_rng(0))
    assert len([p for p in pairs if p[0] == 0]) == 2 and (1, 50) in pairs
    assert all(p in positives[q] for q, p in pairs)


# ---- CLI: refusal message, --force, --dev-fraction 0, --dev-split, eval --head --------------
def write_beir(folder, topics=16, dev_topics=(), more_queries=0):
    """A small BEIR folder: topic k has 2 documents and 2 train queries (+1 dev query for dev_topics;
    + `more_queries` more train queries for each document, worded differently)."""
    folder.mkdir()
    (folder / "qrels").mkdir()
    words = ["loan", "soup", "comet", "tomato", "train", "sleep", "index", "mortgage", "fraud", "bread", "orbit", "garden",
             "violin", "glacier", "tax", "volcano", "coffee", "chess", "satellite", "honey"]
    with open(folder / "corpus.jsonl", "w") as fh:
        for k in range(topics):
            for j in range(2):
                fh.write(json.dumps({"_id": f"d{k}-{j}", "title": f"All about the {words[k]}, part {j}.",
                                     "text": f"A note about {words[k]} and more {words[k]}, with details on {words[k]} number {j} for readers."}) + "\n")
    with open(folder / "queries.jsonl", "w") as fh, open(folder / "qrels" / "train.tsv", "w") as tr, open(folder / "qrels" / "dev.tsv", "w") as dv:
        tr.write("query-id\tcorpus-id\tscore\n")
        dv.write("query-id\tcorpus-id\tscore\n")
        for k in range(topics):
            for j in range(2):
                fh.write(json.dumps({"_id": f"q{k}-{j}", "text": f"what about {words[k]}?"}) + "\n")
                tr.write(f"q{k}-{j}\td{k}-{j}\t1\n")
                for n in range(more_queries):
                    fh.write(json.dumps({"_id": f"q{k}-{j}-{n}", "text": f"{['tell me', 'details', 'facts'][n % 3]} on {words[k]} {j}"}) + "\n")
                    tr.write(f"q{k}-{j}-{n}\td{k}-{j}\t1\n")
            if k in dev_topics:
                fh.write(json.dumps({"_id": f"v{k}", "text": f"{words[k]} please"}) + "\n")
                dv.write(f"v{k}\td{k}-0\t1\n")
    return folder


def test_refusal_reports_the_best_trained_epoch_and_force_saves_a_trained_head(tmp_path):
    ds = write_beir(tmp_path / "ds")
    args = ["train", "--train-layers", "0", "--beir", str(ds), "--out", str(tmp_path / "h"), "--epochs", "2", "--lr", "0", "--batch-size", "8",
            "--cache", str(tmp_path / "c"), "--precision", "fp32", "--no-progress"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code != 0 and "not saved" in r.output
    assert "best trained epoch 0" in r.output and "epoch -1" not in r.output
    assert not (tmp_path / "h").exists()
    # --force saves the best trained epoch's head, with a real training step behind it
    r = CliRunner().invoke(main, args[:9] + ["--lr", "0.01"] + args[11:] + ["--force"])
    assert r.exit_code == 0, r.output
    head = load_head(tmp_path / "h")
    assert float(head.score.weight.detach().abs().sum()) > 0  # not the untrained (mean-pooling) head
    cfg = json.loads((tmp_path / "h" / "head.json").read_text())
    assert cfg["metrics"]["best_epoch"] >= 0 and cfg["metrics"]["dev_split"] == "documents"


def test_dev_fraction_zero_trains_on_every_query_and_needs_force(tmp_path):
    ds = write_beir(tmp_path / "ds")
    args = ["train", "--train-layers", "0", "--beir", str(ds), "--out", str(tmp_path / "h"), "--epochs", "1", "--batch-size", "8", "--dev-fraction", "0",
            "--cache", str(tmp_path / "c"), "--precision", "fp32", "--no-progress"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code != 0 and "no dev set" in r.output and not (tmp_path / "h").exists()
    r = CliRunner().invoke(main, args + ["--force"])
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "h" / "head.json").read_text())["metrics"]
    assert m["train_queries"] == 32 and m["dev_queries"] == 0


def test_dev_split_uses_the_datasets_own_dev_qrels(tmp_path):
    ds = write_beir(tmp_path / "ds", dev_topics=range(12))
    r = CliRunner().invoke(main, ["train", "--train-layers", "0", "--beir", str(ds), "--dev-split", "dev", "--out", str(tmp_path / "h"), "--epochs", "1",
                                  "--batch-size", "8", "--cache", str(tmp_path / "c"), "--precision", "fp32", "--no-progress", "--force"])
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "h" / "head.json").read_text())["metrics"]
    assert m["dev_split"] == "given" and m["dev_queries"] == 12 and m["train_queries"] == 32
    assert m["unseen_dev_queries"] == 0  # every dev query's document is a training positive
    assert "12 dev queries (the given dev split; 0 with unseen documents, 12 about trained documents)" in r.output


def test_train_takes_passage_states_from_an_index_with_kept_states(tmp_path):
    """No second encoding of the passages: their states come from the index; same dev figures."""
    ds = write_beir(tmp_path / "ds")
    idx = tmp_path / "idx"
    r = CliRunner().invoke(main, ["index", str(ds / "corpus.jsonl"), "--index", str(idx), "--keep-states", "--text-column", "title,text",
                                  "--precision", "fp32", "--no-progress"])
    assert r.exit_code == 0, r.output
    common = ["--epochs", "2", "--batch-size", "8", "--precision", "fp32", "--no-progress", "--force"]
    a = CliRunner().invoke(main, ["train", "--train-layers", "0", "--beir", str(ds), "--index", str(idx), "--out", str(tmp_path / "a"), "--cache", str(tmp_path / "c1"), *common])
    assert a.exit_code == 0, a.output
    assert "token states of 32 passages from" in a.output and "encoded" not in a.output.split("token states of")[1].split("\n")[0]
    assert not any(p.name.startswith("passages-") for p in (tmp_path / "c1").iterdir())  # passages were not encoded
    b = CliRunner().invoke(main, ["train", "--train-layers", "0", "--beir", str(ds), "--out", str(tmp_path / "b"), "--cache", str(tmp_path / "c2"), *common])
    assert b.exit_code == 0, b.output
    ma = json.loads((tmp_path / "a" / "head.json").read_text())["metrics"]
    mb = json.loads((tmp_path / "b" / "head.json").read_text())["metrics"]
    assert ma["dev_ndcg@10_base_mean"] == pytest.approx(mb["dev_ndcg@10_base_mean"], abs=0.01)
    # eval --head reports the documents the head never trained on
    r = CliRunner().invoke(main, ["eval", str(ds), "--split", "train", "--head", str(tmp_path / "a"), "--precision", "fp32", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)["results"]
    unseen = [row for row in rows if row.get("queries", "").startswith("unseen documents")]
    assert len(unseen) == 2 and unseen[0]["queries"] == f"unseen documents ({ma['dev_queries']})"

    # unlabelled: pseudo-queries from the corpus alone
    r = CliRunner().invoke(main, ["train", "--train-layers", "0", "--index", str(idx), "--pseudo-queries", "--out", str(tmp_path / "u"), "--cache", str(tmp_path / "c3"), *common])
    assert r.exit_code == 0, r.output
    assert "32 queries with the corpus's pseudo-queries, 32 passages" in r.output
