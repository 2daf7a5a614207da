"""Where trained query layers change hybrid search, query by query, on SciFact's test queries about
documents the training never saw (their relevant documents are no train-split positive).

    python scripts/train_headroom.py --index results/scifact_work/index --head results/head_default

Needs the index `scripts/train_scifact.py` builds (exact search over each document's first-chunk
vector, BM25 over each document's text, fused as `semsearch query` fuses) and a trained head.
Prints nDCG@10 per mode, how many queries the head moves in hybrid, and what the dense side does on
the queries hybrid does not already get right: the room a query-side head has to work in.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "beir" / "scifact"))
    ap.add_argument("--index", required=True, type=Path)
    ap.add_argument("--head", required=True, type=Path)
    args = ap.parse_args()

    import numpy as np

    from semsearch.encoder import Encoder
    from semsearch.encoder.heads import load_head
    from semsearch.eval import exact_search, hybrid_run, load_beir, read_qrels, to_run
    from semsearch.fusion import ALPHA
    from semsearch.store.lexical import LexicalIndex
    from semsearch.store.manifest import Manifest
    from semsearch.training.data import PairData
    from semsearch.training.query_tower import index_vectors

    test = load_beir(args.data, "test")
    m = Manifest.load(args.index)
    enc = Encoder(precision=m.precision)
    dvec, _ = index_vectors(args.index, PairData([], test.doc_texts, {}, passage_ids=test.doc_ids), enc)
    trained = Encoder(precision=m.precision, head=load_head(args.head, enc.fingerprint))
    train_docs = {d for q in read_qrels(Path(args.data) / "qrels" / "train.tsv").values() for d, r in q.items() if r > 0}
    unseen = sorted(q for q, r in test.qrels.items() if not any(d in train_docs for d, v in r.items() if v > 0))
    lex = LexicalIndex.from_texts(test.doc_texts)

    def ndcg10(run: dict, q: str) -> float:
        rel = test.qrels[q]
        ranked = sorted(run.get(q, {}).items(), key=lambda x: -x[1])[:10]
        ideal = sum(r / math.log2(i + 2) for i, r in enumerate(sorted(rel.values(), reverse=True)[:10]))
        return sum(rel.get(d, 0) / math.log2(i + 2) for i, (d, _) in enumerate(ranked)) / ideal if ideal else 0.0

    per: dict[str, np.ndarray] = {}
    for name, qv in (("base", enc.encode(test.query_texts, progress=False)), ("trained", trained.encode_queries(test.query_texts))):
        s, i = exact_search(qv, dvec, 100)
        runs = {"dense": to_run(test.query_ids, test.doc_ids, s, i),
                "bm25": hybrid_run(test, qv, dvec, s, i, lex, 100, "convex", 0.0),
                "hybrid": hybrid_run(test, qv, dvec, s, i, lex, 100, "convex", ALPHA)}
        for mode, run in runs.items():
            per[f"{mode} {name}"] = np.array([ndcg10(run, q) for q in unseen])
    print(f"{len(unseen)} test queries about documents the training never saw; nDCG@10:")
    for k in ("bm25 base", "dense base", "dense trained", "hybrid base", "hybrid trained"):
        print(f"  {k:15s} {100 * per[k].mean():6.2f}")
    hb, ht, db, dt = per["hybrid base"], per["hybrid trained"], per["dense base"], per["dense trained"]
    eps = 1e-9
    print(f"hybrid, trained against base: {(ht > hb + eps).sum()} better, {(ht < hb - eps).sum()} worse, "
          f"{(abs(ht - hb) <= eps).sum()} unchanged")
    perfect = hb >= 1 - eps
    rest = ~perfect
    print(f"base hybrid already perfect on {perfect.sum()}; on the other {rest.sum()} (of which {(hb == 0).sum()} at 0):")
    print(f"  dense base {100 * db[rest].mean():.2f}, dense trained {100 * dt[rest].mean():.2f}, bm25 {100 * per['bm25 base'][rest].mean():.2f}; "
          f"trained dense better on {(dt[rest] > db[rest] + eps).sum()}, worse on {(dt[rest] < db[rest] - eps).sum()}")
    gain = (dt - db).sum() / len(unseen) * 100
    gain_rest = (dt - db)[rest].sum() / len(unseen) * 100
    print(f"  of the dense gain ({gain:+.2f} nDCG@10 points over all {len(unseen)}), {gain_rest:+.2f} falls on those {rest.sum()}")
    best = np.maximum.reduce(list(per.values()))
    print(f"best of these rankings, chosen per query with the answers known: {100 * best.mean():.2f}")


if __name__ == "__main__":
    main()
