"""Levers for hybrid search besides the trained query layers, measured on SciFact (docs/training.md).

Each lever is a way the training data could move the *hybrid* ranking on documents the labels
never covered. Every one is fitted on the train split (labelled queries, and each document's title
as an unlabelled query where it says so) and judged first on the dev queries `semsearch train`
holds out with their documents; test is read once per row, overall and on the 104
unseen-document queries (relevant documents never a train-split positive).

    python scripts/train_scifact.py --reuse-index                 # the int8 index and the default head
    python scripts/train_levers.py --head results/scifact_work/head

Levers (`--levers`, comma-separated; default all):
- fusion:  other score normalisations (z-score, divide by the maximum), other alphas, reciprocal
           rank fusion; chosen on all train queries (a few global parameters cannot memorise documents)
- prf:     dense pseudo-relevance feedback: the query vector plus beta x the mean of the fused
           top k documents' vectors, searched and fused again (Rocchio)
- terms:   learned BM25 query-term weights: w_t = 2 sigmoid(linear(features of term t)), features the
           base model's last-layer states of the term's word pieces (mean) and its IDF and position,
           trained with a listwise loss on the fused score (w = 1 is plain BM25)
- alpha:   a fusion weight per query, predicted from the query's mean state and its score spreads
- adapters: residual linear maps in vector space, q + Aq and/or d + Bd (zero at the start), trained
           with `semsearch train`'s hybrid loss (BM25's fused part fixed in the logits) over the corpus
- blend:   the base and the trained query vectors averaged (needs --head)

Documents: the index's first-chunk vectors (as scripts/train_scifact.py evaluates); queries: the
index's precision; states for `terms`/`alpha`: the fp32 model.
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
import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from semsearch.eval import format_table, load_beir, read_qrels, trec_metrics  # noqa: E402
from semsearch.fusion import DEPTH, minmax  # noqa: E402
from semsearch.store.lexical import STOPWORDS, LexicalIndex, _term  # noqa: E402

_WORD = re.compile(r"\w+", re.UNICODE)


class Setup:
    """What every lever reads: the corpus, both splits, vectors, BM25, the dev split."""

    def __init__(self, args):
        from semsearch.encoder import Encoder
        from semsearch.store.manifest import Manifest
        from semsearch.training import data as td
        from semsearch.training.query_tower import add_corpus_queries, index_vectors
        from semsearch.training.trainer import TrainConfig, make_split

        self.args = args
        self.data = td.from_beir(args.data, "train")
        self.test = load_beir(args.data, "test")
        m = Manifest.load(args.index)
        self.enc = Encoder(precision=m.precision)
        self.precision = m.precision
        self.dv, _ = index_vectors(Path(args.index), td.PairData([], self.test.doc_texts, {}, passage_ids=self.test.doc_ids), self.enc)
        self.dv = np.ascontiguousarray(self.dv, np.float32)
        self.q_train = self.enc.encode(self.data.queries, progress=False)
        self.q_test = self.enc.encode(self.test.query_texts, progress=False)
        self.head_q = None
        if args.head:
            from semsearch.encoder.heads import load_head

            tuned = Encoder(precision=m.precision, head=load_head(args.head, self.enc.fingerprint))
            self.head_q = (tuned.encode_queries(self.data.queries), tuned.encode_queries(self.test.query_texts))
        self.lex = LexicalIndex.from_texts(self.test.doc_texts)
        self.split = make_split(self.data, TrainConfig(dev_fraction=0.2, seed=args.seed), np.random.default_rng(args.seed))
        self.with_titles, _ = add_corpus_queries(self.data, self.data.titles)
        pid = {d: i for i, d in enumerate(self.test.doc_ids)}
        self.test_pos = [{pid[d] for d, r in self.test.qrels[q].items() if r > 0 and d in pid} for q in self.test.query_ids]
        train_docs = {d for q in read_qrels(Path(args.data) / "qrels" / "train.tsv").values() for d, r in q.items() if r > 0}
        self.unseen = [i for i, q in enumerate(self.test.query_ids)
                       if not any(d in train_docs for d, r in self.test.qrels[q].items() if r > 0)]
        self.acc_train = [self.lex.score_all(t) for t in self.data.queries]
        self.acc_test = [self.lex.score_all(t) for t in self.test.query_texts]
        self._states: dict[str, list[np.ndarray]] = {}

    def states(self, which: str) -> list[np.ndarray]:
        """Last-layer token states (fp32 model) of the train or test queries, [CLS] first."""
        if which not in self._states:
            from semsearch.encoder import Encoder
            from semsearch.encoder.query_layers import bottom_states, pad_ids

            enc = getattr(self, "_enc32", None) or Encoder(precision="fp32")
            self._enc32 = enc
            texts = self.data.queries if which == "train" else self.test.query_texts
            ids = enc.tokenize(texts)
            out = []
            with torch.inference_mode():
                for s in range(0, len(ids), 64):
                    x, mask = pad_ids(ids[s : s + 64])
                    h = bottom_states(enc.model, x, mask, len(enc.model.layers)).float()
                    out += [h[r, : len(t)].numpy() for r, t in enumerate(ids[s : s + 64])]
            self._states[which] = out
        return self._states[which]

    # -- candidates and scores ------------------------------------------------------------------
    def candidates(self, qv: np.ndarray, accs: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per query: (candidates: both sides' top DEPTH, their cosines, their BM25 scores)."""
        out = []
        for s in range(0, len(qv), 512):
            cos_b = qv[s : s + 512] @ self.dv.T
            for r, cos in enumerate(cos_b):
                acc = accs[s + r]
                lids, _ = self.lex.top(acc, DEPTH)
                dids = np.argpartition(-cos, DEPTH - 1)[:DEPTH]
                cand = np.union1d(dids, lids).astype(np.int64)
                out.append((cand, cos[cand], acc[cand]))
        return out

    def ndcg(self, cands: list[np.ndarray], scores: list[np.ndarray], positives: list[set[int]], which: list[int]) -> float:
        run, qrels = {}, {}
        for i in which:
            order = np.lexsort((cands[i], -scores[i]))[:10]
            run[str(i)] = {str(int(cands[i][j])): float(scores[i][j]) for j in order}
            qrels[str(i)] = {str(p): 1 for p in positives[i]}
        return trec_metrics(qrels, run, [10])["ndcg@10"]

    def report(self, lever: str, variant: str, fit: dict[str, float], cands_test, scores_test, extra: dict | None = None) -> dict:
        everyone = list(range(len(self.test_pos)))
        row = {"lever": lever, "variant": variant, **{k: round(v, 2) for k, v in fit.items()},
               "test hybrid": round(self.ndcg(cands_test, scores_test, self.test_pos, everyone), 2),
               f"test hybrid, unseen ({len(self.unseen)} q)": round(self.ndcg(cands_test, scores_test, self.test_pos, self.unseen), 2)}
        row.update(extra or {})
        print(json.dumps(row), flush=True)
        return row

    def train_positives(self) -> list[set[int]]:
        return [self.data.positives[i] for i in range(len(self.data.queries))]


