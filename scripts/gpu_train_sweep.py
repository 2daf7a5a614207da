"""A grid of `semsearch train` experiments (scripts/train_scifact.py) under a time budget.

    python scripts/gpu_train_sweep.py --out OUT [--budget 480] [--parallel 5] [--only GLOB,...]
    python scripts/gpu_train_sweep.py --list                 # the grid, in priority order

scripts/gpu_train_sweep.sh runs it on a GPU machine after unpacking the payload. Each dataset is
indexed once (the datasets in parallel); each run then gets its own work folder with a copy of that
index (`--reuse-index`), so runs go in parallel without touching each other's head, cache or
sampled pairs. Runs start in the order of GRID, at most --parallel at a time; a run is not started
when fewer than --min-left seconds of the budget are left, and a run still going when the budget
ends is stopped. Every run passes --force to `semsearch train`, so each head has a test figure,
and train_scifact.py keeps the gate's verdict (head.json's improved_on_dev and dev gain).

Writes to OUT (at most 3 files): results.jsonl (a line per run, as each ends; then one per run not
started), summary.md (one table, rewritten as runs end) and log.txt (everything, a run's output in
one piece when it ends).
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Run:
    name: str
    data: str  # a dataset folder name under --data-root
    script: list[str]  # train_scifact.py options (--pairs-sample N --sample-seed S, --no-labels)
    train: list[str]  # `semsearch train` options (after --)


def grid() -> list[Run]:
    """The experiments, in priority order: what comes first runs first."""
    runs: list[Run] = []

    def add(name: str, data: str, train: str = "", script: str = "") -> None:
        runs.append(Run(name, data, shlex.split(script), shlex.split(train)))

    # The grid of the sweep at 0666d5f (hybrid-mode default, NFCorpus alternatives) is in that
    # commit; this one measures the dense default and the gate's best-of-checks p value.
    # 1. The default on both whole train splits, three seeds each
    for data, short in (("scifact", "sf"), ("nfcorpus", "nf")):
        for s in (0, 1, 2):
            add(f"{short}-default-s{s}", data, f"--seed {s}")
    # 2. What most users have: 200, 1,000 and 50 labelled pairs (three draws each), then no labels
    for n in (200, 1000, 50):
        for data, short in (("scifact", "sf"), ("nfcorpus", "nf")):
            for d in (0, 1, 2):
                add(f"{short}-pairs{n}-d{d}", data, "--seed 0", f"--pairs-sample {n} --sample-seed {d}")
    add("sf-nolabels-s0", "scifact", "--seed 0", "--no-labels")
    add("nf-nolabels-s0", "nfcorpus", "--seed 0", "--no-labels")
    # 3. The earlier default (hybrid mode), the best alternative on SciFact
    add("sf-hybrid-s0", "scifact", "--mode hybrid --seed 0")
    add("nf-hybrid-s0", "nfcorpus", "--mode hybrid --seed 0")
    return runs


def tiny_grid() -> list[Run]:
    """--tiny: a CPU check of this script (one short run; the second should not fit the budget)."""
    return [Run("sf-pairs50-d0-tiny", "scifact", ["--pairs-sample", "50", "--sample-seed", "0"], ["--seed", "0", "--epochs", "1"]),
            Run("sf-default-s0-tiny", "scifact", [], ["--seed", "0", "--epochs", "1"])]


# ---- running ---------------------------------------------------------------------------------------
@dataclass
class Job:
    run: Run
    status: str = "not run"  # not run | running | ok | failed (exit N) | stopped (budget)
    rc: int | None = None
    seconds: float | None = None
    proc: subprocess.Popen | None = None
    started: float = 0.0
    log: Path | None = None
    result: dict = field(default_factory=dict)


class Sweep:
    def __init__(self, args: argparse.Namespace, runs: list[Run]):
        self.a = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.jobs = [Job(r) for r in runs]
        self.t0 = time.monotonic()
        self.log_path = self.out / "log.txt"
        self.results = self.out / "results.jsonl"
        self.results.write_text("")
        self.threads = max(1, (os.cpu_count() or 1) // args.parallel)
        self.env = dict(os.environ, OMP_NUM_THREADS=str(self.threads), MKL_NUM_THREADS=str(self.threads),
                        OPENBLAS_NUM_THREADS=str(self.threads), TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1",
                        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        self.indexes: dict[str, str] = {}  # dataset -> "building" | "ok" | "failed (...)"
        self.env_line = ""

    def left(self) -> float:
        return self.a.budget - (time.monotonic() - self.t0)

    def say(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f} s] {msg}"
        print(line, flush=True)
        with self.log_path.open("a") as f:
            f.write(line + "\n")

    def append_log(self, title: str, path: Path) -> None:
        with self.log_path.open("a") as f:
            f.write(f"\n===== {title} =====\n")
            f.write(path.read_text(errors="replace") if path.exists() else "(no output)\n")
            f.write(f"===== end of {title} =====\n\n")

    def spawn(self, cmd: list[str], log: Path) -> subprocess.Popen:
        with log.open("w") as f:
            f.write("$ " + shlex.join(cmd) + "\n")
            f.flush()
            return subprocess.Popen(cmd, cwd=REPO, env=self.env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)

    @staticmethod
    def stop(procs: list[subprocess.Popen]) -> None:
        """Stop processes and their children: SIGTERM to all, SIGKILL to what is left after 5 s."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in procs:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, sig)
                    except ProcessLookupError:
                        pass
            end = time.monotonic() + 5
            while time.monotonic() < end and any(p.poll() is None for p in procs):
                time.sleep(0.2)

    # -- environment and the base indexes
    def describe_env(self) -> None:
        code = ("import torch, sys; from semsearch.store.faiss_info import faiss_build, describe; "
                "g = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device'; "
                "print(f'python {sys.version.split()[0]}, torch {torch.__version__}, {g}, faiss: {describe(faiss_build())}')")
        r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=self.env, capture_output=True, text=True)
        self.env_line = (r.stdout.strip() or r.stderr.strip()[-300:]).replace("\n", " ")
        self.say(f"environment: {self.env_line}; {os.cpu_count()} CPUs, {self.a.parallel} runs at a time, "
                 f"{self.threads} thread(s) each; budget {self.a.budget:.0f} s")

    def start_indexes(self) -> dict[str, tuple[subprocess.Popen, Path]]:
        procs = {}
        for data in dict.fromkeys(j.run.data for j in self.jobs):
            src = Path(self.a.data_root) / data
            base = self.work / f"base-{data}"
            if (base / "index" / "manifest.json").exists():  # --work of an earlier call: reuse
                self.indexes[data] = "ok"
                continue
            shutil.rmtree(base, ignore_errors=True)
            (base / "corpus").mkdir(parents=True)
            shutil.copy(src / "corpus.jsonl", base / "corpus" / "corpus.jsonl")
            cmd = [sys.executable, "-m", "semsearch.cli", "index", str(base / "corpus"), "--index", str(base / "index"),
                   "--text-column", "title,text", "--no-progress", "--precision", self.a.precision, "--device", "auto"]
            procs[data] = (self.spawn(cmd, self.work / f"index-{data}.log"), time.monotonic())
            self.indexes[data] = "building"
            self.say(f"indexing {data} ({sum(1 for _ in open(src / 'corpus.jsonl'))} documents)")
        return procs

    def poll_indexes(self, procs: dict) -> None:
        for data, (p, t) in list(procs.items()):
            if p.poll() is None:
                continue
            del procs[data]
            secs = time.monotonic() - t
            self.indexes[data] = "ok" if p.returncode == 0 else f"failed (exit {p.returncode})"
            self.say(f"index of {data}: {self.indexes[data]} in {secs:.1f} s")
            self.append_log(f"index {data}", self.work / f"index-{data}.log")

    # -- one run
    def start(self, j: Job) -> None:
        r = j.run
        wd = self.work / "runs" / r.name
        shutil.rmtree(wd, ignore_errors=True)
        wd.mkdir(parents=True)
        shutil.copytree(self.work / f"base-{r.data}" / "index", wd / "work" / "index")
        train = ["--force", "--device", "auto", *r.train]
        cmd = [sys.executable, "scripts/train_scifact.py", "--data", str(Path(self.a.data_root) / r.data),
               "--work", str(wd / "work"), "--out", str(wd / "result"), "--precision", self.a.precision,
               "--reuse-index", "--no-index-head", *r.script, "--", *train]
        j.log = wd / "log.txt"
        j.proc = self.spawn(cmd, j.log)
        j.started = time.monotonic()
        j.status = "running"
        self.say(f"start {r.name}: {r.data} {shlex.join(r.script + ['--'] + train)}")

    def finish(self, j: Job, stopped: bool = False) -> None:
        j.seconds = round(time.monotonic() - j.started, 1)
        j.rc = j.proc.returncode
        j.status = "stopped (budget)" if stopped else ("ok" if j.rc == 0 else f"failed (exit {j.rc})")
        res = self.work / "runs" / j.run.name / "result.json"
        if res.exists():
            try:
                j.result = json.loads(res.read_text())
            except ValueError:
                j.result = {}
        self.append_log(f"{j.run.name} ({j.status}, {j.seconds} s)", j.log)
        self.say(f"end {j.run.name}: {j.status} in {j.seconds} s; gate: {gate_cell(j)}")
        self.write_result(j)

    def write_result(self, j: Job) -> None:
        r = j.run
        head = j.result.get("head") or {}
        rec = {"run": r.name, "dataset": r.data, "script_options": r.script, "train_options": ["--force", "--device", "auto", *r.train],
               "status": j.status, "returncode": j.rc, "seconds": j.seconds, "gate": j.result.get("gate"),
               "rows": j.result.get("rows"), "data": j.result.get("data"), "step_seconds": j.result.get("seconds"),
               "head_metrics": head.get("metrics"), "hyperparameters": head.get("hyperparameters")}
        with self.results.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        self.write_summary()

    # -- the loop
    def run(self) -> None:
        self.say(f"{len(self.jobs)} run(s) in the grid: " + " ".join(j.run.name for j in self.jobs))
        procs = self.start_indexes()
        self.describe_env()
        pending = list(self.jobs)
        running: list[Job] = []
        while pending or running or procs:
            self.poll_indexes(procs)
            for j in list(running):
                if j.proc.poll() is not None:
                    running.remove(j)
                    self.finish(j)
            if self.left() <= 0:
                self.say(f"budget of {self.a.budget:.0f} s spent: stopping {len(running)} run(s)")
                self.stop([j.proc for j in running] + [p for p, _ in procs.values()])
                for j in running:
                    self.finish(j, stopped=True)
                running = []
                break
            while pending and len(running) < self.a.parallel:
                j = pending[0]
                state = self.indexes.get(j.run.data)
                if state != "ok" and state != "building":
                    j.status = f"not run (index {state})"
                    pending.pop(0)
                    continue
                if state == "building" or self.left() < self.a.min_left:
                    break
                pending.pop(0)
                self.start(j)
                running.append(j)
            if not running and not procs and pending and self.left() < self.a.min_left:
                break
            time.sleep(0.5)
        for j in self.jobs:
            if j.status.startswith("not run"):
                if j.status == "not run":
                    j.status = f"not run (budget: under {self.a.min_left:.0f} s left)"
                with self.results.open("a") as f:
                    f.write(json.dumps({"run": j.run.name, "dataset": j.run.data, "script_options": j.run.script,
                                        "train_options": ["--force", "--device", "auto", *j.run.train], "status": j.status}) + "\n")
        self.write_summary()
        done = sum(1 for j in self.jobs if j.status == "ok")
        self.say(f"done: {done} of {len(self.jobs)} run(s) ok, in {time.monotonic() - self.t0:.0f} s; "
                 f"results in {self.out}: {' '.join(sorted(p.name for p in self.out.iterdir()))}")

    def write_summary(self) -> None:
        lines = [f"# semsearch train sweep ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
                 f"{self.env_line}; {self.a.parallel} runs at a time; budget {self.a.budget:.0f} s; "
                 f"indexes: {', '.join(f'{k} {v}' for k, v in self.indexes.items())}", "",
                 "Test nDCG@10, base model -> trained query layers (every head saved with --force). "
                 "Gate: what `semsearch train` would have done without --force: saved (improved on dev), "
                 "within noise (dev gain > 0 but <= 1 standard error, or the best of its checks gains that much by luck in more than 5% of sign flips: p), or not improved. "
                 "unseen: test queries none of whose relevant documents is a positive of the training pairs "
                 "('-' where there is none, as on NFCorpus with all train pairs).", "",
                 "| run | data | options | s | status | gate | dev gain ± se (q), p | dense | hybrid | dense unseen | hybrid unseen |",
                 "| --- | --- | --- | ---: | --- | --- | --- | --- | --- | --- | --- |"]
        for j in self.jobs:
            opts = shlex.join(j.run.script + ["--"] + j.run.train) if j.run.script else shlex.join(j.run.train)
            g = (j.result.get("gate") or {})
            gain = g.get("dev_gain") or {}
            gcell = (f"{gain['gain']:+.2f} ± {gain['se']:.2f} ({int(gain['queries'])})"
                     + (f", p {gain['p']:.3g}" if "p" in gain else "")) if gain else "-"
            rows = j.result.get("rows") or []
            lines.append(f"| {j.run.name} | {j.run.data} | {opts} | {j.seconds if j.seconds is not None else '-'} | {j.status} "
                         f"| {gate_cell(j)} | {gcell} | {fig(rows, 'dense', 'ndcg@10')} | {fig(rows, 'hybrid', 'ndcg@10')} "
                         f"| {fig(rows, 'dense', 'unseen')} | {fig(rows, 'hybrid', 'unseen')} |")
        (self.out / "summary.md").write_text("\n".join(lines) + "\n")


