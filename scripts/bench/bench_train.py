"""Time and peak memory of `semsearch train` on 2,600 queries x 3,600 documents, after an index
of the documents exists (the target: <= 5 minutes, <= 1.5 GB on 2 cores without AMX).

    python scripts/bench/bench_train.py --precision fp32      # needs results/scifact_work/index (scripts/train_scifact.py)

The training set is simulated from SciFact: 3,600 documents of its corpus (every document judged
for a train query, then others), 2,600 queries (the train queries repeated, each copy with a
suffix so that every query is encoded), and by default 42 extra random positives per query, like
a dataset with ~43 positives a query. With the default (trained query layers) the documents'
vectors come from the index and each document's title is a pseudo-query (3,600 more queries);
with `-- --train-layers 0` (pooling head) the index must have kept token states. Everything
about the queries is computed in the timed run (fresh cache). The same-run baseline is what the
trainer used to do first: encode the 3,600 documents (timed on a sample, scaled).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def make_dataset(src: Path, out: Path, n_queries: int, n_docs: int, extra_pos: int, seed: int = 0) -> None:
    import numpy as np

    from semsearch.eval import read_qrels

    rng = np.random.default_rng(seed)
    qrels = read_qrels(src / "qrels" / "train.tsv")
    corpus = [json.loads(line) for line in open(src / "corpus.jsonl", encoding="utf-8")]
    judged = {d for r in qrels.values() for d in r}
    docs = [c for c in corpus if c["_id"] in judged]
    others = [c for c in corpus if c["_id"] not in judged]
    docs += [others[i] for i in rng.permutation(len(others))[: max(0, n_docs - len(docs))]]
    ids = [c["_id"] for c in docs]
    queries = {json.loads(line)["_id"]: json.loads(line)["text"] for line in open(src / "queries.jsonl", encoding="utf-8")}
    base = [q for q in qrels if q in queries]
    out.mkdir(parents=True)
    (out / "qrels").mkdir()
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as fh:
        for c in docs:
            fh.write(json.dumps(c) + "\n")
    with open(out / "queries.jsonl", "w", encoding="utf-8") as qf, open(out / "qrels" / "train.tsv", "w", encoding="utf-8") as rf:
        rf.write("query-id\tcorpus-id\tscore\n")
        for n in range(n_queries):
            q = base[n % len(base)]
            qid = f"{q}-{n // len(base)}"
            qf.write(json.dumps({"_id": qid, "text": queries[q] + ("" if n < len(base) else f" ({n // len(base)})")}) + "\n")
            pos = set(qrels[q]) | {ids[i] for i in rng.choice(len(ids), extra_pos, replace=False)} if extra_pos else set(qrels[q])
            for d in sorted(pos):
                rf.write(f"{qid}\t{d}\t1\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "beir" / "scifact"))
    ap.add_argument("--index", default=str(REPO / "results" / "scifact_work" / "index"))
    ap.add_argument("--work", default=str(REPO / "results" / "bench_train"))
    ap.add_argument("--queries", type=int, default=2600)
    ap.add_argument("--docs", type=int, default=3600)
    ap.add_argument("--extra-positives", type=int, default=42)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--sample-docs", type=int, default=150, help="documents encoded for the same-run baseline")
    ap.add_argument("train_args", nargs="*", help="extra `semsearch train` options (after --)")
    args = ap.parse_args()
    if not (Path(args.index) / "manifest.json").exists():
        sys.exit(f"{args.index}: build it first (python scripts/train_scifact.py --precision fp32)")
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    make_dataset(Path(args.data), work / "data", args.queries, args.docs, args.extra_positives)

    cmd = [sys.executable, "-m", "semsearch.cli", "train", "--beir", str(work / "data"), "--index", args.index,
           "--out", str(work / "head"), "--cache", str(work / "cache"), "--precision", args.precision, "--no-progress", "--force", *args.train_args]
    load0 = os.getloadavg()[0]
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t
    rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(r.stderr[-3000:], r.stdout[-2000:])
    if r.returncode:
        sys.exit(f"train failed ({r.returncode})")

    # Same-run baseline: encoding the documents, as the trainer did before taking states from an index.
    from semsearch.encoder import Encoder

    docs = [json.loads(line) for line in open(work / "data" / "corpus.jsonl", encoding="utf-8")][: args.sample_docs]
    enc = Encoder(precision=args.precision)
    enc.encode(["warm up"])
    t = time.perf_counter()
    enc.encode([f"{d.get('title', '')} {d.get('text', '')}".strip() for d in docs], progress=False)
    per_doc = (time.perf_counter() - t) / len(docs)
    baseline = per_doc * args.docs
    cpu = open("/proc/cpuinfo").read()
    flags = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f" {f}" in cpu]
    m = json.loads((work / "head" / "head.json").read_text())["metrics"]
    text = (f"train on {args.queries} queries x {args.docs} documents (+{args.extra_positives} random positives a query), "
            f"{args.precision}, {os.cpu_count()} cores, CPU flags {' '.join(flags)}, load average at start {load0:.1f}\n"
            f"  whole `semsearch train` command: {wall:.1f} s ({', '.join(f'{k} {v} s' for k, v in m['seconds'].items())}, "
            f"{len(m['history'])} dev checks, best after epoch {m['best_epoch']}), peak RSS {rss_mb:.0f} MB\n"
            f"  same-run baseline, encoding the {args.docs} documents alone (from {len(docs)} timed): {baseline:.1f} s "
            f"-> the whole training command takes {wall / baseline:.2f} x that\n"
            f"  dev split: {m['dev_split']} ({m['dev_queries']} dev queries) {m.get('dev_split_note', '')}\n")
    print(text)
    Path(REPO / "results").mkdir(exist_ok=True)
    (REPO / "results" / "bench_train.md").write_text(text)


if __name__ == "__main__":
    main()