def convex(c: np.ndarray, b: np.ndarray, alpha: float = 0.5) -> np.ndarray:
    return alpha * minmax(c) + (1 - alpha) * minmax(b)


# ---- fusion ------------------------------------------------------------------------------------
def lever_fusion(S: Setup) -> list[dict]:
    def z(x):
        sd = x.std()
        return (x - x.mean()) / sd if sd > 0 else np.zeros_like(x)

    def mx(x):
        h = x.max()
        return x / h if h > 0 else np.zeros_like(x)

    def rrf(k):
        return lambda c, b: 1 / (k + np.argsort(np.argsort(-c)) + 1) + 1 / (k + np.argsort(np.argsort(-b)) + 1)

    variants = {}
    for a in (0.4, 0.5, 0.6):
        variants[f"min-max, alpha {a}{' (semsearch query)' if a == 0.5 else ''}"] = lambda c, b, a=a: convex(c, b, a)
        variants[f"z-score, alpha {a}"] = lambda c, b, a=a: a * z(c) + (1 - a) * z(b)
        variants[f"divided by the maximum, alpha {a}"] = lambda c, b, a=a: a * mx(c) + (1 - a) * mx(b)
    for k in (10, 30, 60):
        variants[f"reciprocal rank, k {k}"] = rrf(k)
    ctr, cte = S.candidates(S.q_train, S.acc_train), S.candidates(S.q_test, S.acc_test)
    rows = []
    everyone = list(range(len(S.data.queries)))
    for name, fn in variants.items():
        tr = S.ndcg([c for c, _, _ in ctr], [fn(x, y) for _, x, y in ctr], S.train_positives(), everyone)
        dev = S.ndcg([c for c, _, _ in ctr], [fn(x, y) for _, x, y in ctr], S.train_positives(), S.split.dev)
        rows.append(S.report("fusion", name, {"train (809 q)": tr, "dev": dev}, [c for c, _, _ in cte], [fn(x, y) for _, x, y in cte]))
    return rows


