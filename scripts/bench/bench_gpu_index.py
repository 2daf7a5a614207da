"""FAISS on the GPU against the CPU in one run, and encoder throughput at larger batches.

    python scripts/bench/bench_gpu_index.py index  [--n 1000000] [--dim 384] [--types flat,ivf,ivf-sq8,auto]
    python scripts/bench/bench_gpu_index.py encode [--docs 2000] [--queries 4000] [--batch-tokens 4096,16384,65536]

`index`: n synthetic unit vectors (Gaussian clusters, so IVF has structure to find) are built with
semsearch's VectorIndex on the CPU and, where faiss sees a GPU, on the GPU (`device="cuda"`), for
each type; `auto` is what semsearch picks for n vectors (choose_type). Half the queries tune the
search knob (nprobe) to --target-recall as `semsearch index` does, the other half measure recall@10
against exact search (a CPU flat index) and queries/s (one batched call, best of three). Where faiss
has no GPU the GPU rows are reported as skipped, with the reason.

`encode`: documents and queries of a BEIR corpus (SciFact by default) through semsearch's Encoder
on --device, for each precision and each batch size in tokens (Encoder.batch_tokens: 4096 on the CPU, 65536 on a GPU by
default in semsearch): documents/s, queries/s, and the cosine of each to the fp32 vectors.

Both print a table and write JSON to --out.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def synthetic(n: int, dim: int, nq: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(n x dim data, nq x dim queries), unit length, float32, in Gaussian clusters."""
    rng = np.random.default_rng(seed)
    n_centres = max(16, min(4096, n // 250))
    centres = rng.standard_normal((n_centres, dim), dtype=np.float32)
    x = np.empty((n, dim), np.float32)
    step = 200_000
    for s in range(0, n, step):
        m = min(step, n - s)
        x[s:s + m] = centres[rng.integers(0, n_centres, m)] + 0.8 * rng.standard_normal((m, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = x[rng.choice(n, nq, replace=False)] + 0.3 * rng.standard_normal((nq, dim), dtype=np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return x, q.astype(np.float32)


def best_of(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def run_index(args) -> dict:
    import faiss

    from semsearch.store.faiss_info import describe, faiss_build
    from semsearch.store.vecfile import MemoryVectors
    from semsearch.store.vectors import VectorIndex, choose_type, faiss_gpus, recall_at, tune

    info = faiss_build()
    gpus = faiss_gpus()
    print(f"faiss {describe(info)}; OpenMP threads {faiss.omp_get_max_threads()}", flush=True)
    t = time.perf_counter()
    x, q = synthetic(args.n, args.dim, args.queries)
    ids = np.arange(args.n, dtype=np.int64)
    print(f"data: {args.n:,} x {args.dim} vectors, {args.queries} queries ({time.perf_counter() - t:.1f} s)", flush=True)
    half = args.queries // 2
    q_tune, q_eval = q[:half], q[half:]

    t = time.perf_counter()
    exact = faiss.IndexFlatIP(args.dim)
    exact.add(x)
    _, exact_ids = exact.search(q, args.k)
    del exact
    print(f"exact top-{args.k} (CPU flat): {time.perf_counter() - t:.1f} s", flush=True)
    ex_tune, ex_eval = exact_ids[:half], exact_ids[half:]

    store = MemoryVectors(args.dim)
    store.add(ids, x)
    rows = []
    for requested in args.types.split(","):
        kind = choose_type(requested, args.n, args.dim)
        for device in args.devices.split(","):
            row = {"type": requested, "kind": kind, "device": device, "n": args.n, "dim": args.dim}
            if device == "cuda" and gpus == 0:
                row["skipped"] = "faiss has no GPU here (" + ("a CPU build of faiss" if not info["gpu_build"] else "no CUDA device seen") + ")"
                rows.append(row)
                print(f"{requested:8} {device:5} skipped: {row['skipped']}", flush=True)
                continue
            gc.collect()
            try:
                t = time.perf_counter()
                vi = VectorIndex.build(args.dim, kind, store, args.n, device=device)
                row["build_s"] = round(time.perf_counter() - t, 2)
                row["ran_on"] = vi.device
                row["built_on"] = getattr(vi, "built_on", None) or vi.device
                row["params"] = {k: v for k, v in vi.params.items() if isinstance(v, (int, float, str))}
                if kind != "flat":
                    row["tuned"] = tune(vi, q_tune, ex_tune, args.k, args.target_recall)
                vi.search(q_eval[:8], args.k)  # warm-up (the GPU copy is made on first search)
                got = {}

                def search():
                    got["ids"] = vi.search(q_eval, args.k)[1]

                secs = best_of(search)
                row["queries_per_s"] = round(len(q_eval) / secs, 1)
                row["recall_at_10"] = round(recall_at(got["ids"], ex_eval), 4)
                row["bytes"] = int(vi.nbytes)
                del vi
            except Exception as e:  # noqa: BLE001 - one row failing must not lose the others
                row["error"] = f"{type(e).__name__}: {e}"
            rows.append(row)
            print(f"{requested:8} {device:5} " + json.dumps({k: v for k, v in row.items() if k not in ("type", "device", "n", "dim")}), flush=True)

    print(f"\n{'type':9}{'kind':14}{'device':8}{'ran on':24}{'build s':>9}{'queries/s':>12}{'recall@10':>11}")
    for r in rows:
        if "skipped" in r or "error" in r:
            print(f"{r['type']:9}{r['kind']:14}{r['device']:8}{r.get('skipped') or r.get('error')}")
            continue
        print(f"{r['type']:9}{r['kind']:14}{r['device']:8}{r['built_on']:24}{r['build_s']:>9.2f}{r['queries_per_s']:>12,.0f}{r['recall_at_10']:>11.4f}")
    return {"bench": "index", "faiss": {k: v for k, v in info.items() if isinstance(v, (int, str, bool, type(None)))},
            "gpus": gpus, "n": args.n, "dim": args.dim, "queries": args.queries, "k": args.k,
            "target_recall": args.target_recall, "rows": rows}


def run_encode(args) -> dict:
    import torch

    from semsearch.encoder import Encoder

    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("encode: skipped on cuda: torch sees no CUDA device", flush=True)
        return {"bench": "encode", "device": "cuda", "skipped": "torch sees no CUDA device"}
    data = Path(args.data)
    docs, queries = [], []
    for line in open(data / "corpus.jsonl"):
        r = json.loads(line)
        docs.append(f"{r.get('title', '')} {r.get('text', '')}".strip())
        if len(docs) >= args.docs:
            break
    for line in open(data / "queries.jsonl"):
        queries.append(json.loads(line)["text"])
    queries = (queries * (args.queries // max(len(queries), 1) + 1))[: args.queries]
    print(f"encode on {device}: {len(docs)} documents, {len(queries)} queries", flush=True)
    rows = []
    ref = {}
    for precision in args.precisions.split(","):
        for bt in [int(b) for b in args.batch_tokens.split(",")]:
            row = {"precision": precision, "batch_tokens": bt, "device": device}
            try:
                enc = Encoder(device=device, precision=precision, batch_tokens=bt)
                enc.encode(docs[:64])
                enc.encode_queries(queries[:64])  # warm-up: kernels, shapes
                if device == "cuda":
                    torch.cuda.synchronize()
                out = {}
                t = time.perf_counter()
                out["d"] = enc.encode(docs)
                if device == "cuda":
                    torch.cuda.synchronize()
                row["docs_per_s"] = round(len(docs) / (time.perf_counter() - t), 1)
                t = time.perf_counter()
                out["q"] = enc.encode_queries(queries)
                if device == "cuda":
                    torch.cuda.synchronize()
                row["queries_per_s"] = round(len(queries) / (time.perf_counter() - t), 1)
                if precision == "fp32" and "d" not in ref:
                    ref = dict(out)
                if ref:
                    row["min_cos_docs_to_fp32"] = round(float((out["d"] * ref["d"]).sum(1).min()), 6)
                    row["min_cos_queries_to_fp32"] = round(float((out["q"] * ref["q"]).sum(1).min()), 6)
                if device == "cuda":
                    row["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
                    torch.cuda.reset_peak_memory_stats()
                del enc
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}"
            rows.append(row)
            print(json.dumps(row), flush=True)
            gc.collect()
    from semsearch.encoder.hardware import resolve_precision

    picked = resolve_precision("auto", device)  # without building an encoder (int8 would export ONNX first)
    print(f"\n{'precision':10}{'batch tokens':>13}{'docs/s':>10}{'queries/s':>11}")
    for r in rows:
        if "error" in r:
            print(f"{r['precision']:10}{r['batch_tokens']:>13}  {r['error']}")
        else:
            print(f"{r['precision']:10}{r['batch_tokens']:>13}{r['docs_per_s']:>10,.0f}{r['queries_per_s']:>11,.0f}")
    print(f"precision auto picks here: {picked}")
    return {"bench": "encode", "device": device, "docs": len(docs), "queries": len(queries), "auto_picks": picked, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    ix = sub.add_parser("index", help="build and query: GPU against CPU faiss")
    ix.add_argument("--n", type=int, default=1_000_000)
    ix.add_argument("--dim", type=int, default=384)
    ix.add_argument("--queries", type=int, default=2000, help="half tune nprobe, half measure")
    ix.add_argument("--k", type=int, default=10)
    ix.add_argument("--types", default="flat,ivf,ivf-sq8,auto")
    ix.add_argument("--devices", default="cpu,cuda")
    ix.add_argument("--target-recall", type=float, default=0.95)
    ix.add_argument("--out", default=str(REPO / "results" / "bench_gpu_index.json"))
    en = sub.add_parser("encode", help="encoder throughput by precision and batch size")
    en.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "beir" / "scifact"))
    en.add_argument("--docs", type=int, default=2000)
    en.add_argument("--queries", type=int, default=4000)
    en.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    en.add_argument("--precisions", default="fp32,fp16")
    en.add_argument("--batch-tokens", default="4096,16384,65536")
    en.add_argument("--out", default=str(REPO / "results" / "bench_gpu_encode.json"))
    args = ap.parse_args()
    report = run_index(args) if args.what == "index" else run_encode(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
