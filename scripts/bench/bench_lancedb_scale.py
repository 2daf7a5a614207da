"""LanceDB beside semsearch at scale: the corpus of scripts/bench/bench_scale.py, the same measures.

LanceDB is what users pick for an index on disk (IVF-PQ codes, full vectors and a full-text
index in Lance files). This builds one over the same synthetic chunks (scripts/bench/synthetic.py: the
same texts, the same stand-in vectors) and measures what bench_scale.py measures of semsearch:
build time and peak RSS, opening in a fresh process, RSS after the same 1,666 queries, p50/p99
of dense, lexical (its native full-text index, BM25) and hybrid (both, fused by its default
reciprocal-rank reranker), and dense recall@10 against exact search. Run it with a Python that
has the `bench-others` extra (lancedb); it needs numpy only besides:

    python -m venv /tmp/bench-others-venv && /tmp/bench-others-venv/bin/pip install lancedb
    /tmp/bench-others-venv/bin/python scripts/bench/bench_lancedb_scale.py build CORPUS DIR
    /tmp/bench-others-venv/bin/python scripts/bench/bench_lancedb_scale.py measure DIR

CORPUS is a corpus folder bench_scale.py wrote (`corpus-<n>`, jsonl parts, one chunk a row).
The IVF-PQ index gets the list count semsearch chose (--partitions, 4,000 at 1M) and codes of
the same size (48 sub-vectors of 8 bits: 48 bytes, as semsearch's 96 of 4 bits); its search
knobs (nprobes, refine_factor) are tuned on queries of another seed, as semsearch tunes its own
on held-out vectors, to the same recall target (0.95), and recall is reported on the benchmark's.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic import Corpus, StandInEncoder  # noqa: E402

TABLE = "chunks"
QUERIES = 1000


def rss(kind: str = "VmRSS") -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(kind + ":"))


def du(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def bench_queries(corpus: Corpus, enc: StandInEncoder):
    """The texts bench_scale.py's measurement uses (same seed, same slices), their vectors."""
    texts = corpus.query_texts(QUERIES + 400, seed=3)
    return texts, enc.encode(texts)


