"""What explain=True costs: p50 latency of Retriever.search with and without it, same queries,
same run, interleaved query by query so machine noise hits all alike.

    python scripts/bench/bench_explain.py [--docs 2000] [--queries 200] [--reencode-queries 40] [--index DIR --precision bf16]

The index (built once in results/bench_explain_index, from the first --docs SciFact documents, or
from data/sample where ../shared has no SciFact, in --precision, default auto) keeps its token
states (--keep-states): explaining a hit then reads them, and encodes nothing. The same index with its kept states ignored stands
for one built without --keep-states, where the explained hits' texts are encoded again (one
batched encoder pass a search). Each query runs, for dense and for hybrid: the plain search, the
explained one with kept states and, for the first --reencode-queries queries, the explained one
re-encoding the hits; each ratio divides by the plain p50 over the same queries. An explained
search works out every number; the per-token and per-word records are built when a hit's
explanation is first read, so two more ratios are given: with every explanation read, and a
search turned into the server's JSON body (Hit.to_dict, the server's renderer) with and
without explain.
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
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

SAMPLE_QUERIES = ["how long does a personal loan decision take", "what does the underwriter check",
                  "lentil soup with cumin", "how to keep a sourdough starter alive", "when do meteor showers peak",
                  "watering tomatoes in hot weather", "ocean currents and climate", "packing light for a long trip",
                  "strength training for beginners", "why do database indexes speed up queries"]


def build(index: Path, data: Path, docs: int, precision: str = "auto") -> None:
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
    index_corpus(corpus, index, Encoder(precision=precision), progress=False, keep_states=True)


def p50(xs: list[float]) -> float | None:
    return round(1000 * statistics.median(xs), 2) if xs else None


def ratio(num: list[float], den: list[float]) -> float | None:
    return round(statistics.median(num) / statistics.median(den), 2) if num and den else None


def _proc_loadavg() -> str | None:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "beir" / "scifact"))
    ap.add_argument("--index", default=str(REPO / "results" / "bench_explain_index"))
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--reencode-queries", type=int, default=40)
    ap.add_argument("--precision", default="auto", help="the encoder's precision where the index is built (queries follow the index)")
    ap.add_argument("-k", type=int, default=10)
    ap.add_argument("--out", default=str(REPO / "results" / "bench_explain.json"))
    args = ap.parse_args()

    data, index = Path(args.data), Path(args.index)
    if not (index / "manifest.json").exists():
        build(index, data, args.docs, args.precision)
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
    kept_states = explain._kept_states
    explain._kept_states = lambda *a, **kw: {}
    try:  # and the re-encoding (the encoder's kernels for a batch of hits)
        for q in queries[:2]:
            r.search(q, k=k, mode="hybrid", explain=True)
    finally:
        explain._kept_states = kept_states
    load_before = os.getloadavg()
    proc_before = _proc_loadavg()
    times: dict[str, list[float]] = {f"{m}_{w}": [] for m in ("dense", "hybrid")
                                     for w in ("plain", "explain_kept", "explain_read", "plain_json", "explain_json",
                                               "plain_re", "explain_encoded")}
    states: dict[str, set] = {"kept": set(), "encoded": set()}

    def no_kept_states(*a, **kw):  # an index without kept token states
        return {}

    def explained(q: str, mode: str, seen: set, read: bool = False) -> float:
        """Seconds of one explained search, freeing its hits included (as the plain search's are);
        read: every hit's explanation read too (its records built: Hit.explanation)."""
        t = time.perf_counter()
        hits = r.search(q, k=k, mode=mode, explain=True)
        if read:
            for h in hits:
                h.explanation
        took = time.perf_counter() - t
        seen.update(h.explanation["dense"]["states"] for h in hits)
        t = time.perf_counter()
        del hits
        return took + time.perf_counter() - t

    try:  # the server's own renderer (orjson where the serve extra is installed)
        from semsearch.serve import _render as render
    except ImportError:
        def render(payload):
            return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    def as_json(q: str, mode: str, explain_: bool) -> float:
        """Seconds of a search and its hits as the server's JSON body (Hit.to_dict, its renderer)."""
        t = time.perf_counter()
        render({"query": q, "hits": [h.to_dict() for h in r.search(q, k=k, mode=mode, explain=explain_)]})
        return time.perf_counter() - t

    for i, q in enumerate(queries):
        for mode in ("dense", "hybrid"):
            t = time.perf_counter()
            r.search(q, k=k, mode=mode)
            plain = time.perf_counter() - t
            times[f"{mode}_plain"].append(plain)
            times[f"{mode}_explain_kept"].append(explained(q, mode, states["kept"]))
            times[f"{mode}_explain_read"].append(explained(q, mode, states["kept"], read=True))
            times[f"{mode}_plain_json"].append(as_json(q, mode, False))
            times[f"{mode}_explain_json"].append(as_json(q, mode, True))
            if i < args.reencode_queries:
                explain._kept_states = no_kept_states
                try:
                    times[f"{mode}_explain_encoded"].append(explained(q, mode, states["encoded"]))
                finally:
                    explain._kept_states = kept_states
                times[f"{mode}_plain_re"].append(plain)
    m = r.manifest
    report = {
        "cpu_flags": sorted(f for f in cpu_flags() if f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")),
        "cores": os.cpu_count(), "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "index": index.name, "chunks": m.counts.get("chunks"), "pooling": m.pooling, "query_encoder": type(r.encoder).__name__,
        "precision": getattr(r.encoder, "precision", None), "index_precision": m.precision, "k": k, "queries": len(queries),
        "states_used": {w: sorted(v) for w, v in states.items()},
        "proc_loadavg_before": proc_before, "proc_loadavg_after": _proc_loadavg(),
        "p50_ms": {name: p50(times[name]) for name in ("dense_plain", "dense_explain_kept", "hybrid_plain", "hybrid_explain_kept")},
        "ratio_p50": {mode: ratio(times[f"{mode}_explain_kept"], times[f"{mode}_plain"]) for mode in ("dense", "hybrid")},
        # the same with every explanation read (its records built), and as the server's JSON
        "read_p50_ms": {mode: p50(times[f"{mode}_explain_read"]) for mode in ("dense", "hybrid")},
        "read_ratio_p50": {mode: ratio(times[f"{mode}_explain_read"], times[f"{mode}_plain"]) for mode in ("dense", "hybrid")},
        "json_p50_ms": {f"{mode}_{w}": p50(times[f"{mode}_{w}_json"]) for mode in ("dense", "hybrid") for w in ("plain", "explain")},
        "json_renderer": render.__module__,
        "json_ratio_p50": {mode: ratio(times[f"{mode}_explain_json"], times[f"{mode}_plain_json"]) for mode in ("dense", "hybrid")},
        "reencode": {"queries": len(times["dense_explain_encoded"]),
                     **{f"{mode}_{w}_p50_ms": p50(times[f"{mode}_{key}"]) for mode in ("dense", "hybrid")
                        for w, key in (("plain", "plain_re"), ("explain", "explain_encoded"))},
                     "ratio_p50": {mode: ratio(times[f"{mode}_explain_encoded"], times[f"{mode}_plain_re"])
                                   for mode in ("dense", "hybrid")}},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
