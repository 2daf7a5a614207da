"""An index of 1M-10M chunks on one machine: build, open, memory, query speed, recall, writes.

    python scripts/bench/bench_scale.py [--sizes 1000000,3000000] [--queries 1000] [--keep DIR]
        [--vector-storage fp16] [--baseline-ref REF] [--baseline-sizes 1000000]

The corpus is scripts/bench/synthetic.py's: chunks of ~200 words (100-300) from a 100k-term Zipf
vocabulary with topic structure, vectors clustered around 2,000 topic centres (a stand-in encoder
reads a chunk's topic from its first word: so only the index's own work is timed). It is written
as JSONL files (50k records each) and indexed by `semsearch.index`'s own pipeline (reading,
chunking, segments published every 250k chunks, the final merge, IVF training and tuning).

Per size, each step in its own child process (so its memory is its own):
- build: wall time, peak RSS, and the index folder's largest size while it was built (polled);
- open: Retriever.load time and RSS in a fresh process, then --queries hybrid queries, and
  --queries / 3 dense and lexical ones: p50 / p99 of each mode, RSS after them;
- dense recall@10 of 200 queries against exact search over every stored vector, and those queries'
  hybrid top 10 with the dense side's re-ranking capped at the fusion depth (store/vectors.py,
  REFINE_K) against every k_factor x k candidate re-ranked (agreement and p50 of each);
- one-document writes: upsert of a new ~700-word document (3 chunks), then its delete: time and
  bytes written, the first of the process and three more (/proc/self/io write_bytes).
--baseline-ref REF: the same on the code of commit REF (a git worktree under /tmp), e.g. the last
commit of the previous index format, at --baseline-sizes, in the same run. The CPU's flags and
the load average are printed with the figures.
--measure-only DIR [--retune R]: measure an index built before (e.g. on a quiet machine); --retune
first runs `semsearch tune --target-recall R` on it (timed), as for an index whose build tuned
fewer knobs.
--memory-limit 1G: the measuring child runs in a memory cgroup (v1) of that limit, which counts
the page cache of the mapped files too: the kernel must take pages back for the queries to go on,
so the figures show what the index needs resident, not what an idle page cache kept of it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_filters import cpu_flags  # noqa: E402
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def rss(kind: str = "VmRSS") -> int:
    """Resident bytes: VmRSS (all), RssAnon (heap: this process's own), RssFile (pages of mapped
    files: the page cache, which the kernel takes back under pressure)."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(kind + ":"))


def resident_by_file(folder: Path) -> dict[str, int]:
    """Resident bytes of each of the index's files mapped into this process (/proc/self/smaps)."""
    out: dict[str, int] = {}
    name = None
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                name = Path(head[5]).name if len(head) > 5 and head[5].startswith(str(folder)) else None
            elif name and line.startswith("Rss:"):
                out[name] = out.get(name, 0) + int(head[1]) * 1024
    return out


def written() -> int:
    with open("/proc/self/io") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("write_bytes:"))


def write_corpus(folder: Path, n: int, per_file: int = 50_000) -> None:
    from synthetic import Corpus

    done = folder.parent / f"{folder.name}.done"  # beside the corpus, not in it (the indexer would skip it)
    if done.exists():
        return
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    corpus = Corpus()
    for at in range(0, n, per_file):
        texts, _ = corpus.texts(at, min(per_file, n - at))
        with open(folder / f"part-{at // per_file:05d}.jsonl", "w") as fh:
            fh.writelines(json.dumps({"text": t, "n": at + i}) + "\n" for i, t in enumerate(texts))
    done.write_text(str(n))


# ---- the child steps -------------------------------------------------------------------------------
def child_build(corpus: Path, index: Path, storage: str | None = None) -> dict:
    import logging

    import semsearch.indexing as indexing

    # the build's steps on stderr (segments published, the final merge's steps): a long build's progress
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    from synthetic import Corpus, StandInEncoder

    enc = StandInEncoder(Corpus())
    t = time.perf_counter()
    vs = indexing.VectorSettings(storage=storage) if storage else None  # a baseline's code may not know it
    indexing.index_corpus(corpus, index, enc, progress=False, **({"vectors": vs} if vs else {}))
    return {"seconds": time.perf_counter() - t, "encode_seconds": enc.seconds}


def memory_cgroup(limit: int) -> Path:
    """A child memory cgroup (v1) of this process's own, limited to `limit` bytes (page cache
    included); SystemExit where the machine has none to make."""
    line = next((x for x in Path("/proc/self/cgroup").read_text().splitlines() if x.split(":")[1] == "memory"), None)
    if line is None:
        raise SystemExit("--memory-limit: no memory cgroup (v1) here")
    group = Path("/sys/fs/cgroup/memory") / line.split(":", 2)[2].lstrip("/") / f"bench-scale-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        (group / "memory.limit_in_bytes").write_text(str(limit))
    except OSError as e:
        raise SystemExit(f"--memory-limit: cannot make a memory cgroup ({e})") from e
    import atexit

    atexit.register(lambda: group.rmdir() if group.exists() else None)  # empty once the children are gone
    return group