# ---- dense pseudo-relevance feedback -------------------------------------------------------------
def lever_prf(S: Setup) -> list[dict]:
    def run(qv, accs, k, beta):
        first = S.candidates(qv, accs)
        q2 = qv.copy()
        for i, (c, x, y) in enumerate(first):
            f = convex(x, y)
            topk = c[np.lexsort((c, -f))[:k]]
            q2[i] = qv[i] + beta * S.dv[topk].mean(0)
        q2 /= np.linalg.norm(q2, axis=1, keepdims=True)
        second = S.candidates(q2.astype(np.float32), accs)
        return [c for c, _, _ in second], [convex(x, y) for _, x, y in second]

    rows = []
    for k in (3, 5, 10):
        for beta in (0.5, 1.0, 2.0):
            c, s = run(S.q_train, S.acc_train, k, beta)
            fit = {"train (809 q)": S.ndcg(c, s, S.train_positives(), list(range(len(c)))),
                   "dev": S.ndcg(c, s, S.train_positives(), S.split.dev)}
            rows.append(S.report("prf", f"top {k}, beta {beta}", fit, *run(S.q_test, S.acc_test, k, beta)))
    return rows


# ---- learned BM25 query-term weights ---------------------------------------------------------------
def _term_items(S: Setup, texts, qv, accs, states, positives, scalars_only: bool):
    enc = S._enc32
    items = []
    for qi, (cand, cos, _) in enumerate(S.candidates(qv, accs)):
        text, st = texts[qi], states[qi]
        offs = enc.token_offsets(text)
        feats: dict[int, list[np.ndarray]] = {}
        order: list[int] = []
        for m in _WORD.finditer(text.lower()):
            w = m.group(0)
            if w in STOPWORDS:
                continue
            toks = [i + 1 for i, (a, b) in enumerate(offs) if a < m.end() and b > m.start() and i + 1 < len(st) - 1]
            if not toks:
                continue
            h = _term(w)
            if h not in feats:
                order.append(h)
                feats[h] = []
            feats[h].append(st[toks].mean(0))
        known = S.lex._terms(np.array(order, np.int64))
        contrib = np.zeros((len(known), len(cand)), np.float32)
        fe = np.zeros((len(known), (0 if scalars_only else st.shape[1]) + 3), np.float32)
        for t, (h, idf, spans) in enumerate(known):
            full = np.zeros(len(S.dv), np.float32)
            for j, lo, hi in spans:
                full[S.lex.offsets[j] + S.lex.parts[j].postings[lo:hi]] += S.lex._weights(j, lo, hi, idf)
            contrib[t] = full[cand]
            if not scalars_only:
                fe[t, :-3] = np.mean(feats[h], 0)
            fe[t, -3:] = (idf / 8.0, t / max(1, len(known)), 1.0)
        items.append({"cand": cand, "cos": cos, "S": contrib, "F": fe, "pos": np.isin(cand, list(positives[qi]))})
    return items


def _pack(items):
    Q, M = len(items), max(1, max(len(it["S"]) for it in items))
    N, D = max(len(it["cand"]) for it in items), items[0]["F"].shape[1]
    P = {"S": torch.zeros(Q, M, N), "F": torch.zeros(Q, M, D), "tm": torch.zeros(Q, M, dtype=torch.bool),
         "cm": torch.zeros(Q, N, dtype=torch.bool), "cos": torch.zeros(Q, N), "pos": torch.zeros(Q, N, dtype=torch.bool)}
    for i, it in enumerate(items):
        m, n = it["S"].shape[0], len(it["cand"])
        P["S"][i, :m, :n] = torch.from_numpy(it["S"])
        P["F"][i, :m] = torch.from_numpy(it["F"])
        P["tm"][i, :m] = True
        P["cm"][i, :n] = True
        P["cos"][i, :n] = torch.from_numpy(it["cos"])
        P["pos"][i, :n] = torch.from_numpy(it["pos"])
    return P


