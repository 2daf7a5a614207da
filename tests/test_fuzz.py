"""Fuzz the index folder and the corpus: the only outcomes allowed are correct results or a clear
semsearch error (a SemsearchError, which the CLI prints as one line: never a traceback), with
nothing written outside the index folder and the previous index intact.

Seeded and repeatable: SEMSEARCH_FUZZ_SEED picks another seed, SEMSEARCH_FUZZ_SCALE multiplies the
number of cases. Each test prints its tally of outcomes. FakeEncoder, real FAISS and SQLite.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from click.testing import CliRunner

from semsearch.cli import main
from semsearch.corpus.readers import ReadOptions
from semsearch.errors import SemsearchError
from semsearch.indexing import index_corpus
from semsearch.search import Retriever
from semsearch.store import Manifest
from semsearch.store.folder import verify

from conftest import REPO, FakeEncoder

SEED = int(os.environ.get("SEMSEARCH_FUZZ_SEED", "0"))
SCALE = float(os.environ.get("SEMSEARCH_FUZZ_SCALE", "1"))
QUERIES = ["credit score loan", "lentil soup onion", "comet meteor", "tomato garden water", "password reset"]


def n_cases(n: int) -> int:
    return max(1, int(n * SCALE))


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".lock"}


def answers(folder: Path) -> list[list[tuple]]:
    r = Retriever.load(folder, encoder=FakeEncoder())
    try:
        return [[(h.path, h.row, h.start, h.end, h.text, round(h.score, 5)) for h in hits]
                for hits in r.search_batch(QUERIES, k=8)]
    finally:
        r.close()


def report(name: str, tally: Counter, total: int) -> None:
    line = f"fuzz {name}: {total} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.items()))
    print("\n" + line)
    out = os.environ.get("SEMSEARCH_FUZZ_REPORT")
    if out:
        with open(out, "a") as fh:
            fh.write(line + "\n")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    src = root / "corpus"
    src.mkdir()
    (src / "bank.txt").write_text("The bank approved the loan after checking the credit score.\nMortgage rates fell.\n")
    (src / "cook.md").write_text("# Soup\nSimmer lentils with onion and cumin for twenty minutes.\n")
    (src / "space.txt").write_text("Meteor showers happen when Earth crosses a comet's debris trail.\n" * 20)
    (src / "faq.csv").write_text("id,question\n1,How do I reset my online banking password?\n2,What is the ATM limit?\n")
    (src / "garden.jsonl").write_text('{"text": "Tomatoes need sun and steady water.", "tag": "garden"}\n{"text": "Prune roses in spring."}\n')
    folder = root / "index"
    index_corpus(src, folder, FakeEncoder())
    return src, folder, answers(folder), snapshot(folder)


# ---- mutations ----------------------------------------------------------------------------------
def mutate_bytes(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    b = bytearray(data)
    op = rng.choice(["flip", "flip", "truncate", "overwrite", "zero", "append", "empty", "swap"])
    if not b and op not in ("append", "empty"):
        op = "append"
    if op == "flip":
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif op == "truncate":
        b = b[: rng.randrange(len(b))]
    elif op in ("overwrite", "zero"):
        a = rng.randrange(len(b))
        n = rng.choice([1, 4, 16, 256, 4096])
        b[a : a + n] = bytes(rng.randrange(256) if op == "overwrite" else 0 for _ in range(min(n, len(b) - a)))
    elif op == "append":
        b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 300)))
    elif op == "empty":
        b = bytearray()
    else:  # two blocks change places
        n = max(1, len(b) // 8)
        i, j = sorted(rng.sample(range(0, max(1, len(b) - n)), 2)) if len(b) > 2 * n else (0, 0)
        b[i : i + n], b[j : j + n] = b[j : j + n], b[i : i + n]
    return op, bytes(b)


WEIRD = [None, -1, 0, 1, 2**63, -(2**63), 1e308, float("nan"), "", "x", "../../outside", "/abs/path", "docs.99.sqlite",
         "vectors.1.faiss", [], [1, 2], {}, {"a": 1}, True, False, 1.5]


def mutate_json(raw: dict, rng: random.Random) -> tuple[str, dict]:
    """Replace (or delete) a random field, at any depth, with a value of a random type."""
    raw = json.loads(json.dumps(raw))
    paths: list[list] = []

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                paths.append(path + [k])
                walk(v, path + [k])

    walk(raw, [])
    path = rng.choice(paths)
    parent = raw
    for k in path[:-1]:
        parent = parent[k]
    if rng.random() < 0.15:
        del parent[path[-1]]
        return "delete " + ".".join(map(str, path)), raw
    value = rng.choice(WEIRD)
    if isinstance(value, float) and value != value:
        value = "NaN"
    parent[path[-1]] = value
    return f"set {'.'.join(map(str, path))}={value!r}", raw


# ---- 1. damaged index files -------------------------------------------------------------------
def test_fuzz_index_files(tmp_path, base):
    src, folder, expected, _ = base
    rng = random.Random(SEED)
    m = Manifest.load(folder)
    targets = ["manifest.json", m.files["docs"], m.files["vectors"], "manifest.json (fields)"]
    tally: Counter = Counter()
    total = 0
    outside_before = {p for p in tmp_path.parent.rglob("*")}
    for target in targets:
        for case in range(n_cases(35)):
            total += 1
            d = tmp_path / "d"
            shutil.rmtree(d, ignore_errors=True)
            shutil.copytree(folder, d)
            if target == "manifest.json (fields)":
                what, raw = mutate_json(json.loads((d / "manifest.json").read_text()), rng)
                (d / "manifest.json").write_text(json.dumps(raw))
                name = "manifest.json"
            else:
                name = target
                what, data = mutate_bytes((d / name).read_bytes(), rng)
                if what == "empty" and rng.random() < 0.3:
                    (d / name).unlink()
                    what = "deleted"
                else:
                    (d / name).write_bytes(data)
            ctx = f"case {case} {target}: {what}"
            damaged = snapshot(d)
            # info and info --verify: a report, or a one-line error (never a traceback)
            for args in (["info"], ["info", "--verify"], ["info", "--json"]):
                res = CliRunner().invoke(main, args + ["--index", str(d)])
                assert res.exit_code == 0 or isinstance(res.exception, SystemExit), f"{ctx}: {args}: {res.exception!r}"
                tally[f"{' '.join(args)}: {'ok' if res.exit_code == 0 else 'error'}"] += 1
            # query: the same answers as before, or a clear error
            try:
                got = answers(d)
                assert got == expected, f"{ctx}: wrong results without an error"
                tally["query: correct"] += 1
            except SemsearchError as e:
                assert "\n" not in str(e), ctx
                tally["query: error"] += 1
            # update over it: a correct index, or a clear error that leaves the files as they were
            try:
                index_corpus(src, d, FakeEncoder())
                assert answers(d) == expected, f"{ctx}: an update over the damaged index gave other results"
                tally["update: correct"] += 1
            except SemsearchError:
                assert snapshot(d) == damaged, f"{ctx}: a failed update changed the index folder"
                tally["update: error"] += 1
            # --rebuild always recovers
            if rng.random() < 0.2:
                index_corpus(src, d, FakeEncoder(), rebuild=True)
                assert answers(d) == expected, ctx
                tally["rebuild: correct"] += 1
    outside_after = {p for p in tmp_path.parent.rglob("*") if not str(p).startswith(str(tmp_path / "d"))}
    assert outside_after <= outside_before | {tmp_path}, "files written outside the index folder"
    report("index files", tally, total)


# ---- 2. malformed corpus files -------------------------------------------------------------------
def _valid(ext: str, rng: random.Random) -> bytes:
    words = ["loan", "credit", "soup", "comet", "naïve", "日本", "a,b", '"q"', "x\ty", "—"]
    text = lambda n: " ".join(rng.choice(words) for _ in range(n))  # noqa: E731
    if ext in (".txt", ".md"):
        return (text(rng.randint(0, 80)) + "\n").encode()
    if ext in (".csv", ".tsv"):
        sep = "," if ext == ".csv" else "\t"
        rows = [sep.join(["id", "text", "tag"])] + [sep.join([str(i), '"' + text(5).replace('"', '""') + '"', "t"]) for i in range(rng.randint(0, 8))]
        return "\n".join(rows).encode()
    if ext == ".jsonl":
        return "\n".join(json.dumps({"text": text(6), "n": i}) for i in range(rng.randint(0, 8))).encode()
    if ext == ".json":
        return json.dumps([{"text": text(6), "meta": {"i": i}} for i in range(rng.randint(0, 8))]).encode()
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table({"text": [text(6) for _ in range(5)], "n": list(range(5))}), buf)
    return buf.getvalue()


def malformed(ext: str, rng: random.Random) -> tuple[str, bytes]:
    kind = rng.choice(["random", "mutated", "mutated", "truncated", "structure", "latin1", "nul"])
    data = _valid(ext, rng)
    if kind == "random":
        return kind, bytes(rng.randrange(256) for _ in range(rng.randint(0, 2000)))
    if kind == "mutated":
        return kind, mutate_bytes(data, rng)[1]
    if kind == "truncated":
        return kind, data[: rng.randrange(len(data) + 1)]
    if kind == "latin1":
        return kind, data + "café résumé".encode("latin-1")
    if kind == "nul":
        return kind, data[: len(data) // 2] + b"\0" + data[len(data) // 2 :]
    shapes = ['{"text": 5}', "[1, 2, 3]", '"just a string"', "null", '{"a": {"b": [{"text": null}]}}', "[" * 5000 + "]" * 5000,
              '{"text": "' + "x" * 10000 + '"}', "id,text\n1", 'text\n"unclosed', "\ufeff{}", '[{"text": "a"}, 7]', "1e999"]
    return kind, rng.choice(shapes).encode()


def test_fuzz_corpus_files(tmp_path, base):
    pytest.importorskip("pyarrow")
    src, folder, expected, snap = base
    rng = random.Random(SEED + 1)
    tally: Counter = Counter()
    exts = [".txt", ".md", ".csv", ".tsv", ".jsonl", ".json", ".parquet"]
    total = n_cases(70)
    for case in range(total):
        work = tmp_path / f"w{case}"
        corpus, d = work / "corpus", work / "index"
        shutil.copytree(src, corpus)
        shutil.copytree(folder, d)
        bad = {}
        for i in range(rng.randint(1, 3)):
            ext = rng.choice(exts)
            kind, data = malformed(ext, rng)
            name = rng.choice([f"bad{i}{ext}", "bank.txt" if ext == ".txt" else f"bad{i}{ext}"])
            (corpus / name).write_bytes(data)
            bad[name] = kind
        skip = rng.random() < 0.5
        ctx = f"case {case}: {bad} skip_errors={skip}"
        corpus_snap = snapshot(corpus)
        try:
            rep = index_corpus(corpus, d, FakeEncoder(), read=ReadOptions(skip_errors=skip))
            assert verify(d) == [], ctx  # what it published is whole
            m = Manifest.load(d)
            assert m.counts["files"] == rep.totals["files"] and m.counts["chunks"] == rep.totals["chunks"], ctx
            good = {"cook.md", "space.txt", "faq.csv", "garden.jsonl"} - set(bad)
            r = Retriever.load(d, encoder=FakeEncoder())
            paths = {Path(p).name for p in r.docs.files()}
            r.close()
            assert good <= paths, f"{ctx}: a good file was lost"
            tally["indexed" + (" (files skipped)" if rep.skipped_files else "")] += 1
        except SemsearchError as e:
            assert "\n" not in str(e), ctx
            assert snapshot(d) == snap, f"{ctx}: a failed run changed the index"
            assert answers(d) == expected, ctx
            tally["error, index intact"] += 1
        assert snapshot(corpus) == corpus_snap, f"{ctx}: the corpus was written to"
        assert {p.name for p in work.iterdir()} == {"corpus", "index"}, f"{ctx}: written outside the index folder"
        shutil.rmtree(work)
    report("corpus files", tally, total)


# ---- 3. damage the cheap checks cannot see ------------------------------------------------------
BLIND = """
import json, random, resource, shutil, sys
from collections import Counter
from pathlib import Path
sys.path.insert(0, {tests!r})
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # a crazy size field must not eat the machine
from conftest import FakeEncoder
from semsearch.errors import SemsearchError
from semsearch.indexing import VectorSettings, index_corpus
from semsearch.search import Retriever
from semsearch.store import Manifest, integrity
sys.path.insert(0, {here!r})
from test_fuzz import mutate_bytes
root, src, seed, n = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng, tally = random.Random(seed), Counter()
for kind in ("flat", "hnsw", "ivf"):
    base = root / kind
    index_corpus(src, base, FakeEncoder(), vectors=VectorSettings(index_type=kind))
    m = Manifest.load(base)
    for case in range(n):
        d = root / "d"
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(base, d)
        p = d / m.files[rng.choice(["vectors", "docs"])]
        what, data = mutate_bytes(p.read_bytes(), rng)
        p.write_bytes(data)
        raw = json.loads((d / "manifest.json").read_text())  # record the damage as if it were the data
        raw["segments"][0]["integrity"]["files"][p.name] = dict(size=len(data), fingerprint=integrity.fingerprint(p), sha256=integrity.sha256(p))
        (d / "manifest.json").write_text(json.dumps(raw))
        print(kind, case, p.name, what, flush=True)
        try:
            r = Retriever.load(d, encoder=FakeEncoder())
            r.search_batch(["credit score", "comet"], k=5)
            r.close()
            index_corpus(src, d, FakeEncoder())
            tally["no error"] += 1
        except SemsearchError:
            tally["clear error"] += 1
