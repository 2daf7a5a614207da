"""Encoding throughput: semsearch's encoder against the sentence-transformers baseline, same run.

    python scripts/bench/bench_encode.py [--docs 600] [--queries 2000] [--precision auto] [--device cpu]
    python scripts/bench/bench_encode.py --docs 200 --queries 500 --precision fp32,bf16,int8
    python scripts/bench/bench_encode.py --cpu-cap avx2 --precision fp32,int8   # as on an AVX2-only CPU

Baseline: SentenceTransformer(<bundled model>).encode(texts, batch_size=32), fp32 on the same device.
Workloads: SciFact documents (title + text, 256-token truncation) and SciFact queries (short).
--precision takes one precision or several (comma-separated): every path runs in the same
interleaved slices as the baseline, so that the machine's drift hits them all alike. --rounds N
repeats that measurement N times and gives each round's ratio with their median and minimum: on a
shared 2-core machine the baseline's own speed moves by 15% from one run to the next.
Prints docs/s and tokens/s for each, the ratio to the baseline, achieved GFLOP/s against the matmul
peak measured here for the precision used (int8: ONNX Runtime's dynamically quantised matmul, the
kernel the int8 model runs), the minimum cosine between fp32 and each path's vectors, and, for one
query at a time (the short-text path: a query, a title, a one-shot `semsearch query`), where the
time of a call goes: tokenization, the forward pass (session run for int8), the rest (batching,
pooling, normalisation).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]
FLAGS_SHOWN = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8")
M, K, N = 8192, 384, 1536  # a model-shaped linear layer: (M tokens x 384) -> 1536


def run_capped(cap: str) -> None:
    """Run this script again in a process whose CPUID answers as a lesser CPU would (scripts/bench/cpuid_cap.c):
    every library then picks the kernels it would pick there, ONNX Runtime's included (it has no cap
    of its own), and semsearch's `auto` is told the same through SEMSEARCH_CPU_ISA. Needs gcc and a
    CPU with CPUID faulting (the `cpuid_fault` flag)."""
    import shutil
    import subprocess
    import sys

    if "cpuid_fault" not in Path("/proc/cpuinfo").read_text():
        raise SystemExit("--cpu-cap needs CPUID faulting (the cpuid_fault flag in /proc/cpuinfo); this CPU or VM has none")
    if shutil.which("gcc") is None:
        raise SystemExit("--cpu-cap needs gcc to build scripts/bench/cpuid_cap.c")
    lib = REPO / "results" / "cpuid_cap.so"  # built afresh each time (0.1 s), replaced whole: a running capped process keeps its copy
    lib.parent.mkdir(parents=True, exist_ok=True)
    tmp = lib.with_name(f".cpuid_cap-{os.getpid()}.so")
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(tmp), str(REPO / "scripts" / "bench" / "cpuid_cap.c")], check=True)
    os.replace(tmp, lib)
    env = dict(os.environ, CPUID_CAP=cap, LD_PRELOAD=str(lib), SEMSEARCH_CPU_ISA=cap)
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def hidden(flag: str) -> bool:
    """Whether --cpu-cap hides this CPU flag from the process (as scripts/bench/cpuid_cap.c clears it)."""
    cap = os.environ.get("CPUID_CAP")
    if cap == "avx2":
        return flag.startswith(("avx512", "amx", "avx_vnni"))
    if cap == "avx512":
        return flag.startswith(("amx", "avx_vnni", "avx512_bf16", "avx512_vnni", "avx512_fp16"))
    return False


def loadavg() -> list[str]:
    """The 1, 5 and 15 minute load averages (others' work on a shared machine slows every figure)."""
    f = Path("/proc/loadavg")
    return f.read_text().split()[:3] if f.exists() else []


def matmul_peak(dtype, seconds: float = 2.0, device: str = "cpu", rows: int = M, threads: int | None = None) -> float:
    """GFLOP/s of a model-shaped linear layer (rows x 384 -> 1536) in dtype on this device."""
    import torch

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        x = torch.randn(rows, K, dtype=dtype, device=device)
        w = torch.randn(N, K, dtype=dtype, device=device)
        with torch.inference_mode():
            for _ in range(3):
                torch.nn.functional.linear(x, w)
            sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
            sync()
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                torch.nn.functional.linear(x, w)
                n += 1
            sync()
            return 2 * rows * K * N * n / (time.perf_counter() - t0) / 1e9
    finally:
        torch.set_num_threads(before)


@functools.cache
def _int8_matmul_session(threads: int):
    """An ONNX Runtime session of one model-shaped linear layer, quantised by quantize_dynamic with
    the int8 recipe's options (u8 activations quantised per run, s8 per-channel 7-bit weights)."""
    import logging

    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    w = np.random.default_rng(0).standard_normal((K, N)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", N])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with tempfile.TemporaryDirectory() as tmp:
        f32, q8 = Path(tmp) / "mm.onnx", Path(tmp) / "mm8.onnx"
        onnx.save(model, str(f32))
        logging.getLogger().disabled, was = True, logging.getLogger().disabled  # its advice goes to the root logger
        try:
            quantize_dynamic(str(f32), str(q8), weight_type=QuantType.QInt8, per_channel=True, reduce_range=True,
                             extra_options={"MatMulConstBOnly": True})
        finally:
            logging.getLogger().disabled = was
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        return ort.InferenceSession(str(q8), so, providers=["CPUExecutionProvider"])


def int8_matmul_peak(seconds: float = 2.0, rows: int = M, threads: int = 1) -> float:
    """GFLOP/s of the model-shaped linear layer as ONNX Runtime runs it in the int8 model."""
    import numpy as np

    sess = _int8_matmul_session(threads)
    x = {"x": np.random.default_rng(1).standard_normal((rows, K)).astype(np.float32)}
    for _ in range(3):
        sess.run(None, x)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        sess.run(None, x)
        n += 1
    return 2 * rows * K * N * n / (time.perf_counter() - t0) / 1e9


def peaks(precisions: list[str], device: str, query_rows: int, rounds: int = 3) -> dict[str, dict[str, float]]:
    """Matmul peaks of each precision: all cores and one thread at 8192 rows (a batch of documents),
    and one thread at a query's rows (what a lone query's matmuls can reach at best). Each is the
    best of a few short timings taken in turn, so that a busy spell on a shared machine does not
    pass for the hardware's limit."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    timers = {}
    for p in precisions:
        if device == "cuda":
            timers[(p, "all_cores")] = lambda p=p: matmul_peak(dtypes.get(p, torch.float32), seconds=0.7, device=device)
        elif p == "int8":
            timers[(p, "all_cores")] = lambda: int8_matmul_peak(seconds=0.7, threads=cores)
            timers[(p, "one_thread")] = lambda: int8_matmul_peak(seconds=0.7, threads=1)
            timers[(p, "one_thread_query_rows")] = lambda: int8_matmul_peak(seconds=0.7, rows=query_rows, threads=1)
        else:
            dt = dtypes.get(p, torch.float32)
            timers[(p, "all_cores")] = lambda dt=dt: matmul_peak(dt, seconds=0.7)
            timers[(p, "one_thread")] = lambda dt=dt: matmul_peak(dt, seconds=0.7, threads=1)
            timers[(p, "one_thread_query_rows")] = lambda dt=dt: matmul_peak(dt, seconds=0.7, rows=query_rows, threads=1)
    best: dict[str, dict[str, float]] = {p: {} for p in precisions}
    for _ in range(rounds):
        for (p, what), timer in timers.items():
            best[p][what] = max(best[p].get(what, 0.0), timer())
    return best


def short_text_breakdown(enc, texts: list[str], flops_of) -> dict:
    """One text a call, as a query arrives: median ms of the whole encode([text]) call, and of its
    parts timed separately on the same texts (tokenization, forward / session run)."""
    import numpy as np
    import torch

    from semsearch.encoder.encoder import _few_threads

    total, tok, fwd, gf = [], [], [], []
    for x in texts:
        t = time.perf_counter()
        enc.encode([x])
        total.append(time.perf_counter() - t)
        t = time.perf_counter()
        ids = enc.tokenize([x])[0]
        tok.append(time.perf_counter() - t)
        arr = np.asarray(ids, np.int64)[None]
        if enc.onnx is not None:
            sess = enc.onnx._session(1)  # a lone query runs on the one-thread session (onnx_backend.SMALL_TOKENS)
            t = time.perf_counter()
            sess.run(None, {"input_ids": arr, "attention_mask": np.ones_like(arr)})
            fwd.append(time.perf_counter() - t)
        else:
            with torch.inference_mode(), _few_threads(enc, [x]):
                b = torch.from_numpy(arr)
                t = time.perf_counter()
                enc.model(b, torch.ones_like(b))
                fwd.append(time.perf_counter() - t)
        gf.append(flops_of(len(ids)))
    med = lambda v: statistics.median(v) * 1000
    flops = statistics.median(gf)
    return {"calls": len(texts), "call_ms": round(med(total), 3), "tokenize_ms": round(med(tok), 3),
            "forward_ms": round(med(fwd), 3), "rest_ms": round(med(total) - med(tok) - med(fwd), 3),
            "call_gflops": round(flops / statistics.median(total) / 1e9, 1),
            "forward_gflops": round(flops / statistics.median(fwd) / 1e9, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "beir" / "scifact"))
    ap.add_argument("--docs", type=int, default=800)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--precision", default="auto", help="one precision, or several comma-separated (e.g. fp32,bf16,int8)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat the whole interleaved measurement this many times and report each round's ratio, "
                         "their median and minimum (the baseline's speed swings by 15%% between runs on a shared machine)")
    ap.add_argument("--cpu-cap", choices=["avx2", "avx512"],
                    help="time every path as on a lesser x86 CPU: CPUID faulted and answered without the extensions "
                         "above AVX2 (or above AVX-512 F/BW/DQ/VL: no VNNI, BF16, AMX), for every library in the "
                         "process (scripts/bench/cpuid_cap.c); needs gcc and the cpuid_fault CPU flag")
    ap.add_argument("--single", type=int, default=200, help="queries timed one call at a time (short-text path); 0: skip")
    ap.add_argument("--out", default=str(REPO / "results" / "bench_encode.json"))
    args = ap.parse_args()
    if args.cpu_cap and os.environ.get("CPUID_CAP") != args.cpu_cap:
        run_capped(args.cpu_cap)  # does not return

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

    load_start = loadavg()
    st = SentenceTransformer(str(default_model_path()), device=args.device)
    st.max_seq_length = 256
    wanted = [p.strip() for p in args.precision.split(",") if p.strip()]
    encs: dict[str, Encoder] = {}
    for p in wanted:
        e = Encoder(precision=p, device=args.device)
        encs[p if p != "auto" else f"auto={e.precision}"] = e
    fp32 = next((e for e in encs.values() if e.precision == "fp32"), None) or Encoder(precision="fp32", device=args.device)
    cfg = fp32.model.cfg
    flops_of = lambda n: n * flops_per_token(cfg, n)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    report = {"machine": f"{platform.processor() or platform.machine()}, {cores} cores, torch threads {torch.get_num_threads()}",
              "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
              "cpu_flags": sorted(f for f in cpu_flags() if f in FLAGS_SHOWN and not hidden(f)),
              "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
              "caps": {k: os.environ[k] for k in ("CPUID_CAP", "SEMSEARCH_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
                                                  "ATEN_CPU_CAPABILITY") if k in os.environ},
              "precisions": {k: e.precision for k, e in encs.items()}, "loadavg_start": load_start, "workloads": {}}
    if len(encs) == 1:
        report["precision"] = next(iter(encs.values())).precision
    for name, texts in (("scifact_docs", docs), ("queries", queries)):
        lens = [len(x) for x in fp32.tokenize(texts)]
        tokens = sum(lens)
        flops = sum(flops_of(n) for n in lens)
        warm = texts[:: max(1, len(texts) // 64)]  # a spread of lengths: every batch shape once
        st.encode(warm, batch_size=32)
        for e in encs.values():
            e.encode(warm)
        fp32.encode(warm)
        # The machine is shared and its speed drifts: run all paths in interleaved slices so that
        # drift hits all alike (each slice in a rotated order), and sum each one's time.
        runners = {"baseline": lambda part: st.encode(part, batch_size=32, convert_to_numpy=True, normalize_embeddings=True)}
        runners.update({k: e.encode for k, e in encs.items()})
        if all(e is not fp32 for e in encs.values()):
            runners["fp32_reference"] = fp32.encode
        names = list(runners)
        spent = dict.fromkeys(names, 0.0)
        rounds: list[dict[str, float]] = []
        n_slices = 4
        for r in range(max(1, args.rounds)):
            got: dict[str, list] = {k: [] for k in names}  # the vectors of the last round are compared below
            took = dict.fromkeys(names, 0.0)
            for s in range(n_slices):
                part = texts[s::n_slices]
                turn = s + r  # rotate who goes first, across slices and rounds
                for k in names[turn % len(names):] + names[: turn % len(names)]:
                    t = time.perf_counter()
                    got[k].append(runners[k](part))
                    took[k] += time.perf_counter() - t
            rounds.append(took)
            for k in names:
                spent[k] += took[k]
        # slices were taken as texts[s::4]: put the vectors back in text order
        order = np.concatenate([np.arange(len(texts))[s::n_slices] for s in range(n_slices)])
        vecs = {}
        for k in names:
            v = np.concatenate(got[k])
            vecs[k] = np.empty_like(v)
            vecs[k][order] = v
        done = len(texts) * len(rounds)  # texts encoded by each path
        ref = vecs["fp32_reference"] if "fp32_reference" in vecs else vecs[next(k for k, e in encs.items() if e is fp32)]
        w = {"texts": len(texts), "tokens": tokens, "mean_tokens": round(tokens / len(texts), 1),
             "baseline_docs_per_s": round(done / spent["baseline"], 1), "baseline_tokens_per_s": round(tokens * len(rounds) / spent["baseline"]),
             "max_abs_fp32_vs_baseline": float(np.abs(ref - vecs["baseline"]).max()), "paths": {}}
        for k, e in encs.items():
            w["paths"][k] = {"docs_per_s": round(done / spent[k], 1), "tokens_per_s": round(tokens * len(rounds) / spent[k]),
                             "ratio_vs_baseline": round(spent["baseline"] / spent[k], 2),
                             "achieved_gflops": round(flops * len(rounds) / spent[k] / 1e9, 1),
                             "min_cosine_vs_fp32": round(float((vecs[k] * ref).sum(1).min()), 6)}
            if len(rounds) > 1:
                each = [r["baseline"] / r[k] for r in rounds]
                w["paths"][k]["ratio_by_round"] = [round(x, 2) for x in each]
                w["paths"][k]["ratio_median"] = round(statistics.median(each), 2)
                w["paths"][k]["ratio_min"] = round(min(each), 2)
        if len(rounds) > 1:
            w["baseline_docs_per_s_by_round"] = [round(len(texts) / r["baseline"], 1) for r in rounds]
        report["workloads"][name] = w

    if args.single and args.device == "cpu":
        few = queries[: args.single]
        for e in encs.values():  # warm each path at every one of these lengths (bf16's kernels are made per shape)
            for x in few:
                e.encode([x])
        report["short_text"] = {}
        # interleaved by rounds of 25 calls, so that drift hits all paths alike
        parts: dict[str, list[dict]] = {k: [] for k in encs}
        for s in range(0, len(few), 25):
            for k, e in encs.items():
                parts[k].append(short_text_breakdown(e, few[s : s + 25], flops_of))
        for k, rows in parts.items():
            report["short_text"][k] = {f: (sum(r[f] for r in rows) if f == "calls" else round(statistics.median(r[f] for r in rows), 3))
                                       for f in rows[0]}

    q_rows = round(statistics.median(len(x) for x in fp32.tokenize(queries[: max(1, args.single)])))
    found = peaks(sorted({e.precision for e in encs.values()}), args.device, q_rows)
    report["matmul_peak_gflops"] = {p: {k: round(v, 1) for k, v in d.items()} for p, d in found.items()}
    report["query_rows_for_peak"] = q_rows
    for w in report["workloads"].values():
        for k, e in encs.items():
            pk = report["matmul_peak_gflops"][e.precision]["all_cores"]
            w["paths"][k]["fraction_of_peak"] = round(w["paths"][k]["achieved_gflops"] / pk, 3)
    for k, s in report.get("short_text", {}).items():
        pk = report["matmul_peak_gflops"][encs[k].precision]
        s["call_fraction_of_one_thread_peak"] = round(s["call_gflops"] / pk["one_thread"], 3)
        s["forward_fraction_of_one_thread_peak"] = round(s["forward_gflops"] / pk["one_thread"], 3)
    report["loadavg_end"] = loadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
