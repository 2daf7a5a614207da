"""`semsearch serve --engine ray` against the one-process server, on one machine: the same top 10
(ids, scores within 1e-5) for N queries in dense, lexical and hybrid mode with three filter forms,
and the router's overhead (p50 and p99 of single hybrid queries, interleaved rounds).

    python scripts/bench_serve_ray.py --chunks 50000 --shards 3 --replicas 2 --queries 200

The corpus and encoder are scripts/synthetic.py's (Zipf words, clustered vectors; the router gets
the same stand-in encoder). The index is written in --steps runs of `index`, so that it has several
segments for the shards to own (segments are the unit a shard owns). Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))
sys.path.insert(0, str(SCRIPTS.parent))


def make_encoder():
    """The router's query encoder, built in its replica (pickled by value from this script)."""
    import sys as _sys

    _sys.path.insert(0, str(SCRIPTS))
    from synthetic import Corpus, StandInEncoder

    return StandInEncoder(Corpus())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build(work: Path, chunks: int, steps: int) -> Path:
    from synthetic import Corpus

    from semsearch.indexing import index_corpus

    corpus_dir, folder = work / "corpus", work / "index"
    shutil.rmtree(work, ignore_errors=True)
    corpus_dir.mkdir(parents=True)
    corpus, enc = Corpus(), make_encoder()
    per = chunks // steps
    for step in range(steps):
        texts, _ = corpus.texts(step * per, per)
        with open(corpus_dir / f"part-{step:05d}.jsonl", "w") as fh:
            fh.writelines(json.dumps({"text": t, "n": step * per + i}) + "\n" for i, t in enumerate(texts))
        index_corpus(corpus_dir, folder, enc, progress=False)
    return folder


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=50_000)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--latency-queries", type=int, default=300)
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "semsearch-bench-serve-ray")
    a = ap.parse_args()

    import httpx
    import ray
    import uvicorn
    from ray import serve
    from synthetic import Corpus

    from semsearch.serve import create_app
    from semsearch.serve_ray import build_app
    from semsearch.service import Service

    t = time.perf_counter()
    folder = build(a.work, a.chunks, a.steps)
    out: dict = {"chunks": a.chunks, "build_seconds": round(time.perf_counter() - t, 1), "shards": a.shards,
                 "replicas": a.replicas, "loadavg_start": os.getloadavg()}
    from semsearch.store.manifest import Manifest

    m = Manifest.load(folder)
    out["segments"] = len(m.segments)
    out["index_type"] = m.index.get("type")

    one_port, ray_port = free_port(), free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(Service(folder, device="cpu", encoder=make_encoder())),
                                           host="127.0.0.1", port=one_port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    t = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": ray_port})
    serve.run(build_app(folder, a.shards, a.replicas, encoder=make_encoder), name="semsearch", route_prefix="/")
    out["ray_start_seconds"] = round(time.perf_counter() - t, 1)
    while not server.started:
        time.sleep(0.05)
    one, sharded = f"http://127.0.0.1:{one_port}", f"http://127.0.0.1:{ray_port}"
    queries = Corpus().query_texts(a.queries + a.latency_queries, seed=5)
    half = a.chunks // 2
    wheres = [None, {"n": {"<": half}}, [f"n>={a.chunks // 10}", f"n<{a.chunks - a.chunks // 10}"], "path:part-0000[0-2].jsonl"]
    same = differ = 0
    worst = 0.0
    with httpx.Client(timeout=300) as c:
        for mode in ("dense", "lexical", "hybrid"):
            for where in wheres:
                for at in range(0, a.queries, 100):
                    body = {"queries": queries[at: min(at + 100, a.queries)], "k": 10, "mode": mode, "where": where}
                    ra, rb = c.post(one + "/search", json=body), c.post(sharded + "/search", json=body)
                    ra.raise_for_status()
                    rb.raise_for_status()
                    for x, y in zip(ra.json()["results"], rb.json()["results"]):
                        ids_ok = [h["id"] for h in x["hits"]] == [h["id"] for h in y["hits"]]
                        gap = max((abs(h["score"] - g["score"]) for h, g in zip(x["hits"], y["hits"])), default=0.0)
                        worst = max(worst, gap)
                        if ids_ok and gap <= 1e-5:
                            same += 1
                        else:
                            differ += 1
        out["compared"] = {"same_top10": same, "differ": differ, "largest_score_gap": worst,
                           "modes": 3, "filter_forms": len(wheres) - 1, "queries": a.queries}
        lat: dict[str, list[float]] = {"one_process": [], "sharded": []}
        lq = queries[a.queries:]
        for r in range(0, len(lq), 50):
            for name, url in (("one_process", one), ("sharded", sharded)) if r % 100 == 0 else (("sharded", sharded), ("one_process", one)):
                for q in lq[r: r + 50]:
                    t0 = time.perf_counter()
                    c.get(url + "/search", params={"q": q, "k": 10, "mode": "hybrid"}).raise_for_status()
                    lat[name].append((time.perf_counter() - t0) * 1000)
        for name, ms in lat.items():
            out[f"hybrid_ms_{name}"] = {"p50": round(float(np.percentile(ms, 50)), 2), "p99": round(float(np.percentile(ms, 99)), 2),
                                        "n": len(ms)}
    out["p50_ratio"] = round(out["hybrid_ms_sharded"]["p50"] / out["hybrid_ms_one_process"]["p50"], 2)
    out["loadavg_end"] = os.getloadavg()
    serve.shutdown()
    ray.shutdown()
    server.should_exit = True
    print(json.dumps(out))


if __name__ == "__main__":
    main()
