"""SciFact through an index built by many incremental runs against one built in one run.

    python scripts/eval_incremental.py [--runs 20] [--precision auto] [--keep DIR]

The corpus (corpus.jsonl) is split into `--runs` JSONL files. Index A is built by one
`semsearch index` run over all of them; index B by `--runs` runs, each after one more file
appears in its corpus folder (so B is written as a sequence of segments, merged as the merge
policy decides). Both are then evaluated as built (`semsearch eval --index`) in every mode
(dense, lexical, hybrid) on the test split, and the script prints both tables, the difference,
B's segment count, and whether every figure is equal.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "beir" / "scifact"))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--keep", type=Path, default=None, help="keep the corpora and indexes in this folder")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--evaluate-only", action="store_true", help="evaluate the indexes a --keep folder holds already")
    a = ap.parse_args()

    from semsearch.corpus.readers import ReadOptions
    from semsearch.indexing import encoder_for_index, index_corpus
    from semsearch.store import Manifest

    root = a.keep or Path(tempfile.mkdtemp(prefix="eval-incremental-"))
    root.mkdir(parents=True, exist_ok=True)
    if a.evaluate_only:
        return report(a, root, [len(Manifest.load(root / "incremental").segments)], None, None)
    lines = Path(a.data, "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    per = -(-len(lines) // a.runs)
    parts = [lines[i : i + per] for i in range(0, len(lines), per)]
    full, inc = root / "corpus-all", root / "corpus-inc"
    for d in (full, inc, root / "one-shot", root / "incremental"):
        shutil.rmtree(d, ignore_errors=True)
    full.mkdir()
    inc.mkdir()
    for j, part in enumerate(parts):
        (full / f"part{j:02d}.jsonl").write_text("\n".join(part) + "\n", encoding="utf-8")
    enc = encoder_for_index(None, precision=a.precision)
    read = ReadOptions(text_column="title,text")
    t = time.perf_counter()
    index_corpus(full, root / "one-shot", enc, read=read, progress=False)
    one_s = time.perf_counter() - t
    t = time.perf_counter()
    segs = []
    for j in range(len(parts)):
        shutil.copy(full / f"part{j:02d}.jsonl", inc / f"part{j:02d}.jsonl")
        rep = index_corpus(inc, root / "incremental", enc, read=read, progress=False)
        segs.append(len(Manifest.load(root / "incremental").segments))
        print(f"run {j + 1}: +{rep.chunks} chunks, {segs[-1]} segment(s)", flush=True)
    inc_s = time.perf_counter() - t
    report(a, root, segs, one_s, inc_s, enc.precision)


def report(a, root: Path, segs: list[int], one_s: float | None, inc_s: float | None, precision: str | None = None) -> None:
    from semsearch import api
    from semsearch.store import Manifest

    precision = precision or Manifest.load(root / "one-shot").precision
    parts = sorted((root / "corpus-all").glob("*.jsonl"))
    out = {}
    for name in ("one-shot", "incremental"):
        rep = api.evaluate(a.data, split="test", index=root / name, modes=["dense", "lexical", "hybrid"], device="cpu")
        out[name] = {r["search"]: r for r in rep["results"]}
    keys = ["ndcg@10", "recall@100"]
    took = f"; one run {one_s:.0f} s, {len(parts)} runs {inc_s:.0f} s" if one_s is not None else ""
    print(f"\nSciFact test, {precision} encoder, {len(parts)} files{took}; segments after each run: {segs}")
    print(f"{'search':<10}" + "".join(f"{'one-shot ' + k:>22}{'incremental ' + k:>24}" for k in keys))
    equal = True
    for mode in out["one-shot"]:
        a_, b_ = out["one-shot"][mode], out["incremental"][mode]
        print(f"{mode:<10}" + "".join(f"{a_.get(k, float('nan')):>22.2f}{b_.get(k, float('nan')):>24.2f}" for k in keys))
        equal &= all(a_.get(k) == b_.get(k) for k in a_ if k not in ("pooling", "search"))
    print("every figure equal:", equal)
    if a.json:
        a.json.write_text(json.dumps({"results": out, "segments": segs, "equal": equal, "precision": precision,
                                      "seconds": {"one_shot": one_s, "incremental": inc_s}}, indent=2))
    if a.keep is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
