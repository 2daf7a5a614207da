"""What one write costs in a semsearch index of 10k, 100k and 1M chunks, and what queries cost.

    python scripts/bench/bench_writes.py [--sizes 10000,100000,1000000] [--writes 15] [--queries 60]
        [--baseline-ref 4d5f750] [--baseline-sizes 10000,100000] [--many-writes 1000]
        [--others] [--others-python /tmp/bench-others-venv/bin/python]
        [--only writes,baseline,queries,many,others] [--keep DIR] [--json PATH]

The model is replaced by a cheap deterministic stand-in encoder: a text's vector is drawn from a
seed taken from its hash, near one of 200 random centres, in microseconds, and a query text
"q<i>: words" encodes as the i-th prepared query vector (a stored vector plus noise). So only
the index's own work is timed (chunking, the docstore, the vector index, BM25, publishing),
not a transformer. Encoding time is still measured (time spent inside encoder.encode) and shown
apart, so "time excluding encoding" is what the index costs.

The synthetic index is built as scripts/bench/bench_filters.py builds it (IndexWriter, finalize_vectors,
commit): N chunks, vectors around 200 random centres, short texts (8-20 words from a 5,000-word
zipf vocabulary), metadata {"year": 2000..2024, "lang": "de" for 1% of chunks, else "en"}; the
index type is the automatic one for its size (flat below 50k chunks, IVF above).

1. Writes (each size in --sizes). On a copy of the index, through the public API, --writes times
   each: `upsert_documents` of a new document of about 3 chunks (700 words, windows of 254
   tokens), `upsert_documents` replacing that document with new text, `delete_documents` of it.
   Per kind of write: median and max of the wall time (ms), of the time excluding encoding, of
   the bytes the process wrote during the call (`write_bytes` of /proc/self/io: what reached the
   block layer, page cache writeback included as it is charged) and of `wchar` (bytes passed to
   write calls); and the number of segments in the manifest after the writes and the most seen
   between them (read leniently: 1 for a format without segments).
2. --baseline-ref REF: the same write measurement on the code of commit REF (e.g. 4d5f750, the
   last commit of the previous single-generation format), in the same run: a git worktree of REF
   at /tmp/semsearch-baseline-REF (made once, then reused) and this script in a subprocess with
   PYTHONPATH set to it, at --baseline-sizes; printed beside the current code's figures, with
   previous / current ratios.
3. Queries (current code, each size >= --queries-min, 100000): p50 of Retriever.search(q, k=10) in its default
   (hybrid) mode over --queries queries, unfiltered, with where="year>=2010" (~60% of chunks
   pass) and where={"lang": "de"} (~1%); the ratio is filtered p50 / unfiltered p50.
4. --many-writes M (default 1000, 0 for none; at --many-at, 100000, when it is in --sizes; on
   the current code only, as the previous format copies the whole index on every write): hybrid p50 on a fresh copy of the 100k index,
   then M one-document upserts (new ids, 3 chunks each) through upsert_documents, then hybrid
   p50 again over the same queries; the ratio after / before and the segment count.
5. --others: Chroma and LanceDB at --others-n (100k) chunks of precomputed 384-d vectors (no
   embedding model runs): a one-document upsert (3 rows; new ids), an upsert replacing those 3
   rows, a delete of them; median and max of time and of /proc/self/io bytes, --writes times.
   They are not dependencies of semsearch (the optional extra `bench-others` names them); they
   run in a subprocess of --others-python (default: this interpreter), e.g. a separate venv:
       python3 -m venv /tmp/bench-others-venv
       /tmp/bench-others-venv/bin/pip install chromadb lancedb numpy
   A system that cannot be imported there is skipped, and the reason printed. semsearch's own
   figures at the same size (section 1, when measured in the run) are printed beside them.

--only runs the named sections (writes, baseline, queries, many, others), e.g.
`--only others` for the competitors alone; --queries-min and --many-at let sections 3 and 4 run
at small sizes while developing.

The index folders are built in --keep DIR when given (and reused from there by later runs, when
the storage code's manifest format is the same), else in a temporary folder removed at the end;
writes always go to a copy, so a kept index stays as built. --json PATH writes every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from functools import partial
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")  # chromadb

SCRIPT = Path(__file__).resolve()
REPO = SCRIPT.parents[2]
WINDOW = 254  # tokens a chunk (the manifest's chunking; overlap 0)
DOC_WORDS = 700  # one stand-in token a word: windows of 254, 254, 192 = 3 chunks
OPS = ("upsert new", "upsert replace", "delete")
SECTIONS = ("writes", "baseline", "queries", "many", "others")
WHERES = {"none": None, "year>=2010 (~60%)": "year>=2010", "lang=de (~1%)": {"lang": "de"}}


def cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            flags = set(fh.read().split())
    except OSError:
        return platform.machine()
    return " ".join(f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8") if f in flags)


def io_counters() -> dict[str, int]:
    """This process's I/O counters (all its threads), from /proc/self/io; {} where there is none."""
    out = {}
    try:
        with open("/proc/self/io") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                out[key.strip()] = int(value)
    except (OSError, ValueError):
        pass
    return out


