"""The pooling head: init equals mean pooling, loss, training end to end, gate, save/load, re-pool."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from semsearch.cli import main
from semsearch.encoder.pooling import AttentionHead, mean_pool
from semsearch.train.data import PairData
from semsearch.train.head import load_head, save_head
from semsearch.train.loss import mnr_loss
from semsearch.train.trainer import TrainConfig, _batches, train_head

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
    # lr 0: the head never moves from mean pooling, so it cannot beat it.
    assert not res.improved and res.best_epoch == -1
    assert res.best_dev == pytest.approx(res.base_dev)
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
    r = CliRunner().invoke(main, ["train", "--pairs", str(pairs), "--out", str(out), "--epochs", "3", "--batch-size", "16",
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
    r = CliRunner().invoke(main, ["query", "loan approval", "--index", str(idx), "--json", "-k", "3"])
    assert r.exit_code == 0 and len(json.loads(r.output)["hits"]) == 3


def test_new_pooling_without_kept_states_is_refused_with_cost(small_corpus, tmp_path):
    idx = tmp_path / "idx"
    assert CliRunner().invoke(main, ["index", str(small_corpus), "--index", str(idx), "--no-progress"]).exit_code == 0
    r = CliRunner().invoke(main, ["index", str(small_corpus), "--index", str(idx), "--pooling", "max", "--no-progress"])
    assert r.exit_code != 0
    assert "pooling 'max' vs the index's 'mean'" in r.output and "--keep-states" in r.output and "MB" in r.output
