"""Docs/s of the Ray engine (1 and 2 CPU actors) against the local engine on the same machine,
and what staging through Parquet shards costs.

    python scripts/bench/bench_ray.py [--docs 400] [--rounds 2]

Builds the same index from the first --docs SciFact documents (split into 16 JSONL files) with:
  local      the streaming path of `semsearch index` (torch on all cores, in this process)
  inprocess  the shards path in this process: same encoder, plus writing and reading the shards
             (inprocess / local = the staging overhead, without any cluster)
  ray-1      Ray Data on a local cluster, 1 CPU actor (torch on 1 thread)
  ray-2      the same, 2 CPU actors
Runs are interleaved over --rounds rounds; every figure is also given as a ratio to the local
run of the same round. The cluster's start-up is timed once, apart; each Ray run includes its
actors' start-up (importing torch, loading the model), as a real run would. A last line gives the
steady-state throughput of one replica (the encoder on 1 thread, in process): the figure for
sizing a CPU cluster.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]


def cpu_flags() -> str:
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return platform.processor()
    return " ".join(f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags) + f", {os.cpu_count()} cores"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "beir" / "scifact"))
    ap.add_argument("--docs", type=int, default=400)
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "results" / "bench_ray.json"))
    args = ap.parse_args()

    import ray
    import torch

    from semsearch.corpus import ReadOptions
    from semsearch.encoder import Encoder
    from semsearch.engines.inprocess import InProcessEngine
    from semsearch.engines.ray_engine import RayEngine
    from semsearch.indexing import index_corpus

    lines = (Path(args.data) / "corpus.jsonl").read_text().splitlines(keepends=True)[: args.docs]
    enc = Encoder(device="cpu", precision="fp32")
    report = {"cpu": cpu_flags(), "precision": enc.precision, "docs": len(lines), "files": args.files, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus"
        corpus.mkdir()
        per = -(-len(lines) // args.files)
        for i in range(args.files):
            (corpus / f"part{i:02d}.jsonl").write_text("".join(lines[i * per:(i + 1) * per]))
        t = time.perf_counter()
        ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
        report["cluster_start_seconds"] = round(time.perf_counter() - t, 2)
        print(f"local Ray cluster (num_cpus=2) started in {report['cluster_start_seconds']} s", flush=True)
        engines = {"local": lambda: None, "inprocess": lambda: InProcessEngine(enc),
                   "ray-1": lambda: RayEngine(workers=1), "ray-2": lambda: RayEngine(workers=2)}
        for r in range(args.rounds):
            order = list(engines) if r % 2 == 0 else list(reversed(engines))
            for name in order:
                t = time.perf_counter()
                rep = index_corpus(corpus, Path(tmp) / f"{name}-{r}", enc, read=ReadOptions(text_column="title,text"),
                                   rebuild=True, progress=False, engine=engines[name]())
                secs = time.perf_counter() - t
                run = {"round": r, "engine": name, "seconds": round(secs, 2), "chunks": rep.chunks,
                       "docs_per_s": round(rep.documents / secs, 2), **{f"engine_{k}": v for k, v in (rep.engine or {}).items()
                                                                        if k in ("seconds", "staged_bytes", "build_seconds", "shards")}}
                report["runs"].append(run)
                print(run, flush=True)
        ray.shutdown()
        # one replica in steady state: the encoder on one thread, in this process (model loaded),
        # over the chunks the local run made

        local = Path(tmp) / "local-0"
        from semsearch.store.manifest import Manifest
        from semsearch.store.segments import read_rows

        texts = [t for _, t in read_rows(local, Manifest.load(local), "c.text")]  # every segment
        threads = torch.get_num_threads()
        replica = {}
        for n_threads in (1, threads):
            torch.set_num_threads(n_threads)
            enc.encode(texts[:32])  # warm up the shapes
            t = time.perf_counter()
            enc.encode(texts)
            replica[n_threads] = len(texts) / (time.perf_counter() - t)
        torch.set_num_threads(threads)
        report["replica_chunks_per_s"] = {f"{k} thread(s)": round(v, 2) for k, v in replica.items()}
    for name in engines:
        ratios = [x["seconds"] / next(y["seconds"] for y in report["runs"] if y["engine"] == "local" and y["round"] == x["round"])
                  for x in report["runs"] if x["engine"] == name]
        dps = [x["docs_per_s"] for x in report["runs"] if x["engine"] == name]
        report.setdefault("summary", {})[name] = {"docs_per_s_median": round(statistics.median(dps), 2),
                                                 "time_vs_local_median": round(statistics.median(ratios), 3)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()
