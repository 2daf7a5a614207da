"""Reproduce the pooling-head figures on SciFact: train on `train`, report on `test`.

    python scripts/train_scifact.py --precision fp32        # writes results/train_scifact.{md,json}
    python scripts/train_scifact.py --reuse-index           # skip step 1 when the index exists
    python scripts/train_scifact.py -- --projection none    # anything after -- goes to `semsearch train`

Steps (each timed): (1) index the SciFact corpus with kept token states (the "first indexing");
(2) `semsearch train --index` on the train split: passages' token states come from that index, so
only the queries are encoded (the test split is never read); (3) evaluate mean pooling vs the head
on test, from the index's kept states (each document's first chunk = the document truncated at
256 tokens, as the BEIR evaluation encodes it), overall and on the test queries whose relevant
documents were never training positives; (4) re-pool the index with the head (no transformer pass).
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "beir" / "scifact"))
    ap.add_argument("--work", default=str(REPO / "results" / "scifact_work"))
    ap.add_argument("--out", default=str(REPO / "results" / "train_scifact"))
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--reuse-index", action="store_true", help="keep an existing index of the work folder")
    ap.add_argument("train_args", nargs="*", help="extra `semsearch train` options (after --)")
    args = ap.parse_args()
    work = Path(args.work)
    head, index, cache = work / "head", work / "index", work / "cache"
    prec = ["--precision", args.precision]
    t_index = None
    if not (args.reuse_index and (index / "manifest.json").exists()):
        if work.exists():
            shutil.rmtree(work)
        (work / "corpus").mkdir(parents=True)
        shutil.copy(Path(args.data) / "corpus.jsonl", work / "corpus" / "corpus.jsonl")
        t_index, _ = sh("index", str(work / "corpus"), "--index", str(index), "--keep-states", "--text-column", "title,text", "--no-progress", *prec)
    shutil.rmtree(head, ignore_errors=True)
    t_train, rc = sh("train", "--beir", args.data, "--split", "train", "--index", str(index), "--out", str(head),
                     "--cache", str(cache), "--no-progress", *prec, *args.train_args, check=False)
    saved = (head / "head.json").exists()

    import numpy as np
    import torch

    from semsearch.encoder import Encoder
    from semsearch.encoder.pooling import mean_pool
    from semsearch.eval import exact_search, format_table, load_beir, read_qrels, to_run, trec_metrics
    from semsearch.train.head import load_head
    from semsearch.train.index_states import passage_states
    from semsearch.train.states import StateCache

    test = load_beir(args.data, "test")
    enc = Encoder(precision=args.precision)
    t = time.perf_counter()
    docs = passage_states(index, test.doc_texts, test.doc_ids, enc).passages
    queries = StateCache.build(enc, test.query_texts, progress=False)
    poolings = {"mean": mean_pool}
    if saved:
        poolings["head"] = load_head(head)
    train_docs = {d for q in read_qrels(Path(args.data) / "qrels" / "train.tsv").values() for d, r in q.items() if r > 0}
    seen = {q: r for q, r in test.qrels.items() if any(d in train_docs for d, v in r.items() if v > 0)}
    unseen = {q: r for q, r in test.qrels.items() if q not in seen}
    rows = []
    for name, fn in poolings.items():
        with torch.no_grad():
            s, i = exact_search(queries.pool_all(fn), docs.pool_all(fn), 100)
        run = to_run(test.query_ids, test.doc_ids, s, i)
        m = trec_metrics(test.qrels, run, [10, 100])
        rows.append({"pooling": name, "ndcg@10": round(m["ndcg@10"], 2), "recall@100": round(m["recall@100"], 2),
                     f"ndcg@10 seen-docs ({len(seen)} q)": round(trec_metrics(seen, run, [10])["ndcg@10"], 2),
                     f"ndcg@10 unseen-docs ({len(unseen)} q)": round(trec_metrics(unseen, run, [10])["ndcg@10"], 2)})
    t_eval = time.perf_counter() - t
    t_repool = None
    if saved:
        t_repool, _ = sh("index", str(work / "corpus"), "--index", str(index), "--head", str(head), "--no-progress", *prec)
    cfg = json.loads((head / "head.json").read_text()) if saved else None
    lines = [f"SciFact: head trained on `train` ({' '.join(args.train_args) or 'default options'}), evaluated on `test` (exact search, {enc.precision})",
             "", format_table(rows), ""]
    if cfg:
        met = cfg["metrics"]
        lines.append("dev (train queries on held-out documents): " + json.dumps({k: v for k, v in met.items() if k not in ("history",)}))
    else:
        lines.append(f"no head saved: `semsearch train` refused it (exit {rc}); the table shows mean pooling only")
    if t_index is not None:
        lines.append(f"first indexing (encode + keep states): {t_index:.1f} s")
    lines.append(f"train command (passage states from the index; queries encoded): {t_train:.1f} s")
    if t_repool is not None:
        lines.append(f"re-pool the index with the head (whole command): {t_repool:.1f} s" + (f" = {t_repool / t_index:.3f} x first indexing" if t_index else ""))
    lines.append(f"test evaluation from kept states (encode 300 queries, pool, search): {t_eval:.1f} s")
    text = "\n".join(lines) + "\n"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps({"rows": rows, "head": cfg, "train_args": args.train_args, "seconds": {
        "first_index": t_index, "train": t_train, "repool": t_repool, "eval": t_eval}}, indent=2))
    print(text)


if __name__ == "__main__":
    main()