def fmt_bytes(b: float | None) -> str:
    if b is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b:.0f} B"


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return "-"
    if b == 0:
        return "-" if a == 0 else "inf"
    return f"{a / b:.2f}"


class StandInEncoder:
    """Deterministic and cheap: 'q<i>: words' encodes as the i-th prepared query vector; any other
    text as a vector near one of the centres, drawn from a seed taken from the text's crc32.
    Tokens are whitespace-separated words. Time inside encode() is added up in `seconds`."""

    name, fingerprint, backend, precision, head_info, pooling = "stand-in", "standin01", "fake", "fp32", None, "mean"
    max_length = WINDOW + 2
    _QUERY = re.compile(r"q(\d+):")
    _TOKEN = re.compile(r"\S+")

    def __init__(self, centres: np.ndarray, qv: np.ndarray | None = None):
        self.centres, self.qv = centres, qv
        self.dim = self.out_dim = centres.shape[1]
        self.seconds = 0.0
        self.texts = 0

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        return [m.span() for m in self._TOKEN.finditer(text)]

    def encode(self, texts, progress=None) -> np.ndarray:
        t = time.perf_counter()
        if isinstance(texts, str):
            texts = [texts]
        out = np.empty((len(texts), self.dim), np.float32)
        for i, text in enumerate(texts):
            m = self._QUERY.match(text)
            if m is not None and self.qv is not None:
                out[i] = self.qv[int(m.group(1))]
                continue
            r = np.random.default_rng(zlib.crc32(text.encode("utf-8")))
            v = self.centres[r.integers(len(self.centres))] + r.normal(scale=0.6, size=self.dim)
            out[i] = v / np.linalg.norm(v)
        self.seconds += time.perf_counter() - t
        self.texts += len(texts)
        return out


# ---- the synthetic index ------------------------------------------------------------------------
VOCAB = [f"w{i}" for i in range(5000)]


def words(rng: np.random.Generator, n: int) -> str:
    return " ".join(VOCAB[x] for x in rng.zipf(1.3, size=n) % len(VOCAB))


def format_signature() -> str:
    """The manifest format of the semsearch imported (its version and fields): a kept index is
    reused only by code that writes the same format."""
    from semsearch.store.manifest import FORMAT_VERSION, Manifest

    return f"{FORMAT_VERSION}:" + ",".join(sorted(Manifest.__dataclass_fields__))


def build(folder: Path, n: int, dim: int, rng: np.random.Generator) -> tuple[np.ndarray, list[str], np.ndarray]:
    """The index of n synthetic chunks, as scripts/bench/bench_filters.py builds it (chunk windows of
    WINDOW tokens); gives back 2,000 stored vectors (queries are made from them), query words, and
    the centres."""
    return _filters().build(folder, n, dim, rng)


def _filters():
    """scripts/bench/bench_filters.py, whose index builder and timer this benchmark shares (imported
    when first needed: the --others worker runs in another Python)."""
    if str(SCRIPT.parent) not in sys.path:
        sys.path.insert(0, str(SCRIPT.parent))
    import bench_filters

    return bench_filters


