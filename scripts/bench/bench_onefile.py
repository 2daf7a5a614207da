"""One large text file against the same text as many small files: indexing time and tokens/s.

    python scripts/bench/bench_onefile.py [--docs 400] [--rounds 2] [--precision auto]

The first N SciFact documents (title + text) are written as N .txt files, and joined (blank lines
between) as one .txt file; each corpus is indexed anew with the real model, in alternation, each
run in a child process. Tokens/s counts the tokens the encoder ran over (each chunk's tokens with
[CLS] and [SEP], read back from the index): one file is cut into full windows with overlap, so
it encodes more tokens than the documents hold, at a longer (costlier) length per chunk.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data" / "beir" / "scifact"


def tokens_in(folder: Path) -> tuple[int, int]:
    """(chunks, tokens the encoder ran over) of an index."""
    from semsearch.encoder.encoder import Encoder
    from semsearch.store import open_index

    _, _, docs = open_index(folder)
    texts = [r[0] for r in docs.db.execute("SELECT text FROM chunks")]
    enc = Encoder(device="cpu", precision="fp32")
    return len(texts), sum(len(ids) for ids in enc.tokenize(texts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--data", type=Path, default=DATA)
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = Path(tempfile.mkdtemp(prefix="bench-onefile-"))
    many, one = root / "many", root / "one"
    many.mkdir()
    one.mkdir()
    texts = []
    with open(a.data / "corpus.jsonl") as fh:
        for line in fh:
            d = json.loads(line)
            texts.append(f"{d['title']}\n\n{d['text']}")
            if len(texts) == a.docs:
                break
    for i, t in enumerate(texts):
        (many / f"doc{i:04d}.txt").write_text(t + "\n")
    (one / "all.txt").write_text("\n\n".join(texts) + "\n")
    print(f"{len(texts)} documents, {sum(len(t) for t in texts) / 1e6:.2f} MB of text; load {open('/proc/loadavg').read().split()[:3]}")
    runs: dict[str, list[float]] = {"many files": [], "one file": []}
    for r in range(a.rounds):
        for name, corpus in (("many files", many), ("one file", one)):
            idx = root / f"idx-{name.replace(' ', '-')}"
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "semsearch.cli", "index", str(corpus), "--index", str(idx), "--rebuild",
                            "--no-progress", "--precision", a.precision], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
            runs[name].append(time.perf_counter() - t)
    print(f"| corpus | chunks | tokens encoded | index s (median of {a.rounds}) | tokens/s |\n|---|---|---|---|---|")
    for name in runs:
        chunks, toks = tokens_in(root / f"idx-{name.replace(' ', '-')}")
        med = statistics.median(runs[name])
        print(f"| {name} | {chunks} | {toks:,} | {med:.1f} ({', '.join(f'{x:.1f}' for x in runs[name])}) | {toks / med:,.0f} |")


if __name__ == "__main__":
    main()
