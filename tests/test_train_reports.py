"""What `semsearch eval` and `semsearch train` report around a trained head: a head for another
corpus, one head a run, a forced save, missing unseen-document rows, one JSON layout."""
from __future__ import annotations

import json
import logging

import pytest
from click.testing import CliRunner

from semsearch.cli import main
from semsearch.encoder.heads import corpus_record, document_key
from semsearch.encoder.query_layers import QueryTower
from semsearch.training.query_tower import save_tower

from test_train import write_beir

DOC_IDS = [f"d{k}-{j}" for k in range(16) for j in range(2)]  # write_beir's 32 documents
FP32 = ["--precision", "fp32", "--no-progress"]


def _head(real_encoder, folder, corpus_ids=DOC_IDS, positives=None):
    """Untrained query layers (the base model's own: cheap) recording the corpus of corpus_ids and
    the training positives `positives` (None: no record of them, as a head trained on pairs)."""
    tower = QueryTower.from_base(real_encoder.model, 1)
    corpus = corpus_record(document_key(i, "") for i in corpus_ids) if corpus_ids is not None else None
    save_tower(tower, folder, {"base_model_fingerprint": real_encoder.fingerprint, "doc_pooling": "mean",
                               "training_data": "a test corpus", **({"corpus": corpus} if corpus else {})}, positives)
    return folder


def _eval(*args):
    return CliRunner().invoke(main, ["eval", *map(str, args), "--precision", "fp32", "--device", "cpu"])