def child_measure(index: Path, queries: int) -> dict:
    from synthetic import Corpus, StandInEncoder

    group = os.environ.get("BENCH_CGROUP")
    if group:  # the whole measurement inside the limit (its peak usage is reported)
        (Path(group) / "cgroup.procs").write_text(str(os.getpid()))

    import faiss  # noqa: F401  (its own pages are not the index's)
    from semsearch.search import Retriever

    corpus = Corpus()
    enc = StandInEncoder(corpus)
    texts = corpus.query_texts(queries + 600, seed=3)
    out: dict = {"disk_bytes": sum(p.stat().st_size for p in index.iterdir() if p.is_file())}
    r0, r0_anon = rss(), rss("RssAnon")
    t = time.perf_counter()
    r = Retriever.load(index, encoder=enc)
    out["load_seconds"] = time.perf_counter() - t
    out["rss_after_load"] = rss()
    out["rss_before_load"] = r0

    def timed(mode: str, qs: list[str]) -> list[float]:
        ms = []
        for q in qs:
            t0 = time.perf_counter()
            r.search(q, k=10, mode=mode)
            ms.append((time.perf_counter() - t0) * 1000)
        return ms

    r.search(texts[0], k=10)  # the first query's one-off costs (the lexical side's statistics)
    out["first_query_ms"] = timed("hybrid", texts[1:2])[0]
    for mode, qs in (("hybrid", texts[2: 2 + queries]), ("dense", texts[2: 2 + queries // 3]),
                     ("lexical", texts[2: 2 + queries // 3])):
        ms = timed(mode, qs)
        out[mode] = {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)), "n": len(ms)}
    out["rss_after_queries"] = rss()
    out["anon_after_queries"], out["file_after_queries"] = rss("RssAnon"), rss("RssFile")
    out["anon_before_load"] = r0_anon
    out["file_pages_by_file"] = resident_by_file(index.resolve())
    # dense recall@10 against exact search over every stored vector
    rq = texts[queries + 2: queries + 202]
    qv = enc.encode(rq)
    best_s = np.full((len(rq), 10), -np.inf, np.float32)
    best_i = np.full((len(rq), 10), -1, np.int64)
    for ids, vecs in r.docs.iter_vectors(65536):
        s = qv @ vecs.T
        cs, ci = np.concatenate([best_s, s], 1), np.concatenate([best_i, np.broadcast_to(ids, s.shape)], 1)
        top = np.argpartition(-cs, 9, axis=1)[:, :10]
        best_s, best_i = np.take_along_axis(cs, top, 1), np.take_along_axis(ci, top, 1)
    got = [{h.id for h in hits} for hits in r.search_batch(rq, k=10, mode="dense")]
    out["recall@10"] = float(np.mean([len(g & set(e.tolist())) / 10 for g, e in zip(got, best_i)]))
    out["index"] = {k: r.manifest.index.get(k) for k in ("type", "params", "recall")}
    # hybrid with the dense side's re-ranking capped at its fusion depth (vectors.REFINE_K) against
    # the same 200 queries with every k_factor * k candidate re-ranked: top-10 overlap and p50 of each
    from semsearch.store import vectors as vectors_

    if hasattr(vectors_, "REFINE_K"):
        # timed on two sets of new queries in turns (capped, uncapped, capped, ...), so that neither
        # finds the other's pages in the cache; the agreement on the first set, untimed
        cap, other = vectors_.REFINE_K, texts[queries + 202: queries + 402]

        def hybrid_ids(q: str, refine_k: int) -> tuple[list[int], float]:
            vectors_.REFINE_K = refine_k
            t0 = time.perf_counter()
            got = [h.id for h in r.search(q, k=10, mode="hybrid")]
            return got, (time.perf_counter() - t0) * 1000

        capped, ms_capped, ms_full = [], [], []
        for qa, qb in zip(rq, other):
            ids, ms = hybrid_ids(qa, cap)
            capped.append(ids)
            ms_capped.append(ms)
            ms_full.append(hybrid_ids(qb, 10 ** 9)[1])
        full = [hybrid_ids(q, 10 ** 9)[0] for q in rq]
        vectors_.REFINE_K = cap
        out["hybrid_capped"] = {"agreement@10": float(np.mean([len(set(a) & set(b)) / max(len(b), 1) for a, b in zip(capped, full)])),
                                "p50_capped": float(np.percentile(ms_capped, 50)), "p50_full": float(np.percentile(ms_full, 50)),
                                "n": len(rq)}
    out["segments"] = len(r.manifest.segments)
    out["chunks"] = int(r.manifest.counts.get("chunks", 0))
    if group:
        out["cgroup_limit"] = int((Path(group) / "memory.limit_in_bytes").read_text())
        out["cgroup_peak"] = int((Path(group) / "memory.max_usage_in_bytes").read_text())
        out["cgroup_failcnt"] = int((Path(group) / "memory.failcnt").read_text())
    r.close()
    # one-document writes
    from semsearch.documents import Document, delete_documents, upsert_documents

    doc = Document("bench-doc", " ".join(corpus.texts(10 ** 9, 4)[0][:3]))
    # the first write of the process (its imports and first opening of the index), then the next
    # three: what a long-running writer (a server, `watch`) pays for each
    for rnd in range(4):
        for name, fn in (("upsert", lambda: upsert_documents(index, [doc], enc)), ("delete", lambda: delete_documents(index, ["bench-doc"]))):
            os.sync()
            w0, t0 = written(), time.perf_counter()
            fn()
            got = {"ms": (time.perf_counter() - t0) * 1000, "bytes": written() - w0}
            if rnd == 0:
                out[name] = got
            else:
                out.setdefault(f"{name}_next", []).append(got)
    return out


# ---- the parent ------------------------------------------------------------------------------------
def folder_bytes(folder: Path) -> int:
    """Bytes of the files under folder (0 where it is not there yet); files that go while it is
    walked are skipped."""
    total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


class DiskPeak:
    """The largest size a folder reached, polled every `every` seconds on a thread (a build's
    final merge writes its output while the segments it merges are still there)."""

    def __init__(self, folder: Path, every: float = 2.0):
        import threading

        self.folder, self.every, self.peak = folder, every, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, folder_bytes(self.folder))
            self._stop.wait(self.every)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, folder_bytes(self.folder))


def run_child_peak(step: str, args: list[str], pythonpath: str | None = None, cgroup: Path | None = None) -> dict:
    """run_child, with the child's peak RSS (ru_maxrss from wait4)."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    if cgroup is not None:
        env["BENCH_CGROUP"] = str(cgroup)
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", step, *args],
                            stdout=subprocess.PIPE, env=env, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"child {step} failed ({os.waitstatus_to_exitcode(status)})")
    got = json.loads(out.strip().splitlines()[-1])
    got["peak_rss"] = usage.ru_maxrss * 1024
    return got


def worktree(ref: str) -> str:
    path = Path(f"/tmp/semsearch-baseline-{ref}")
    if not path.exists():
        subprocess.run(["git", "-C", str(HERE.parent), "worktree", "add", "--detach", str(path), ref], check=True,
                       capture_output=True)
    return str(path)


def report(label: str, n: int, b: dict, m: dict) -> None:
    gb = lambda x: x / 1e9  # noqa: E731
    print(f"\n== {label}: {n:,} chunks ({m['segments']} segment(s), {m['index']['type']}, {gb(m['disk_bytes']):.2f} GB on disk, "
          f"{m['disk_bytes'] / n:.0f} B a chunk)")
    if b is not None:
        print(f"build        {b['seconds']:.0f} s (encoding {b['encode_seconds']:.0f} s, {n / b['seconds']:,.0f} chunks/s), "
              f"peak RSS {gb(b['peak_rss']):.2f} GB"
              + (f", disk at its peak {gb(b['disk_peak']):.2f} GB ({b['disk_peak'] / max(m['disk_bytes'], 1):.2f}x the index, "
                 f"polled every 2 s)" if b.get("disk_peak") else ""))
    print(f"load         {m['load_seconds']:.2f} s; RSS {gb(m['rss_before_load']):.2f} -> {gb(m['rss_after_load']):.2f} GB after load, "
          f"{gb(m['rss_after_queries']):.2f} GB after the queries ({(m['rss_after_queries'] - m['rss_before_load']) / n:.0f} B a chunk); "
          f"first hybrid query {m['first_query_ms']:.0f} ms")
    if "anon_after_queries" in m:
        print(f"             of which after the queries: heap (RssAnon) {gb(m['anon_after_queries']):.2f} GB "
              f"(+{(m['anon_after_queries'] - m['anon_before_load']) / n:.0f} B a chunk), mapped file pages (RssFile) "
              f"{gb(m['file_after_queries']):.2f} GB"
              + (" (" + ", ".join(f"{k} {gb(v):.2f}" for k, v in sorted(m["file_pages_by_file"].items())) + ")"
                 if m.get("file_pages_by_file") else ""))
    for mode in ("dense", "lexical", "hybrid"):
        print(f"{mode:<12} p50 {m[mode]['p50']:7.2f} ms  p99 {m[mode]['p99']:7.2f} ms  (n={m[mode]['n']})")
    print(f"recall@10    {m['recall@10']:.3f} (dense, 200 queries, against exact search; index {m['index']})")
    if "hybrid_capped" in m:
        h = m["hybrid_capped"]
        print(f"hybrid cap   top-10 agreement {h['agreement@10']:.3f} with every k_factor x 100 candidate re-ranked; p50 "
              f"{h['p50_capped']:.2f} ms capped vs {h['p50_full']:.2f} ms uncapped ({h['n']} new queries each, in turns)")
    for w in ("upsert", "delete"):
        nxt = m.get(f"{w}_next") or []
        more = (f"; the next {len(nxt)}: " + ", ".join(f"{x['ms']:.0f} ms" for x in nxt)
                + f", up to {max(x['bytes'] for x in nxt) / 1e6:.2f} MB written") if nxt else ""
        print(f"{w:<12} {m[w]['ms']:.0f} ms, {m[w]['bytes'] / 1e6:.2f} MB written (the first of the process){more}")
    if "cgroup_limit" in m:
        print(f"memory cgroup: limit {gb(m['cgroup_limit']):.2f} GB (page cache included), peak {gb(m['cgroup_peak']):.2f} GB, "
              f"{m['cgroup_failcnt']} times at the limit (pages taken back)")


def _bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000000")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--keep", type=Path, default=Path("/tmp/semsearch-scale"))
    ap.add_argument("--baseline-ref")
    ap.add_argument("--baseline-sizes", default="1000000")
    ap.add_argument("--measure-only", type=Path)
    ap.add_argument("--retune", type=float, help="with --measure-only: `semsearch tune --target-recall R` first")
    ap.add_argument("--vector-storage", choices=["fp32", "fp16"], help="every build (the baseline's too) stores vectors so (default fp32)")
    ap.add_argument("--memory-limit", help="measure inside a memory cgroup of this size (page cache included), e.g. 1G")
    ap.add_argument("--child")
    ap.add_argument("rest", nargs="*")
    a = ap.parse_args()
    if a.child == "build":
        print(json.dumps(child_build(Path(a.rest[0]), Path(a.rest[1]), a.rest[2] if len(a.rest) > 2 else None)))
        return
    if a.child == "measure":
        print(json.dumps(child_measure(Path(a.rest[0]), int(a.rest[1]))))
        return
    cgroup = memory_cgroup(_bytes(a.memory_limit)) if a.memory_limit else None
    if a.measure_only:  # measure a built index again (e.g. on a quiet machine): --measure-only DIR
        print(f"CPU flags: {cpu_flags()}; {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}", flush=True)
        if a.retune:
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "semsearch.cli", "tune", "--index", str(a.measure_only),
                            "--target-recall", str(a.retune)], check=True, cwd=HERE.parent.parent)
            print(f"semsearch tune: {time.perf_counter() - t:.1f} s (whole command); load average {os.getloadavg()[0]:.2f}", flush=True)
        m = run_child_peak("measure", [str(a.measure_only), str(a.queries)], cgroup=cgroup)
        n = m.get("chunks") or 0
        report(f"measured again: {a.measure_only}", n or 1, None, m)
        return
    print(f"CPU flags: {cpu_flags()}; {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}", flush=True)
    runs = [("current", None, int(s)) for s in a.sizes.split(",") if s]  # --sizes "": the baseline alone
    if a.baseline_ref:
        runs += [(f"previous ({a.baseline_ref})", worktree(a.baseline_ref), int(s)) for s in a.baseline_sizes.split(",") if s]
    results = {}
    for label, path, n in runs:
        corpus = a.keep / f"corpus-{n}"
        write_corpus(corpus, n)
        index = a.keep / f"index-{n}-{'current' if path is None else 'previous'}"
        shutil.rmtree(index, ignore_errors=True)
        print(f"{label}: building {n:,} chunks ...", flush=True)
        disk = DiskPeak(index)
        b = run_child_peak("build", [str(corpus), str(index)] + ([a.vector_storage] if a.vector_storage else []), path)
        b["disk_peak"] = disk.stop()
        m = run_child_peak("measure", [str(index), str(a.queries)], path, cgroup)
        report(label, n, b, m)
        results[f"{label} {n}"] = {"build": b, "measure": m}
        print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
    out = a.keep / "results.json"
    old = json.loads(out.read_text()) if out.exists() else {}
    out.write_text(json.dumps({**old, **results}, indent=1))


if __name__ == "__main__":
    main()