print("TALLY", json.dumps(tally))
"""


def test_fuzz_data_files_past_the_fingerprints(tmp_path, base):
    """Damage recorded in the manifest as if it were the data (as damage in the middle of a file
    too large for the load-time fingerprint would be): faiss and SQLite must still end in results or
    a SemsearchError, never another exception or a crash. Run in a child process under a memory cap."""
    src = base[0]
    script = tmp_path / "blind.py"
    script.write_text(BLIND.format(tests=str(REPO / "tests"), here=str(Path(__file__).parent)))
    n = n_cases(25)
    r = subprocess.run([sys.executable, str(script), str(tmp_path), str(src), str(SEED + 2), str(n)],
                       capture_output=True, text=True, timeout=600)
    last = r.stdout.strip().splitlines()[-1:] or [""]
    assert r.returncode == 0 and last[0].startswith("TALLY"), (
        f"exit {r.returncode} after: {r.stdout.strip().splitlines()[-1:]}\n{r.stderr[-3000:]}")
    tally = Counter(json.loads(last[0][6:]))
    assert sum(tally.values()) == 3 * n
    report("data files past the fingerprints (results are not checked)", tally, 3 * n)


def test_fuzz_mutators_do_change_the_bytes():
    rng = random.Random(0)
    data = bytes(range(256)) * 10
    changed = sum(mutate_bytes(data, rng)[1] != data for _ in range(200))
    assert changed >= 190
