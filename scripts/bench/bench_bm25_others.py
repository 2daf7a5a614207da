"""BM25 top-k latency of two external engines, bm25s and tantivy, against semsearch's own, on one corpus.

    python scripts/bench/bench_bm25_others.py [--sizes 1000000] [--queries 300] [--engines semsearch,bm25s,tantivy]
                                        [--workdir /tmp/bench-bm25-others]

Neither bm25s nor tantivy (the Python binding of the Rust search library) is a semsearch
dependency: run this with a Python that has them, e.g. a venv of its own:

    python3 -m venv /tmp/bench-others-venv
    /tmp/bench-others-venv/bin/pip install numpy scipy bm25s tantivy snowballstemmer PyStemmer
    /tmp/bench-others-venv/bin/python scripts/bench/bench_bm25_others.py

semsearch is imported from this source tree (semsearch.store.lexical needs only numpy and
snowballstemmer). An engine that does not import is skipped, with the reason. semsearch's index is
built at every size whatever --engines says: its exhaustive top k is what the others are checked
against (left out of --engines, its timings are not printed).

The corpus is scripts/bench/synthetic.py's (~200 words a chunk, a 100k-term Zipf vocabulary with topic
structure; queries of 3-8 terms), and every engine sees the same tokens: chunk i is the words
"w<id>" of its term ids, a query the words of its term ids. semsearch's posting arrays are made
straight from the term ids, as scripts/bench/bench_bm25.py makes them (term id = term hash, no text
analysis); bm25s gets the texts through its Tokenizer with no stop words and no stemmer, tantivy
through its "default" tokenizer (splits on non-alphanumerics, lower-cases) on a text field indexed
with term frequencies but no positions (the others keep none); "w123" is one token in both.
BM25 with k1 = 1.2, b = 0.75 everywhere (bm25s: method "lucene"; tantivy's are fixed at those).

Per size and engine:
- build: seconds spent in the engine's own calls (making the texts is not counted). bm25s and
  tantivy tokenize text; semsearch builds from term ids and tokenizes nothing, so its build time
  is not like-for-like (the real indexer also analyses text: words, stop words, Porter2 stems).
  tantivy's writer uses its default threads (several where there are cores) and the time
  includes waiting for its background merges; bm25s and semsearch build on one thread.
- size: tantivy's index folder; the folder bm25s's retriever.save() writes; for semsearch its
  posting arrays and pruning bounds in memory (what an index file stores as blobs).
- p50 / p99 of one query's top k, k = 10 (lexical search) and 100 (what hybrid takes from each
  side), the same queries one after another on the calling thread: semsearch LexicalIndex.top_k
  (MaxScore-pruned) and, for reference, its exhaustive scorer (score_all + top); bm25s
  BM25.retrieve (its numpy backend scores every posting of the query terms; numba where that is
  installed); tantivy Searcher.search(count=False) (its top-k collector, with block-max WAND
  pruning: count=True would count every match and turn the pruning off). Query analysis is
  outside the clock for every engine: semsearch gets term ids, bm25s token lists, tantivy parsed
  Query objects; tantivy's hits (segment, doc) are turned into chunk numbers through a fast field
  after the clock stops. A few queries are run once before timing (warm caches and pages).
- agreement with semsearch's exhaustive top k: the queries whose top k is the same set of chunks,
  and overlap@k (the mean fraction of semsearch's top k the engine returns). Scores are not
  compared: they differ by each engine's conventions. bm25s's "lucene" method leaves out the
  constant factor (k1 + 1) (same ranking, other float32 roundings); tantivy keeps a document's
  length as a 1-byte Lucene-style field norm (a length of 100-300 terms is rounded down to a
  step of 8 to 32), so its ranking is not exactly semsearch's and equal sets are not expected.
  Ties at the k-th place may be broken differently too (semsearch: lower chunk number first).
The CPU's flags and the load average are printed with the figures.
"""
from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))  # semsearch from this source tree
from bench_bm25 import postings, pruned_against_exhaustive  # noqa: E402
from bench_filters import cpu_flags  # noqa: E402
from synthetic import Corpus  # noqa: E402

from semsearch.store.lexical import LexicalIndex  # noqa: E402

K1, B = 1.2, 0.75
KS = (10, 100)
BLOCK = 50_000  # chunks whose texts are made at a time
WARMUP = 20  # queries run once before timing