def ensure_index(root: Path, n: int, dim: int) -> tuple[Path, np.ndarray, list[str], np.ndarray]:
    """root/n<N>, built unless a usable one (same manifest format, same dim) is there already."""
    folder, meta = root / f"n{n}", root / f"n{n}.npz"
    sig = format_signature()
    if (folder / "manifest.json").exists() and meta.exists():
        z = np.load(meta, allow_pickle=True)
        if str(z["format"]) == sig and z["centres"].shape[1] == dim:
            print(f"{n:,} chunks: reusing {folder}", flush=True)
            return folder, z["sample"], list(z["qwords"]), z["centres"]
        print(f"{n:,} chunks: {folder} was built by another index format or dim; rebuilding it", flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    print(f"{n:,} chunks: building in {folder}", flush=True)
    sample, qwords, centres = build(folder, n, dim, np.random.default_rng(n))
    np.savez(meta, sample=sample, qwords=np.array(qwords, object), centres=centres, format=np.array(sig))
    return folder, sample, qwords, centres


def copy_index(src: Path, dst: Path) -> Path:
    """A private copy for writes (so a kept index stays as built), flushed to disk first so its
    writeback is not charged to the writes measured next."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock"))
    os.sync()
    return dst


def manifest_info(folder: Path) -> dict:
    with open(folder / "manifest.json") as fh:
        raw = json.load(fh)
    return {"segments": len(raw.get("segments", [None])), "generation": raw.get("generation"),
            "index_type": (raw.get("index") or {}).get("type"), "chunks": (raw.get("counts") or {}).get("chunks")}


def query_vectors(sample: np.ndarray, nq: int) -> np.ndarray:
    q = sample[:nq] + np.random.default_rng(1).normal(scale=0.02, size=(nq, sample.shape[1])).astype(np.float32)
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def summary(recs: list[dict]) -> dict:
    out = {}
    for key in ("ms", "ms_excl_encoding", "encode_ms", "write_bytes", "wchar", "read_bytes", "cancelled_write_bytes"):
        vals = [r[key] for r in recs if r.get(key) is not None]
        if vals:
            out[key] = {"median": round(statistics.median(vals), 3), "max": round(max(vals), 3)}
    return out


# ---- 1. one write at a time ---------------------------------------------------------------------
def measure_call(fn, encoder: StandInEncoder | None = None) -> tuple[dict, object]:
    e0 = encoder.seconds if encoder is not None else 0.0
    io0 = io_counters()
    t = time.perf_counter()
    result = fn()
    ms = (time.perf_counter() - t) * 1e3
    io1 = io_counters()
    rec = {"ms": round(ms, 3)}
    if encoder is not None:
        enc = (encoder.seconds - e0) * 1e3
        rec.update(encode_ms=round(enc, 3), ms_excl_encoding=round(ms - enc, 3))
    for key in ("write_bytes", "wchar", "read_bytes", "cancelled_write_bytes"):
        if key in io0 and key in io1:
            rec[key] = io1[key] - io0[key]
    return rec, result


def measure_writes(folder: Path, n: int, centres: np.ndarray, writes: int, seed: int) -> dict:
    """--writes rounds of: upsert a new 3-chunk document, upsert it again with new text, delete it."""
    from semsearch.documents import Document, delete_documents, upsert_documents

    encoder = StandInEncoder(centres)
    rng = np.random.default_rng(seed)
    recs: dict[str, list[dict]] = {op: [] for op in OPS}
    before = manifest_info(folder)
    seg_max = before["segments"]
    for i in range(writes):
        doc_id = f"bench-{i}"
        meta = {"year": int(rng.integers(2000, 2025)), "lang": "en"}
        new, replacement = Document(doc_id, words(rng, DOC_WORDS), meta), Document(doc_id, words(rng, DOC_WORDS), meta)
        calls = {
            "upsert new": (partial(upsert_documents, folder, [new], encoder), "added"),
            "upsert replace": (partial(upsert_documents, folder, [replacement], encoder), "updated"),
            "delete": (partial(delete_documents, folder, [doc_id]), "deleted"),
        }
        for op, (fn, field) in calls.items():
            rec, report = measure_call(fn, encoder)
            if getattr(report, field, None) != 1:
                raise RuntimeError(f"{op} of {doc_id}: expected 1 {field}, the report says {report}")
            rec["chunks_encoded"] = getattr(report, "chunks", 0)
            rec["segments"] = manifest_info(folder)["segments"]
            seg_max = max(seg_max, rec["segments"])
            recs[op].append(rec)
    after = manifest_info(folder)
    return {"n": n, "index_type": before["index_type"], "writes": writes,
            "segments_before": before["segments"], "segments_after": after["segments"], "segments_max": seg_max,
            "generation_after": after["generation"], "summary": {op: summary(r) for op, r in recs.items()}, "raw": recs}


def writes_at(folder: Path, n: int, centres: np.ndarray, writes: int) -> dict:
    """Section 1 on a copy of the index of n chunks at `folder`."""
    import semsearch

    work = copy_index(folder, folder.with_name(folder.name + ".writes"))
    try:
        print(f"{n:,} chunks: {writes} x {', '.join(OPS)}", flush=True)
        row = measure_writes(work, n, centres, writes, seed=n + 1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    row["semsearch"] = str(Path(semsearch.__file__).parent)
    print_writes(row)
    return row


def run_writes(root: Path, sizes: list[int], dim: int, writes: int) -> list[dict]:
    out = []
    for n in sizes:
        folder, _, _, centres = ensure_index(root, n, dim)
        out.append(writes_at(folder, n, centres, writes))
    return out


def print_writes(row: dict) -> None:
    print(f"\n{row['n']:,} chunks ({row['index_type']}), {row['writes']} of each write; segments "
          f"{row['segments_before']} before, {row['segments_after']} after (at most {row['segments_max']}); code: {row.get('semsearch', '?')}")
    print("| write | median ms | max ms | median ms excl. encoding | max ms excl. encoding | median write_bytes | "
          "max write_bytes | median wchar | max wchar |\n|---|---|---|---|---|---|---|---|---|")
    for op, s in row["summary"].items():
        def g(k: str, w: str, s: dict = s) -> float | None:
            return s.get(k, {}).get(w)

        print(f"| {op} | {g('ms', 'median'):.1f} | {g('ms', 'max'):.1f} | {g('ms_excl_encoding', 'median'):.1f} | "
              f"{g('ms_excl_encoding', 'max'):.1f} | {fmt_bytes(g('write_bytes', 'median'))} | {fmt_bytes(g('write_bytes', 'max'))} | "
              f"{fmt_bytes(g('wchar', 'median'))} | {fmt_bytes(g('wchar', 'max'))} |")
    print(flush=True)


# ---- 2. the previous format, in a subprocess ----------------------------------------------------
def baseline_worktree(ref: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", ref)
    path = Path("/tmp") / f"semsearch-baseline-{safe}"
    want = subprocess.run(["git", "-C", str(REPO), "rev-parse", f"{ref}^{{commit}}"], capture_output=True, text=True, check=True).stdout.strip()
    if (path / "semsearch" / "__init__.py").exists():
        have = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
        if have != want:
            print(f"warning: {path} is at {have[:12]}, not {ref} ({want[:12]}); using it as it is", flush=True)
    else:
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), want], check=True)
    return path


def run_baseline(ref: str, sizes: list[int], root: Path, a) -> list[dict]:
    tree = baseline_worktree(ref)
    out = root / f"baseline-{re.sub(r'[^A-Za-z0-9._-]', '_', ref)}.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    cmd = [sys.executable, str(SCRIPT), "--_worker", "writes", "--sizes", ",".join(map(str, sizes)), "--writes", str(a.writes),
           "--dim", str(a.dim), "--_root", str(root / f"baseline-{re.sub(r'[^A-Za-z0-9._-]', '_', ref)}"), "--_out", str(out)]
    print(f"previous format: {ref} in {tree}, in a subprocess", flush=True)
    p = subprocess.run(cmd, env=env, check=False, cwd=tree)
    if p.returncode != 0 or not out.exists():
        raise RuntimeError(f"the baseline subprocess failed with exit status {p.returncode}")
    rows = json.loads(out.read_text())
    for row in rows:
        if not str(row.get("semsearch", "")).startswith(str(tree)):
            raise RuntimeError(f"the baseline subprocess imported semsearch from {row.get('semsearch')}, not {tree}")
    return rows


def print_side_by_side(current: list[dict], previous: list[dict], ref: str) -> None:
    cur = {r["n"]: r for r in current}
    print(f"\nWrites: current code vs the previous format ({ref}); medians; ratio = previous / current")
    print("| chunks | write | ms current | ms previous | ratio | ms excl. enc. current | ms excl. enc. previous | ratio | "
          "write_bytes current | write_bytes previous | ratio | wchar current | wchar previous | ratio |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p in previous:
        c = cur.get(p["n"])
        for op in OPS:
            def med(row: dict | None, key: str, op: str = op) -> float | None:
                return None if row is None else row["summary"][op].get(key, {}).get("median")

            cells = []
            for key in ("ms", "ms_excl_encoding", "write_bytes", "wchar"):
                a, b = med(c, key), med(p, key)
                show = (lambda x: "-" if x is None else f"{x:.1f}") if key.startswith("ms") else fmt_bytes
                cells += [show(a), show(b), ratio(b, a)]
            print(f"| {p['n']:,} | {op} | " + " | ".join(cells) + " |")
    for p in previous:
        c = cur.get(p["n"])
        print(f"  {p['n']:,}: segments after the writes: current {c['segments_after'] if c else '-'}, previous {p['segments_after']}")
    print(flush=True)


# ---- 3. queries ---------------------------------------------------------------------------------
def query_p50s(folder: Path, n: int, sample: np.ndarray, qwords: list[str], centres: np.ndarray, nq: int) -> dict:
    from semsearch.search import Retriever

    nq = min(nq, len(sample))
    r = Retriever.load(folder, encoder=StandInEncoder(centres, query_vectors(sample, nq)))
    texts = [f"q{i}: {qwords[i]}" for i in range(nq)]
    try:
        t = time.perf_counter()
        r.search(texts[0], 10)  # loads the lexical side
        first = (time.perf_counter() - t) * 1e3
        row = {"n": n, "mode": r.default_mode, "index_type": r.manifest.index["type"], "first_query_ms": round(first, 1),
               "queries": nq, "p50_ms": {}, "p90_ms": {}}
        for qt in texts:  # one untimed pass: the pages of the docstore these queries read are in the page cache
            r.search(qt, 10)
        for name, where in WHERES.items():
            r.search(texts[0], 10, where=where)  # warm (reads the field)
            ms = _filters().timed(lambda i, where=where: r.search(texts[i], 10, where=where), nq)
            row["p50_ms"][name] = round(statistics.median(ms), 3)
            row["p90_ms"][name] = round(float(np.percentile(ms, 90)), 3)
    finally:
        r.close()
    print(f"\n{row['n']:,} chunks ({row['index_type']}), Retriever.search k=10, mode {row['mode']}, {nq} queries "
          f"(first query, loading the lexical side: {first:.0f} ms)")
    print("| where | p50 ms | p90 ms | p50 / unfiltered p50 |\n|---|---|---|---|")
    for name, p50 in row["p50_ms"].items():
        print(f"| {name} | {p50:.2f} | {row['p90_ms'][name]:.2f} | {p50 / row['p50_ms']['none']:.2f} |")
    print(flush=True)
    return row


# ---- 4. many writes, then queries ---------------------------------------------------------------
def many_writes(root: Path, folder: Path, n: int, sample, qwords, centres, count: int, nq: int) -> dict:
    from semsearch.documents import Document, upsert_documents
    from semsearch.search import Retriever

    work = copy_index(folder, root / f"{folder.name}.many")
    try:
        nq = min(nq, len(sample))
        enc = StandInEncoder(centres, query_vectors(sample, nq))
        texts = [f"q{i}: {qwords[i]}" for i in range(nq)]
        r = Retriever.load(work, encoder=enc)
        try:
            for qt in texts:  # untimed: the docstore pages these queries read come into the page cache
                r.search(qt, 10)
            before = statistics.median(_filters().timed(lambda i: r.search(texts[i], 10), nq))
            seg0 = manifest_info(work)["segments"]
            rng = np.random.default_rng(7)
            ms = []
            t0 = time.perf_counter()
            for i in range(count):
                doc = Document(f"many-{i}", words(rng, DOC_WORDS), {"year": int(rng.integers(2000, 2025)), "lang": "en"})
                t = time.perf_counter()
                upsert_documents(work, [doc], enc)
                ms.append((time.perf_counter() - t) * 1e3)
                if (i + 1) % max(count // 10, 1) == 0:
                    print(f"  {i + 1} upserts ({time.perf_counter() - t0:.0f} s; last {ms[-1]:.0f} ms)", flush=True)
            t = time.perf_counter()
            r.search(texts[0], 10)  # picks up the new generation, loads its lexical side
            first_after = (time.perf_counter() - t) * 1e3
            for qt in texts:  # as before: an untimed pass
                r.search(qt, 10)
            after = statistics.median(_filters().timed(lambda i: r.search(texts[i], 10), nq))
            info = manifest_info(work)
            mode = r.default_mode
        finally:
            r.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    row = {"n": n, "upserts": count, "mode": mode, "p50_before_ms": round(before, 3),
           "p50_after_ms": round(after, 3), "ratio": round(after / before, 3), "first_query_after_ms": round(first_after, 1),
           "segments_before": seg0, "segments_after": info["segments"], "chunks_after": info["chunks"],
           "upsert_ms": {"median": round(statistics.median(ms), 2), "max": round(max(ms), 2), "total_s": round(sum(ms) / 1e3, 1)}}
    print(f"\n{row['n']:,} chunks, {count} one-document upserts (median {row['upsert_ms']['median']:.1f} ms, max "
          f"{row['upsert_ms']['max']:.0f} ms, {row['upsert_ms']['total_s']:.0f} s in all): {mode} p50 {before:.2f} ms before, "
          f"{after:.2f} ms after (x{row['ratio']:.2f}); segments {seg0} -> {info['segments']}; first query after: {first_after:.0f} ms")
    print(flush=True)
    return row


# ---- 5. Chroma and LanceDB (a subprocess of --others-python) ------------------------------------
def synthetic_rows(n: int, dim: int, seed: int = 5):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(200, dim)).astype(np.float32)
    v = centres[rng.integers(0, 200, n)] + rng.normal(scale=0.6, size=(n, dim)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    lens = rng.integers(8, 21, n)
    texts = [words(rng, int(x)) for x in lens]
    years = rng.integers(2000, 2025, n)
    metas = [{"year": int(years[i]), "lang": "de" if i % 100 == 0 else "en"} for i in range(n)]
    return [f"c{i}" for i in range(n)], v, texts, metas, rng


def doc_rows(rng: np.random.Generator, doc: str, dim: int):
    """A 3-chunk document as rows: ids, vectors, texts, metadata."""
    v = rng.normal(size=(3, dim)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    year = int(rng.integers(2000, 2025))
    return [f"{doc}#{j}" for j in range(3)], v, [words(rng, WINDOW) for _ in range(3)], [{"year": year, "lang": "en"}] * 3


def bench_chroma(d: Path, n: int, dim: int, writes: int) -> dict:
    import chromadb
    from chromadb.config import Settings

    ids, v, texts, metas, rng = synthetic_rows(n, dim)
    client = chromadb.PersistentClient(path=str(d), settings=Settings(anonymized_telemetry=False))
    col = client.create_collection("bench", metadata={"hnsw:space": "cosine"})
    try:
        batch = int(client.get_max_batch_size())
    except (AttributeError, TypeError, ValueError):
        batch = 5000
    batch = max(1, min(batch, 5000))
    t0 = time.perf_counter()
    for at in range(0, n, batch):
        s = slice(at, at + batch)
        col.add(ids=ids[s], embeddings=v[s], documents=texts[s], metadatas=metas[s])
        if (at // batch) % 5 == 4:
            print(f"  chroma: {min(at + batch, n):,} rows ({time.perf_counter() - t0:.0f} s)", flush=True)
    build_s = time.perf_counter() - t0
    del v
    recs: dict[str, list[dict]] = {op: [] for op in OPS}
    for i in range(writes):
        rid, rv, rt, rm = doc_rows(rng, f"doc{i}", dim)
        _, rv2, rt2, _ = doc_rows(rng, f"doc{i}", dim)
        for op, fn in (("upsert new", partial(col.upsert, ids=rid, embeddings=rv, documents=rt, metadatas=rm)),
                       ("upsert replace", partial(col.upsert, ids=rid, embeddings=rv2, documents=rt2, metadatas=rm)),
                       ("delete", partial(col.delete, ids=rid))):
            recs[op].append(measure_call(fn)[0])
    count = col.count()
    if count != n:
        raise RuntimeError(f"chroma holds {count} rows after the writes, not {n}")
    return {"version": chromadb.__version__, "build_s": round(build_s, 1), "api": {"upsert new": "collection.upsert",
            "upsert replace": "collection.upsert", "delete": "collection.delete"},
            "summary": {op: summary(r) for op, r in recs.items()}, "raw": recs}


def bench_lancedb(d: Path, n: int, dim: int, writes: int) -> dict:
    import lancedb
    import pyarrow as pa

    def table(ids, v, texts, metas):
        return pa.table({"id": pa.array(ids, pa.string()),
                         "vector": pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(v, np.float32).ravel(), pa.float32()), dim),
                         "text": pa.array(texts, pa.string()),
                         "year": pa.array([m["year"] for m in metas], pa.int32()),
                         "lang": pa.array([m["lang"] for m in metas], pa.string())})

    ids, v, texts, metas, rng = synthetic_rows(n, dim)
    db = lancedb.connect(str(d))
    t0 = time.perf_counter()
    tbl = db.create_table("bench", data=table(ids, v, texts, metas))
    build_s = time.perf_counter() - t0
    del v
    has_merge = hasattr(tbl, "merge_insert")
    recs: dict[str, list[dict]] = {op: [] for op in OPS}
    for i in range(writes):
        rid, rv, rt, rm = doc_rows(rng, f"doc{i}", dim)
        _, rv2, rt2, _ = doc_rows(rng, f"doc{i}", dim)
        new, repl = table(rid, rv, rt, rm), table(rid, rv2, rt2, rm)
        in_list = "id IN (" + ", ".join(f"'{x}'" for x in rid) + ")"
        def replace(repl=repl, in_list=in_list) -> None:
            if has_merge:
                tbl.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(repl)
            else:
                tbl.delete(in_list)
                tbl.add(repl)

        for op, fn in (("upsert new", partial(tbl.add, new)), ("upsert replace", replace), ("delete", partial(tbl.delete, in_list))):
            recs[op].append(measure_call(fn)[0])
    count = tbl.count_rows()
    if count != n:
        raise RuntimeError(f"lancedb holds {count} rows after the writes, not {n}")
    return {"version": lancedb.__version__, "build_s": round(build_s, 1), "versions": len(tbl.list_versions()),
            "api": {"upsert new": "table.add", "upsert replace": "table.merge_insert" if has_merge else "table.delete + table.add",
                    "delete": "table.delete"},
            "summary": {op: summary(r) for op, r in recs.items()}, "raw": recs}


def others_worker(root: Path, n: int, dim: int, writes: int) -> dict:
    out = {"python": sys.executable, "n": n, "dim": dim, "writes": writes}
    for name, fn, module in (("chroma", bench_chroma, "chromadb"), ("lancedb", bench_lancedb, "lancedb")):
        try:
            __import__(module)
        except Exception as e:  # noqa: BLE001 (ImportError, or a broken install: skipped either way)
            out[name] = {"skipped": f"cannot import {module} in {sys.executable}: {type(e).__name__}: {e}"}
            print(f"{name}: skipped ({out[name]['skipped']})", flush=True)
            continue
        d = root / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        print(f"{name}: {n:,} rows of {dim}-d vectors in {d}", flush=True)
        try:
            out[name] = fn(d, n, dim, writes)
        except Exception as e:  # noqa: BLE001 (one system failing leaves the other measured)
            out[name] = {"skipped": f"failed: {type(e).__name__}: {e}"}
            print(f"{name}: {out[name]['skipped']}", flush=True)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return out


def run_others(a, root: Path) -> dict:
    out = root / "others.json"
    cmd = [a.others_python, str(SCRIPT), "--_worker", "others", "--_n", str(a.others_n), "--dim", str(a.dim),
           "--writes", str(a.writes), "--_root", str(root / "others"), "--_out", str(out)]
    print(f"Chroma and LanceDB with {a.others_python}, in a subprocess", flush=True)
    p = subprocess.run(cmd, check=False)
    if p.returncode != 0 or not out.exists():
        return {"skipped": f"the subprocess ({' '.join(cmd)}) failed with exit status {p.returncode}"}
    return json.loads(out.read_text())


def print_others(res: dict, semsearch_row: dict | None) -> None:
    print(f"\nOne document of 3 chunks at {res.get('n', 0):,} rows of precomputed vectors, {res.get('writes')} of each write; "
          "medians (max); bytes from /proc/self/io")
    if "skipped" in res:
        print(f"  skipped: {res['skipped']}")
        return
    print("| system | write | API | ms | write_bytes | wchar |\n|---|---|---|---|---|---|")
    systems = [(k, res[k]) for k in ("chroma", "lancedb")]
    if semsearch_row is not None:
        systems.insert(0, ("semsearch (excl. encoding)", {"summary": semsearch_row["summary"], "api": {
            "upsert new": "upsert_documents", "upsert replace": "upsert_documents", "delete": "delete_documents"}}))
    for name, r in systems:
        if "skipped" in r:
            print(f"| {name} | skipped: {r['skipped']} | | | | |")
            continue
        label = name if "version" not in r else f"{name} {r['version']}"
        for op in OPS:
            s = r["summary"][op]
            ms = s.get("ms_excl_encoding") or s["ms"]
            wb, wc = s.get("write_bytes", {}), s.get("wchar", {})
            print(f"| {label} | {op} | {r['api'][op]} | {ms['median']:.1f} ({ms['max']:.1f}) | "
                  f"{fmt_bytes(wb.get('median'))} ({fmt_bytes(wb.get('max'))}) | {fmt_bytes(wc.get('median'))} ({fmt_bytes(wc.get('max'))}) |")
    for k in ("chroma", "lancedb"):
        if "build_s" in res.get(k, {}):
            print(f"  {k}: {res['n']:,} rows loaded in {res[k]['build_s']:.0f} s")
    print(flush=True)


# ---- main ---------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,100000,1000000", help="index sizes in chunks")
    ap.add_argument("--writes", type=int, default=15, help="repeats of each kind of write")
    ap.add_argument("--queries", type=int, default=60)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--baseline-ref", help="also measure the writes on this commit's code (e.g. 4d5f750)")
    ap.add_argument("--baseline-sizes", default="10000,100000")
    ap.add_argument("--many-writes", type=int, default=1000, help="upserts before querying the 100k index again (0: none)")
    ap.add_argument("--many-at", type=int, default=100_000, help="the size (one of --sizes) for --many-writes")
    ap.add_argument("--queries-min", type=int, default=100_000, help="time queries at the sizes from this one up")
    ap.add_argument("--others", action="store_true", help="also measure Chroma and LanceDB")
    ap.add_argument("--others-python", default=sys.executable, help="the Python that has chromadb and lancedb")
    ap.add_argument("--others-n", type=int, default=100_000)
    ap.add_argument("--only", help=f"run only these sections (comma-separated: {', '.join(SECTIONS)})")
    ap.add_argument("--keep", type=Path, help="build (or reuse) the indexes in this folder")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--_worker", choices=("writes", "others"), help=argparse.SUPPRESS)
    ap.add_argument("--_root", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--_out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--_n", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",") if x.strip()]

    if a._worker == "writes":
        a._root.mkdir(parents=True, exist_ok=True)
        a._out.write_text(json.dumps(run_writes(a._root, sizes, a.dim, a.writes)))
        return
    if a._worker == "others":
        a._root.mkdir(parents=True, exist_ok=True)
        a._out.write_text(json.dumps(others_worker(a._root, a._n, a.dim, a.writes)))
        return

    if a.only:
        sections = {s.strip() for s in a.only.split(",") if s.strip()}
        unknown = sections - set(SECTIONS)
        if unknown:
            ap.error(f"unknown section(s) {', '.join(sorted(unknown))}; choose from {', '.join(SECTIONS)}")
        if "baseline" in sections and not a.baseline_ref:
            ap.error("--only baseline needs --baseline-ref")
    else:
        sections = {"writes", "queries", "many"} | ({"baseline"} if a.baseline_ref else set()) | ({"others"} if a.others else set())
    if "many" in sections and (a.many_writes <= 0 or a.many_at not in sizes):
        sections.discard("many")

    print(f"CPU flags: {cpu_flags()}; {os.cpu_count()} cores")
    print(f"sections: {', '.join(s for s in SECTIONS if s in sections)}", flush=True)
    results: dict = {"cpu_flags": cpu_flags(), "cores": os.cpu_count(), "sizes": sizes, "writes_each": a.writes,
                     "sections": sorted(sections), "writes": [], "queries": [], "many_writes": None, "baseline": None, "others": None}
    root = a.keep or Path(tempfile.mkdtemp(prefix="bench-writes-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        if sections & {"writes", "queries", "many"}:
            import semsearch

            results["semsearch"] = str(Path(semsearch.__file__).parent)
            for n in sizes:
                want_q = "queries" in sections and n >= a.queries_min
                want_m = "many" in sections and n == a.many_at
                if not ("writes" in sections or want_q or want_m):
                    continue
                folder, sample, qwords, centres = ensure_index(root, n, a.dim)
                if want_q:
                    results["queries"].append(query_p50s(folder, n, sample, qwords, centres, a.queries))
                if "writes" in sections:
                    results["writes"].append(writes_at(folder, n, centres, a.writes))
                if want_m:
                    results["many_writes"] = many_writes(root, folder, n, sample, qwords, centres, a.many_writes, a.queries)
        if "baseline" in sections:
            bsizes = [int(x) for x in a.baseline_sizes.split(",") if x.strip()]
            try:
                results["baseline"] = {"ref": a.baseline_ref, "results": run_baseline(a.baseline_ref, bsizes, root, a)}
                print_side_by_side(results["writes"], results["baseline"]["results"], a.baseline_ref)
            except (RuntimeError, subprocess.CalledProcessError, OSError, ValueError) as e:
                results["baseline"] = {"ref": a.baseline_ref, "error": str(e)}
                print(f"previous format: not measured ({e})", flush=True)
        if "others" in sections:
            results["others"] = run_others(a, root)
            same = [r for r in results["writes"] if r["n"] == a.others_n]
            print_others(results["others"], same[0] if same else None)
        if results["queries"]:
            print("Queries: filtered p50 / unfiltered p50")
            for q in results["queries"]:
                print(f"  {q['n']:,} chunks: " + ", ".join(f"{k}: {v / q['p50_ms']['none']:.2f}" for k, v in q["p50_ms"].items() if k != "none"))
        if a.json:
            a.json.write_text(json.dumps(results, indent=1))
            print(f"results written to {a.json}")
    finally:
        if a.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
