"""What one oversized request body costs everyone else: `/health` latency on a second connection
while a large body is sent to `POST /documents`, and how long until that body is refused.

    python scripts/bench/bench_serve_bodies.py [--rounds 3]

Two bodies: a million empty documents (3 MB; refused for its count) and a thousand documents
with large metadata (7 MB, 1.7M JSON values; refused for its values). The server is
`semsearch serve`'s app on loopback over a small index (stand-in encoder: the cost measured is
the body's, not the model's). Run it on two checkouts to compare (the docs quote before/after).
Figures: docs/serve.md, "Limits".
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))


def cpu_flags() -> str:
    try:
        flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split()
    except (OSError, StopIteration):
        return "?"
    return " ".join(f for f in ("amx_bf16", "avx512f", "avx2") if f in flags) or "none of amx/avx512/avx2"


def bodies() -> dict[str, bytes]:
    meta = {f"k{i}": [i, {"v": "x"}] for i in range(280)}
    docs = [{"id": f"d{i}", "text": "some text", "metadata": meta} for i in range(999)] + [{"id": "last"}]
    return {"a million empty documents": b'{"documents": [' + b",".join([b"{}"] * 1_000_000) + b"]}",
            "1,000 documents, 1.7M values": json.dumps({"documents": docs}).encode()}


def main() -> None:
    import httpx

    from conftest import FakeEncoder, running
    from semsearch.indexing import index_corpus
    from semsearch.serve import create_app
    from semsearch.service import Service

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    (tmp / "corpus").mkdir()
    (tmp / "corpus" / "a.txt").write_text("loan approval takes one business day")
    index_corpus(tmp / "corpus", tmp / "idx", FakeEncoder(), progress=False)
    print(f"CPU flags: {cpu_flags()}; load average {os.getloadavg()[0]:.2f}")
    with running(create_app(Service(tmp / "idx", device="cpu", encoder=FakeEncoder()))) as url:
        with httpx.Client(base_url=url, timeout=120) as c:
            quiet = []
            for _ in range(200):
                t0 = time.perf_counter()
                c.get("/health")
                quiet.append(time.perf_counter() - t0)
        quiet.sort()
        print(f"quiet /health: p50 {quiet[100] * 1e3:.1f} ms, p99 {quiet[198] * 1e3:.1f} ms")
        for name, body in bodies().items():
            for _ in range(args.rounds):
                done, lat, res = threading.Event(), [], []

                def big():
                    t0 = time.perf_counter()
                    with httpx.Client(base_url=url, timeout=300) as big_c:
                        r = big_c.post("/documents", content=body, headers={"content-type": "application/json"})
                    res.append((r.status_code, time.perf_counter() - t0))
                    done.set()

                with httpx.Client(base_url=url, timeout=300) as c:
                    c.get("/health")
                    t = threading.Thread(target=big)
                    t.start()
                    while not done.is_set():
                        t0 = time.perf_counter()
                        c.get("/health")
                        lat.append(time.perf_counter() - t0)
                    t.join()
                lat.sort()
                p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
                print(f"{name} ({len(body) / 1e6:.1f} MB): HTTP {res[0][0]} after {res[0][1]:.2f} s; /health during it: "
                      f"n {len(lat)}, p50 {lat[len(lat) // 2] * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, max {lat[-1] * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
