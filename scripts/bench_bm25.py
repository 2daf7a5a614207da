"""BM25 with rank-safe pruning (MaxScore) against the exhaustive scorer, at 1M+ chunks.

    python scripts/bench_bm25.py [--sizes 1000000] [--queries 1000] [--parts 1]

Posting arrays are built straight from the synthetic corpus of scripts/synthetic.py (~200 words a
chunk, a 100k-term Zipf vocabulary with topic structure), split into --parts segments. For each
size and k (10: lexical search; 100: what hybrid takes from each side): p50 / p99 of the
exhaustive scorer (score_all + top: every posting of every query term) and of top_k (pruned), the
ratio of their p50s, and whether each query's top k is the same chunks with the same scores.
The CPU's flags and the load average are printed with the figures.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_filters import cpu_flags  # noqa: E402
from synthetic import Corpus  # noqa: E402

from semsearch.store.lexical import LexicalIndex, Postings  # noqa: E402


def postings(corpus: Corpus, start: int, n: int, block: int = 50_000) -> Postings:
    """Posting arrays of chunks start..start+n (ids = chunk numbers), built with numpy."""
    keys, tfs, lens = [], [], []
    V = corpus.vocab
    for a in range(start, start + n, block):
        m = min(block, start + n - a)
        _, lengths, terms = corpus.chunk_terms(a, m)
        doc = np.repeat(np.arange(a - start, a - start + m, dtype=np.int64), lengths)
        u, c = np.unique(terms.astype(np.int64) * n + doc, return_counts=True)  # (term, row) pairs, term-major
        keys.append(u)
        tfs.append(c.astype(np.int32))
        lens.append(lengths.astype(np.float32))
    key = np.concatenate(keys)
    tf = np.concatenate(tfs)
    order = np.argsort(key, kind="stable")
    key, tf = key[order], tf[order]
    term, row = key // n, (key % n).astype(np.int32)
    vocab, starts = np.unique(term, return_index=True)
    indptr = np.append(starts, len(term)).astype(np.int64)
    return Postings(np.arange(start, start + n, dtype=np.int64), np.concatenate(lens), vocab.astype(np.int64), indptr, row, tf)


def pruned_against_exhaustive(li: LexicalIndex, qterms, k: int):
    """(exhaustive ms, pruned ms, queries whose top k agree in ids and scores, exhaustive ids) over
    the queries, each scored both ways one after the other."""
    ex, pr, same, ref = [], [], 0, []
    for h in qterms:
        t0 = time.perf_counter()
        e_ids, e_s = li.top(li.score_all(h), k)
        t1 = time.perf_counter()
        p_ids, p_s = li.top_k(h, k)
        t2 = time.perf_counter()
        ex.append((t1 - t0) * 1000)
        pr.append((t2 - t1) * 1000)
        same += bool(np.array_equal(e_ids, p_ids) and np.array_equal(e_s, p_s))
        ref.append(e_ids.astype(np.int64))
    return ex, pr, same, ref


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000000")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--parts", type=int, default=1)
    args = ap.parse_args()
    corpus = Corpus()
    qterms, _, _ = corpus.queries(args.queries)
    print(f"CPU flags: {cpu_flags()}; load average {os.getloadavg()[0]:.2f}")
    for n in [int(x) for x in args.sizes.split(",")]:
        t = time.perf_counter()
        step = -(-n // args.parts)
        parts = [postings(corpus, a, min(step, n - a)) for a in range(0, n, step)]
        li = LexicalIndex(parts)
        for p in parts:
            p.blocks()
        nnz = sum(len(p.postings) for p in parts)
        print(f"\n{n:,} chunks in {len(parts)} part(s), {nnz:,} postings; built in {time.perf_counter() - t:.0f} s")
        for k in (10, 100):
            ex, pr, same, _ = pruned_against_exhaustive(li, qterms, k)
            q = lambda xs, p: float(np.percentile(xs, p))  # noqa: E731
            print(f"k={k:<4} exhaustive p50 {q(ex, 50):7.2f} ms p99 {q(ex, 99):7.2f} | pruned p50 {q(pr, 50):7.2f} ms "
                  f"p99 {q(pr, 99):7.2f} | p50 ratio {statistics.median(ex) / statistics.median(pr):5.1f}x | "
                  f"same top {k}: {same}/{len(qterms)}")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
