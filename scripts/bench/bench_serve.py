"""Load test of `semsearch serve` on loopback: concurrent clients, mixed search / embedding
requests, document upserts and deletes during the run.

    python scripts/bench/bench_serve.py [--requests 2000] [--clients 8] [--corpus DIR]

It indexes the corpus (default: the bundled sample) into a temporary folder, starts
`semsearch serve` on a free loopback port in its own process, and sends requests from
--clients concurrent clients: 40% POST /search, 20% GET /search, 20% POST /v1/embeddings,
20% POST /embed, with SciFact queries as texts where the data is there. Meanwhile one writer
upserts a revised document and a new one, and deletes an older one, over and over.

Then two runs of searches only, with the writer going on: a control without filters, then a
filtered run: --clients clients send only filtered searches (POST /search with
`where={"year": {">=": 2010}}`, passing about half of the seeded documents, and with the equality
`where={"lang": "de"}`, about 2%; GET /search with `where=year>=2010` and `where=lang=de`) while the
writer goes on; every hit must satisfy its filter. The filters select among --seed-docs documents
upserted before the runs (SciFact abstracts where the data is there, else generated notes), with
metadata year (1995-2024) and lang ("de" for one in 50, else "en"). Last, --big-requests
searches of 10 queries x k=1000 (the default --max-results) while another client polls /health.

Checks, all reported: every request answered 200; each client's responses never go back a
generation; the revised document, whenever it comes back, has the text and metadata of one
write, the very one published at the generation the response names (a half-written index would
pair one generation's vectors with another's texts); after the run the index's vector count
equals its chunk count. Latency p50 / p99 and requests/s are reported. Same-run baseline, before
the load: rounds of the same mix of calls one at a time, in-process (Retriever.search,
Encoder.encode; no HTTP) and over HTTP, interleaved: the HTTP overhead, and what concurrency
gains over one client.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import socket
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]
SCIFACT = REPO.parent / "shared" / "data" / "beir" / "scifact"
MIX = [("search", 0.4), ("search_get", 0.2), ("openai", 0.2), ("tei", 0.2)]
FILTERED_MIX = [("filter_num", 0.35), ("filter_eq", 0.35), ("filter_num_get", 0.15), ("filter_eq_get", 0.15)]
UNFILTERED_MIX = [("plain", 0.7), ("plain_get", 0.3)]  # the same searches without a filter: the control
NUM_WHERE, EQ_WHERE = {"year": {">=": 2010}}, {"lang": "de"}
REV_QUERY = "revision marker of the load test document"


def seed_documents(n: int) -> list[dict]:
    """n documents with metadata the filtered run selects on: year 1995-2024, lang 'de' for one in 50."""
    f = SCIFACT / "corpus.jsonl"
    texts = []
    if f.exists():
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                d = json.loads(line)
                texts.append(f"{d.get('title', '')}. {d['text']}"[:1500])
                if len(texts) >= n:
                    break
    topics = ["antibiotic resistance", "soil bacteria", "sleep and memory", "bone density", "gene expression", "vaccination rates"]
    while len(texts) < n:
        i = len(texts)
        texts.append(f"Seed note {i} on {topics[i % len(topics)]} and {topics[(i * 7) % len(topics)]}, study number {i}.")
    return [{"id": f"seed-{i}", "text": t, "metadata": {"year": 1995 + (i * 7) % 30, "lang": "de" if i % 50 == 0 else "en"}}
            for i, t in enumerate(texts)]


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def queries() -> list[str]:
    f = SCIFACT / "queries.jsonl"
    if f.exists():
        return [json.loads(line)["text"] for line in open(f, encoding="utf-8")][:500]
    return ["loan approval", "how to start sourdough", "meteor showers", "strength training", "packing light",
            "credit score", "database index", "ocean currents", "sleep and recovery", "code review"]


def request_for(kind: str, q: str, rng: random.Random):
    if kind == "search":
        if rng.random() < 0.25:
            return "POST", "/search", {"query": REV_QUERY, "k": 5}
        return "POST", "/search", {"query": q, "k": 10}
    if kind == "search_get":
        return "GET", "/search", {"q": q, "k": 10}
    if kind == "openai":
        return "POST", "/v1/embeddings", {"input": [q, q[::-1]]}
    if kind == "plain":
        return "POST", "/search", {"query": q, "k": 10}
    if kind == "plain_get":
        return "GET", "/search", {"q": q, "k": 10}
    if kind == "filter_num":
        return "POST", "/search", {"query": q, "k": 10, "where": NUM_WHERE}
    if kind == "filter_eq":
        return "POST", "/search", {"query": q, "k": 10, "where": EQ_WHERE}
    if kind == "filter_num_get":
        return "GET", "/search", {"q": q, "k": 10, "where": "year>=2010"}
    if kind == "filter_eq_get":
        return "GET", "/search", {"q": q, "k": 10, "where": "lang=de"}
    return "POST", "/embed", {"inputs": q}


def filter_violations(kind: str, hits: list[dict]) -> list[str]:
    """Hits of a filtered search that do not satisfy its filter."""
    if kind.startswith("filter_num"):
        bad = [h for h in hits if not (isinstance(h["metadata"].get("year"), (int, float)) and h["metadata"]["year"] >= 2010)]
    elif kind.startswith("filter_eq"):
        bad = [h for h in hits if h["metadata"].get("lang") != "de"]
    else:
        return []
    return [f"{kind}: {h['path']} {h['metadata']} does not pass the filter" for h in bad]


async def client(cid: int, url: str, n: int, qs: list[str], results: dict, published: dict, problems: list,
                 mix: list = MIX, headers: dict | None = None) -> None:
    import httpx

    rng = random.Random(cid)
    last_gen = 0
    async with httpx.AsyncClient(base_url=url, timeout=120, headers=headers) as c:
        for _ in range(n):
            kind = rng.choices([m for m, _ in mix], [w for _, w in mix])[0]
            method, path, body = request_for(kind, rng.choice(qs), rng)
            t = time.perf_counter()
            r = await (c.get(path, params=body) if method == "GET" else c.post(path, json=body))
            results.setdefault(kind, []).append(time.perf_counter() - t)
            if r.status_code != 200:
                problems.append(f"{method} {path}: {r.status_code} {r.text[:200]}")
                continue
            if kind.startswith(("search", "filter", "plain")):
                data = r.json()
                problems.extend(filter_violations(kind, data["hits"]))
                if kind.startswith("filter"):
                    results["filtered_hits"] = results.get("filtered_hits", 0) + len(data["hits"])
                g = data["generation"]
                if g < last_gen:
                    problems.append(f"client {cid}: generation went back from {last_gen} to {g}")
                last_gen = g
                results.setdefault("generations", set()).add(g)
                for h in data["hits"]:
                    if h["path"] == "api:load-rev":
                        rev = h["metadata"]["revision"]
                        if f"revision {rev}." not in h["text"]:
                            problems.append(f"api:load-rev text and metadata disagree at generation {g}: {h['text']!r} {h['metadata']}")
                        results.setdefault("rev_checks", []).append((g, rev))


async def writer(url: str, stop: asyncio.Event, published: dict, timings: list, problems: list, interval: float,
                 headers: dict | None = None, start: int = 0) -> None:
    import httpx

    i = start
    async with httpx.AsyncClient(base_url=url, timeout=120, headers=headers) as c:
        while not stop.is_set():
            docs = [{"id": "load-rev", "text": f"{REV_QUERY}: revision {i}.", "metadata": {"revision": i}},
                    {"id": f"load-new-{i}", "text": f"Load test note {i} about antibiotic resistance and soil bacteria.",
                     "metadata": {"n": i, "year": 2000 + i % 25, "lang": "de" if i % 2 else "en"}}]
            t = time.perf_counter()
            r = await c.post("/documents", json={"documents": docs})
            if r.status_code != 200:
                problems.append(f"upsert {i}: {r.status_code} {r.text[:200]}")
            else:
                published[r.json()["generation"]] = i
                timings.append(time.perf_counter() - t)
            if i >= 3:
                t = time.perf_counter()
                r = await c.delete(f"/documents/load-new-{i - 3}")
                if r.status_code != 200:
                    problems.append(f"delete {i - 3}: {r.status_code} {r.text[:200]}")
                else:
                    published[r.json()["generation"]] = i  # the revision stays i
                    timings.append(time.perf_counter() - t)
            i += 1
            try:
                await asyncio.wait_for(stop.wait(), interval)
            except asyncio.TimeoutError:
                pass
    return i


async def big_with_health(url: str, qs: list[str], n: int, headers: dict | None) -> dict:
    """n searches of 10 queries x k=1000 (the default --max-results), one after another, while
    another client polls /health: how long the big ones take and what /health waits meanwhile."""
    import httpx

    done = asyncio.Event()
    health: list[float] = []
    big: list[tuple[float, int, int]] = []

    async def poll() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            while not done.is_set():
                t = time.perf_counter()
                r = await c.get("/health")
                health.append(time.perf_counter() - t)
                if r.status_code != 200:
                    raise SystemExit(f"/health answered {r.status_code} during the big requests")
                await asyncio.sleep(0.02)

    async def searches() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=600, headers=headers) as c:
            for i in range(n):
                t = time.perf_counter()
                r = await c.post("/search", json={"queries": qs[i * 10:(i + 1) * 10] or qs[:10], "k": 1000})
                r.raise_for_status()
                big.append((time.perf_counter() - t, len(r.content), sum(len(x["hits"]) for x in r.json()["results"])))
        done.set()

    await asyncio.gather(poll(), searches())
    return {"requests": n, "seconds_each": [round(b[0], 2) for b in big], "response_mb_each": [round(b[1] / 2**20, 1) for b in big],
            "hits_each": [b[2] for b in big], "health_polls": len(health), "health_p50_ms": round(1000 * pct(health, 50), 1),
            "health_max_ms": round(1000 * max(health), 1) if health else None}


def mix(n: int, qs: list[str], seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    return [(rng.choices([m for m, _ in MIX], [w for _, w in MIX])[0], rng.choice(qs)) for _ in range(n)]


def in_process(r, calls: list[tuple[str, str]]) -> list[float]:
    """The calls in this process (Retriever.search, Encoder.encode; no HTTP), one at a time."""
    lat = []
    for kind, q in calls:
        t = time.perf_counter()
        if kind.startswith("search"):
            r.search(q, k=10)
        elif kind == "openai":
            r.encoder.encode([q, q[::-1]])
        else:
            r.encoder.encode([q])
        lat.append(time.perf_counter() - t)
    return lat


def over_http(url: str, calls: list[tuple[str, str]], headers: dict | None = None) -> list[float]:
    """The same calls through the server, one at a time."""
    import httpx

    lat = []
    rng = random.Random(0)
    with httpx.Client(base_url=url, timeout=120, headers=headers) as c:
        for kind, q in calls:
            method, path, body = request_for(kind, q, rng)
            t = time.perf_counter()
            r = c.get(path, params=body) if method == "GET" else c.post(path, json=body)
            lat.append(time.perf_counter() - t)
            r.raise_for_status()
    return lat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=str(REPO / "data" / "sample"))
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--baseline-calls", type=int, default=40, help="Calls per baseline round (in-process, then over HTTP, one at a time).")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--write-interval", type=float, default=0.2, help="Seconds between the writer's upserts.")
    ap.add_argument("--filtered-requests", type=int, default=1000, help="Requests of the filtered run, and of its unfiltered control (0: skip both).")
    ap.add_argument("--seed-docs", type=int, default=300, help="Documents with year/lang metadata upserted before the runs.")
    ap.add_argument("--big-requests", type=int, default=3, help="Searches of --max-results hits (10 queries x k=1000) while /health is polled (0: skip).")
    ap.add_argument("--api-key", action="store_true", help="Run the server with an API key and send it (the cost of checking it).")
    ap.add_argument("--out", default=str(REPO / "results" / "bench_serve.json"))
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench_serve_"))
    folder = tmp / "idx"
    proc = None
    try:
        subprocess.run([sys.executable, "-m", "semsearch.cli", "index", args.corpus, "--index", str(folder), "--no-progress"],
                       check=True, cwd=REPO)
        qs = queries()

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        env, headers = dict(os.environ), None
        if args.api_key:
            import secrets

            env["SEMSEARCH_API_KEY"] = secrets.token_urlsafe(32)
            headers = {"Authorization": f"Bearer {env['SEMSEARCH_API_KEY']}"}
        proc = subprocess.Popen([sys.executable, "-m", "semsearch.cli", "serve", "--index", str(folder), "--port", str(port),
                                 "--device", "cpu"], cwd=REPO, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
        import httpx

        deadline = time.time() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline or proc.poll() is not None:
                raise SystemExit(f"the server did not start: {proc.stderr.read() if proc.poll() is not None else 'timeout'}")
            time.sleep(0.2)

        seeds = seed_documents(args.seed_docs)
        t = time.perf_counter()
        for at in range(0, len(seeds), 50):
            r = httpx.post(url + "/documents", json={"documents": seeds[at:at + 50]}, headers=headers, timeout=600)
            if r.status_code != 200:
                raise SystemExit(f"seeding failed: {r.status_code} {r.text[:300]}")
        seed_seconds = time.perf_counter() - t

        # Same-run baseline: the same sequential calls in-process and over HTTP, interleaved.
        from semsearch.search import Retriever

        local = Retriever.load(folder, device="cpu")
        base: dict[str, list[float]] = {"in_process": [], "http_sequential": []}
        for rnd in range(args.rounds):
            calls = mix(args.baseline_calls, qs, rnd)
            # on a worker thread, as the server runs them: on a loaded machine the main thread's
            # OpenMP team can be many times slower than a worker thread's for the same call
            with ThreadPoolExecutor(1) as pool:
                base["in_process"] += pool.submit(in_process, local, calls).result()
            base["http_sequential"] += over_http(url, calls, headers)
        local.close()
        del local

        results: dict = {}
        published: dict[int, int] = {}
        problems: list[str] = []
        writes: list[float] = []

        async def run(n_requests: int, mix: list, results: dict, problems: list, writes: list, start: int) -> tuple[float, int]:
            stop = asyncio.Event()
            w = asyncio.create_task(writer(url, stop, published, writes, problems, args.write_interval, headers, start))
            per = [n_requests // args.clients + (1 if i < n_requests % args.clients else 0) for i in range(args.clients)]
            t0 = time.perf_counter()
            await asyncio.gather(*(client(i, url, n, qs, results, published, problems, mix, headers) for i, n in enumerate(per)))
            elapsed = time.perf_counter() - t0
            stop.set()
            return elapsed, await w

        passes0 = httpx.get(url + "/info", headers=headers).json()["encoder_passes"]
        elapsed, next_write = asyncio.run(run(args.requests, MIX, results, problems, writes, 0))
        passes1 = httpx.get(url + "/info", headers=headers).json()["encoder_passes"]

        n_published = len(published)

        def search_run(mix: list, start: int) -> tuple[dict, int]:
            """A run of searches only, from the same clients, with the writer going on."""
            res: dict = {}
            probs: list[str] = []
            wr: list[float] = []
            secs, nxt = asyncio.run(run(args.filtered_requests, mix, res, probs, wr, start))
            lat_ = [x for k, v in res.items() if k in dict(mix) for x in v]
            hits = res.get("filtered_hits", 0)
            return {
                "clients": args.clients, "requests": len(lat_), "errors": len(probs), "problems": probs[:20],
                "seconds": round(secs, 2), "requests_per_s": round(len(lat_) / secs, 1),
                "p50_ms": round(1000 * pct(lat_, 50), 2), "p99_ms": round(1000 * pct(lat_, 99), 2),
                "by_kind": {k: {"n": len(res.get(k, [])), "p50_ms": round(1000 * pct(res.get(k, []), 50), 2),
                                "p99_ms": round(1000 * pct(res.get(k, []), 99), 2)} for k, _ in mix},
                "writes": {"n": len(wr), "p50_ms": round(1000 * pct(wr, 50), 1), "p99_ms": round(1000 * pct(wr, 99), 1)},
                "generations_seen": len(res.get("generations", ())),
                **({"hits_per_request": round(hits / max(1, len(lat_)), 2)} if hits else {}),  # each checked against its filter
            }, nxt

        unfiltered: dict = {}
        filtered: dict = {}
        if args.filtered_requests:  # the same searches without, then with filters
            unfiltered, next_write = search_run(UNFILTERED_MIX, next_write)
            filtered, next_write = search_run(FILTERED_MIX, next_write)

        big: dict = {}
        if args.big_requests:
            big = asyncio.run(big_with_health(url, qs, args.big_requests, headers))

        # Every revision seen must be the one published at or before its response's generation,
        # and no older than the newest published at that generation.
        gens = sorted(published)
        for g, rev in results.get("rev_checks", []):
            at = [published[x] for x in gens if x <= g]
            if at and at[-1] != rev:
                problems.append(f"generation {g} served revision {rev}, but it holds revision {at[-1]}")
        from semsearch.store import Manifest, open_index

        m = Manifest.load(folder)
        _, vectors, docs = open_index(folder)
        if not vectors.ntotal == docs.counts()["chunks"] == m.counts["chunks"]:
            problems.append(f"after the run: {vectors.ntotal} vectors, {docs.counts()['chunks']} chunks, manifest {m.counts['chunks']}")

        lat = [x for k, v in results.items() if k in dict(MIX) for x in v]
        report = {
            "cpu": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores visible",
            "corpus": args.corpus, "seed_docs": len(seeds), "seed_seconds": round(seed_seconds, 1), "api_key": args.api_key,
            "chunks_at_end": m.counts["chunks"], "clients": args.clients,
            "requests": len(lat), "errors": len(problems), "problems": problems[:20],
            "seconds": round(elapsed, 2), "requests_per_s": round(len(lat) / elapsed, 1),
            "p50_ms": round(1000 * pct(lat, 50), 2), "p99_ms": round(1000 * pct(lat, 99), 2),
            "by_kind": {k: {"n": len(results.get(k, [])), "p50_ms": round(1000 * pct(results.get(k, []), 50), 2),
                            "p99_ms": round(1000 * pct(results.get(k, []), 99), 2)} for k, _ in MIX},
            "writes": {"n": len(writes), "interval_s": args.write_interval, "generations_published": n_published,
                       "p50_ms": round(1000 * pct(writes, 50), 1), "p99_ms": round(1000 * pct(writes, 99), 1)},
            "texts_per_encoder_pass": round((passes1["texts"] - passes0["texts"]) / max(1, passes1["passes"] - passes0["passes"]), 2),
            "generations_seen_by_searches": len(results.get("generations", ())),
            "revision_checks": len(results.get("rev_checks", [])),
            "sequential_baseline": {k: {"calls": len(v), "p50_ms": round(1000 * pct(v, 50), 2), "calls_per_s": round(len(v) / sum(v), 1)}
                                    for k, v in base.items()},
            "http_overhead_p50_ms": round(1000 * (pct(base["http_sequential"], 50) - pct(base["in_process"], 50)), 2),
            "http_vs_in_process_p50": round(pct(base["http_sequential"], 50) / pct(base["in_process"], 50), 2),
            "concurrent_vs_sequential_http_throughput": round(len(lat) / elapsed / (len(base["http_sequential"]) / sum(base["http_sequential"])), 2),
            "unfiltered_searches": unfiltered,
            "filtered": filtered,
            "big_requests": big,
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps(report, indent=2))
        if problems or any(x and x["errors"] for x in (unfiltered, filtered)):
            raise SystemExit(1)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(20)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
