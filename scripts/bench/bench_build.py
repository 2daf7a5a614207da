"""An index build's time with an encoder as fast as a GPU's, against a baseline commit, same run.

    python scripts/bench/bench_build.py [--chunks 100000] [--rate 4000] [--baseline-ref REF] [--rounds 2]

The corpus is bench_scale.py's (synthetic.py: ~200-word chunks of a Zipf vocabulary with topic
structure, in 50k-record JSONL files, kept under --keep). The encoder is synthetic.py's stand-in,
which, with --rate R, also sleeps so that each batch takes len(batch) / R seconds in all: an
encoder of R chunks/s that leaves the CPU to the rest, as a GPU does (--rate 0: the stand-in
alone, a few microseconds a chunk, holding the GIL). `--encoder model --device cuda` builds with
the real model on a GPU instead (--rate is then ignored; chunking by the model's tokenizer), and
`--cpus 0,1` pins each build to those cores, to hold a many-core GPU machine to the 2 cores the
figures are asked for. What is timed is `semsearch.index`'s own pipeline: reading, chunking,
encoding, term analysis, SQLite, vectors, the final IVF.

Each build runs in its own child process, the current code and --baseline-ref's (a git worktree
under /tmp) in turns, --rounds times; printed: wall seconds, the seconds spent in the encoder,
chunks/s, the child's CPU seconds, and the load average, with the CPU's flags. Figures:
docs/benchmarks.md, "Build: encoding beside the rest".
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_filters import cpu_flags  # noqa: E402
from bench_scale import worktree, write_corpus  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def child_build(corpus: Path, index: Path, rate: float, encoder: str = "stand-in", device: str = "auto",
                batch_tokens: int | None = None) -> dict:
    import logging

    import semsearch.indexing as indexing

    # the build's steps (segments published, the final merge's steps) with their time, on stderr
    logging.basicConfig(level=logging.INFO, format="  %(relativeCreated)9.0f ms  %(name)s: %(message)s")
    if encoder == "model":
        return _model_build(corpus, index, device, batch_tokens)
    from synthetic import Corpus, StandInEncoder

    class Paced(StandInEncoder):
        """The stand-in, taking len(texts) / rate seconds a batch, the rest asleep (GIL released)."""

        spent = 0.0  # seconds in encode, sleep included
        calls: list = []  # (start, end) of each call, on the log's clock (relativeCreated, s)

        def encode(self, texts, progress=None):
            t = time.perf_counter()
            at = time.time() - logging._startTime
            v = super().encode(texts, progress)
            if rate > 0:
                time.sleep(max(0.0, len(v) / rate - (time.perf_counter() - t)))
            self.spent += time.perf_counter() - t
            self.calls.append((at, time.time() - logging._startTime))
            return v

    enc = Paced(Corpus())
    t0 = time.perf_counter()
    rep = indexing.index_corpus(corpus, index, enc, progress=False)
    wall = time.perf_counter() - t0
    cpu = _cpu_seconds()
    _idle(sorted(enc.calls))
    return {"seconds": wall, "encode_seconds": enc.spent, "chunks": rep.chunks, "cpu_seconds": cpu}  # CPU: the reader process's too


def _cpu_seconds() -> float:
    """This process's CPU seconds and its children's (the reader process's)."""
    return sum(ru.ru_utime + ru.ru_stime for ru in (resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))


def _idle(calls: list) -> None:
    """Where the encoder waited for work (between its calls, from its first to its last), on
    stderr: the total by the log's 10-second windows, and the longest waits."""
    if len(calls) < 2:
        return
    gaps = [(b[0] - a[1], a[1]) for a, b in zip(calls, calls[1:]) if b[0] > a[1]]
    total = sum(g for g, _ in gaps)
    windows: dict[int, float] = {}
    for g, at in gaps:
        windows[int(at // 10) * 10] = windows.get(int(at // 10) * 10, 0.0) + g
    busy = ", ".join(f"{w}s: {v:.1f}" for w, v in sorted(windows.items()) if v >= 0.5)
    top = ", ".join(f"{g:.2f} s at {at:.1f} s" for g, at in sorted(gaps, reverse=True)[:8])
    print(f"  encoder idle {total:.1f} s between {calls[0][0]:.1f} and {calls[-1][1]:.1f} s; by 10-s window (>= 0.5 s): {busy}; "
          f"longest: {top}", file=sys.stderr, flush=True)


def _model_build(corpus: Path, index: Path, device: str, batch_tokens: int | None) -> dict:
    """The same build with the real model (the bundled all-MiniLM-L6-v2) on `device`, the seconds
    inside its encode calls (tokenizing included) counted apart."""
    import semsearch.indexing as indexing
    from semsearch.encoder import Encoder

    enc = Encoder(device=device, **({"batch_tokens": batch_tokens} if batch_tokens else {}))
    spent = [0.0]
    encode = enc.encode

    def timed(texts, progress=None):
        t = time.perf_counter()
        v = encode(texts, progress)
        spent[0] += time.perf_counter() - t
        return v

    enc.encode = timed  # what the build calls (indexing.py); no states or cache here
    chunking = indexing.resolve_chunking(None, enc, None, None)
    t0 = time.perf_counter()
    rep = indexing.index_corpus(corpus, index, enc, chunking, progress=False)
    wall = time.perf_counter() - t0
    cpu = _cpu_seconds()
    return {"seconds": wall, "encode_seconds": spent[0], "chunks": rep.chunks, "cpu_seconds": cpu,
            "device": enc.device, "precision": enc.precision, "batch_tokens": enc.batch_tokens}


def run_child(args: list[str], pythonpath: str | None, cpus: set[int] | None = None) -> dict:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else pythonpath
    if cpus:  # every thread pool in the child (torch, faiss, numpy) sizes itself to these cores
        env.update({v: str(len(cpus)) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")})
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", *args], env=env, check=True,
                         stdout=subprocess.PIPE, text=True, preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=4000.0, help="the emulated encoder's chunks/s (0: the stand-in alone)")
    ap.add_argument("--baseline-ref", help="a commit to build with too, in turns with the current code")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--keep", type=Path, default=Path("/tmp/semsearch-scale"))
    ap.add_argument("--encoder", choices=("stand-in", "model"), default="stand-in",
                    help="stand-in: synthetic.py's, paced by --rate; model: the bundled model on --device")
    ap.add_argument("--device", default="auto", help="--encoder model's device (auto: a GPU where there is one)")
    ap.add_argument("--cpus", help="pin each build to these cores, e.g. 0,1")
    ap.add_argument("--batch-tokens", type=int, help="--encoder model's tokens a batch (default: the Encoder's)")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("rest", nargs="*")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child_build(Path(a.rest[0]), Path(a.rest[1]), float(a.rest[2]), a.encoder, a.device, a.batch_tokens)))
        return
    cpus = {int(c) for c in a.cpus.split(",")} if a.cpus else None
    if a.encoder == "model":
        encoder = f"the bundled model on device {a.device}"
    else:
        encoder = f"the encoder at {a.rate:g} chunks/s" if a.rate else "the stand-in encoder alone"
    print(f"CPU flags: {cpu_flags()}; {os.cpu_count()} cores{f', builds pinned to cores {sorted(cpus)}' if cpus else ''}; "
          f"load average {os.getloadavg()[0]:.2f}; {a.chunks:,} records, {encoder}", flush=True)
    corpus = a.keep / f"corpus-{a.chunks}"
    write_corpus(corpus, a.chunks)
    codes = [("current", None)] + ([(f"baseline {a.baseline_ref}", worktree(a.baseline_ref))] if a.baseline_ref else [])
    got: dict[str, list[dict]] = {label: [] for label, _ in codes}
    for r in range(a.rounds):
        for label, path in codes:
            index = a.keep / f"build-{a.chunks}-{'current' if path is None else 'baseline'}"
            shutil.rmtree(index, ignore_errors=True)
            b = run_child(["--encoder", a.encoder, "--device", a.device, *(["--batch-tokens", str(a.batch_tokens)] if a.batch_tokens else []), str(corpus), str(index), str(a.rate)], path, cpus)
            b["load"] = os.getloadavg()[0]
            got[label].append(b)
            print(f"round {r + 1} {label:<24} {b['seconds']:7.1f} s wall, {b['encode_seconds']:6.1f} s in the encoder, "
                  f"{b['chunks'] / b['seconds']:6.0f} chunks/s ({b['chunks']:,}), {b['cpu_seconds']:7.1f} s CPU, load {b['load']:.2f}"
                  + (f", encoder on {b['device']} in {b['precision']}, {b['batch_tokens']} tokens a batch" if "device" in b else ""), flush=True)
            shutil.rmtree(index, ignore_errors=True)
    if a.baseline_ref:
        cur = sorted(x["seconds"] for x in got["current"])
        base = sorted(x["seconds"] for x in got[codes[1][0]])
        print(f"best of {a.rounds}: current {cur[0]:.1f} s, baseline {base[0]:.1f} s: {cur[0] / base[0]:.2f}x the baseline's time")


if __name__ == "__main__":
    main()