def _mm(x, mask):
    big = torch.finfo(x.dtype).max
    lo = torch.where(mask, x, torch.full_like(x, big)).min(-1, keepdim=True).values
    hi = torch.where(mask, x, torch.full_like(x, -big)).max(-1, keepdim=True).values
    rng = hi - lo
    return torch.where(rng > 0, (x - lo) / rng.clamp_min(1e-12), (hi > 0).float().expand_as(x))


def lever_terms(S: Setup) -> list[dict]:
    S.states("train")
    rows = []
    for scalars_only, lr in ((False, 1e-2), (False, 1e-3), (True, 1e-2)):
        tr = _term_items(S, S.data.queries, S.q_train, S.acc_train, S.states("train"), S.train_positives(), scalars_only)
        te = _term_items(S, S.test.query_texts, S.q_test, S.acc_test, S.states("test"), S.test_pos, scalars_only)
        net = torch.nn.Linear(tr[0]["F"].shape[1], 1)
        torch.nn.init.zeros_(net.weight)
        torch.nn.init.zeros_(net.bias)

        def fused(P):
            w = 2 * torch.sigmoid(net(P["F"]).squeeze(-1)) * P["tm"]
            f = 0.5 * _mm(P["cos"], P["cm"]) + 0.5 * _mm(torch.einsum("qm,qmn->qn", w, P["S"]), P["cm"])
            return torch.where(P["cm"], f, torch.full_like(f, -1e9))

        Ptr, Pdev, Pte = _pack([tr[i] for i in S.split.train]), _pack([tr[i] for i in S.split.dev]), _pack(te)
        dev_pos = [S.data.positives[i] for i in S.split.dev]

        def score(items, P, positives, which=None):
            with torch.no_grad():
                f = fused(P)
            return S.ndcg([it["cand"] for it in items], [f[i, : len(it["cand"])].numpy() for i, it in enumerate(items)], positives,
                          list(range(len(items))) if which is None else which)

        dev_items = [tr[i] for i in S.split.dev]
        base_dev = score(dev_items, Pdev, dev_pos)
        opt = torch.optim.Adam(net.parameters(), lr=lr)
        g = torch.Generator().manual_seed(S.args.seed)
        best = (base_dev, 0, {k: v.clone() for k, v in net.state_dict().items()})
        for ep in range(30):
            perm = torch.randperm(Ptr["S"].shape[0], generator=g)
            for s in range(0, len(perm), 64):
                b = {k: v[perm[s : s + 64]] for k, v in Ptr.items()}
                keep = b["pos"].any(-1)
                if not keep.any():
                    continue
                f = fused(b)[keep] * 20.0
                pos = b["pos"][keep]
                loss = (torch.logsumexp(f, -1) - torch.logsumexp(f.masked_fill(~pos, -1e9), -1)).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            if (ep + 1) % 5 == 0:
                d = score(dev_items, Pdev, dev_pos)
                if d > best[0]:
                    best = (d, ep + 1, {k: v.clone() for k, v in net.state_dict().items()})
        last_dev = score(dev_items, Pdev, dev_pos)
        with torch.no_grad():
            f = fused(Pte)
        name = f"{'IDF and position' if scalars_only else 'token states, IDF, position'}, lr {lr:g}, 30 epochs"
        rows.append(S.report("terms", name, {"dev base": base_dev, "dev": last_dev, "dev best (epochs)": best[0]},
                             [it["cand"] for it in te], [f[i, : len(it["cand"])].numpy() for i, it in enumerate(te)],
                             {"best dev check, epochs": best[1]}))
    return rows


