"""What an abusive `where` costs a server: 10,000 fields in one request, against plain searches.

    python scripts/bench/bench_abuse.py [--fields 10000] [--rounds 20] [--index DIR]

Indexes the bundled sample (data/sample) with the real model (or takes --index), starts
`semsearch serve` in-process on a loopback port (real uvicorn), and reports, each as median and
spread over --rounds: a plain hybrid search; POST /search with --fields distinct `where` fields
(a ~160 KB body) and its status; a plain search again after the abusive ones; the server's RSS
before and after. Ratios are against the plain search of the same run. The CPU's flags and the
load average are printed with the figures.
"""
from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "bench"))
from bench_filters import cpu_flags  # noqa: E402


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(fn, rounds: int) -> tuple[list[float], object]:
    out, last = [], None
    for _ in range(rounds):
        t = time.perf_counter()
        last = fn()
        out.append((time.perf_counter() - t) * 1000)
    return out, last


def show(name: str, ms: list[float], base: float | None = None) -> str:
    med = statistics.median(ms)
    ratio = f"  {med / base:5.2f}x plain" if base else ""
    return f"{name:<34} p50 {med:8.2f} ms  (min {min(ms):.2f}, max {max(ms):.2f}, n={len(ms)}){ratio}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fields", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--index", type=Path)
    args = ap.parse_args()

    import httpx
    import uvicorn

    from semsearch.encoder import Encoder
    from semsearch.indexing import index_corpus
    from semsearch.serve import Service, create_app

    enc = Encoder(device="cpu")
    folder = args.index
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix="bench-abuse-")) / "idx"
        index_corpus(REPO / "data" / "sample", folder, enc, progress=False)
    app = create_app(Service(folder, device="cpu", encoder=enc))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}"
    client = httpx.Client(timeout=600)
    chunks = client.get(url + "/info").json().get("counts", {}).get("chunks")
    print(f"CPU flags: {cpu_flags()}; load average {os.getloadavg()[0]:.2f}; index {chunks} chunks")

    def plain():
        r = client.post(url + "/search", json={"query": "loan approval", "k": 10})
        assert r.status_code == 200, r.text
        return r

    wide = {"query": "loan approval", "k": 10, "where": {f"field{i}": "x" for i in range(args.fields)}}
    body = httpx.Request("POST", url, json=wide).content
    plain()  # warm: model, lexical side, first-call costs
    rss0 = rss_mb()
    before, _ = timed(plain, args.rounds)
    abusive, last = timed(lambda: client.post(url + "/search", content=body, headers={"content-type": "application/json"}), args.rounds)
    after, _ = timed(plain, args.rounds)
    rss1 = rss_mb()
    base = statistics.median(before)
    print(show("plain hybrid search", before))
    print(show(f"{args.fields:,} where fields ({len(body) / 1024:.0f} KB)", abusive, base)
          + f"  -> {last.status_code} {last.json().get('error', {}).get('message', '')[:70]!r}")
    print(show("plain hybrid search after", after, base))
    print(f"server RSS {rss0:.0f} MB -> {rss1:.0f} MB; load average {os.getloadavg()[0]:.2f}")
    server.should_exit = True


if __name__ == "__main__":
    sys.exit(main())
