"""BM25 with rank-safe pruning (MaxScore) against the exhaustive scorer, at 1M+ chunks.

    python scripts/bench/bench_bm25.py [--sizes 1000000] [--queries 1000] [--parts 1] [--layouts v1,v2]

Posting arrays are built straight from the synthetic corpus of scripts/bench/synthetic.py (~200 words a
chunk, a 100k-term Zipf vocabulary with topic structure), split into --parts segments. For each
size and k (10: lexical search; 100: what hybrid takes from each side): p50 / p99 of the
exhaustive scorer (score_all + top: every posting of every query term) and of top_k (pruned), the
ratio of their p50s, and whether each query's top k is the same chunks with the same scores.
--layouts: how the scorer reads the posting arrays, each measured in the same run on the same
queries: `v1` and `v2` write the posting files of that version (scripts' temporary folder, or
--dir) and map them as a segment does (the file sizes are printed); `memory` scores the arrays as
built. Every layout's top k is also compared with the first layout's.
The CPU's flags and the load average are printed with the figures.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_filters import cpu_flags  # noqa: E402
from synthetic import Corpus  # noqa: E402

from semsearch.store import lexical  # noqa: E402
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


def forget(li: LexicalIndex) -> None:
    """Drop the lists a compressed posting file keeps decoded: each query is timed on its own."""
    for p in li.parts:
        getattr(p, "forget", lambda: None)()


def pruned_against_exhaustive(li: LexicalIndex, qterms, k: int, scores: list | None = None):
    """(exhaustive ms, pruned ms, queries whose top k agree in ids and scores, exhaustive ids) over
    the queries, each scored both ways one after the other; `scores` gets the exhaustive scores."""
    ex, pr, same, ref = [], [], 0, []
    for h in qterms:
        forget(li)
        t0 = time.perf_counter()
        e_ids, e_s = li.top(li.score_all(h), k)
        ex.append((time.perf_counter() - t0) * 1000)
        forget(li)
        t1 = time.perf_counter()
        p_ids, p_s = li.top_k(h, k)
        pr.append((time.perf_counter() - t1) * 1000)
        same += bool(np.array_equal(e_ids, p_ids) and np.array_equal(e_s, p_s))
        ref.append(e_ids.astype(np.int64))
        if scores is not None:
            scores.append(e_s)
    return ex, pr, same, ref


def interleaved(indexes: dict[str, LexicalIndex], qterms, k: int) -> dict[str, tuple[list, list, int, list]]:
    """pruned_against_exhaustive for several layouts, a query at a time through each in turn
    (so a busy machine's load falls on all alike): per layout (exhaustive ms, pruned ms, queries
    whose pruned and exhaustive top k agree, exhaustive (ids, scores))."""
    out = {name: ([], [], 0, []) for name in indexes}
    for h in qterms:
        for name, li in indexes.items():
            ex, pr, same, ids = out[name]
            s: list = []
            e, p, agree, got = pruned_against_exhaustive(li, [h], k, s)
            ex += e
            pr += p
            ids.append((got[0], s[0]))
            out[name] = (ex, pr, same + agree, ids)
    return out


def opened(parts: list[Postings], layout: str, folder: Path) -> list[Postings]:
    """The parts as the scorer reads them in `layout` (files written and mapped, or as built)."""
    if layout == "memory":
        return parts
    write = {"v1": lexical.write_file_v1, "v2": lexical.write_file}[layout]
    out = []
    for i, p in enumerate(parts):
        path = folder / f"{layout}.{i}.bin"
        t = time.perf_counter()
        write(path, p)
        out.append(lexical.open_file(path))
        print(f"  {layout} part {i}: {path.stat().st_size / 1e6:,.1f} MB, written in {time.perf_counter() - t:.1f} s")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000000")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--parts", type=int, default=1)
    ap.add_argument("--layouts", default="v1,v2", help="comma-separated: v1, v2 (posting files), memory")
    ap.add_argument("--dir", default=None, help="where the posting files go (default: a temporary folder)")
    args = ap.parse_args()
    layouts = args.layouts.split(",")
    corpus = Corpus()
    qterms, _, _ = corpus.queries(args.queries)
    print(f"CPU flags: {cpu_flags()}; load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for n in [int(x) for x in args.sizes.split(",")]:
            t = time.perf_counter()
            step = -(-n // args.parts)
            parts = [postings(corpus, a, min(step, n - a)) for a in range(0, n, step)]
            nnz = sum(len(p.postings) for p in parts)
            print(f"\n{n:,} chunks in {len(parts)} part(s), {nnz:,} postings; built in {time.perf_counter() - t:.0f} s")
            indexes = {}
            for layout in layouts:
                indexes[layout] = LexicalIndex(opened(parts, layout, Path(tmp)))
            if "memory" not in layouts:
                del parts  # the files alone, mapped: as a served index
            for li in indexes.values():  # untimed: the queries' pages into the page cache
                for h in qterms:
                    li.top_k(h, 10)
                    li.score_all(h)
            for k in (10, 100):
                times = interleaved(indexes, qterms, k)
                ref = None
                for layout, (ex, pr, same, got) in times.items():
                    q = lambda xs, p: float(np.percentile(xs, p))  # noqa: E731
                    agree = "" if ref is None else f" | as {layouts[0]} (ids, scores): {sum(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(ref, got))}/{len(got)}"
                    ref = got if ref is None else ref
                    print(f"{layout:<6} k={k:<4} exhaustive p50 {q(ex, 50):7.2f} ms p99 {q(ex, 99):7.2f} | pruned p50 "
                          f"{q(pr, 50):7.2f} ms p99 {q(pr, 99):7.2f} | p50 ratio {statistics.median(ex) / statistics.median(pr):5.1f}x | "
                          f"same top {k}: {same}/{len(qterms)}{agree}")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
