"""Index types at scale: 1,000,000 x 384 vectors, Flat against semsearch's default and memory-lean choices.

    python scripts/bench/bench_index.py [--n 1000000] [--with-hnsw]

The vectors are synthetic but fitted to real text embeddings: SciFact chunk embeddings of the
bundled model are clustered (k-means, 64 clusters); each synthetic vector picks a cluster by its
weight and is drawn from a Gaussian with that cluster's mean and its top-48 principal directions
(with their variances) plus isotropic noise carrying the remaining variance, then L2-normalised.
Queries are real SciFact query embeddings: half tune the search knob to the recall target, the
other half measure recall@10 against exact search, so the reported recall is not the tuned one.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]


def real_embeddings(data: Path, index: Path | None) -> tuple[np.ndarray, np.ndarray]:
    """(SciFact chunk/document vectors, SciFact query vectors), from an index if given."""
    from semsearch.encoder import Encoder

    enc = Encoder()
    queries = [json.loads(line)["text"] for line in open(data / "queries.jsonl")]
    qv = enc.encode(queries)
    if index is not None and (index / "manifest.json").exists():
        from semsearch.store import open_index

        _, _, docs = open_index(index)
        dv = np.concatenate([v for _, v in docs.iter_vectors()])
    else:
        texts = []
        for line in open(data / "corpus.jsonl"):
            r = json.loads(line)
            texts.append(f"{r.get('title', '')} {r.get('text', '')}".strip())
        dv = enc.encode(texts, progress=True)
    return dv, qv


def fit_generator(real: np.ndarray, k: int = 64, rank: int = 48, seed: int = 0):
    import faiss

    d = real.shape[1]
    km = faiss.Kmeans(d, k, niter=25, seed=seed, spherical=True)
    km.train(real)
    _, assign = km.index.search(real, 1)
    assign = assign[:, 0]
    comps = []
    for c in range(k):
        x = real[assign == c]
        if len(x) < 2:
            continue
        mu = x.mean(0)
        r = x - mu
        _, s, vt = np.linalg.svd(r, full_matrices=False)
        var = s**2 / (len(x) - 1)
        top = min(rank, len(var))
        rest = float(var[top:].sum() / max(d - top, 1))
        comps.append((len(x), mu, vt[:top], np.sqrt(var[:top]), np.sqrt(rest)))
    return comps


def sample(comps, n: int, seed: int = 1, block: int = 100_000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = np.array([c[0] for c in comps], float)
    which = rng.choice(len(comps), n, p=w / w.sum())
    d = comps[0][1].shape[0]
    out = np.empty((n, d), np.float32)
    for c, (_, mu, vt, sd, noise) in enumerate(comps):
        idx = np.nonzero(which == c)[0]
        for s in range(0, len(idx), block):
            part = idx[s : s + block]
            z = rng.standard_normal((len(part), len(sd))) * sd
            x = mu + z @ vt + noise * rng.standard_normal((len(part), d))
            out[part] = x
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out


def qps(index, queries: np.ndarray, k: int, single: int) -> tuple[float, float]:
    """(single-query QPS over the first `single` queries one at a time, batched QPS over all)."""
    t = time.perf_counter()
    for q in queries[:single]:
        index.search(q[None], k)
    one = single / (time.perf_counter() - t)
    t = time.perf_counter()
    index.search(queries, k)
    return one, len(queries) / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "beir" / "scifact"))
    ap.add_argument("--index", default=str(REPO / "results" / "bench_scifact_index"), help="reuse this SciFact index's vectors if present")
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--target-recall", type=float, default=0.95)
    ap.add_argument("--max-bytes-per-vector", type=int, default=500)
    ap.add_argument("--with-hnsw", action="store_true", help="also build HNSW (slow on 2 cores)")
    ap.add_argument("--out", default=str(REPO / "results" / "bench_index.json"))
    args = ap.parse_args()

    import faiss

    from semsearch.store.vectors import VectorIndex, choose_type, faiss_gpus, recall_at, tune

    k = 10
    t0 = time.perf_counter()
    cache = Path(args.out).with_name(f"bench_index_vectors_{args.n}.npz")
    if cache.exists():  # the generated set of an earlier run (same seed): skip regenerating
        z = np.load(cache)
        real, qv, xb = z["real"], z["queries"], z["xb"]
    else:
        real, qv = real_embeddings(Path(args.data), Path(args.index) if args.index else None)
        xb = sample(fit_generator(real), args.n)
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.savez(cache, real=real, queries=qv, xb=xb)
    ids = np.arange(args.n, dtype=np.int64)
    t_gen = time.perf_counter() - t0
    tune_q, eval_q = qv[0::2], qv[1::2]
    report = {"n": args.n, "dim": int(xb.shape[1]), "real_vectors_fitted": int(len(real)), "queries_tune": len(tune_q),
              "queries_eval": len(eval_q), "generate_s": round(t_gen, 1), "faiss_threads": faiss.omp_get_max_threads(), "indexes": {}}

    # How hard is it? Mean top-10 cosine of real queries over real vs synthetic vectors.
    flat_real = faiss.IndexFlatIP(real.shape[1])
    flat_real.add(real)
    report["mean_top10_cosine_real_corpus"] = round(float(flat_real.search(eval_q, k)[0].mean()), 4)

    t = time.perf_counter()
    flat = VectorIndex.create(xb.shape[1], "flat")
    flat.add(ids, xb)
    t_flat = time.perf_counter() - t
    _, exact_eval = flat.search(eval_q, k)
    _, exact_tune = flat.search(tune_q, k)
    report["mean_top10_cosine_synthetic"] = round(float(flat.search(eval_q, k)[0].mean()), 4)
    one, batch = qps(flat, eval_q, k, single=50)
    report["indexes"]["flat"] = {"build_s": round(t_flat, 1), "bytes_per_vector": round(flat.nbytes / args.n, 1),
                                 "recall@10": 1.0, "single_qps": round(one, 1), "batched_qps": round(batch, 1)}
    flat_one = one

    choices = {"default": (choose_type("auto", args.n, xb.shape[1]), "cpu"),
               "memory_lean": (choose_type("auto", args.n, xb.shape[1], args.max_bytes_per_vector), "cpu")}
    if args.with_hnsw:
        choices["hnsw"] = ("hnsw", "cpu")
    if faiss_gpus() > 0:  # faiss-gpu and a GPU: the same data built and searched there
        choices["gpu_flat"] = ("flat", "cuda")
        choices["gpu_memory_lean"] = (choices["memory_lean"][0], "cuda")
    report["faiss_gpus"] = faiss_gpus()
    for label, (kind, device) in choices.items():
        t = time.perf_counter()
        vi = VectorIndex.build(xb.shape[1], kind, [(ids[s : s + 100_000], xb[s : s + 100_000]) for s in range(0, args.n, 100_000)], args.n,
                               device=device)
        t_build = time.perf_counter() - t
        tuned = tune(vi, tune_q, exact_tune, k, args.target_recall)
        _, got = vi.search(eval_q, k)
        one, batch = qps(vi, eval_q, k, single=len(eval_q))
        report["indexes"][label] = {
            "type": kind, "device": vi.device, "params": vi.params, "build_s": round(t_build, 1),
            "bytes_per_vector": round(vi.nbytes / args.n, 1), "recall@10_tune_queries": tuned["recall"],
            "recall@10": round(recall_at(got, exact_eval), 4), "single_qps": round(one, 1), "batched_qps": round(batch, 1),
            "single_qps_vs_flat": round(one / flat_one, 1),
        }
        print(label, json.dumps(report["indexes"][label]), flush=True)
        del vi
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
