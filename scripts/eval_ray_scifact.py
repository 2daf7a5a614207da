"""SciFact nDCG@10 of an index built with the Ray engine against one built with the local engine.

    python scripts/eval_ray_scifact.py                          # the whole test split (5,183 documents)
    python scripts/eval_ray_scifact.py --queries 60 --docs 600  # a subset: its judged documents + others

Both indexes are built from the same corpus file (fp32 on the CPU, --text-column title,text, so
chunks carry the BEIR text) and evaluated as built (`semsearch eval --index`); the script also
checks that both hold the same chunks with the same ids, and the largest vector difference.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent


def chunks(folder: Path):
    from semsearch.store.folder import open_index
    from semsearch.store.manifest import Manifest
    from semsearch.store.segments import read_rows

    rows = list(read_rows(folder, Manifest.load(folder), "f.path, c.row, c.ord, c.start, c.end, c.text"))  # every segment
    docs = open_index(folder)[2]
    ids, vecs = docs.get_vectors([r[0] for r in rows])
    docs.close()
    return rows, vecs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "beir" / "scifact"))
    ap.add_argument("--queries", type=int, default=None)
    ap.add_argument("--docs", type=int, default=None)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "results" / "eval_ray_scifact.json"))
    args = ap.parse_args()

    import ray

    from semsearch import eval as ev
    from semsearch.corpus import ReadOptions
    from semsearch.encoder import Encoder
    from semsearch.engines.ray_engine import RayEngine
    from semsearch.indexing import index_corpus
    from semsearch.search import Retriever

    data = ev.load_beir(args.data, "test")
    if args.queries or args.docs:
        data = data.subset(args.queries, args.docs)
    keep = set(data.doc_ids)
    enc = Encoder(device="cpu", precision="fp32")
    report = {"queries": len(data.query_ids), "docs": len(keep)}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus"
        corpus.mkdir()
        with open(Path(args.data) / "corpus.jsonl") as src, open(corpus / "corpus.jsonl", "w") as dst:
            for line in src:
                if json.loads(line)["_id"] in keep:
                    dst.write(line)
        read = ReadOptions(text_column="title,text")
        ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
        for name, engine in (("ray", RayEngine(workers=args.workers)), ("local", None)):
            t = time.perf_counter()
            rep = index_corpus(corpus, Path(tmp) / name, enc, read=read, progress=False, engine=engine)
            secs = time.perf_counter() - t
            ndcg = ev.evaluate_index(data, Retriever.load(Path(tmp) / name, encoder=enc)).to_dict()
            report[name] = {"seconds": round(secs, 1), "chunks": rep.chunks, "results": ndcg["results"]}
            print(name, report[name]["seconds"], "s", flush=True)
        ray.shutdown()
        (ra, va), (rl, vl) = chunks(Path(tmp) / "ray"), chunks(Path(tmp) / "local")
        report["same_chunks_and_ids"] = ra == rl
        report["max_abs_vector_diff"] = float(np.abs(va - vl).max())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
