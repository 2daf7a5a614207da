"""Single-query latency of a long-lived Retriever (torch encoder) with one torch thread for small
inputs (the default) against all threads (before), on a quiet CPU and beside two busy processes.

    python scripts/bench/bench_threads.py [--index DIR] [--queries 80]

Both settings are interleaved query by query, so background noise hits them alike. Without --index
it indexes the bundled sample corpus once into results/bench_threads_index.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", default=str(REPO / "results" / "bench_threads_index"))
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "beir" / "scifact"))
    ap.add_argument("--queries", type=int, default=80)
    args = ap.parse_args()

    import torch

    import semsearch.encoder.encoder as enc_mod
    from semsearch.search import Retriever

    if not (Path(args.index) / "manifest.json").exists():
        subprocess.run([sys.executable, "-m", "semsearch.cli", "index", str(REPO / "data" / "sample"), "--index", args.index,
                        "--no-progress", "--precision", "fp32"], check=True)
    r = Retriever.load(args.index, device="cpu")
    qs = [json.loads(line)["text"] for line in open(Path(args.data) / "queries.jsonl")][: args.queries]
    small = enc_mod.SMALL_CHARS

    def one(q: str, limit: int) -> float:
        enc_mod.SMALL_CHARS = limit
        t = time.perf_counter()
        r.search(q, 10, mode="dense")
        return time.perf_counter() - t

    for q in qs[:10]:
        one(q, small)
    report = {"torch_threads": torch.get_num_threads(), "cpu_flags": sorted({f for f in open("/proc/cpuinfo").read().split()
                                                                             if f.startswith(("avx", "amx", "fma"))})}
    for label, hogs in (("quiet", 0), ("two busy processes", 2)):
        procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
        try:
            a, b = [], []
            for q in qs:
                a.append(one(q, small))
                b.append(one(q, -1))
        finally:
            for p in procs:
                p.kill()
        ms = lambda v: round(1000 * v, 1)  # noqa: E731
        report[label] = {"one_thread_p50_ms": ms(statistics.median(a)), "all_threads_p50_ms": ms(statistics.median(b)),
                         "one_thread_p90_ms": ms(sorted(a)[int(0.9 * len(a))]), "all_threads_p90_ms": ms(sorted(b)[int(0.9 * len(b))])}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