def texts(corpus: Corpus, start: int, n: int) -> list[str]:
    """The texts of chunks start..start+n: the words "w<id>" of their term ids (no topic marker:
    semsearch's posting arrays hold only the term ids)."""
    _, lengths, terms = corpus.chunk_terms(start, n)
    words = corpus.words[terms]
    ends = np.cumsum(lengths)
    return [" ".join(words[e - l: e]) for e, l in zip(ends.tolist(), lengths.tolist())]


def folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def pct(xs: list[float], p: float) -> float:
    return float(np.percentile(xs, p))


# ---- engines: each builds its index over chunks 0..n and gives back a Built ----------------------
class Built:
    """An engine's index: `search(i, k)` (the top k of query i) is what is timed; `ids(result)` turns its result into
    chunk numbers (int64, best first; after the clock)."""

    def __init__(self, build_s: float, size: int, size_what: str, note: str, search, ids):
        self.build_s, self.size, self.size_what, self.note, self.search, self.ids = build_s, size, size_what, note, search, ids


def build_bm25s(corpus: Corpus, n: int, qterms: list[np.ndarray], workdir: Path) -> Built:
    import bm25s

    tok = bm25s.tokenization.Tokenizer(stopwords=None, stemmer=None)  # default splitter \w\w+: "w123" whole
    ids: list[list[int]] = []
    spent = 0.0
    for a in range(0, n, BLOCK):
        block = texts(corpus, a, min(BLOCK, n - a))
        t = time.perf_counter()
        ids += tok.tokenize(block, update_vocab=True, return_as="ids", show_progress=False)
        spent += time.perf_counter() - t
        del block
    t = time.perf_counter()
    retriever = bm25s.BM25(method="lucene", k1=K1, b=B, backend="auto")
    retriever.index(tok.to_tokenized_tuple(ids), show_progress=False)
    spent += time.perf_counter() - t
    del ids
    gc.collect()
    folder = workdir / f"bm25s-{n}"
    shutil.rmtree(folder, ignore_errors=True)
    retriever.save(str(folder))
    queries = [[[f"w{t}" for t in q.tolist()]] for q in qterms]  # one query: a list of one token list

    def search(i: int, k: int):
        return retriever.retrieve(queries[i], k=k, show_progress=False, n_threads=0)

    def to_ids(res) -> np.ndarray:
        docs, scores = res
        return docs[0][scores[0] > 0].astype(np.int64)  # bm25s fills k places, zero scores included

    return Built(spent, folder_size(folder), "saved folder", f"bm25s {bm25s.__version__}, backend {retriever.backend}, "
                 f"vocabulary {sum(1 for w in tok.get_vocab_dict() if w):,} tokens", search, to_ids)


def build_tantivy(corpus: Corpus, n: int, qterms: list[np.ndarray], workdir: Path) -> Built:
    import tantivy

    folder = workdir / f"tantivy-{n}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    sb = tantivy.SchemaBuilder()
    sb.add_unsigned_field("id", stored=False, fast=True)
    sb.add_text_field("body", stored=False, tokenizer_name="default", index_option="freq")
    schema = sb.build()
    spent = 0.0
    t = time.perf_counter()
    index = tantivy.Index(schema, path=str(folder))
    writer = index.writer()  # default heap (128 MB) and threads
    spent += time.perf_counter() - t
    for a in range(0, n, BLOCK):
        block = texts(corpus, a, min(BLOCK, n - a))
        t = time.perf_counter()
        for i, text in enumerate(block, a):
            doc = tantivy.Document()
            doc.add_unsigned("id", i)
            doc.add_text("body", text)
            writer.add_document(doc)
        spent += time.perf_counter() - t
        del block
    t = time.perf_counter()
    writer.commit()
    writer.wait_merging_threads()
    spent += time.perf_counter() - t
    gc_writer = index.writer()  # files of segments merged away: gone before the folder is measured
    gc_writer.garbage_collect_files()
    gc_writer.wait_merging_threads()
    index.reload()
    searcher = index.searcher()
    # the same tokens as semsearch's: the document frequency of a query's terms
    probe = qterms[0]
    li_df = [int(searcher.doc_freq("body", f"w{t}")) for t in probe.tolist()]
    queries = [index.parse_query(" ".join(f"w{t}" for t in q.tolist()), ["body"]) for q in qterms]  # OR of the terms

    def search(i: int, k: int):
        return searcher.search(queries[i], k, count=False).hits

    def to_ids(hits) -> np.ndarray:
        if not hits:
            return np.zeros(0, np.int64)
        return np.array(searcher.fast_field_values("id", [a for _, a in hits]), np.int64)

    built = Built(spent, folder_size(folder), "index folder", f"{getattr(tantivy, '__version__', 'tantivy ?')}, "
                  f"{searcher.num_segments} segment(s), {searcher.num_docs:,} docs", search, to_ids)
    built.df_probe = li_df
    return built


