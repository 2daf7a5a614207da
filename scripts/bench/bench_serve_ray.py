"""`semsearch serve --engine ray` against the one-process server, on one machine: the same top 10
(ids, scores within 1e-5) for N queries in dense, lexical and hybrid mode with three filter forms,
and the router's overhead (p50 and p99 of single hybrid queries, interleaved rounds; a first pass
of new queries, then the same queries again, whose terms the router holds: `_again`).

    python scripts/bench/bench_serve_ray.py --chunks 50000 --shards 3 --replicas 2 --queries 200

The corpus and encoder are scripts/bench/synthetic.py's (Zipf words, clustered vectors; the router gets
the same stand-in encoder). The index is written in --steps runs of `index`, so that it has several
segments for the shards to own (without partitions, segments are the unit a shard owns); --index DIR
serves an index already built from the same corpus (a partitioned one: a partition a shard). Prints
one JSON object.

    python scripts/bench/bench_serve_ray.py --beir ../shared/data/beir/scifact --docs 1500 --queries 200 --explain 5

--beir: a BEIR dataset's first --docs documents and its queries instead, with the bundled model (the
router loads it from the index); --explain K also compares explain=true answers (top K, every number
of every explanation within 1e-5) in the three modes.
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
sys.path.insert(0, str(SCRIPTS.parents[1]))


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


def build_beir(work: Path, beir: Path, docs: int, steps: int) -> tuple[Path, list[str]]:
    from semsearch.encoder import Encoder
    from semsearch.indexing import index_corpus

    corpus_dir, folder = work / "corpus", work / "index"
    shutil.rmtree(work, ignore_errors=True)
    corpus_dir.mkdir(parents=True)
    with open(beir / "corpus.jsonl", encoding="utf-8") as fh:
        rows = [json.loads(line) for _, line in zip(range(docs), fh)]
    enc = Encoder(device="cpu")
    per = -(-len(rows) // steps)
    for step in range(steps):
        with open(corpus_dir / f"part-{step:05d}.jsonl", "w") as fh:
            fh.writelines(json.dumps({"text": f"{r.get('title', '')}. {r['text']}", "n": step * per + i}) + "\n"
                          for i, r in enumerate(rows[step * per:(step + 1) * per]))
        index_corpus(corpus_dir, folder, enc, progress=False)
    with open(beir / "queries.jsonl", encoding="utf-8") as fh:
        queries = [json.loads(line)["text"] for line in fh]
    return folder, queries


def differences(a, b, path: str = "") -> list[str]:
    """Where two explanations differ: numbers beyond 1e-5 (relative to their size), anything else unequal."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items against {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) or isinstance(b, float):
        ok = a is not None and b is not None and abs(float(a) - float(b)) <= 1e-5 * max(1.0, abs(float(a)))
        return [] if ok else [f"{path}: {a} against {b}"]
    return [] if a == b else [f"{path}: {a!r} against {b!r}"]


def _pcts(values: list[float]) -> dict:
    return {"p50": round(float(np.percentile(values, 50)), 2), "p99": round(float(np.percentile(values, 99)), 2), "n": len(values)}