# ---- 1. eval --head checks the head's corpus, as index --head does ----------------------------
def test_eval_refuses_a_head_trained_on_another_corpus_unless_forced(tmp_path, real_encoder, caplog):
    ds = write_beir(tmp_path / "ds")
    other = _head(real_encoder, tmp_path / "other", corpus_ids=[f"x{i}" for i in range(40)], positives=["x1", "x2"])
    r = _eval(ds, "--split", "train", "--head", other, "--mode", "dense")
    assert r.exit_code == 1
    msg = r.output
    assert "trained on another corpus (a test corpus)" in msg and "about 0% of the 40 training documents" in msg
    assert "this dataset's corpus of 32 documents" in msg and "--force" in msg and f"semsearch train --beir {ds}" in msg
    assert "ndcg@10" not in msg  # nothing was evaluated

    with caplog.at_level(logging.WARNING):
        r = _eval(ds, "--split", "train", "--head", other, "--mode", "dense", "--force", "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert {row["pooling"] for row in rep["results"]} == {"mean", "head"}
    assert rep["settings"]["head_corpus_share"] == 0.0
    assert any("another corpus" in rec.getMessage() and "(forced)" in rec.getMessage() for rec in caplog.records)


def test_eval_accepts_a_head_of_the_same_corpus_also_on_a_cut_of_it(tmp_path, real_encoder, caplog):
    ds = write_beir(tmp_path / "ds")
    own = _head(real_encoder, tmp_path / "own", positives=DOC_IDS[:16])
    with caplog.at_level(logging.WARNING):
        # --max-docs cuts the corpus to 8 documents: the head is checked against the whole corpus
        r = _eval(ds, "--split", "train", "--head", own, "--mode", "dense", "--max-queries", "4", "--max-docs", "8", "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["settings"]["head_corpus_share"] == 1.0 and rep["settings"]["documents"] == 8
    assert not any("another corpus" in rec.getMessage() for rec in caplog.records)
    # a head that records no corpus (written before the record existed) is evaluated, silently
    old = _head(real_encoder, tmp_path / "old", corpus_ids=None, positives=DOC_IDS[:16])
    r = _eval(ds, "--split", "train", "--head", old, "--mode", "dense", "--max-queries", "4", "--json")
    assert r.exit_code == 0, r.output
    assert "head_corpus_share" not in json.loads(r.stdout)["settings"]


# ---- 2. one --head a run, and the help says so -----------------------------------------------
def test_eval_takes_one_head_a_run_and_its_help_says_so(tmp_path, real_encoder):
    r = CliRunner().invoke(main, ["eval", "--help"])
    assert r.exit_code == 0
    help_text = " ".join(r.output.split())
    assert "one per run" in help_text and "repeatable" not in help_text.split("--model")[0].split("--head")[1]
    assert "--force" in help_text
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    r = CliRunner().invoke(main, ["eval", str(write_beir(tmp_path / "ds")), "--head", str(a), "--head", str(b)])
    assert r.exit_code == 2 and "evaluate one --head at a time" in r.output


# ---- 3. a forced save says it did not improve, with the figures ------------------------------
def test_a_forced_save_says_it_did_not_improve_on_dev_and_was_saved_because_of_force(tmp_path):
    ds = write_beir(tmp_path / "ds")
    out = tmp_path / "h"
    r = CliRunner().invoke(main, ["train", "--beir", str(ds), "--out", str(out), "--train-layers", "1", "--epochs", "1",
                                  "--lr", "0", "--batch-size", "8", "--cache", str(tmp_path / "c"), "--force", "--mode", "hybrid", *FP32])
    assert r.exit_code == 0, r.output
    cfg = json.loads((out / "head.json").read_text())
    met = cfg["metrics"]
    assert cfg["improved_on_dev"] is False
    assert met["ranked_by"] == "dev"  # judged on the whole dev set
    base, head = met["dev_ndcg@10_base"], met["dev_ndcg@10_head"]
    assert head <= base  # --lr 0: the layers are the base model's
    stdout = r.stdout
    assert "warning: the trained query layers did not improve on the dev split" in stdout
    assert f"(nDCG@10 {base:.2f} for the base model (hybrid) -> {head:.2f} trained, on {met['dev_queries']} queries)" in stdout
    assert "they were saved only because of --force (head.json records improved_on_dev: false)" in stdout
    assert stdout.index("warning:") < stdout.index("saved query layers to")


def test_a_forced_pooling_head_and_a_head_no_dev_set_checked_say_so_too(tmp_path):
    from semsearch import api

    ds = write_beir(tmp_path / "ds")
    common = dict(beir=ds, train_layers=0, epochs=1, batch_size=8, cache=tmp_path / "c", precision="fp32", device="cpu",
                  progress=False, force=True)
    rep = api.train(tmp_path / "p", lr=0.0, **common)
    assert rep.forced and not rep.improved
    cfg = json.loads((tmp_path / "p" / "head.json").read_text())
    met = cfg["metrics"]
    assert cfg["improved_on_dev"] is False and met["gate"] == "dev"  # 6 held-out queries: too few for the unseen gate
    assert rep.note == (f"the head did not improve on the dev split (nDCG@10 {met['dev_ndcg@10_base_mean']:.2f} for mean pooling "
                        f"-> {met['dev_ndcg@10_head']:.2f} trained, on {met['dev_queries']} queries): it was saved only because "
                        "of --force (head.json records improved_on_dev: false)")

    rep = api.train(tmp_path / "n", dev_fraction=0.0, **common)
    assert rep.forced and rep.note.startswith("the head was not checked: no dev set (--dev-fraction 0)")
    assert "saved only because of --force" in rep.note


# ---- 4. no unseen-document rows: it says why ---------------------------------------------------
def test_eval_says_why_there_are_no_unseen_document_rows(tmp_path, real_encoder):
    ds = write_beir(tmp_path / "ds")
    every = _head(real_encoder, tmp_path / "every", positives=DOC_IDS)  # trained on every document
    r = _eval(ds, "--split", "train", "--head", every, "--mode", "dense")
    assert r.exit_code == 0, r.output
    why = "no unseen-document rows: all 32 train queries have a relevant document the head was trained on"
    assert why in r.stdout and "unseen documents" not in r.stdout
    r = _eval(ds, "--split", "train", "--head", every, "--mode", "dense", "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["notes"] == [why] and not any("queries" in row for row in rep["results"])
    assert why in r.stderr  # beside the JSON, for a person reading

    # some documents never trained on: the rows, and no note
    half = _head(real_encoder, tmp_path / "half", positives=DOC_IDS[:16])
    r = _eval(ds, "--split", "train", "--head", half, "--mode", "dense", "--json")
    rep = json.loads(r.stdout)
    assert rep["notes"] == [] and {row["queries"] for row in rep["results"] if "queries" in row} == {"unseen documents (16)"}

    # a head that does not list its training documents (trained on a pairs file)
    unlisted = _head(real_encoder, tmp_path / "unlisted", positives=None)
    r = _eval(ds, "--split", "train", "--head", unlisted, "--mode", "dense")
    assert r.exit_code == 0, r.output
    assert "no unseen-document rows: the head does not record the documents it was trained on" in r.stdout


def test_eval_of_an_index_with_its_head_says_why_there_are_no_unseen_document_rows(tmp_path, real_encoder):
    ds = write_beir(tmp_path / "ds")
    every = _head(real_encoder, tmp_path / "every", positives=DOC_IDS)
    idx = tmp_path / "idx"
    r = CliRunner().invoke(main, ["index", str(ds / "corpus.jsonl"), "--index", str(idx), "--text-column", "title,text",
                                  "--head", str(every), "--device", "cpu", *FP32])
    assert r.exit_code == 0, r.output
    r = _eval(ds, "--split", "train", "--index", idx, "--mode", "dense")
    assert r.exit_code == 0, r.output
    assert "no unseen-document rows: all 32 train queries have a relevant document the head was trained on" in r.stdout


# ---- 5. one JSON layout: rows under `results` ---------------------------------------------------
STS = [
    (5.0, "A man is playing a guitar.", "A man plays the guitar."),
    (4.2, "The bank approved my loan.", "My loan application was approved by the bank."),
    (2.5, "A woman is slicing onions.", "A woman is cooking dinner."),
    (1.0, "The cat sleeps on the sofa.", "Interest rates went up today."),
    (0.2, "Stars shine at night.", "I bought new running shoes."),
]


def test_every_eval_report_has_its_rows_under_results(tmp_path):
    p = tmp_path / "sts.tsv"
    p.write_text("score\tsentence1\tsentence2\n" + "".join(f"{a}\t{b}\t{c}\n" for a, b, c in STS))
    r = _eval("--pairs", p, "--pooling", "cls,mean", "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert {"dataset", "split", "results", "settings", "seconds"} <= set(rep)
    assert rep["dataset"] == rep["pairs_file"] == str(p) and rep["split"] is None
    assert [row["pooling"] for row in rep["results"]] == ["cls", "mean"]
    assert rep["results"][1]["spearman"] > 80 and rep["results"][1]["pairs"] == 5
    assert rep["settings"]["precision"] == "fp32" and rep["settings"]["model_fingerprint"]
    assert rep["pairs"]["results"] == rep["results"]  # the earlier layout, kept as an alias
    r = _eval("--pairs", p, "--pooling", "mean")
    assert r.exit_code == 0, r.output
    assert f"pairs: {p}" in r.output and "spearman" in r.output

    # a dataset and pairs together: one list of rows, each table in the text
    ds = write_beir(tmp_path / "ds")
    r = _eval(ds, "--split", "train", "--pairs", p, "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["dataset"] == str(ds) and rep["pairs_file"] == str(p)
    assert [("spearman" in row, row["pooling"]) for row in rep["results"]] == [(False, "mean"), (True, "mean")]
    r = _eval(ds, "--split", "train", "--pairs", p)
    assert r.exit_code == 0, r.output
    assert "ndcg@10" in r.output and f"pairs: {p}" in r.output and "spearman" in r.output


def test_the_python_report_has_the_same_layout(tmp_path):
    import semsearch
    from semsearch.errors import InputError

    p = tmp_path / "sts.csv"
    p.write_text("score,sentence1,sentence2\n" + "".join(f'{a},"{b}","{c}"\n' for a, b, c in STS))
    rep = semsearch.evaluate(pairs=p, precision="fp32", device="cpu")
    assert rep["results"][0]["pooling"] == "mean" and rep["notes"] == []
    with pytest.raises(InputError):
        semsearch.evaluate()
