"""semsearch eval: trec_eval metrics, BEIR loading, pair similarity, SciFact through the CLI."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from semsearch.cli import main
from semsearch.errors import CorpusError, InputError
from semsearch.eval import evaluate_beir, load_beir, read_qrels, trec_metrics

from conftest import NO_SCIFACT, SCIFACT

needs_scifact = pytest.mark.skipif(not SCIFACT.exists(), reason=NO_SCIFACT)


def test_metrics_on_hand_made_run():
    qrels = {"q1": {"d1": 1}, "q2": {"d3": 1, "d4": 1}}
    run = {"q1": {"d2": 0.9, "d1": 0.8}, "q2": {"d3": 0.9, "d5": 0.8, "d4": 0.7}}
    m = trec_metrics(qrels, run, ks=[1, 2, 10])
    # q1: relevant at rank 2 -> nDCG 1/log2(3); q2: ranks 1 and 3 -> (1 + 1/2) / (1 + 1/log2(3))
    assert m["ndcg@10"] == pytest.approx(100 * (0.6309298 + 0.9197208) / 2, abs=1e-3)
    assert m["mrr@10"] == pytest.approx(75.0)
    assert m["mrr@1"] == pytest.approx(50.0)  # only q2 has a relevant document at rank 1
    assert m["recall@2"] == pytest.approx(75.0)
    assert m["recall@1"] == pytest.approx(25.0)


def test_metrics_count_queries_with_no_results_as_zero():
    qrels = {"q1": {"d1": 1}, "q2": {"d2": 1}}
    m = trec_metrics(qrels, {"q1": {"d1": 1.0}}, ks=[10])
    assert m["ndcg@10"] == pytest.approx(50.0)


def write_beir(root, qrels_text, corpus=None, queries=None):
    root.mkdir(parents=True, exist_ok=True)
    (root / "qrels").mkdir(exist_ok=True)
    corpus = corpus or [
        {"_id": "d1", "title": "Loans", "text": "The bank approved the mortgage loan."},
        {"_id": "d2", "title": "", "text": "Lentil soup needs cumin and onions."},
        {"_id": "d3", "title": "Stars", "text": "Meteor showers come from comet debris."},
    ]
    queries = queries or [
        {"_id": "q1", "text": "mortgage approval"},
        {"_id": "q2", "text": "how to cook lentils"},
        {"_id": "q3", "text": "a query without judgements"},
    ]
    (root / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    (root / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in queries))
    (root / "qrels" / "test.tsv").write_bytes(qrels_text.encode())
    return root


def test_beir_loader_crlf_missing_docs_unjudged(tmp_path, caplog):
    root = write_beir(tmp_path / "ds", "query-id\tcorpus-id\tscore\r\nq1\td1\t1\r\nq2\td2\t1\r\nq2\tgone\t1\r\n")
    d = load_beir(root, "test")
    assert d.query_ids == ["q1", "q2"] and d.unjudged_queries == 1
    assert d.qrels == {"q1": {"d1": 1}, "q2": {"d2": 1}}
    assert d.missing_docs == 1 and "not in the corpus" in caplog.text
    assert d.doc_texts[0] == "Loans The bank approved the mortgage loan."  # title + " " + text
    assert d.doc_texts[1] == "Lentil soup needs cumin and onions."


def test_beir_loader_errors_name_file_and_line(tmp_path):
    root = write_beir(tmp_path / "ds", "query-id\tcorpus-id\tscore\nq1\td1\n")
    with pytest.raises(CorpusError, match=r"test\.tsv:2: expected 3"):
        load_beir(root)
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\tyes\n")
    with pytest.raises(CorpusError, match=r"test\.tsv:2: score 'yes'"):
        read_qrels(root / "qrels" / "test.tsv")
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    with open(root / "corpus.jsonl", "a") as fh:
        fh.write("{not json\n")
    with pytest.raises(CorpusError, match=r"corpus\.jsonl:4: malformed"):
        load_beir(root)
    with pytest.raises(InputError, match="splits here: test"):
        load_beir(root, "dev")
    with pytest.raises(InputError, match="does not exist"):
        load_beir(tmp_path / "nope")


def test_exact_eval_ranks_relevant_first(tmp_path, real_encoder):
    root = write_beir(tmp_path / "ds", "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n")
    rep = evaluate_beir(load_beir(root), real_encoder, ["cls", "mean", "max"], ks=[1, 10])
    assert [r["pooling"] for r in rep.rows] == ["cls", "mean", "max"]
    mean = rep.rows[1]
    assert mean["ndcg@10"] == 100.0 and mean["mrr@1"] == 100.0
    assert rep.settings["dataset_checksum"] and rep.settings["model_fingerprint"] == real_encoder.fingerprint


def test_pairs_eval(tmp_path):
    p = tmp_path / "sts.tsv"
    rows = [
        (5.0, "A man is playing a guitar.", "A man plays the guitar."),
        (4.2, "The bank approved my loan.", "My loan application was approved by the bank."),
        (2.5, "A woman is slicing onions.", "A woman is cooking dinner."),
        (1.0, "The cat sleeps on the sofa.", "Interest rates went up today."),
        (0.2, "Stars shine at night.", "I bought new running shoes."),
    ]
    p.write_text("score\tsentence1\tsentence2\n" + "".join(f"{a}\t{b}\t{c}\n" for a, b, c in rows))
    r = CliRunner().invoke(main, ["eval", "--pairs", str(p), "--pooling", "cls,mean,max", "--json", "--precision", "fp32"])
    assert r.exit_code == 0, r.output
    pairs = json.loads(r.output)["pairs"]
    res = {x["pooling"]: x for x in pairs["results"]}
    assert set(res) == {"cls", "mean", "max"}
    assert pairs["settings"]["precision"] == "fp32" and pairs["settings"]["model_fingerprint"]
    assert res["mean"]["spearman"] > 80 and res["mean"]["pairs"] == 5
    # positions instead of names
    q = tmp_path / "pos.csv"
    q.write_text("a,b,gold\n" + "".join(f'"{b}","{c}",{a}\n' for a, b, c in rows))
    r = CliRunner().invoke(main, ["eval", "--pairs", str(q), "--pair-columns", "2,0,1", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["pairs"]["results"][0]["spearman"] > 80
    r = CliRunner().invoke(main, ["eval", "--pairs", str(q), "--pair-columns", "score,x,y"])
    assert r.exit_code != 0 and "no column 'score'" in r.output


@needs_scifact
def test_scifact_subset_through_cli(tmp_path):
    """Retrieval smoke test on real data: relevant SciFact abstracts rank first for most queries."""
    out = tmp_path / "report.json"
    r = CliRunner().invoke(main, ["eval", str(SCIFACT), "--pooling", "cls,mean,max", "--max-queries", "30",
                                  "--max-docs", "150", "--out", str(out), "--k", "1,10,100"])
    assert r.exit_code == 0, r.output
    assert "ndcg@10" in r.output and "mean" in r.output
    rep = json.loads(out.read_text())
    res = {x["pooling"]: x for x in rep["results"]}
    assert rep["settings"]["queries"] == 30 and rep["settings"]["documents"] == 150
    assert res["mean"]["mrr@1"] >= 70  # the top hit is relevant for most queries
    assert res["mean"]["ndcg@10"] > res["max"]["ndcg@10"]


@needs_scifact
def test_eval_existing_index_reports_ann_recall(tmp_path):
    """Index a slice of SciFact's corpus.jsonl and evaluate the index as built."""
    data = load_beir(SCIFACT).subset(20, 150)
    keep = set(data.doc_ids)
    root = tmp_path / "ds"
    (root / "qrels").mkdir(parents=True)
    with open(SCIFACT / "corpus.jsonl") as src, open(root / "corpus.jsonl", "w") as dst:
        for line in src:
            if json.loads(line)["_id"] in keep:
                dst.write(line)
    (root / "queries.jsonl").write_text((SCIFACT / "queries.jsonl").read_text())
    (root / "qrels" / "test.tsv").write_text((SCIFACT / "qrels" / "test.tsv").read_text())
    folder = tmp_path / "idx"
    corpus_dir = tmp_path / "corpus"
    corpus_dir.mkdir()
    (corpus_dir / "corpus.jsonl").write_text((root / "corpus.jsonl").read_text())
    r = CliRunner().invoke(main, ["index", str(corpus_dir), "--index", str(folder), "--no-progress"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["eval", str(root), "--index", str(folder), "--max-queries", "20", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    index_row, exact_row, lexical_row, hybrid_row = rep["results"]  # every mode the index offers
    assert index_row["ann_recall@10"] == 1.0  # a flat index is exact
    assert index_row["ndcg@10"] == exact_row["ndcg@10"] > 60
    assert (lexical_row["search"], hybrid_row["search"]) == ("lexical", "hybrid") and hybrid_row["ndcg@10"] > 60
