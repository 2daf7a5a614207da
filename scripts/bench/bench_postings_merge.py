"""A final merge's posting side on its own: segments' posting files merged into one, timed.

    python scripts/bench/bench_postings_merge.py --parts DIR [--take 8] [--rounds 2] [--baseline-ref REF]

DIR holds segments' posting files (lexical.<s>.bin: a long build's published segments, such as
bench_scale.py's 250k-chunk ones; hard-link them elsewhere while the build runs, its merge
removes them). The first --take, in id order, are merged with `lexical.write_merged` as a build's
final merge does (no deletion), by the current code and by --baseline-ref's (a git worktree),
each in a child process, in turns, --rounds times. Printed: seconds, postings merged a second,
the child's peak RSS, the load average and the CPU's flags; the outputs are checked to be the
same bytes. Figures: docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_filters import cpu_flags  # noqa: E402
from bench_scale import worktree  # noqa: E402


def child(paths: list[str], out: str, sets: list[str]) -> dict:
    from semsearch.store import lexical

    import numpy as np

    for kv in sets:  # --set NAME=VALUE: a constant of store/lexical/writing.py, for a trial
        name, value = kv.split("=")
        setattr(lexical.writing, name, int(value))

    parts = [(lexical.open_file(p), np.zeros(0, np.int64)) for p in paths]
    parts.sort(key=lambda pd: int(pd[0].ids[0]))
    nnz = sum(int(p.indptr[-1]) for p, _ in parts)
    t = time.perf_counter()
    lexical.write_merged(out, parts)
    secs = time.perf_counter() - t
    h = hashlib.sha256()
    with open(out, "rb") as fh:
        while b := fh.read(1 << 24):
            h.update(b)
    return {"seconds": secs, "postings": nnz, "sha256": h.hexdigest(),
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}


def run(label: str, root: Path, paths: list[str], out: Path, sets: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(root))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(paths), str(out), *[f"--set={s}" for s in sets]]
    got = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd=root).stdout.splitlines()[-1])
    out.unlink(missing_ok=True)
    got["label"] = label
    print(f"{label:>10}: {got['seconds']:7.1f} s, {got['postings'] / got['seconds'] / 1e6:5.2f}M postings/s, "
          f"peak RSS {got['peak_rss_gb']:.2f} GB, load {os.getloadavg()[0]:.2f}", flush=True)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", type=Path)
    ap.add_argument("--take", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--baseline-ref")
    ap.add_argument("--set", action="append", default=[], help="NAME=VALUE: a constant of lexical/writing.py (current code only)")
    ap.add_argument("--child", nargs=2)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(json.loads(a.child[0]), a.child[1], a.set)))
        return
    files = sorted(a.parts.glob("lexical.*.bin"), key=lambda p: int(p.name.split(".")[1]))[: a.take]
    print(f"CPU flags: {cpu_flags()}; {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}")
    print(f"{len(files)} posting files, {sum(p.stat().st_size for p in files) / 1e9:.2f} GB")
    sides = [("current", Path(__file__).resolve().parents[2])]
    if a.baseline_ref:
        sides.append((a.baseline_ref, worktree(a.baseline_ref)))
    with tempfile.TemporaryDirectory(dir=a.parts) as tmp:
        got: dict[str, list[dict]] = {}
        for _ in range(a.rounds):
            for label, root in sides:
                sets = a.set if label == "current" else []
                got.setdefault(label, []).append(run(label, root, [str(p) for p in files], Path(tmp) / "merged.bin", sets))
    digests = {g["sha256"] for runs in got.values() for g in runs}
    print(f"outputs: {'the same bytes' if len(digests) == 1 else 'DIFFERENT'}")
    for label, runs in got.items():
        best = min(r["seconds"] for r in runs)
        print(f"{label:>10}: best {best:.1f} s ({runs[0]['postings'] / best / 1e6:.2f}M postings/s)")


if __name__ == "__main__":
    main()
