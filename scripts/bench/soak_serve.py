"""A soak of `semsearch serve` as many clients share it: searchers, a writer, slow and idle
connections and oversized bodies at once, against a quiet run of the same searchers.

    python scripts/bench/soak_serve.py [--minutes 5] [--quiet-seconds 60] [--searchers 8] [--slow 50]

Indexes the bundled sample (data/sample) with the real model, starts `semsearch serve` (the CLI,
real uvicorn, loopback) and runs two phases:
- quiet: --searchers threads, each with its own keep-alive connection, searching in turn;
- soak (--minutes): the same searchers, plus a writer (POST /documents then DELETE, in turn), --slow
  connections that never finish a request (half idle, half sending a header byte every 2 s; each
  reopened when the server closes it), and a 1,000,000-item body to POST /documents every
  --oversized-every seconds.
Counts as an error: a search or write that is not 200, an oversized body that is not refused with
a 4xx, anything that raises (timeouts included), and a searcher that sees a generation older than
one it saw before. Prints search p50/p99 of both phases and their ratio, the CPU's flags and the
load average. Figures: docs/serve.md, "A soak".
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "bench"))
from bench_filters import cpu_flags  # noqa: E402
QUERIES = ["loan approval", "how long does a loan take", "lentil soup with cumin", "muscle recovery after exercise",
           "printing press in Europe", "watering tomatoes", "credit score check", "sleep and training",
           "books spread", "what to cook tonight", "mortgage rates", "garden vegetables in summer"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3 if xs else float("nan")


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.errors: list[str] = []
        self.counts: dict[str, int] = {}

    def error(self, what: str) -> None:
        with self.lock:
            self.errors.append(what)

    def count(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + n


def searcher(url: str, j: int, stop: threading.Event, lat: list[float], tally: Tally) -> None:
    import httpx

    seen = 0
    with httpx.Client(base_url=url, timeout=60) as c:
        i = j
        while not stop.is_set():
            q = QUERIES[i % len(QUERIES)]
            i += 1
            t0 = time.perf_counter()
            try:
                r = c.post("/search", json={"query": q, "k": 10})
            except Exception as e:  # noqa: BLE001 - every failure counts
                tally.error(f"search raised {type(e).__name__}: {e}")
                continue
            lat.append(time.perf_counter() - t0)
            if r.status_code != 200:
                tally.error(f"search {r.status_code}: {r.text[:200]}")
                continue
            g = r.json()["generation"]
            if g < seen:
                tally.error(f"searcher {j} saw generation {g} after {seen}")
            seen = max(seen, g)
            tally.count("searches")


def writer(url: str, stop: threading.Event, tally: Tally) -> None:
    import httpx

    n = 0
    with httpx.Client(base_url=url, timeout=120) as c:
        while not stop.is_set():
            doc = {"id": f"soak-{n}", "text": f"Soak note {n}: the loan desk answers within one business day.",
                   "metadata": {"n": n}}
            try:
                up = c.post("/documents", json={"documents": [doc]})
                gone = c.delete(f"/documents/soak-{n}")
            except Exception as e:  # noqa: BLE001
                tally.error(f"write raised {type(e).__name__}: {e}")
                continue
            for what, r in (("upsert", up), ("delete", gone)):
                if r.status_code != 200:
                    tally.error(f"{what} {r.status_code}: {r.text[:200]}")
            tally.count("writes", 2)
            n += 1


def slow_client(port: int, trickle: bool, stop: threading.Event, tally: Tally) -> None:
    """A connection that never finishes its request; reopened whenever the server closes it."""
    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 10_000
    while not stop.is_set():
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError as e:
            tally.error(f"slow connect: {e}")
            stop.wait(1)
            continue
        tally.count("slow connections")
        s.settimeout(0.5)
        at = 0
        try:
            while not stop.is_set():
                if trickle and at < len(request):
                    s.sendall(request[at:at + 1])
                    at += 1
                try:
                    if s.recv(4096) == b"":
                        tally.count("slow connections closed by the server")
                        break
                    tally.count("slow connections answered")  # a 408 before the close
                except socket.timeout:
                    pass
                stop.wait(1.5 if trickle else 0.5)
        except OSError:
            tally.count("slow connections closed by the server")
        finally:
            s.close()


def oversized(url: str, every: float, stop: threading.Event, times: list[float], tally: Tally) -> None:
    import httpx

    body = b'{"documents": [' + b",".join([b"{}"] * 1_000_000) + b"]}"
    with httpx.Client(base_url=url, timeout=120) as c:
        while not stop.wait(every):
            t0 = time.perf_counter()
            try:
                r = c.post("/documents", content=body, headers={"content-type": "application/json"})
            except Exception as e:  # noqa: BLE001
                tally.error(f"oversized raised {type(e).__name__}: {e}")
                continue
            times.append(time.perf_counter() - t0)
            tally.count(f"oversized {r.status_code}")
            if not 400 <= r.status_code < 500:
                tally.error(f"oversized body answered {r.status_code}")


def phase(url: str, port: int, seconds: float, args, loaded: bool) -> dict:
    stop, tally, lat, big = threading.Event(), Tally(), [[] for _ in range(args.searchers)], []
    threads = [threading.Thread(target=searcher, args=(url, j, stop, lat[j], tally)) for j in range(args.searchers)]
    if loaded:
        threads.append(threading.Thread(target=writer, args=(url, stop, tally)))
        threads += [threading.Thread(target=slow_client, args=(port, j % 2 == 0, stop, tally), daemon=True)
                    for j in range(args.slow)]
        threads.append(threading.Thread(target=oversized, args=(url, args.oversized_every, stop, big, tally)))
    for t in threads:
        t.start()
    time.sleep(seconds)
    load = os.getloadavg()[0]
    stop.set()
    for t in threads:
        t.join(timeout=180)
    lats = [x for xs in lat for x in xs]
    return {"p50": pct(lats, 0.5), "p99": pct(lats, 0.99), "n": len(lats), "errors": tally.errors,
            "counts": tally.counts, "load": load, "oversized_max_s": max(big, default=float("nan"))}


def main() -> None:
    import httpx

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=5.0, help="length of the soak phase")
    ap.add_argument("--quiet-seconds", type=float, default=60.0, help="length of the quiet phase")
    ap.add_argument("--searchers", type=int, default=8)
    ap.add_argument("--slow", type=int, default=50, help="connections that never finish a request")
    ap.add_argument("--oversized-every", type=float, default=3.0, help="seconds between 1,000,000-item bodies")
    ap.add_argument("--index", type=Path, help="an index to serve (its documents are written to); default: the sample")
    args = ap.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    semsearch = [sys.executable, "-m", "semsearch.cli"]
    index = args.index
    if index is None:
        index = Path(tempfile.mkdtemp()) / "idx"
        subprocess.run([*semsearch, "index", str(REPO / "data" / "sample"), "--index", str(index)], check=True, env=env,
                       stdout=subprocess.DEVNULL)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(Path(tempfile.mkdtemp()) / "serve.log", "w+")
    server = subprocess.Popen([*semsearch, "serve", "--index", str(index), "--port", str(port)], env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        httpx.post(url + "/search", json={"query": "warm up"}, timeout=60)
        print(f"CPU flags: {cpu_flags()}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}", flush=True)
        quiet = phase(url, port, args.quiet_seconds, args, loaded=False)
        print(f"quiet ({args.quiet_seconds:.0f} s, {args.searchers} searchers): {quiet['n']} searches, "
              f"p50 {quiet['p50']:.1f} ms, p99 {quiet['p99']:.1f} ms, errors {len(quiet['errors'])}, "
              f"load {quiet['load']:.2f}", flush=True)
        soak = phase(url, port, args.minutes * 60, args, loaded=True)
        print(f"soak ({args.minutes:g} min: {args.searchers} searchers, a writer, {args.slow} slow or idle connections, "
              f"a 1,000,000-item body every {args.oversized_every:g} s): {soak['n']} searches, p50 {soak['p50']:.1f} ms, "
              f"p99 {soak['p99']:.1f} ms (p99 {soak['p99'] / quiet['p99']:.2f}x quiet), errors {len(soak['errors'])}, "
              f"load {soak['load']:.2f}; oversized refused in at most {soak['oversized_max_s']:.2f} s")
        print("counts: " + json.dumps(dict(sorted(soak["counts"].items()))))
        for e in (quiet["errors"] + soak["errors"])[:20]:
            print("  error:", e)
        print("server still answers:", httpx.get(url + "/health", timeout=10).json())
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.seek(0)
        tracebacks = log.read().count("Traceback")
        print(f"server log: {log.name} ({tracebacks} tracebacks)")
    sys.exit(1 if quiet["errors"] or soak["errors"] else 0)


if __name__ == "__main__":
    main()
