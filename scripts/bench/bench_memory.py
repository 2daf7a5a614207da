"""Peak memory of `semsearch index` on SciFact: the whole corpus against a fifth of it.

    python scripts/bench/bench_memory.py

Indexing streams (documents are read, chunked and embedded in flushes of 512 chunks), so peak RSS
should stay nearly flat as the corpus grows; only the vector index (1.5 KB a chunk) grows with it.
Each run is a fresh process; its peak RSS is read with getrusage by a small parent process.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]

MEASURE = r"""
import resource, subprocess, sys, time
t = time.perf_counter()
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, time.perf_counter() - t)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "beir" / "scifact"))
    ap.add_argument("--out", default=str(REPO / "results" / "bench_memory.json"))
    args = ap.parse_args()
    lines = (Path(args.data) / "corpus.jsonl").read_text().splitlines(keepends=True)
    report = {"runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        for frac in (0.2, 1.0):
            corpus = Path(tmp) / f"c{frac}"
            corpus.mkdir()
            n = int(len(lines) * frac)
            (corpus / "corpus.jsonl").write_text("".join(lines[:n]))
            cmd = [sys.executable, "-m", "semsearch.cli", "index", str(corpus), "--index", str(Path(tmp) / f"i{frac}"), "--no-progress"]
            out = subprocess.run([sys.executable, "-c", MEASURE, *cmd], check=True, capture_output=True, text=True, cwd=REPO)
            kb, secs = out.stdout.split()
            manifest = json.loads((Path(tmp) / f"i{frac}" / "manifest.json").read_text())
            report["runs"].append({"documents": n, "chunks": manifest["counts"]["chunks"], "peak_rss_mb": round(int(kb) / 1024, 1),
                                   "seconds": round(float(secs), 1)})
            print(report["runs"][-1], flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
