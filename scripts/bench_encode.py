"""Encoding throughput: semsearch's encoder against the sentence-transformers baseline, same run.

    python scripts/bench_encode.py [--docs 600] [--queries 2000] [--precision auto] [--device cpu]

Baseline: SentenceTransformer(<bundled model>).encode(texts, batch_size=32), fp32 on the same device.
Workloads: SciFact documents (title + text, 256-token truncation) and SciFact queries (short).
Prints docs/s and tokens/s for both, the ratio, achieved GFLOP/s against the matmul peak
measured here for the precision used, and the minimum cosine between fp32 and fast vectors.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent


def matmul_peak(dtype, seconds: float = 2.0, device: str = "cpu") -> float:
    """GFLOP/s of a model-shaped linear layer (8192 x 384 -> 1536) in dtype on this device."""
    import torch

    x = torch.randn(8192, 384, dtype=dtype, device=device)
    w = torch.randn(1536, 384, dtype=dtype, device=device)
    for _ in range(3):
        torch.nn.functional.linear(x, w)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        torch.nn.functional.linear(x, w)
        n += 1
    sync()
    return 2 * 8192 * 384 * 1536 * n / (time.perf_counter() - t0) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "beir" / "scifact"))
    ap.add_argument("--docs", type=int, default=800)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--out", default=str(REPO / "results" / "bench_encode.json"))
    args = ap.parse_args()

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from semsearch.encoder import Encoder
    from semsearch.encoder.encoder import default_model_path
    from semsearch.encoder.hardware import cpu_flags
    from semsearch.encoder.transformer import flops_per_token

    docs, queries = [], []
    with open(Path(args.data) / "corpus.jsonl") as fh:
        for line in fh:
            r = json.loads(line)
            docs.append(f"{r.get('title', '')} {r.get('text', '')}".strip())
    with open(Path(args.data) / "queries.jsonl") as fh:
        queries = [json.loads(line)["text"] for line in fh]
    rng = np.random.default_rng(0)
    docs = [docs[i] for i in rng.choice(len(docs), min(args.docs, len(docs)), replace=False)]
    queries = queries[: args.queries]

    st = SentenceTransformer(str(default_model_path()), device=args.device)
    st.max_seq_length = 256
    fp32 = Encoder(precision="fp32", device=args.device)
    fast = Encoder(precision=args.precision, device=args.device)
    cfg = fast.model.cfg
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    report = {"machine": f"{platform.processor() or platform.machine()}, {cores} cores, torch threads {torch.get_num_threads()}",
              "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
              "precision": fast.precision, "workloads": {}}
    for name, texts in (("scifact_docs", docs), ("queries", queries)):
        lens = [len(x) for x in fast.tokenize(texts)]
        tokens = sum(lens)
        flops = sum(n * flops_per_token(cfg, n) for n in lens)
        warm = texts[:: max(1, len(texts) // 64)]  # a spread of lengths: every batch shape once
        st.encode(warm, batch_size=32)
        fast.encode(warm)
        fp32.encode(warm)
        # The machine is shared and its speed drifts: run the three in interleaved slices so that
        # drift hits all alike, and sum each one's time.
        t_base = t_fast = t_fp32 = 0.0
        ref, v, v32 = [], [], []
        n_slices = 4
        for s in range(n_slices):
            part = texts[s::n_slices]
            t = time.perf_counter()
            ref.append(st.encode(part, batch_size=32, convert_to_numpy=True, normalize_embeddings=True))
            t_base += time.perf_counter() - t
            t = time.perf_counter()
            v.append(fast.encode(part))
            t_fast += time.perf_counter() - t
            t = time.perf_counter()
            v32.append(fp32.encode(part))
            t_fp32 += time.perf_counter() - t
        ref, v, v32 = np.concatenate(ref), np.concatenate(v), np.concatenate(v32)
        report["workloads"][name] = {
            "texts": len(texts), "tokens": tokens, "mean_tokens": round(tokens / len(texts), 1),
            "baseline_docs_per_s": round(len(texts) / t_base, 1), "baseline_tokens_per_s": round(tokens / t_base),
            "semsearch_fp32_docs_per_s": round(len(texts) / t_fp32, 1),
            "semsearch_docs_per_s": round(len(texts) / t_fast, 1), "semsearch_tokens_per_s": round(tokens / t_fast),
            "ratio_vs_baseline": round(t_base / t_fast, 2), "fp32_ratio_vs_baseline": round(t_base / t_fp32, 2),
            "achieved_gflops": round(flops / t_fast / 1e9, 1),
            "min_cosine_fast_vs_fp32": round(float((v * v32).sum(1).min()), 6),
            "max_abs_fp32_vs_baseline": float(np.abs(v32 - ref).max()),
        }
    # int8 has no torch matmul to time: its figures are against the fp32 peak.
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(fast.precision, torch.float32)
    peak = matmul_peak(dtype, device=args.device)
    report["matmul_peak_gflops"] = round(peak, 1)
    report["matmul_peak_dtype"] = str(dtype).removeprefix("torch.")
    report["cpu_flags"] = sorted(f for f in cpu_flags() if f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8"))
    for w in report["workloads"].values():
        w["fraction_of_peak"] = round(w["achieved_gflops"] / peak, 3)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