def build(corpus_dir: Path, out: Path, partitions: int, sub_vectors: int) -> None:
    import lancedb
    import pyarrow as pa

    corpus = Corpus()
    enc = StandInEncoder(corpus)
    texts_q, qv = bench_queries(corpus, enc)
    rq = qv[QUERIES + 2: QUERIES + 202]  # the recall queries: exact top 10 kept as the rows stream by
    tune_q = enc.encode(corpus.query_texts(200, seed=7))
    exact = [(np.full((len(x), 10), -np.inf, np.float32), np.full((len(x), 10), -1, np.int64)) for x in (rq, tune_q)]
    dim = corpus.dim
    schema = pa.schema([("id", pa.int64()), ("text", pa.string()), ("vector", pa.list_(pa.float32(), dim))])
    t0 = time.perf_counter()
    n = 0

    def batches():
        nonlocal n
        for part in sorted(Path(corpus_dir).glob("*.jsonl")):
            texts = [json.loads(line)["text"] for line in part.read_text().splitlines() if line.strip()]
            v = enc.encode(texts)
            ids = np.arange(n, n + len(texts), dtype=np.int64)
            for k, q in enumerate((rq, tune_q)):
                s = q @ v.T
                cs, ci = np.concatenate([exact[k][0], s], 1), np.concatenate([exact[k][1], np.broadcast_to(ids, s.shape)], 1)
                top = np.argpartition(-cs, 9, axis=1)[:, :10]
                exact[k] = (np.take_along_axis(cs, top, 1), np.take_along_axis(ci, top, 1))
            n += len(texts)
            print(f"  {part.name}: {n:,} rows, {time.perf_counter() - t0:.0f} s", flush=True)
            yield pa.RecordBatch.from_arrays(
                [pa.array(ids), pa.array(texts, pa.string()),
                 pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(v, np.float32).ravel()), dim)], schema=schema)

    db = lancedb.connect(str(out))
    tbl = db.create_table(TABLE, data=batches(), schema=schema, mode="overwrite")
    t1 = time.perf_counter()
    tbl.create_index(metric="dot", num_partitions=partitions, num_sub_vectors=sub_vectors, index_type="IVF_PQ")
    t2 = time.perf_counter()
    tbl.create_fts_index("text", use_tantivy=False)
    t3 = time.perf_counter()
    np.save(out / "exact-recall.npy", exact[0][1])
    np.save(out / "exact-tune.npy", exact[1][1])
    res = {"rows": n, "ingest_seconds": t1 - t0, "ivf_pq_seconds": t2 - t1, "fts_seconds": t3 - t2, "seconds": t3 - t0,
           "encode_seconds": enc.seconds, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "disk_bytes": du(out), "lancedb": lancedb.__version__, "partitions": partitions, "sub_vectors": sub_vectors}
    (out / "build.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


def measure(out: Path) -> None:
    corpus = Corpus()
    enc = StandInEncoder(corpus)
    texts, qv = bench_queries(corpus, enc)
    tune_q = enc.encode(corpus.query_texts(200, seed=7))
    import lancedb

    r0 = rss()
    t = time.perf_counter()
    tbl = lancedb.connect(str(out)).open_table(TABLE)
    res: dict = {"load_seconds": time.perf_counter() - t, "rss_before_load": r0, "rss_after_load": rss(),
                 "disk_bytes": du(out), "rows": tbl.count_rows()}

    def dense(v, nprobes, refine, k=10):
        q = tbl.search(v, query_type="vector").distance_type("dot").nprobes(nprobes).limit(k).select(["id"])
        if refine:
            q = q.refine_factor(refine)
        return q.to_arrow()["id"].to_numpy()

    def recall(qs, exact, nprobes, refine):
        return float(np.mean([len(set(dense(v, nprobes, refine).tolist()) & set(e.tolist())) / 10 for v, e in zip(qs, exact)]))

    # the cheapest (nprobes, refine_factor) that reaches 0.95 on the tuning queries, as semsearch
    # tunes its nprobe on held-out vectors (a refine factor re-ranks against the full vectors)
    exact_tune = np.load(out / "exact-tune.npy")
    tried, knobs = [], None
    for nprobes in (2, 4, 8, 16, 32, 64):
        for refine in (None, 10, 50):
            rc = recall(tune_q, exact_tune, nprobes, refine)
            tried.append({"nprobes": nprobes, "refine_factor": refine, "recall": round(rc, 4)})
            if rc >= 0.95:
                knobs = (nprobes, refine)
                break
        if knobs:
            break
    knobs = knobs or (64, 50)
    res["tuning"], res["knobs"] = tried, {"nprobes": knobs[0], "refine_factor": knobs[1]}

    def hybrid(text, v):
        q = tbl.search(query_type="hybrid").vector(v).text(text).distance_type("dot").nprobes(knobs[0]).limit(10).select(["id"])
        if knobs[1]:
            q = q.refine_factor(knobs[1])
        return q.to_arrow()

    def lexical(text):
        return tbl.search(text, query_type="fts").limit(10).select(["id"]).to_arrow()

    def timed(fn, args) -> dict:
        ms = []
        for a in args:
            t0 = time.perf_counter()
            fn(*a)
            ms.append((time.perf_counter() - t0) * 1000)
        return {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)), "n": len(ms)}

    hybrid(texts[0], qv[0])  # the first query's one-off costs, as bench_scale.py leaves out
    t0 = time.perf_counter()
    hybrid(texts[1], qv[1])
    res["first_query_ms"] = (time.perf_counter() - t0) * 1000
    res["hybrid"] = timed(hybrid, list(zip(texts[2: 2 + QUERIES], qv[2: 2 + QUERIES])))
    res["dense"] = timed(lambda v: dense(v, *knobs), [(v,) for v in qv[2: 2 + QUERIES // 3]])
    res["lexical"] = timed(lexical, [(x,) for x in texts[2: 2 + QUERIES // 3]])
    res["rss_after_queries"], res["anon_after_queries"], res["file_after_queries"] = rss(), rss("RssAnon"), rss("RssFile")
    res["recall@10"] = recall(qv[QUERIES + 2: QUERIES + 202], np.load(out / "exact-recall.npy"), *knobs)
    print(json.dumps(res, indent=1))
    gb = 1e9
    print(f"lancedb {tbl.count_rows():,} rows, {res['disk_bytes'] / gb:.2f} GB on disk; knobs {res['knobs']}")
    print(f"load {res['load_seconds']:.2f} s; RSS {res['rss_after_load'] / gb:.2f} GB after load, "
          f"{res['rss_after_queries'] / gb:.2f} GB after the queries (heap {res['anon_after_queries'] / gb:.2f}, "
          f"mapped files {res['file_after_queries'] / gb:.2f})")
    for mode in ("dense", "lexical", "hybrid"):
        print(f"{mode:8s} p50 {res[mode]['p50']:7.2f} ms  p99 {res[mode]['p99']:7.2f} ms  (n={res[mode]['n']})")
    print(f"recall@10 {res['recall@10']:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("corpus", type=Path)
    b.add_argument("out", type=Path)
    b.add_argument("--partitions", type=int, default=4000)
    b.add_argument("--sub-vectors", type=int, default=48)
    m = sub.add_parser("measure")
    m.add_argument("out", type=Path)
    a = ap.parse_args()
    if a.cmd == "build":
        a.out.mkdir(parents=True, exist_ok=True)
        build(a.corpus, a.out, a.partitions, a.sub_vectors)
    else:
        measure(a.out)


if __name__ == "__main__":
    os.environ.setdefault("LANCEDB_LOG", "error")
    main()