def breakdown(folder: Path, n_shards: int, encoder_factory, queries: list[str]) -> dict:
    """Where a sharded hybrid search's time goes, beside the HTTP figures: the same queries (their
    terms known to the router: two rounds) through the router code with the shards in this
    process, each round's time being its slowest shard's (the shards' own search, as if they ran
    side by side); the router's own work (encoding, merging, fusing: the rest of the in-process
    time); and a round of Ray Serve calls to every shard that does no search (`generation`),
    what each round costs in transport."""
    from ray import serve

    from semsearch.search import Retriever
    from semsearch.serve_ray import ray_fanout
    from semsearch.shards import Shard, ShardedSearch

    shards = [Shard(folder, i, n_shards) for i in range(n_shards)]
    rounds: list[tuple[str, float, float]] = []  # (method, slowest shard, all shards) of the search under way

    def timed(method, *args):
        got, slowest, total = [], 0.0, 0.0
        for sh in shards:
            t = time.perf_counter()
            got.append(getattr(sh, method)(*args))
            took = time.perf_counter() - t
            slowest, total = max(slowest, took), total + took
        rounds.append((method, slowest, total))
        return got

    enc = encoder_factory() if encoder_factory else None
    router = ShardedSearch(folder, timed, enc if enc is not None else Retriever.load(folder).encoder)
    for q in queries:  # the router meets the queries' terms (a `prepare` round each)
        router.search(q, 10, mode="hybrid")
    own, mine, n_rounds = [], [], []
    for q in queries:
        rounds.clear()
        t = time.perf_counter()
        router.search(q, 10, mode="hybrid")
        whole = time.perf_counter() - t
        own.append(1000 * sum(r[1] for r in rounds))
        mine.append(1000 * (whole - sum(r[2] for r in rounds)))
        n_rounds.append(len(rounds))
    fan = ray_fanout([serve.get_deployment_handle(f"shard-{i}", app_name="semsearch") for i in range(n_shards)])
    noop = []
    for _ in range(len(queries)):
        t = time.perf_counter()
        fan("generation")
        noop.append(1000 * (time.perf_counter() - t))
    return {"shards_own_search_ms": _pcts(own), "router_own_work_ms": _pcts(mine),
            "rounds_a_search": sorted(set(n_rounds)), "ray_round_without_search_ms": _pcts(noop)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=50_000)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--latency-queries", type=int, default=300)
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "semsearch-bench-serve-ray")
    ap.add_argument("--beir", type=Path, default=None, help="a BEIR dataset folder: its documents and queries, the real model")
    ap.add_argument("--docs", type=int, default=1500, help="with --beir: how many of its documents")
    ap.add_argument("--explain", type=int, default=0, metavar="K", help="also compare explain=true answers of the top K")
    ap.add_argument("--index", type=Path, default=None,
                    help="serve this index of the synthetic corpus instead of building one (e.g. bench_partitions.py's --shards 3 build)")
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
    if a.index is not None:
        folder, beir_queries = a.index, None
    elif a.beir is not None:
        folder, beir_queries = build_beir(a.work, a.beir, a.docs, a.steps)
    else:
        folder, beir_queries = build(a.work, a.chunks, a.steps), None
    out: dict = {"build_seconds": round(time.perf_counter() - t, 1), "shards": a.shards,
                 "replicas": a.replicas, "loadavg_start": os.getloadavg()}
    from semsearch.store.manifest import Manifest

    m = Manifest.load(folder)
    a.chunks = out["chunks"] = m.counts["chunks"]
    encoder_factory = None if a.beir is not None else make_encoder
    out["segments"] = len(m.segments)
    out["partitions"] = m.shards
    out["index_type"] = m.index.get("type")

    one_port, ray_port = free_port(), free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(Service(folder, device="cpu", encoder=encoder_factory() if encoder_factory else None)),
                                           host="127.0.0.1", port=one_port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    t = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": ray_port})
    serve.run(build_app(folder, a.shards, a.replicas, encoder=encoder_factory), name="semsearch", route_prefix="/")
    out["ray_start_seconds"] = round(time.perf_counter() - t, 1)
    while not server.started:
        time.sleep(0.05)
    one, sharded = f"http://127.0.0.1:{one_port}", f"http://127.0.0.1:{ray_port}"
    queries = (beir_queries[: a.queries + a.latency_queries] if beir_queries is not None
               else Corpus().query_texts(a.queries + a.latency_queries, seed=5))
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
        if a.explain:
            per = max(1, 100 // a.explain)  # the server explains at most 100 hits a request
            agree = disagree = hits = 0
            first: list[str] = []
            for mode in ("dense", "lexical", "hybrid"):
                for at in range(0, a.queries, per):
                    body = {"queries": queries[at: min(at + per, a.queries)], "k": a.explain, "mode": mode, "explain": True}
                    ra, rb = c.post(one + "/search", json=body), c.post(sharded + "/search", json=body)
                    ra.raise_for_status()
                    rb.raise_for_status()
                    for x, y in zip(ra.json()["results"], rb.json()["results"]):
                        for hx, hy in zip(x["hits"], y["hits"]):
                            hits += 1
                            d = differences(hx["explanation"], hy["explanation"]) if hx["id"] == hy["id"] else ["id"]
                            agree += not d
                            disagree += bool(d)
                            first += d[:1] if len(first) < 5 else []
            out["explained"] = {"hits": hits, "equal": agree, "differ": disagree, "first_differences": first, "k": a.explain}
        # Two passes over the same new queries: the first meets terms the router may not hold yet
        # (a `prepare` round for them), the second only terms it holds (two rounds a search).
        lq = queries[a.queries:]
        for pass_ in ("first", "again"):
            lat: dict[str, list[float]] = {"one_process": [], "sharded": []}
            for r in range(0, len(lq), 50):
                for name, url in (("one_process", one), ("sharded", sharded)) if r % 100 == 0 else (("sharded", sharded), ("one_process", one)):
                    for q in lq[r: r + 50]:
                        t0 = time.perf_counter()
                        c.get(url + "/search", params={"q": q, "k": 10, "mode": "hybrid"}).raise_for_status()
                        lat[name].append((time.perf_counter() - t0) * 1000)
            suffix = "" if pass_ == "first" else "_again"
            for name, ms in lat.items():
                out[f"hybrid_ms_{name}{suffix}"] = {"p50": round(float(np.percentile(ms, 50)), 2),
                                                    "p99": round(float(np.percentile(ms, 99)), 2), "n": len(ms)}
            out[f"p50_ratio{suffix}"] = round(out[f"hybrid_ms_sharded{suffix}"]["p50"] / out[f"hybrid_ms_one_process{suffix}"]["p50"], 2)
        out["breakdown"] = breakdown(folder, a.shards, encoder_factory, lq)
    out["loadavg_end"] = os.getloadavg()
    serve.shutdown()
    ray.shutdown()
    server.should_exit = True
    print(json.dumps(out))


if __name__ == "__main__":
    main()