# ---- a fusion weight per query ------------------------------------------------------------------
def lever_alpha(S: Setup) -> list[dict]:
    def items(qv, accs, states, positives):
        out = []
        for qi, (cand, c, b) in enumerate(S.candidates(qv, accs)):
            cs, bs = np.sort(c), np.sort(b)
            sc = np.array([cs[-1] - cs[-2], (bs[-1] - bs[-2]) / bs[-1] if bs[-1] > 0 else 0.0, np.log1p(bs[-1]) / 5, cs[-1],
                           len(cand) / 200, np.count_nonzero(b) / len(b)], np.float32)
            out.append({"cand": cand, "c": torch.from_numpy(minmax(c).astype(np.float32)), "b": torch.from_numpy(minmax(b).astype(np.float32)),
                        "f": torch.from_numpy(np.concatenate([states[qi].mean(0), sc]).astype(np.float32)),
                        "pos": torch.from_numpy(np.isin(cand, list(positives[qi])))})
        return out

    tr = items(S.q_train, S.acc_train, S.states("train"), S.train_positives())
    te = items(S.q_test, S.acc_test, S.states("test"), S.test_pos)
    rows = []
    for lr in (3e-3, 1e-3):
        torch.manual_seed(S.args.seed)
        net = torch.nn.Linear(tr[0]["f"].shape[0], 1)
        torch.nn.init.zeros_(net.weight)
        torch.nn.init.zeros_(net.bias)  # alpha 0.5 at the start: semsearch query's fusion
        opt = torch.optim.Adam(net.parameters(), lr=lr)

        def fused(it):
            a = torch.sigmoid(net(it["f"]))[0]
            return a * it["c"] + (1 - a) * it["b"]

        def score(its, positives, which):
            with torch.no_grad():
                return S.ndcg([it["cand"] for it in its], [fused(it).numpy() for it in its], positives, which)

        base_dev = score(tr, S.train_positives(), S.split.dev)
        rng = np.random.default_rng(S.args.seed)
        train = [i for i in S.split.train if tr[i]["pos"].any()]
        for _ in range(20):
            for s in range(0, len(train), 32):
                batch = [train[j] for j in rng.permutation(len(train))[:32]]
                loss = sum(torch.logsumexp(20 * fused(tr[i]), 0) - torch.logsumexp(20 * fused(tr[i])[tr[i]["pos"]], 0) for i in batch)
                opt.zero_grad()
                (loss / len(batch)).backward()
                opt.step()
        with torch.no_grad():
            rows.append(S.report("alpha", f"linear on the mean state + 6 score features, lr {lr:g}, 20 epochs",
                                 {"dev base": base_dev, "dev": score(tr, S.train_positives(), S.split.dev)},
                                 [it["cand"] for it in te], [fused(it).numpy() for it in te]))
    return rows


