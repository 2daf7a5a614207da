"""Query latency: a one-shot `semsearch query` process, and Retriever.search in a long-lived one,
each against the sentence-transformers + faiss baseline, in the same run.

    python scripts/bench/bench_query.py [--index DIR] [--runs 7]

Without --index it builds (once) an index of the SciFact corpus in results/bench_scifact_index.
An index with trained query layers (`semsearch index CORPUS --index DIR --head HEAD`) is timed the
same way: its queries go through the trained layers (report: "query_layers": true).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]

BASELINE = r"""
import sys, json, faiss, numpy as np
from sentence_transformers import SentenceTransformer
model = SentenceTransformer(sys.argv[1], device="cpu")
index = faiss.read_index(sys.argv[2])
q = model.encode([sys.argv[3]], normalize_embeddings=True)
scores, ids = index.search(np.asarray(q, dtype="float32"), 10)
print(json.dumps({"ids": ids[0].tolist(), "scores": scores[0].tolist()}))
"""


def wall(cmd: list[str], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, cwd=REPO)
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "beir" / "scifact"))
    ap.add_argument("--index", default=None)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--out", default=str(REPO / "results" / "bench_query.json"))
    ap.add_argument("--precision", default=None, help="query encoder of the long-lived process (default: as Retriever.load picks)")
    args = ap.parse_args()

    index = Path(args.index) if args.index else REPO / "results" / "bench_scifact_index"
    if not (index / "manifest.json").exists():
        corpus = REPO / "results" / "bench_scifact_corpus"
        corpus.mkdir(parents=True, exist_ok=True)
        (corpus / "corpus.jsonl").write_bytes((Path(args.data) / "corpus.jsonl").read_bytes())
        subprocess.run([sys.executable, "-m", "semsearch.cli", "index", str(corpus), "--index", str(index), "--no-progress"], check=True, cwd=REPO)
    manifest = json.loads((index / "manifest.json").read_text())
    segs = manifest.get("segments") or [{"vectors": manifest["files"]["vectors"]}]  # format 2, or format 1
    if len(segs) != 1:
        sys.exit(f"{index} has {len(segs)} segments; the baseline searches one FAISS file: run `semsearch compact --index {index}`")
    vectors_file = index / segs[0]["vectors"]
    queries = [json.loads(line)["text"] for line in open(Path(args.data) / "queries.jsonl")][: args.queries]
    q = "What causes antibiotic resistance in bacteria?"

    from semsearch.encoder.models import default_model_path

    semsearch_cmd = [sys.executable, "-m", "semsearch.cli", "query", q, "--index", str(index), "-k", "10", "--mode", "dense"]
    baseline_cmd = [sys.executable, "-c", BASELINE, str(default_model_path()), str(vectors_file), q]
    # Interleave the two so that machine noise hits both alike.
    ours, base = [], []
    for _ in range(args.runs):
        ours += wall(semsearch_cmd, 1)
        base += wall(baseline_cmd, 1)

    from semsearch.search import Retriever, encode_queries

    enc = None
    if args.precision:
        from semsearch.encoder import Encoder

        enc = Encoder(manifest["model"], pooling=manifest["pooling"], max_length=manifest["max_length"], precision=args.precision)
    r = Retriever.load(index, encoder=enc)
    for x in queries[:10]:
        r.search(x, k=10, mode="dense")
        r.search(x, k=10, mode="hybrid")
    lat, enc, srch, hyb = [], [], [], []
    for x in queries:  # dense and hybrid interleaved, query by query
        t = time.perf_counter()
        r.search(x, k=10, mode="dense")
        lat.append(time.perf_counter() - t)
        t = time.perf_counter()
        r.search(x, k=10, mode="hybrid")
        hyb.append(time.perf_counter() - t)
    for x in queries:  # where the time goes: encoding, then FAISS + docstore
        t = time.perf_counter()
        v = encode_queries(r.encoder, [x])
        t1 = time.perf_counter()
        r.search_vectors(v, 10)
        enc.append(t1 - t)
        srch.append(time.perf_counter() - t1)

    import faiss
    import numpy as np
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(default_model_path()), device="cpu")
    fi = faiss.read_index(str(vectors_file))
    for x in queries[:10]:
        fi.search(st.encode([x], normalize_embeddings=True).astype(np.float32), 10)
    blat = []
    for x in queries:
        t = time.perf_counter()
        fi.search(st.encode([x], normalize_embeddings=True).astype(np.float32), 10)
        blat.append(time.perf_counter() - t)

    ms = lambda v: round(1000 * v, 2)  # noqa: E731
    from semsearch.encoder.hardware import cpu_flags

    report = {
        "cpu_flags": sorted(f for f in cpu_flags() if f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")),
        "query_encoder_precision": r.encoder.precision,
        "query_layers": (manifest.get("head") or {}).get("kind") == "query-layers",
        "index": str(index), "chunks": manifest["counts"]["chunks"], "index_type": manifest["index"]["type"],
        "new_process": {"semsearch_median_s": round(statistics.median(ours), 3), "baseline_median_s": round(statistics.median(base), 3),
                        "speedup": round(statistics.median(base) / statistics.median(ours), 2), "runs": args.runs,
                        "semsearch_all_s": [round(x, 3) for x in ours], "baseline_all_s": [round(x, 3) for x in base]},
        "long_lived": {"semsearch_p50_ms": ms(statistics.median(lat)), "semsearch_p95_ms": ms(sorted(lat)[int(0.95 * len(lat))]),
                       "baseline_p50_ms": ms(statistics.median(blat)), "baseline_p95_ms": ms(sorted(blat)[int(0.95 * len(blat))]),
                       "speedup_p50": round(statistics.median(blat) / statistics.median(lat), 2), "queries": len(lat),
                       "encode_p50_ms": ms(statistics.median(enc)), "faiss_and_docstore_p50_ms": ms(statistics.median(srch)),
                       "hybrid_p50_ms": ms(statistics.median(hyb)),
                       "hybrid_minus_dense_p50_ms": ms(statistics.median(hyb) - statistics.median(lat))},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
