"""Filtered search against unfiltered, at 100k and 1M chunks: what a `where` costs.

    python scripts/bench/bench_filters.py [--sizes 100000,1000000] [--queries 60] [--dim 384]

A stand-in encoder (vectors drawn around 200 random centres; a query is a stored vector plus
noise) and synthetic texts (8-20 words from a 5,000-word vocabulary) stand in for the model, so
only the index's own work is timed: the FAISS search, BM25, the filter, the docstore join. The
index is the automatic type for its size (flat below 50k chunks, ivf-fastscan above), built as
`semsearch index` builds it. Each chunk has metadata {"year": 2000..2024 (uniform), "lang": "de"
for 1% of chunks, else "en"}, so `year>=2010` passes ~60% and `lang=de` ~1%.

For each size: p50 / p90 of Retriever.search (k=10) over the same queries, dense and hybrid,
unfiltered and with each filter; filtered runs twice: with the per-generation cache of recent
filters' selections (what a service answering many queries with the same filter gets) and with
it off (every query computes its selection anew). The ratio column is filtered p50 / unfiltered
p50 in the same run. Also the one-off cost of reading a metadata field into memory (the first
filtered query of a generation pays it).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def cpu_flags() -> str:
    try:
        flags = set(open("/proc/cpuinfo").read().split())
    except OSError:
        return platform.machine()
    return " ".join(f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8") if f in flags)


class StandInEncoder:
    """Query texts 'q<i>: words' encode as the i-th prepared query vector."""

    name, fingerprint, backend, precision, head_info, pooling = "stand-in", "standin01", "fake", "fp32", None, "mean"
    max_length = 256

    def __init__(self, qv: np.ndarray):
        self.qv = qv
        self.dim = self.out_dim = qv.shape[1]

    def encode(self, texts, progress=None):
        return np.stack([self.qv[int(t.split(":")[0][1:])] for t in texts])


def build(folder: Path, n: int, dim: int, rng: np.random.Generator) -> tuple[np.ndarray, list[str], np.ndarray]:
    """The synthetic index of n chunks (also scripts/bench/bench_writes.py's); gives back 2,000 stored
    vectors (queries are made from them), query words, and the centres the vectors were drawn around."""
    from semsearch.indexing import VectorSettings, finalize_vectors
    from semsearch.store.docstore import ChunkRow
    from semsearch.store.folder import IndexWriter
    from semsearch.store.manifest import Manifest

    vocab = [f"w{i}" for i in range(5000)]
    centres = rng.normal(size=(200, dim)).astype(np.float32)
    w = IndexWriter(folder, dim)
    files = [w.docs.add_file(str(folder / "src" / f"part{j}.jsonl"), "h", 1, 1, "now") for j in range(10)]
    block = 50_000
    sample = None
    t0 = time.perf_counter()
    for at in range(0, n, block):
        m = min(block, n - at)
        v = centres[rng.integers(0, 200, m)] + rng.normal(scale=0.6, size=(m, dim)).astype(np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        if sample is None:
            sample = v[:2000].copy()
        lens = rng.integers(8, 21, m)
        words = rng.zipf(1.3, size=int(lens.sum())) % len(vocab)
        years = rng.integers(2000, 2025, m)
        rows, o = [], 0
        for i in range(m):
            text = " ".join(vocab[x] for x in words[o:o + lens[i]])
            o += lens[i]
            meta = {"year": int(years[i]), "lang": "de" if (at + i) % 100 == 0 else "en"}
            rows.append(ChunkRow(files[(at + i) % 10], at + i + 1, 0, 0, len(text), None, text, meta))
        w.vectors.add(w.docs.add_chunks(rows, v), v)
        print(f"  {at + m:,} chunks written ({time.perf_counter() - t0:.0f} s)", flush=True)
    entry = finalize_vectors(w, dim, VectorSettings(target_recall=0.95), None)
    w.commit(Manifest(model="stand-in", model_fingerprint="standin01", backend="fake", pooling="mean", dim=dim,
                      max_length=256, precision="fp32", chunking={"window": 254, "overlap": 0}, index=entry,
                      counts={"files": 10, "documents": n, "chunks": n}))
    print(f"  built {entry['type']} in {time.perf_counter() - t0:.0f} s", flush=True)
    qwords = [" ".join(vocab[x] for x in rng.zipf(1.3, size=4) % len(vocab)) for _ in range(len(sample))]
    return sample, qwords, centres


def timed(fn, reps: int) -> list[float]:
    out = []
    for i in range(reps):
        t = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t) * 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--queries", type=int, default=60)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--keep", type=Path, help="build (or reuse) the indexes in this folder")
    ap.add_argument("--json", type=Path, help="also write the results here")
    a = ap.parse_args()

    from semsearch import filters
    from semsearch.search import Retriever

    print(f"CPU flags: {cpu_flags()}; {os.cpu_count()} cores")
    results = []
    root = a.keep or Path(tempfile.mkdtemp(prefix="bench-filters-"))
    for n in [int(x) for x in a.sizes.split(",")]:
        rng = np.random.default_rng(n)
        folder = root / f"n{n}"
        print(f"{n:,} chunks: building in {folder}", flush=True)
        meta = folder / "bench-queries.npz"
        if (folder / "manifest.json").exists() and meta.exists():
            z = np.load(meta, allow_pickle=True)
            sample, qwords = z["sample"], list(z["qwords"])
        else:
            sample, qwords, _ = build(folder, n, a.dim, rng)
            np.savez(meta, sample=sample, qwords=np.array(qwords, object))
        q = sample[: a.queries] + np.random.default_rng(1).normal(scale=0.02, size=(a.queries, a.dim)).astype(np.float32)
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        r = Retriever.load(folder, encoder=StandInEncoder(q))
        texts = [f"q{i}: {qwords[i]}" for i in range(a.queries)]
        wheres = {"none": None, "year>=2010 (~60%)": ["year>=2010"], "lang=de (~1%)": ["lang=de"]}
        t = time.perf_counter()
        r.search(texts[0], 10, mode="hybrid")  # loads the lexical side
        load_lex = time.perf_counter() - t
        first = {}
        for name, w in wheres.items():
            if w is not None:
                t = time.perf_counter()
                sel = filters.parse(w).select(r.docs)
                first[name] = ((time.perf_counter() - t) * 1e3, len(sel) / n)
        row = {"n": n, "type": r.manifest.index["type"], "lexical_load_s": round(load_lex, 2),
               "first_filter_ms": {k: round(v[0], 1) for k, v in first.items()},
               "pass_fraction": {k: round(v[1], 4) for k, v in first.items()}, "p50_ms": {}, "p90_ms": {}}
        for mode in ("dense", "hybrid"):
            for cache in (True, False):
                filters._Columns.CACHE = 16 if cache else 0
                for name, w in wheres.items():
                    if w is None and not cache:
                        continue
                    r.search(texts[0], 10, mode=mode, where=w)  # warm
                    ms = timed(lambda i: r.search(texts[i], 10, mode=mode, where=w), a.queries)
                    label = f"{mode} {name}" + ("" if w is None else (" cached" if cache else " uncached"))
                    row["p50_ms"][label] = round(statistics.median(ms), 2)
                    row["p90_ms"][label] = round(float(np.percentile(ms, 90)), 2)
        filters._Columns.CACHE = 16
        results.append(row)
        print(f"\n{n:,} chunks, {row['type']}; lexical side loaded in {load_lex:.2f} s; first use of a filter "
              f"(reads the field): {row['first_filter_ms']} ms; pass fractions {row['pass_fraction']}")
        print("| search (k=10) | p50 ms | p90 ms | p50 / unfiltered p50 |\n|---|---|---|---|")
        for label, p50 in row["p50_ms"].items():
            base = row["p50_ms"][f"{label.split()[0]} none"]
            print(f"| {label} | {p50:.2f} | {row['p90_ms'][label]:.2f} | {p50 / base:.2f} |")
        print(flush=True)
        r.close()
    if a.json:
        a.json.write_text(json.dumps({"cpu_flags": cpu_flags(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
