"""Choose hybrid search's fusion and weight on SciFact *train* queries, then report test once.

    python scripts/tune_hybrid.py [--data ../shared/data/beir/scifact] [--cache results/scifact_mean_fp32.npz]

Dense side: exact search, mean pooling, fp32 (the reference setting); lexical side: the BM25
index of semsearch.store.lexical over the full document text. The grid (convex alpha 0.1..0.9,
and RRF) is searched on the train split only; the chosen setting and every other row are then
reported on test, so the README can show what the choice costs or gains there. Writes
results/tune_hybrid.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ALPHAS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared/data/beir/scifact"))
    ap.add_argument("--cache", default="results/scifact_mean_fp32.npz", help="doc/query vectors (written if missing)")
    ap.add_argument("--out", default="results/tune_hybrid.json")
    args = ap.parse_args()

    from semsearch import fusion
    from semsearch.eval import exact_search, hybrid_run, load_beir, to_run, trec_metrics
    from semsearch.store.lexical import LexicalIndex

    train, test = load_beir(args.data, "train"), load_beir(args.data, "test")
    assert train.doc_ids == test.doc_ids
    cache = Path(args.cache)
    if cache.exists():
        z = np.load(cache)
        docs, q_train, q_test = z["docs"], z["q_train"], z["q_test"]
    else:
        from semsearch.encoder import Encoder

        enc = Encoder(precision="fp32", device="cpu")
        docs = enc.encode(test.doc_texts, progress=True)
        q_train, q_test = enc.encode(train.query_texts, progress=False), enc.encode(test.query_texts, progress=False)
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.savez(cache, docs=docs, q_train=q_train, q_test=q_test)
    t = time.perf_counter()
    lex = LexicalIndex.from_texts(test.doc_texts)
    print(f"lexical index: {len(lex)} documents in {time.perf_counter() - t:.1f} s")

    settings = [("convex", a) for a in ALPHAS] + [("rrf", None)]
    table: dict[str, dict] = {}
    for split, data, qv in (("train", train, q_train), ("test", test, q_test)):
        scores, idx = exact_search(qv, docs, 100)
        row = {"dense": trec_metrics(data.qrels, to_run(data.query_ids, data.doc_ids, scores, idx), [10, 100], data.zero_queries)}
        lrun = {q: {data.doc_ids[i]: s for i, s in lex.search(qt, 100) if data.doc_ids[i] != q}
                for q, qt in zip(data.query_ids, data.query_texts)}
        row["lexical"] = trec_metrics(data.qrels, lrun, [10, 100], data.zero_queries)
        for f, a in settings:
            run = hybrid_run(data, qv, docs, scores, idx, lex, 100, f, a if a is not None else fusion.ALPHA)
            row[f"{f} {a}" if a is not None else f] = trec_metrics(data.qrels, run, [10, 100], data.zero_queries)
        table[split] = {k: {m: round(v, 2) for m, v in r.items() if m in ("ndcg@10", "recall@100")} for k, r in row.items()}
    best = max((k for k in table["train"] if k not in ("dense", "lexical")), key=lambda k: table["train"][k]["ndcg@10"])
    print(f"{'setting':<12} {'train nDCG@10':>14} {'test nDCG@10':>13} {'test R@100':>11}")
    for k in table["train"]:
        mark = "  <- chosen on train" if k == best else ""
        print(f"{k:<12} {table['train'][k]['ndcg@10']:>14.2f} {table['test'][k]['ndcg@10']:>13.2f} {table['test'][k]['recall@100']:>11.2f}{mark}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"chosen_on_train": best, "depth": fusion.DEPTH, "table": table}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
