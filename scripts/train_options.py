"""Measure the pooling head's options (`semsearch train --train-layers 0`) on SciFact's *train*
split only (dev = queries on held-out documents). The default trainer (query layers) is measured
by scripts/train_scifact.py.

    python scripts/train_options.py                 # every option, writes results/train_options.{md,json}
    python scripts/train_options.py --only full,diagonal --seeds 0,1

The passages' token states come from the SciFact index that
`scripts/train_scifact.py --precision fp32 -- --train-layers 0` builds (kept states); those of the train queries and the corpus titles / first sentences (the unlabelled
pseudo-queries) are computed once at fp32 and cached under results/expcache; each option then
trains on them. The test split is never read here: pick the default on these figures, then
report it once with scripts/train_scifact.py.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from semsearch.training.states import StateCache  # noqa: E402

OPTIONS = {
    # name: (TrainConfig overrides, pseudo-query source or None)
    "full": ({"projection": "full"}, None),
    "full-decay": ({"projection": "full", "weight_decay": 10.0}, None),
    "full-lr5e-4": ({"projection": "full", "lr": 5e-4}, None),
    "diagonal": ({"projection": "diagonal"}, None),
    "none": ({"projection": "none"}, None),
    "none-lr5e-4": ({"projection": "none", "lr": 5e-4}, None),
    "none+titles": ({"projection": "none"}, "titles"),
    "full+titles": ({"projection": "full"}, "titles"),
    "diagonal+titles": ({"projection": "diagonal"}, "titles"),
    "full+firsts": ({"projection": "full"}, "firsts"),
    "titles-only": ({"projection": "full"}, "titles-only"),
}


def corpus_pseudo_queries(corpus: Path) -> tuple[list[str], list[str]]:
    """(titles, first sentences) of every corpus record, in corpus order."""
    titles, firsts = [], []
    with open(corpus, encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            titles.append((r.get("title") or "").strip() or "untitled")
            firsts.append(first_sentence(r.get("text") or "") or "empty")
    return titles, firsts


def first_sentence(text: str) -> str:
    m = re.match(r"(.{20,}?[.!?])\s", text.strip() + " ")
    return m.group(1) if m else text.strip()[:200]


def build_caches(data_dir: Path, out: Path, index: Path, data, needed: set[str]) -> dict[str, StateCache]:
    """Token states of the train queries and the pseudo-queries (fp32, cached under `out`), and of
    the passages from `index` (built with --keep-states), as scripts/train_scifact.py builds it."""
    from semsearch.training.index_states import passage_states

    caches = {}
    titles, firsts = corpus_pseudo_queries(data_dir / "corpus.jsonl")
    enc = None
    for name, texts in (("queries", data.queries), ("titles", titles), ("firsts", firsts)):
        if name not in needed:
            continue
        c = StateCache.load(out / f"{name}-final", {"texts": len(texts)})
        if c is None:
            from semsearch.encoder import Encoder

            enc = enc or Encoder(precision="fp32")
            t = time.perf_counter()
            c = StateCache.build(enc, texts, progress=True)
            c.save(out / f"{name}-final", {"texts": len(texts)})
            print(f"encoded {len(texts)} {name} in {time.perf_counter() - t:.0f} s", flush=True)
        caches[name] = c
    if not (index / "manifest.json").exists():
        sys.exit(f"{index}: build it first: semsearch index CORPUS_DIR --index {index} --keep-states --text-column title,text --precision fp32")
    got = passage_states(index, data.passages, data.passage_ids, None)
    assert got.encoded == 0, got.encoded
    caches["passages"] = got.passages
    return caches


def partial_caches(prefix: str, data, cache: Path, data_dir: Path, needed: set[str]):
    """The first n corpus documents (those with states in PREFIX_states.f16) and the train queries
    all of whose relevant documents are among them."""
    from semsearch.training.data import PairData

    ids = json.loads(Path(prefix + "_ids.json").read_text())
    spans = np.load(prefix + "_spans.npy")
    mm = np.memmap(prefix + "_states.f16", dtype=np.float16, mode="r").reshape(-1, 384)
    n = len(ids)
    assert list(data.passage_ids[:n]) == ids
    keep = [q for q in sorted(data.positives) if data.positives[q] and max(data.positives[q]) < n]
    caches = {}
    for name in needed:
        c = StateCache.load(cache / f"{name}-final")
        caches[name] = c.subset(keep) if name == "queries" else c.subset(range(n))
    caches["passages"] = StateCache.from_spans([mm], spans)
    sub = PairData([data.queries[q] for q in keep], data.passages[:n], {i: set(data.positives[q]) for i, q in enumerate(keep)},
                   passage_ids=ids, checksum=data.checksum + f"/first{n}", source=data.source + f" (first {n} documents)")
    print(f"partial: {n} documents, {len(keep)} of {len(data.positives)} train queries", flush=True)
    return sub, caches


def concat(a: StateCache, b: StateCache) -> StateCache:
    spans_a = np.stack([a.part, a.start, a.length], 1)
    spans_b = np.stack([b.part + len(a.parts), b.start, b.length], 1)
    return StateCache.from_spans(a.parts + b.parts, np.concatenate([spans_a, spans_b]))


def run_option(name: str, seed: int, data, caches: dict[str, StateCache]) -> dict:
    from semsearch.training.data import PairData
    from semsearch.training.trainer import TrainConfig, train_head

    overrides, pseudo = OPTIONS[name]
    queries, qstates = list(data.queries), caches["queries"]
    positives = {q: set(p) for q, p in data.positives.items()}
    unlabelled: set[int] = set()
    if pseudo:
        src = pseudo.split("-")[0]
        n0 = len(queries)
        # Pseudo-query i -> corpus document i (the corpus order of data.passages).
        queries += [f"{src}:{i}" for i in range(len(data.passages))]
        positives.update({n0 + i: {i} for i in range(len(data.passages))})
        unlabelled = set(range(n0, n0 + len(data.passages)))
        qstates = concat(qstates, caches[src])
    d = PairData(queries, data.passages, positives, passage_ids=data.passage_ids, checksum=data.checksum,
                 source=data.source, unlabelled=unlabelled)
    if pseudo and pseudo.endswith("-only"):
        # No labels at all: every labelled query is dev; train only on the pseudo-queries.
        d.dev_queries = sorted(data.positives)
    cfg = TrainConfig(seed=seed, **overrides)
    t = time.perf_counter()
    res = train_head(d, None, cfg, passages=caches["passages"], queries=qstates, progress=False)
    return {"option": name, "seed": seed, "split": res.split.kind, "dev_q": res.n_dev, "unseen_q": len(res.split.unseen),
            "base_unseen": round(res.base.get("unseen", float("nan")), 2), "head_unseen": round(res.best.get("unseen", float("nan")), 2),
            "gain_unseen": round(res.best.get("unseen", 0) - res.base.get("unseen", 0), 2),
            "best_epoch": res.best_epoch, "epochs_run": len(res.history), "seconds": round(time.perf_counter() - t, 1),
            "history": res.history}


def test_report(name: str, data, caches: dict[str, StateCache], data_dir: Path, n_docs: int | None) -> str:
    """Once, after the option was chosen on dev: train it, then mean pooling vs the head on the
    SciFact *test* queries (those whose relevant documents are all among the corpus used)."""
    import torch

    from semsearch.encoder import Encoder
    from semsearch.encoder.pooling import mean_pool
    from semsearch.eval import exact_search, format_table, load_beir, read_qrels, to_run, trec_metrics
    from semsearch.training.data import PairData
    from semsearch.training.trainer import TrainConfig, train_head

    overrides, pseudo = OPTIONS[name]
    assert pseudo is None, "test_report runs labelled options"
    res = train_head(data, None, TrainConfig(**overrides), passages=caches["passages"], queries=caches["queries"], progress=False)
    test = load_beir(data_dir, "test")
    docs = set(data.passage_ids)
    qids = [q for q in test.query_ids if all(d in docs for d in test.qrels[q])]
    qt = dict(zip(test.query_ids, test.query_texts))
    enc = Encoder(precision="fp32")
    qs = StateCache.build(enc, [qt[q] for q in qids], progress=False)
    train_docs = {d for q in read_qrels(data_dir / "qrels" / "train.tsv").values() for d, r in q.items() if r > 0}
    qrels = {q: test.qrels[q] for q in qids}
    unseen = {q: r for q, r in qrels.items() if not any(d in train_docs for d in r)}
    rows = []
    for label, fn in (("mean", mean_pool), (f"head ({name})", res.head)):
        with torch.no_grad():
            sc, ix = exact_search(qs.pool_all(fn), caches["passages"].pool_all(fn), 100)
        run = to_run(qids, data.passage_ids, sc, ix)
        rows.append({"pooling": label, f"ndcg@10 ({len(qids)} q)": round(trec_metrics(qrels, run, [10])["ndcg@10"], 2),
                     f"ndcg@10 unseen-docs ({len(unseen)} q)": round(trec_metrics(unseen, run, [10])["ndcg@10"], 2)})
    return (f"SciFact test, corpus = {'first ' + str(n_docs) + ' documents' if n_docs else 'all documents'}; head {name} "
            f"(saved: {res.improved}; {res.verdict()})\n" + format_table(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "beir" / "scifact"))
    ap.add_argument("--cache", default=str(REPO / "results" / "expcache"))
    ap.add_argument("--index", default=str(REPO / "results" / "scifact_work" / "index"), help="the SciFact index with kept states")
    ap.add_argument("--out", default=str(REPO / "results" / "train_options"))
    ap.add_argument("--only", default=None, help="comma-separated option names")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--epochs", type=int, default=None, help="override every option's epochs")
    ap.add_argument("--test-report", default=None, help="OPTION: once the default is chosen, train it and report it on the test split")
    ap.add_argument("--partial", default=None,
                    help="PREFIX: use only the first corpus documents, with states from PREFIX_states.f16 / _spans.npy / _ids.json "
                         "(the first part of an interrupted --keep-states index, for a machine too busy to finish one)")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(2)
    from semsearch.training.data import from_beir

    data = from_beir(args.data, "train")  # the train split only: the test split is never read here
    names = args.only.split(",") if args.only else list(OPTIONS)
    needed = {"queries"} | {OPTIONS[n][1].split("-")[0] for n in names if OPTIONS[n][1]}
    if args.epochs:
        for n in names:
            OPTIONS[n][0]["epochs"] = args.epochs
    if args.partial:
        data, caches = partial_caches(args.partial, data, Path(args.cache), Path(args.data), needed)
    else:
        caches = build_caches(Path(args.data), Path(args.cache), Path(args.index), data, needed)
    if args.test_report:
        text = test_report(args.test_report, data, caches, Path(args.data), len(data.passages) if args.partial else None)
        print(text)
        Path(args.out + "_test.md").write_text(text + "\n")
        return
    rows = []
    for name in names:
        for seed in (int(s) for s in args.seeds.split(",")):
            r = run_option(name, seed, data, caches)
            rows.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "history"}), flush=True)
    from semsearch.eval import format_table

    table = format_table([{k: v for k, v in r.items() if k != "history"} for r in rows])
    means = {}
    for r in rows:
        means.setdefault(r["option"], []).append(r["gain_unseen"])
    summary = "\n".join(f"{k}: mean unseen-document dev gain {np.mean(v):+.2f} over {len(v)} seed(s)" for k, v in means.items())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    prev = json.loads(out.with_suffix(".json").read_text()) if out.with_suffix(".json").exists() else []
    out.with_suffix(".json").write_text(json.dumps(prev + rows, indent=2))
    out.with_suffix(".md").write_text(out.with_suffix(".md").read_text() + "\n" + table + "\n\n" + summary + "\n"
                                      if out.with_suffix(".md").exists() else table + "\n\n" + summary + "\n")
    print(table)
    print(summary)


if __name__ == "__main__":
    main()