# ---- residual linear maps in vector space ---------------------------------------------------------
def lever_adapters(S: Setup) -> list[dict]:
    from semsearch.training.query_tower import _LexicalBias, hybrid_ndcg10

    data = S.with_titles
    titles_v = S.enc.encode([data.queries[i] for i in range(len(S.data.queries), len(data.queries))], progress=False)
    Q = torch.from_numpy(np.concatenate([S.q_train, titles_v]).astype(np.float32))
    D = torch.from_numpy(S.dv)
    from semsearch.training.trainer import TrainConfig, make_split

    split = make_split(data, TrainConfig(dev_fraction=0.2, seed=S.args.seed), np.random.default_rng(S.args.seed))
    bias = _LexicalBias(S.test.doc_texts, data.queries, 20.0, 0.5)
    bias.set_ranges(Q.numpy(), S.dv)
    rows = []
    for sides, pairs_of in (("documents", "labels + titles"), ("documents", "titles"), ("queries + documents", "titles"),
                            ("queries", "labels + titles")):
        torch.manual_seed(S.args.seed)
        dim = Q.shape[1]
        maps = {s: torch.nn.Linear(dim, dim, bias=False) for s in ("queries", "documents") if s in sides}
        for m in maps.values():
            torch.nn.init.zeros_(m.weight)
        opt = torch.optim.AdamW([p for m in maps.values() for p in m.parameters()], lr=1e-3, weight_decay=0.0)

        def fq(x):
            return F.normalize(x + maps["queries"](x), dim=-1) if "queries" in maps else x

        def fd(x):
            return F.normalize(x + maps["documents"](x), dim=-1) if "documents" in maps else x

        use = [q for q in split.train if (q in data.unlabelled and "titles" in pairs_of) or (q not in data.unlabelled and "labels" in pairs_of)]
        rng = np.random.default_rng(S.args.seed)
        base_dev = hybrid_ndcg10(Q.numpy(), S.dv, split.dev, data.queries, S.lex, data.positives, 0.5)
        for _ in range(3):
            pairs = [(q, p) for q in use for p in sorted(data.positives[q])[:2]]
            order = rng.permutation(len(pairs))
            for s in range(0, len(pairs), 64):
                b = [pairs[j] for j in order[s : s + 64]]
                qs = [q for q, _ in b]
                logits = 20.0 * fq(Q[qs]) @ fd(D).T
                hide = [(r, o) for r, (q, p) in enumerate(b) for o in data.positives[q] if o != p]
                if hide:
                    logits = logits.index_put((torch.tensor([r for r, _ in hide]), torch.tensor([o for _, o in hide])), torch.tensor(-1e4))
                tgt = torch.tensor([p for _, p in b])
                loss = 0.5 * F.cross_entropy(logits + bias.rows(qs, None, len(S.dv)), tgt) + 0.5 * F.cross_entropy(logits, tgt)
                opt.zero_grad()
                loss.backward()
                opt.step()
        with torch.no_grad():
            qd, dd = fq(Q).numpy(), fd(D).numpy()
            qt = fq(torch.from_numpy(np.asarray(S.q_test, np.float32))).numpy()
        dev = hybrid_ndcg10(qd, dd, split.dev, data.queries, S.lex, data.positives, 0.5)
        saved = S.dv
        S.dv = dd
        cte = S.candidates(qt, S.acc_test)
        dense = qt @ dd.T
        S.dv = saved
        dn = [np.argsort(-row)[:DEPTH] for row in dense]
        extra = {"test dense": round(S.ndcg(dn, [dense[i][dn[i]] for i in range(len(dn))], S.test_pos, list(range(len(dn)))), 2),
                 "test dense, unseen": round(S.ndcg(dn, [dense[i][dn[i]] for i in range(len(dn))], S.test_pos, S.unseen), 2)}
        rows.append(S.report("adapters", f"{sides}, {pairs_of}, 3 epochs", {"dev base": base_dev, "dev": dev},
                             [c for c, _, _ in cte], [convex(x, y) for _, x, y in cte], extra))
    return rows


# ---- base and trained query vectors blended -------------------------------------------------------
def lever_blend(S: Setup) -> list[dict]:
    if S.head_q is None:
        print("blend: skipped (give --head)")
        return []
    rows = []
    for w in (0.0, 0.25, 0.5, 0.75, 1.0):
        def mix(b, t):
            v = (1 - w) * b + w * t
            return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)

        ctr = S.candidates(mix(S.q_train, S.head_q[0]), S.acc_train)
        cte = S.candidates(mix(S.q_test, S.head_q[1]), S.acc_test)
        dev = S.ndcg([c for c, _, _ in ctr], [convex(x, y) for _, x, y in ctr], S.train_positives(), S.split.dev)
        rows.append(S.report("blend", f"{1 - w:g} x base + {w:g} x trained", {"dev": dev}, [c for c, _, _ in cte],
                             [convex(x, y) for _, x, y in cte]))
    return rows


LEVERS = {"fusion": lever_fusion, "prf": lever_prf, "terms": lever_terms, "alpha": lever_alpha, "adapters": lever_adapters,
          "blend": lever_blend}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "beir" / "scifact"))
    ap.add_argument("--index", default=str(REPO / "results" / "scifact_work" / "index"))
    ap.add_argument("--head", default=None, help="a trained query-layers head, for the blend lever")
    ap.add_argument("--levers", default=",".join(LEVERS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(REPO / "results" / "train_levers"))
    args = ap.parse_args()
    unknown = [x for x in args.levers.split(",") if x not in LEVERS]
    if unknown:
        ap.error(f"unknown lever(s) {', '.join(unknown)}; valid: {', '.join(LEVERS)}")
    t0 = time.perf_counter()
    S = Setup(args)
    print(f"set up in {time.perf_counter() - t0:.0f} s ({S.precision} index; {len(S.split.dev)} dev queries, "
          f"{len(S.unseen)} unseen-document test queries)", flush=True)
    rows = []
    for name in args.levers.split(","):
        rows += LEVERS[name](S)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=2))
    keys = list(dict.fromkeys(k for r in rows for k in r))
    out.with_suffix(".md").write_text(format_table([{k: r.get(k, "") for k in keys} for r in rows]) + "\n")
    print(f"wrote {out}.md/.json ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
