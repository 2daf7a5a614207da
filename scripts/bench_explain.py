"""What explain=True costs: p50 latency of Retriever.search with and without it, same queries,
same run, interleaved query by query so machine noise hits both alike.

    python scripts/bench_explain.py [--docs 2000] [--queries 200] [--reencode-queries 40]

The index (built once in results/bench_explain_index, from the first --docs SciFact documents, or
from data/sample where ../shared has no SciFact) keeps its token states (--keep-states): explaining
a hit then reads them, and encodes nothing. The same index with its kept states ignored stands
for one built without --keep-states, where each explained hit's text is encoded again; that
path is measured on the first --reencode-queries queries.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SAMPLE_QUERIES = ["how long does a personal loan decision take", "what does the underwriter check",
                  "lentil soup with cumin", "how to keep a sourdough starter alive", "when do meteor showers peak",
                  "watering tomatoes in hot weather", "ocean currents and climate", "packing light for a long trip",
                  "strength training for beginners", "why do database indexes speed up queries"]


def build(index: Path, data: Path, docs: int) -> None:
    from semsearch.encoder import Encoder
    from semsearch.indexing import index_corpus

    if (data / "corpus.jsonl").exists():
        corpus = REPO / "results" / "bench_explain_corpus"
        corpus.mkdir(parents=True, exist_ok=True)
        with open(data / "corpus.jsonl", encoding="utf-8") as src, open(corpus / "corpus.jsonl", "w", encoding="utf-8") as dst:
            for i, line in enumerate(src):
                if i >= docs:
                    break
                dst.write(line)
    else:
        corpus = REPO / "data" / "sample"
    index_corpus(corpus, index, Encoder(), progress=False, keep_states=True)


def p50(xs: list[float]) -> float:
    return round(1000 * statistics.median(xs), 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "beir" / "scifact"))
    ap.add_argument("--index", default=str(REPO / "results" / "bench_explain_index"))
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--reencode-queries", type=int, default=40)
    ap.add_argument("-k", type=int, default=10)
    ap.add_argument("--out", default=str(REPO / "results" / "bench_explain.json"))
    args = ap.parse_args()

    data, index = Path(args.data), Path(args.index)
    if not (index / "manifest.json").exists():
        build(index, data, args.docs)
    if (data / "queries.jsonl").exists():
        queries = [json.loads(line)["text"] for line in open(data / "queries.jsonl", encoding="utf-8")][: args.queries]
    else:
        queries = (SAMPLE_QUERIES * (args.queries // len(SAMPLE_QUERIES) + 1))[: args.queries]

    import semsearch.explain as explain
    from semsearch.encoder.hardware import cpu_flags
    from semsearch.search import Retriever

    r = Retriever.load(index)
    k = args.k
    for q in queries[:10]:  # warm up both paths
        for mode in ("dense", "hybrid"):
            r.search(q, k=k, mode=mode)
            r.search(q, k=k, mode=mode, explain=True)
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {f"{m}_{w}": [] for m in ("dense", "hybrid") for w in ("plain", "explain_kept")}
    states = set()
    for q in queries:
        for mode in ("dense", "hybrid"):
            t = time.perf_counter()
            r.search(q, k=k, mode=mode)
            times[f"{mode}_plain"].append(time.perf_counter() - t)
            t = time.perf_counter()
            hits = r.search(q, k=k, mode=mode, explain=True)
            times[f"{mode}_explain_kept"].append(time.perf_counter() - t)
            states.update(h.explanation["dense"]["states"] for h in hits)
    # An index without kept token states: every explained hit's text is encoded again.
    kept_states = explain._kept_states
    explain._kept_states = lambda *a, **kw: {}
    re_plain, re_explain = [], []
    try:
        for q in queries[: args.reencode_queries]:
            t = time.perf_counter()
            r.search(q, k=k, mode="hybrid")
            re_plain.append(time.perf_counter() - t)
            t = time.perf_counter()
            r.search(q, k=k, mode="hybrid", explain=True)
            re_explain.append(time.perf_counter() - t)
    finally:
        explain._kept_states = kept_states
    m = r.manifest
    report = {
        "cpu_flags": sorted(f for f in cpu_flags() if f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")),
        "cores": os.cpu_count(), "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "index": index.name, "chunks": m.counts.get("chunks"), "pooling": m.pooling, "query_encoder": type(r.encoder).__name__,
        "precision": getattr(r.encoder, "precision", None), "k": k, "queries": len(queries), "states_used": sorted(states),
        "p50_ms": {name: p50(v) for name, v in times.items()},
        "ratio_p50": {mode: round(statistics.median(times[f"{mode}_explain_kept"]) / statistics.median(times[f"{mode}_plain"]), 2)
                      for mode in ("dense", "hybrid")},
        "reencode": {"queries": len(re_plain), "hybrid_plain_p50_ms": p50(re_plain), "hybrid_explain_p50_ms": p50(re_explain),
                     "ratio_p50": round(statistics.median(re_explain) / statistics.median(re_plain), 2)},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
