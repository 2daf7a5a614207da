"""Peak memory indexing one large .txt file, and resuming after a kill -9.

    python scripts/bench/bench_bigfile.py                       # 50 MB file, real tokenizer, hashing vectors
    python scripts/bench/bench_bigfile.py --baseline-src OLD    # also the same pipeline from an older checkout
    python scripts/bench/bench_bigfile.py --model-mb 2          # + real model on a 2 MB slice, killed and resumed

Each measurement runs in a fresh child process and reports its peak RSS (ru_maxrss). The large
run chunks with the model's real tokenizer but embeds with a cheap hashing stand-in, so that it
measures reading, chunking, the docstore and FAISS (what grew with the file) in minutes, not the
encoder's hours on two cores. The model run measures the whole pipeline on a slice, kills it with
SIGKILL part-way, and reports how many chunks the next run took from the resume cache.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHILD = r"""
import hashlib, json, resource, sys, time
from pathlib import Path
import numpy as np
src, corpus, folder, mode = sys.argv[1:5]
sys.path.insert(0, src)
from semsearch.indexing import index_corpus

class TokenizerOnly:
    '''The bundled model's tokenizer for chunking; vectors from a hash of the words.'''
    name, fingerprint, backend, precision, pooling, head_info = "tok-only", "tok00001", "fake", "fp32", "mean", None
    def __init__(self):
        from tokenizers import Tokenizer
        from semsearch.encoder.models import resolve_model
        _, where = resolve_model(None)
        self.tok = Tokenizer.from_file(str(where / "tokenizer.json"))
        self.tok.no_truncation(); self.tok.no_padding()
        self.dim = self.out_dim = 384; self.max_length = 256
    def token_offsets(self, text):
        return self.tok.encode(text, add_special_tokens=False).offsets
    def encode(self, texts, progress=None):
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for w in t.split()[:64]:
                out[i, int.from_bytes(hashlib.blake2b(w.encode(), digest_size=4).digest(), "little") % self.dim] += 1
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)

if mode == "tokenizer":
    enc = TokenizerOnly()
else:
    from semsearch.encoder import Encoder
    enc = Encoder()
t = time.perf_counter()
rep = index_corpus(Path(corpus), Path(folder), enc, progress=False)
print(json.dumps({"seconds": round(time.perf_counter() - t, 1), "chunks": rep.chunks, "resumed": getattr(rep, "resumed", 0),
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))
"""


def make_text(path: Path, mb: float) -> None:
    """English-like text: the sample corpus and, where present, SciFact abstracts, cycled."""
    parts = []
    scifact = REPO.parent / "shared" / "data" / "beir" / "scifact" / "corpus.jsonl"
    if scifact.exists():
        with open(scifact, encoding="utf-8") as fh:
            for line in fh:
                rec = json.loads(line)
                parts.append(rec.get("title", "") + "\n" + rec.get("text", "") + "\n\n")
    for p in sorted((REPO / "data" / "sample").rglob("*")):
        if p.suffix in (".txt", ".md"):
            parts.append(p.read_text(encoding="utf-8") + "\n\n")
    target = int(mb * 1e6)
    with open(path, "w", encoding="utf-8") as out:
        n = i = 0
        while n < target:
            s = parts[i % len(parts)]
            out.write(s)
            n += len(s.encode())
            i += 1


def child(src: Path, corpus: Path, folder: Path, mode: str, kill_after: float | None = None) -> dict | None:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(src))
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(src), str(corpus), str(folder), mode],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if kill_after is not None:
        time.sleep(kill_after)
        p.send_signal(signal.SIGKILL)
        p.wait()
        return None
    out, err = p.communicate()
    if p.returncode != 0:
        return {"error": err.strip().splitlines()[-1:] if err else f"exit {p.returncode}"}
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=50)
    ap.add_argument("--baseline-src", type=Path, default=None, help="an older checkout's root, measured on --baseline-mb")
    ap.add_argument("--baseline-mb", type=float, default=5)
    ap.add_argument("--model-mb", type=float, default=0, help="also index a slice this large with the real model")
    ap.add_argument("--kill-after", type=float, default=40, help="seconds before the model run is killed")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        results = {}
        small = tmp / "small" / "doc.txt"
        small.parent.mkdir()
        make_text(small, a.baseline_mb)
        if a.baseline_src is not None:  # interleaved: old, new, on the same small file
            results[f"baseline {a.baseline_mb:g} MB"] = child(a.baseline_src, small.parent, tmp / "i0", "tokenizer")
            results[f"semsearch {a.baseline_mb:g} MB"] = child(REPO, small.parent, tmp / "i1", "tokenizer")
        big = tmp / "big" / "doc.txt"
        big.parent.mkdir()
        make_text(big, a.mb)
        results[f"semsearch {a.mb:g} MB"] = child(REPO, big.parent, tmp / "i2", "tokenizer")
        if a.model_mb:
            sl = tmp / "slice" / "doc.txt"
            sl.parent.mkdir()
            make_text(sl, a.model_mb)
            child(REPO, sl.parent, tmp / "i3", "model", kill_after=a.kill_after)
            results[f"real model {a.model_mb:g} MB, after kill -9 at {a.kill_after:g} s"] = child(REPO, sl.parent, tmp / "i3", "model")
        for k, v in results.items():
            print(f"{k}: {json.dumps(v)}")


if __name__ == "__main__":
    main()
