"""An index partitioned by document (`index --shards N`) at scale: how evenly its partitions hold
the chunks, what the partitioned build costs beside an unpartitioned one, and whether N
in-process shards (semsearch.shards, one partition each) answer as one process.

    python scripts/bench/bench_partitions.py [--chunks 1000000] [--shards 3] [--per-file 1000]
        [--queries 200] [--keep DIR] [--no-baseline] [--compare-only]

The corpus is bench_scale.py's synthetic one (Zipf words, clustered vectors, a stand-in encoder),
written as JSONL files of --per-file records: a document is a file here (its records stay
together), so the partitions' shares depend on the number of files. Steps, each timed: build
unpartitioned (unless --no-baseline), build with --shards N; then the partitions' chunk shares,
and --queries queries x dense, lexical, hybrid x 4 filter forms answered by one process and by
N shards over the partitioned index: top-10 ids equal, largest score gap, p50/p99 of each.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_filters import cpu_flags  # noqa: E402
from bench_scale import write_corpus  # noqa: E402


def build(corpus: Path, index: Path, shards: int | None) -> dict:
    import resource

    import semsearch.indexing as indexing
    from synthetic import Corpus, StandInEncoder

    shutil.rmtree(index, ignore_errors=True)
    enc = StandInEncoder(Corpus())
    t = time.perf_counter()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    indexing.index_corpus(corpus, index, enc, progress=False, **({"shards": shards} if shards else {}))
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    return {"seconds": round(time.perf_counter() - t, 1), "cpu_seconds": round(cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 1),
            "disk_gb": round(sum(p.stat().st_size for p in index.iterdir() if p.is_file()) / 1e9, 2)}


def compare(index: Path, shards: int, n_queries: int, n_chunks: int) -> dict:
    from semsearch.search import Retriever
    from semsearch.shards import Shard, ShardedSearch, local_fanout
    from semsearch.store.manifest import Manifest
    from synthetic import Corpus, StandInEncoder

    m = Manifest.load(index)
    by_part: dict = {}
    for e in m.segments:
        by_part[e.get("part")] = by_part.get(e.get("part"), 0) + e["live"]
    total = sum(by_part.values())
    out: dict = {"segments": len(m.segments), "shares": {str(k): round(v / total, 4) for k, v in sorted(by_part.items(), key=str)}}
    corpus = Corpus()
    enc = StandInEncoder(corpus)
    queries = corpus.query_texts(n_queries, seed=5)
    one = Retriever.load(index, encoder=enc)
    router = ShardedSearch(index, local_fanout([Shard(index, i, shards) for i in range(shards)]), enc)
    wheres = [None, {"n": {">=": n_chunks // 2}}, "path:*part-0000*.jsonl", [f"n<{n_chunks // 10}"]]
    same = total_lists = 0
    gap = 0.0
    times: dict = {}
    for mode in ("dense", "lexical", "hybrid"):
        for where in wheres:
            for q in queries:
                t = time.perf_counter()
                a = one.search(q, 10, mode=mode, where=where)
                t1 = time.perf_counter()
                b = router.search(q, 10, mode=mode, where=where)
                t2 = time.perf_counter()
                times.setdefault((mode, "one"), []).append(t1 - t)
                times.setdefault((mode, "sharded"), []).append(t2 - t1)
                total_lists += 1
                same += [h.id for h in a] == [h.id for h in b]
                if len(a) == len(b):
                    gap = max([gap] + [abs(x.score - y.score) for x, y in zip(a, b)])
    out.update(identical=f"{same} / {total_lists}", largest_score_gap=gap)
    out["ms"] = {f"{mode} {who}": [round(1000 * float(np.percentile(v, 50)), 2), round(1000 * float(np.percentile(v, 99)), 2)]
                 for (mode, who), v in times.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, default=1_000_000)
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--per-file", type=int, default=1000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--keep", type=Path, default=Path("/tmp/semsearch-partitions"))
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--compare-only", action="store_true", help="only the comparison, over the partitioned index already built")
    a = ap.parse_args()
    print(f"CPU flags: {cpu_flags()}; {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}", flush=True)
    corpus = a.keep / f"corpus-{a.chunks}-{a.per_file}"
    write_corpus(corpus, a.chunks, a.per_file)
    res: dict = {}
    if a.compare_only:
        res["partitioned"] = compare(a.keep / f"index-{a.shards}", a.shards, a.queries, a.chunks)
        res["load average"] = round(os.getloadavg()[0], 2)
        print(json.dumps(res, indent=1), flush=True)
        return
    if not a.no_baseline:
        res["build, one partition"] = build(corpus, a.keep / "index-one", None)
        print(json.dumps(res), flush=True)
    res[f"build, --shards {a.shards}"] = build(corpus, a.keep / f"index-{a.shards}", a.shards)
    print(json.dumps(res), flush=True)
    res["partitioned"] = compare(a.keep / f"index-{a.shards}", a.shards, a.queries, a.chunks)
    res["load average"] = round(os.getloadavg()[0], 2)
    print(json.dumps(res, indent=1), flush=True)


if __name__ == "__main__":
    main()
