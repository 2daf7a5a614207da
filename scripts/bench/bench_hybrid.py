"""What hybrid search costs and gains over dense at SciFact size, through Retriever.search, and
how the lexical index compares with SQLite FTS5's bm25() in the same run.

    python scripts/bench/bench_hybrid.py [--data ../shared/data/beir/scifact] [--cache results/scifact_mean_fp32.npz]

The index holds the 5,183 SciFact documents as one chunk each (full text; vectors: mean pooling,
fp32, from the cache tune_hybrid.py writes), so the same run also checks that Retriever.search
reproduces `semsearch eval`'s figures for dense and hybrid. Query vectors come precomputed, so
the timings are of retrieval alone (FAISS or BM25, fusion, docstore): encoding a query costs the
same in every mode. Writes results/bench_hybrid.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


class CachedQueries:
    """An encoder whose query vectors were computed beforehand (text -> vector)."""

    name, fingerprint, backend, precision, head_info, pooling, max_length = "cached", "cached", "fake", "fp32", None, "mean", 256

    def __init__(self, texts, vecs):
        self.map = dict(zip(texts, vecs))
        self.dim = self.out_dim = vecs.shape[1]

    def encode(self, texts, progress=None):
        return np.stack([self.map[t] for t in texts])


def build(folder: Path, data, docs: np.ndarray) -> None:
    from semsearch.indexing import VectorSettings, finalize_vectors
    from semsearch.store.docstore import ChunkRow
    from semsearch.store.folder import IndexWriter
    from semsearch.store.manifest import Manifest

    shutil.rmtree(folder, ignore_errors=True)
    w = IndexWriter(folder, docs.shape[1])
    f = w.docs.add_file(str(Path(data.folder) / "corpus.jsonl"), "-", 0, 0, "-")
    rows = [ChunkRow(f, i + 1, 0, 0, len(t), None, t, {"_id": d}) for i, (d, t) in enumerate(zip(data.doc_ids, data.doc_texts))]
    w.vectors.add(w.docs.add_chunks(rows, docs), docs)
    entry = finalize_vectors(w, docs.shape[1], VectorSettings(index_type="flat"), None)
    w.commit(Manifest(model="cached", model_fingerprint="cached", backend="fake", pooling="mean", dim=docs.shape[1], max_length=256,
                      precision="fp32", chunking={"window": 254, "overlap": 0}, index=entry,
                      counts={"files": 1, "documents": len(rows), "chunks": len(rows)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[3] / "shared/data/beir/scifact"))
    ap.add_argument("--cache", default="results/scifact_mean_fp32.npz")
    ap.add_argument("--index", default="results/bench_hybrid_index")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds over all test queries")
    ap.add_argument("--out", default="results/bench_hybrid.json")
    args = ap.parse_args()

    from semsearch.eval import load_beir, trec_metrics
    from semsearch.search import Retriever
    from semsearch.store.lexical import STOPWORDS
    import re

    def match_expression_fts5(q: str) -> str | None:
        # The query's distinct words, quoted and OR-ed, stop words dropped: the same terms the
        # lexical index scores, in FTS5's safe syntax.
        words = dict.fromkeys(w for w in re.findall(r"\w+", q.lower()) if w not in STOPWORDS)
        return " OR ".join(f'"{w}"' for w in words) or None

    test = load_beir(args.data, "test")
    if not Path(args.cache).exists():
        sys.exit(f"{args.cache} not found: run scripts/tune_hybrid.py first (it encodes SciFact once and caches the vectors)")
    z = np.load(args.cache)
    build(Path(args.index), test, z["docs"])
    r = Retriever.load(args.index, encoder=CachedQueries(test.query_texts, z["q_test"]))
    qs = test.query_texts

    # Quality through Retriever.search (one chunk per document, so hits are documents).
    quality = {}
    for mode in ("dense", "lexical", "hybrid"):
        run = {q: {h.metadata["_id"]: h.score for h in r.search(qt, 100, mode=mode) if h.metadata["_id"] != q}
               for q, qt in zip(test.query_ids, qs)}
        m = trec_metrics(test.qrels, run, [10, 100], test.zero_queries)
        quality[mode] = {"ndcg@10": round(m["ndcg@10"], 2), "recall@100": round(m["recall@100"], 2)}

    # FTS5 over the same texts, the alternative this index was measured against.
    fts = sqlite3.connect(":memory:")
    fts.execute("CREATE VIRTUAL TABLE t USING fts5(text, tokenize='porter unicode61 remove_diacritics 2')")
    fts.executemany("INSERT INTO t(rowid, text) VALUES (?, ?)", ((i + 1, t) for i, t in enumerate(test.doc_texts)))

    def fts5(q: str) -> list:
        e = match_expression_fts5(q)
        return fts.execute("SELECT rowid, -bm25(t) FROM t WHERE t MATCH ? ORDER BY bm25(t) LIMIT 100", (e,)).fetchall() if e else []

    run = {q: {test.doc_ids[i - 1]: s for i, s in fts5(qt) if test.doc_ids[i - 1] != q} for q, qt in zip(test.query_ids, qs)}
    m = trec_metrics(test.qrels, run, [10, 100], test.zero_queries)
    quality["fts5_bm25"] = {"ndcg@10": round(m["ndcg@10"], 2), "recall@100": round(m["recall@100"], 2)}

    # Latency, warm, k = 10, interleaved per query so machine noise hits every variant alike.
    lex = r._lexical()
    for q in qs[:20]:
        r.search(q, 10, mode="hybrid")
    t = {k: [] for k in ("dense", "lexical", "hybrid", "hybrid_rrf", "bm25_only", "fts5_bm25_only")}
    for _ in range(args.rounds):
        for q in qs:
            for name, fn in (("dense", lambda: r.search(q, 10, mode="dense")), ("lexical", lambda: r.search(q, 10, mode="lexical")),
                             ("hybrid", lambda: r.search(q, 10, mode="hybrid")),
                             ("hybrid_rrf", lambda: r.search(q, 10, mode="hybrid", fusion="rrf")),
                             ("bm25_only", lambda: lex.search(q, 100)), ("fts5_bm25_only", lambda: fts5(q))):
                t0 = time.perf_counter()
                fn()
                t[name].append(time.perf_counter() - t0)
    p50 = {k: round(1000 * statistics.median(v), 3) for k, v in t.items()}
    report = {
        "index": {"chunks": len(r), "note": "SciFact test corpus, one chunk per document, mean pooling fp32 vectors"},
        "quality_test": quality,
        "latency_p50_ms": p50,
        "hybrid_minus_dense_p50_ms": round(p50["hybrid"] - p50["dense"], 3),
        "fts5_vs_ours_bm25_ratio": round(p50["fts5_bm25_only"] / max(p50["bm25_only"], 1e-9), 1),
        "queries": len(qs), "rounds": args.rounds,
        "cpu_flags": sorted({f for f in open("/proc/cpuinfo").read().split() if f.startswith(("avx", "amx", "fma"))}) if Path("/proc/cpuinfo").exists() else [],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
