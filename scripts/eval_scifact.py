"""Full SciFact evaluation for every pooling (one encoder pass), written to a file.

    python scripts/eval_scifact.py                      # default precision, writes results/scifact_eval.{md,json}
    python scripts/eval_scifact.py --precision fp32     # the reference arithmetic

Reference (exact search, all-MiniLM-L6-v2, 256 tokens): nDCG@10 mean 64.51, cls 60.63, max 45.71.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
REFERENCE = {"mean": 64.51, "cls": 60.63, "max": 45.71}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "beir" / "scifact"))
    ap.add_argument("--split", default="test")
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--head", default=None, help="also evaluate a trained head folder")
    ap.add_argument("--out", default=str(REPO / "results" / "scifact_eval"))
    args = ap.parse_args()

    from semsearch.encoder import Encoder
    from semsearch.eval import evaluate_beir, format_table, load_beir

    t0 = time.perf_counter()
    head = None
    poolings = ["cls", "mean", "max"]
    if args.head:
        from semsearch.encoder.heads import head_info, load_head

        head = load_head(args.head)
        poolings.append("head")
    enc = Encoder(precision=args.precision, head=head)
    if head is not None:
        enc.head_info = head_info(args.head)
    rep = evaluate_beir(load_beir(args.data, args.split), enc, poolings, ks=[10, 100], progress=True)
    for row in rep.rows:
        ref = REFERENCE.get(row["pooling"])
        if ref is not None:
            row["reference_ndcg@10"] = ref
            row["delta"] = round(row["ndcg@10"] - ref, 2)
    wall = time.perf_counter() - t0
    cols = ["pooling", "ndcg@10", "recall@100", "mrr@10", "map@10", "reference_ndcg@10", "delta"]
    table = format_table([{k: r.get(k, "") for k in cols} for r in rep.rows])
    text = (f"SciFact {args.split}, exact search, {rep.settings['model']} ({rep.settings['model_fingerprint']}), "
            f"precision {rep.settings['precision']}, max length {rep.settings['max_length']}\n\n{table}\n\n"
            f"encode: {rep.seconds}\nwall time: {wall:.1f} s\n")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps({**rep.to_dict(), "wall_s": round(wall, 1)}, indent=2))
    print(text)


if __name__ == "__main__":
    main()
