"""Reproduce the training figures on SciFact: train on `train`, report on `test`.

    python scripts/train_scifact.py --precision fp32        # writes results/train_scifact.{md,json}
    python scripts/train_scifact.py --reuse-index           # skip step 1 when the index exists
    python scripts/train_scifact.py -- --train-layers 0     # anything after -- goes to `semsearch train`
    python scripts/train_scifact.py --reuse-index --pairs-sample 50 --sample-seed 1   # 50 labelled pairs of train
    python scripts/train_scifact.py --data ../shared/data/beir/nfcorpus --work results/nfcorpus_work   # another BEIR set
    python scripts/train_scifact.py --reuse-index --no-labels      # no qrels: the corpus's pseudo-queries only

Steps (each timed):
(1) index the SciFact corpus (`--text-column title,text`, so each document's first chunk is the
    document truncated at 256 tokens, as the BEIR evaluation encodes it);
(2) `semsearch train --index` on the train split (the test split is never read): the documents'
    vectors come from the index, so only the queries are encoded;
(3) evaluate the base model against the trained query layers on test, exact search over the
    index's vectors of each document's first chunk, dense and hybrid (BM25 over each document's
    text, fused as `semsearch query` fuses): overall, on the test queries whose relevant
    documents were never positives of the train split ("unseen"), and on the rest;
(4) `semsearch index --head` on the index: records the head; no document is re-encoded
    (--no-index-head skips it: an index copied to another work folder names its corpus's old path).
The .json also holds the gate's verdict ("gate": improved_on_dev, the dev gain and its standard
error, within_noise) and the run's data options, for scripts/gpu_train_sweep.py.
With `-- --train-layers 0` (a pooling head), step 1 keeps token states and step 3 re-pools them.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def sh(*args: str, check: bool = True) -> tuple[float, int]:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "semsearch.cli", *args], cwd=REPO)
    if check and r.returncode:
        sys.exit(f"semsearch {args[0]} failed ({r.returncode})")
    return time.perf_counter() - t, r.returncode


def sample_pairs(data: Path, out: Path, n: int, seed: int) -> Path:
    """A copy of the BEIR folder `data` whose train qrels are n of its (query, document) pairs
    drawn at random (seed); corpus, queries and the other splits are links to the originals."""
    import random

    lines = (data / "qrels" / "train.tsv").read_text().replace("\r\n", "\n").splitlines()
    header, pairs = lines[0], [ln for ln in lines[1:] if ln.strip()]
    if n > len(pairs):
        sys.exit(f"--pairs-sample {n}: the train split has {len(pairs)} pairs")
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    for name in ("corpus.jsonl", "queries.jsonl"):
        if not (out / name).exists():
            (out / name).symlink_to((data / name).resolve())
    for split in (data / "qrels").iterdir():
        if split.name != "train.tsv" and not (out / "qrels" / split.name).exists():
            (out / "qrels" / split.name).symlink_to(split.resolve())
    (out / "qrels" / "train.tsv").write_text("\n".join([header] + random.Random(seed).sample(pairs, n)) + "\n")
    return out


def gate_verdict(cfg: dict | None, rc: int) -> dict:
    """What `semsearch train`'s dev gate said of the saved head (head.json): improved_on_dev, the dev
    gain, its paired standard error and the best-of-checks p value, and whether that gain is within
    its noise (query_tower's TowerResult.within_noise: 0 < gain and (gain <= NOISE_Z x se or
    p > GATE_P)). With --force a head is saved either way."""
    from semsearch.training.query_tower import GATE_P, NOISE_Z

    if not cfg:
        return {"saved": False, "train_exit": rc}
    met = cfg.get("metrics", {})
    gain = met.get("dev_gain") or {}
    rank = met.get("ranked_by") or met.get("gate")
    return {"saved": True, "train_exit": rc, "improved_on_dev": cfg.get("improved_on_dev"), "dev_gain": gain or None,
            "within_noise": bool(gain) and 0 < gain["gain"] and (gain["gain"] <= NOISE_Z * gain["se"] or gain.get("p", 0) > GATE_P),
            "ranked_by": rank,
            "dev_base": met.get(f"{rank}_ndcg@10_base"), "dev_head": met.get(f"{rank}_ndcg@10_head"),
            "best_epoch": met.get("best_epoch"), "dev_queries": met.get("dev_queries"), "dev_split": met.get("dev_split")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "beir" / "scifact"))
    ap.add_argument("--work", default=str(REPO / "results" / "scifact_work"))
    ap.add_argument("--out", default=str(REPO / "results" / "train_scifact"))
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--reuse-index", action="store_true", help="keep an existing index of the work folder")
    ap.add_argument("--pairs-sample", type=int, default=0,
                    help="train on this many (query, document) pairs drawn from the train qrels (0: all), as a user with few labels")
    ap.add_argument("--sample-seed", type=int, default=0, help="the draw of --pairs-sample")
    ap.add_argument("--no-labels", action="store_true",
                    help="train on the index alone (`semsearch train` without --beir: pseudo-queries from the corpus); test as usual")
    ap.add_argument("--no-index-head", action="store_true", help="skip step 4 (`semsearch index --head`)")
    ap.add_argument("train_args", nargs="*", help="extra `semsearch train` options (after --)")
    args = ap.parse_args()
    if args.no_labels and args.pairs_sample:
        sys.exit("--no-labels trains on no pairs: drop --pairs-sample")
    dataset = Path(args.data).resolve().name  # before --pairs-sample points args.data at the sample
    if args.pairs_sample:
        args.data = str(sample_pairs(Path(args.data), Path(f"{args.work}-pairs-{args.pairs_sample}-{args.sample_seed}"),
                                     args.pairs_sample, args.sample_seed))
    work = Path(args.work)
    head, index, cache = work / "head", work / "index", work / "cache"
    prec = ["--precision", args.precision]
    pooling_head = any(a in ("--train-layers=0",) for a in args.train_args) or any(
        a == "--train-layers" and b == "0" for a, b in zip(args.train_args, args.train_args[1:]))
    t_index = None
    if not (args.reuse_index and (index / "manifest.json").exists()):
        if work.exists():
            shutil.rmtree(work)
        (work / "corpus").mkdir(parents=True)
        shutil.copy(Path(args.data) / "corpus.jsonl", work / "corpus" / "corpus.jsonl")
        t_index, _ = sh("index", str(work / "corpus"), "--index", str(index), "--text-column", "title,text", "--no-progress",
                        *(["--keep-states"] if pooling_head else []), *prec)
    shutil.rmtree(head, ignore_errors=True)
    labels = [] if args.no_labels else ["--beir", args.data, "--split", "train"]
    t_train, rc = sh("train", *labels, "--index", str(index), "--out", str(head),
                     "--cache", str(cache), "--no-progress", *prec, *args.train_args, check=False)
    saved = (head / "head.json").exists()

    import numpy as np
    import torch

    from semsearch.encoder import Encoder
    from semsearch.eval import exact_search, format_table, load_beir, read_qrels, to_run, trec_metrics
    from semsearch.store.manifest import Manifest
    from semsearch.encoder.heads import load_head, unseen_document_queries
    from semsearch.training.query_tower import index_vectors

    test = load_beir(args.data, "test")
    m = Manifest.load(index)
    enc = Encoder(precision=m.precision)
    t = time.perf_counter()
    vectors: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    from semsearch.training.data import PairData

    docs_data = PairData([], test.doc_texts, {}, passage_ids=test.doc_ids)
    if pooling_head:
        from semsearch.encoder.pooling import mean_pool
        from semsearch.training.index_states import passage_states
        from semsearch.training.states import StateCache

        states = passage_states(index, test.doc_texts, test.doc_ids, enc).passages
        queries = StateCache.build(enc, test.query_texts, progress=False)
        with torch.no_grad():
            vectors["mean"] = (queries.pool_all(mean_pool), states.pool_all(mean_pool))
            if saved:
                h = load_head(head)
                vectors["head"] = (queries.pool_all(h), states.pool_all(h))
    else:
        dvec, found = index_vectors(index, docs_data, enc)
        vectors["base"] = (enc.encode(test.query_texts, progress=False), dvec)
        if saved:
            tuned = Encoder(precision=m.precision, head=load_head(head, enc.fingerprint))
            vectors["query layers"] = (tuned.encode_queries(test.query_texts), dvec)
    # --no-labels: no labelled positive was trained on, so every test query is about unseen documents
    train_docs = set() if args.no_labels else {
        d for q in read_qrels(Path(args.data) / "qrels" / "train.tsv").values() for d, r in q.items() if r > 0}
    unseen = {q: r for q, r in test.qrels.items() if not any(d in train_docs for d, v in r.items() if v > 0)}
    seen = {q: r for q, r in test.qrels.items() if q not in unseen}
    unseen_head = None
    if saved:
        ids = unseen_document_queries(head, test.qrels)
        unseen_head = {q: test.qrels[q] for q in ids} if ids is not None else None
    from semsearch.eval import hybrid_run
    from semsearch.fusion import ALPHA
    from semsearch.store.lexical import LexicalIndex

    lex = LexicalIndex.from_texts(test.doc_texts)
    rows = []
    for mode in ("dense", "hybrid"):
        per_q: dict[str, dict[str, dict[str, float]]] = {}  # name -> query -> nDCG@10 (for the gain's test noise)
        for name, (qv, dv) in vectors.items():
            s, i = exact_search(qv, dv, 100)
            run = to_run(test.query_ids, test.doc_ids, s, i)
            if mode == "hybrid":  # BM25 over the documents' whole text, fused as `semsearch query` fuses
                run = hybrid_run(test, qv, dv, s, i, lex, 100, "convex", ALPHA)
            per_q[name] = {}
            mt = trec_metrics(test.qrels, run, [10, 100], per_query=per_q[name])
            row = {"mode": mode, "queries": name, "ndcg@10": round(mt["ndcg@10"], 2), "recall@100": round(mt["recall@100"], 2)}
            for label, part in ((f"unseen docs ({len(unseen)} q)", unseen), (f"seen docs ({len(seen)} q)", seen)):
                # (NFCorpus: every test query has a relevant document among the train split's positives)
                row[f"ndcg@10 {label}"] = round(trec_metrics(part, run, [10])["ndcg@10"], 2) if part else "-"
            if unseen_head:
                row[f"ndcg@10 docs the head never trained on ({len(unseen_head)} q)"] = round(trec_metrics(unseen_head, run, [10])["ndcg@10"], 2)
            if len(per_q) == 2:  # the head against the base, query by query: the gain and its paired standard error
                (_, base_q), (_, head_q) = per_q.items()
                for label, part in (("", test.qrels), ("unseen docs ", unseen)):
                    if part:
                        d = np.array([head_q.get(q, {}).get("ndcg@10", 0.0) - base_q.get(q, {}).get("ndcg@10", 0.0) for q in part])
                        se = d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else float("nan")
                        row[f"test gain {label}+/- se"] = f"{d.mean():+.2f} +/- {se:.2f}"
            rows.append(row)
    t_eval = time.perf_counter() - t
    t_head = None
    if saved and not args.no_index_head:
        t_head, _ = sh("index", str(work / "corpus"), "--index", str(index), "--head", str(head), "--no-progress", *prec)
    cfg = json.loads((head / "head.json").read_text()) if saved else None
    trained_on = "the corpus's pseudo-queries (no labels)" if args.no_labels else "`train`"
    lines = [f"{Path(args.data).resolve().name}: trained on {trained_on} ({' '.join(args.train_args) or 'default options'}), evaluated on `test` "
             f"(exact search over the index's first-chunk vectors, {m.precision}; hybrid: + BM25, convex, alpha {ALPHA})", "", format_table(rows), ""]
    if cfg:
        met = cfg["metrics"]
        lines.append("dev (train queries on held-out documents): " + json.dumps({k: v for k, v in met.items() if k not in ("history",)}))
    else:
        lines.append(f"nothing saved: `semsearch train` refused it (exit {rc}); the table shows the base model only")
    if t_index is not None:
        lines.append(f"first indexing: {t_index:.1f} s")
    lines.append(f"train command (document vectors from the index; queries encoded): {t_train:.1f} s")
    if t_head is not None:
        lines.append(f"`semsearch index --head` on the index (whole command): {t_head:.1f} s" + (f" = {t_head / t_index:.3f} x first indexing" if t_index else ""))
    lines.append(f"test evaluation (encode 300 queries, search): {t_eval:.1f} s")
    text = "\n".join(lines) + "\n"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps({"rows": rows, "head": cfg, "train_args": args.train_args, "seconds": {
        "first_index": t_index, "train": t_train, "index_head": t_head, "eval": t_eval},
        "data": {"dataset": dataset, "pairs_sample": args.pairs_sample,
                 "sample_seed": args.sample_seed if args.pairs_sample else None, "no_labels": args.no_labels},
        "gate": gate_verdict(cfg, rc)}, indent=2))
    print(text)


if __name__ == "__main__":
    main()