def gate_cell(j: Job) -> str:
    g = j.result.get("gate")
    if not g:
        return "-"
    if not g.get("saved"):
        return f"no head (train exit {g.get('train_exit')})"
    if g.get("improved_on_dev"):
        return "saved (improved)"
    return "within noise" if g.get("within_noise") else "not improved"


def fig(rows: list[dict], mode: str, key: str) -> str:
    """'base -> trained' for a mode; key 'ndcg@10' (all test queries) or 'unseen' (with the query count)."""
    by = {r["queries"]: r for r in rows if r.get("mode") == mode}
    base, head = by.get("base"), by.get("query layers")
    if not base:
        return "-"
    col = key
    if key == "unseen":
        col = next((k for k in base if k.startswith("ndcg@10 unseen docs")), None)
        if col is None:
            return "-"
    b = base.get(col, "-")
    t = head.get(col, "-") if head else "(no head)"
    n = f" [{col.split('(')[-1].rstrip(')')}]" if key == "unseen" and b != "-" else ""
    return "-" if b == "-" else f"{b} -> {t}{n}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-wheels/sweep-out"))
    ap.add_argument("--work", default=None, help="where indexes and runs go (default: a new folder under /tmp)")
    ap.add_argument("--data-root", default=str(REPO.parent / "shared" / "data" / "beir"), help="holds scifact/ and nfcorpus/ (BEIR layout)")
    ap.add_argument("--budget", type=float, default=480, help="seconds for everything (indexes included)")
    ap.add_argument("--min-left", type=float, default=60, help="do not start a run with fewer seconds left")
    ap.add_argument("--parallel", type=int, default=5)
    ap.add_argument("--precision", default="auto", help="fp16 on a GPU; on a CPU use fp32 (auto would first export an int8 ONNX encoder)")
    ap.add_argument("--only", default="", help="comma-separated globs of run names (default: all)")
    ap.add_argument("--tiny", action="store_true", help="the CPU check grid (see tiny_grid)")
    ap.add_argument("--list", action="store_true", help="print the grid and exit")
    args = ap.parse_args()
    runs = tiny_grid() if args.tiny else grid()
    if args.only:
        pats = [p for p in args.only.split(",") if p]
        runs = [r for r in runs if any(fnmatch.fnmatch(r.name, p) for p in pats)]
    if args.list:
        for i, r in enumerate(runs, 1):
            print(f"{i:3d} {r.name:22s} {r.data:9s} {shlex.join(r.script + ['--', '--force', '--device', 'auto', *r.train])}")
        return
    if not runs:
        sys.exit("no run matches --only")
    args.work = args.work or __import__("tempfile").mkdtemp(prefix="semsearch-sweep-")
    Sweep(args, runs).run()


if __name__ == "__main__":
    main()