ENGINES = {"bm25s": build_bm25s, "tantivy": build_tantivy}


def time_engine(name: str, search, ids, qterms: list[np.ndarray], ref: dict[int, list[np.ndarray]]) -> None:
    """p50 / p99 of search at each k, and agreement with semsearch's exhaustive top k."""
    for i in range(min(WARMUP, len(qterms))):
        search(i, max(KS))
    for k in KS:
        lat, same, overlap = [], 0, []
        for i, want in enumerate(ref[k]):
            t = time.perf_counter()
            res = search(i, k)
            lat.append((time.perf_counter() - t) * 1000)
            got = ids(res)
            same += set(got.tolist()) == set(want.tolist())
            overlap.append(len(np.intersect1d(got, want)) / len(want) if len(want) else 1.0)
        print(f"  {name:<22} k={k:<4} p50 {pct(lat, 50):8.2f} ms  p99 {pct(lat, 99):8.2f} ms | same top-{k} set as "
              f"semsearch exhaustive: {same:>4}/{len(qterms)}, overlap@{k} {np.mean(overlap):.4f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000000")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--engines", default="semsearch,bm25s,tantivy")
    ap.add_argument("--workdir", default="/tmp/bench-bm25-others")
    args = ap.parse_args()
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    for e in engines:
        if e != "semsearch" and e not in ENGINES:
            ap.error(f"unknown engine {e!r} (semsearch, {', '.join(ENGINES)})")
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    available = {}
    for e in engines:
        if e == "semsearch":
            continue
        try:
            __import__(e)
            available[e] = ENGINES[e]
        except ImportError as err:
            print(f"{e}: skipped, it does not import ({err})")

    corpus = Corpus()
    qterms, _, _ = corpus.queries(args.queries)
    print(f"CPU flags: {cpu_flags()}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}; "
          f"numpy {np.__version__}; Python {sys.version.split()[0]}")
    for n in [int(x) for x in args.sizes.split(",")]:
        print(f"\n{n:,} chunks, {len(qterms)} queries")
        # semsearch: the reference top k (exhaustive) of every query, and its own timings
        t = time.perf_counter()
        p = postings(corpus, 0, n)
        li = LexicalIndex([p])
        p.blocks()
        build_s = time.perf_counter() - t
        size = sum(a.nbytes for a in (p.ids, p.lengths, p.vocab, p.indptr, p.postings, p.tfs, *p.blocks()))
        print(f"semsearch: built in {build_s:.1f} s (from term ids: no text analysis); {size / 1e6:,.1f} MB of arrays "
              f"in memory; {len(p.postings):,} postings, vocabulary {len(p.vocab):,} terms")
        ref: dict[int, list[np.ndarray]] = {}
        for q in qterms[:WARMUP]:
            li.top_k(q, max(KS))
            li.top(li.score_all(q), max(KS))
        for k in KS:
            ex, pr, same, ref[k] = pruned_against_exhaustive(li, qterms, k)
            if "semsearch" in engines:
                print(f"  {'semsearch top_k':<22} k={k:<4} p50 {pct(pr, 50):8.2f} ms  p99 {pct(pr, 99):8.2f} ms | "
                      f"same top-{k} (ids and scores) as exhaustive: {same}/{len(qterms)}")
                print(f"  {'semsearch exhaustive':<22} k={k:<4} p50 {pct(ex, 50):8.2f} ms  p99 {pct(ex, 99):8.2f} ms")
        df = [int(len(p.postings[p.indptr[v]:p.indptr[v + 1]])) if v >= 0 else 0 for v in p.find(qterms[0]).tolist()]
        del li, p
        gc.collect()
        for name, build in available.items():
            try:
                built = build(corpus, n, qterms, workdir)
            except Exception as err:  # noqa: BLE001 - an engine that fails is reported, the others still run
                print(f"{name}: failed to build ({type(err).__name__}: {err})")
                continue
            print(f"{name}: built in {built.build_s:.1f} s; {built.size / 1e6:,.1f} MB ({built.size_what}); {built.note}")
            probe = getattr(built, "df_probe", None)
            if probe is not None and probe != df:
                print(f"  warning: {name}'s document frequencies of query 0's terms {probe} are not semsearch's {df}")
            time_engine(name, built.search, built.ids, qterms, ref)
            del built
            gc.collect()
    print(f"\nload average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
