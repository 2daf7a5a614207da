"""Fine-tuning the top layers of the *query* encoder against the documents' fixed vectors.

Why the query side only (measured on SciFact, docs/training.md, "What else was tried"; README "Training on
documents it never saw"): a pooling head trained on both sides memorised its training documents
(test 64.6 -> 75.3 overall, but 67.3 -> 63.8 on queries whose documents it never trained on).
Keeping every document vector as the base model makes it and training the top layers of the
query encoder only:
- generalised: +1.9 nDCG@10 on the test queries whose documents were never training positives;
- costs no re-indexing: an index's vectors stay valid, `index --head` only records the head;
- is cheap: the frozen bottom layers run once per training query (their output is cached), the
  document vectors come from the index (or one encoding), and every document of the corpus is a
  negative of every query (a full softmax over the corpus, not only in-batch negatives).

Unlabelled pairs from the corpus itself (each document's title, else its first sentence, as a
query for it) are added by default: they adapt the query encoder to the corpus's vocabulary and
are what made the gain carry over to unseen documents (labels alone: about +0.5 on them).
"""
from __future__ import annotations

import copy
import functools
import hashlib
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from semsearch.encoder.query_layers import KIND, QueryTower, bottom_states, load_tower, pad_ids, tower_states  # noqa: F401
from semsearch.encoder.transformer import attention_bias as _bias
from semsearch.errors import InputError
from semsearch.progress import bar as progress_bar
from semsearch.training.data import PairData, texts_checksum
from semsearch.training.split import DevSplit

log = logging.getLogger(__name__)

# A head is saved only where its dev gain is larger than NOISE_Z standard errors of that gain
# (paired, over the dev queries it is ranked on): a mean over a few queries moves by several
# points when one of them moves a rank, and the best of ten checks picks such moves. With 10-20
# dev queries (a user's 50 labelled pairs) a gain of a few points is noise; with SciFact's 244
# it is not (docs/training.md, "Small data").
NOISE_Z = 1.0
# ... and only where it was ranked on this many dev queries or more. Per-query gains are mostly 0
# with a few of +-30 to 100 points, so their standard error from a few dozen is itself unsure:
# 200 labelled NFCorpus pairs left 32 dev queries, whose base nDCG@10 was 3.8 (each held one of
# its ~40 relevant documents labelled), and a gain of +1.24 +/- 1.15 there passed NOISE_Z
# (docs/training.md, "The gate on a GPU sweep"). 200 SciFact pairs leave 51-60.
MIN_DEV_QUERIES = 50
# ... and only where luck alone would rarely give the best of its checks that gain: the share of
# random sign flips of the per-query gains (the same flip for every check, so their correlation is
# kept) under which the best check gains as much, at most GATE_P. The kept check is the best of up
# to ten, and the best of ten noisy checks beats the base model by chance far more often than one
# does (Westfall and Young's max-T permutation test). Without it 1,000 NFCorpus pairs gave two heads
# that passed NOISE_Z on 170-175 dev queries (+0.60 +/- 0.37, +1.40 +/- 0.96) and lost on test
# (docs/training.md, "The gate and the best of its checks"). 0.05 is the conventional level,
# chosen before the runs that measured it.
GATE_P = 0.05
GATE_FLIPS = 4_000  # random sign flips (the p value's own error at 0.05: about 0.0035)
FULL_SOFTMAX = 65_536  # corpora up to this many documents: every document is a negative of every query
SAMPLED_NEGATIVES = 16_384  # larger ones: this many random documents a batch, plus the batch's positives


# ---- configuration and result ------------------------------------------------------------
@dataclass
class TowerConfig:
    layers: int = 2  # top transformer layers of the query encoder trained
    # 5 epochs at 4e-5: SciFact's dev set preferred them (whole dev 75.01, against 73.75 for 3 epochs
    # and 72.97 for 3 at 2e-5), the held-out documents' figure not below the base model's in any
    # (docs/training.md, "Queries about the documents it trained on").
    epochs: int = 5  # at most (see patience)
    evals_per_epoch: int = 2  # dev checks an epoch (the best check is kept)
    patience: int = 3  # stop after this many dev checks without a better figure
    batch_size: int = 64
    lr: float = 4e-5
    weight_decay: float = 0.01  # AdamW's, toward zero
    scale: float = 20.0  # 1 / temperature of the softmax over the corpus
    positives_per_query: int = 2
    pseudo_queries: bool = True
    seed: int = 0
    # The search mode the layers are trained and judged for. "hybrid": BM25's part of the fused
    # score is added, fixed, to every logit, so the dense side learns what BM25 misses (see
    # _LexicalBias), and the dev gate ranks as `semsearch query` does by default. "dense": the
    # dense ranking alone.
    # The default is "dense", chosen on the dev sets of SciFact and NFCorpus: there the gate
    # accepted dense-mode heads on both (SciFact dev +7.12 +/- 1.25 over 244 queries, NFCorpus
    # +2.85 +/- 0.44 over 518), and hybrid-mode heads on SciFact only (NFCorpus: refused in three
    # seeds, dense dev 32-34 -> 28-31). On test (three seeds each), SciFact's hybrid figure gains
    # less than the hybrid mode's (75.20 against 76.21 for seed 0) and NFCorpus's gains (35.81 ->
    # 36.58, dense 31.55 -> 33.62, where hybrid mode lowered dense by 2.5-5.4): docs/training.md,
    # "Choosing the mode on both datasets".
    mode: str = "dense"
    alpha: float = 0.5  # the fusion weight of the dense side the hybrid loss and gate assume
    # hybrid: the loss is mix * (cross-entropy of the fused logits) + (1 - mix) * (the dense one's).
    # The fused loss alone lowered the dense ranking (SciFact dev 60.96 -> 59.75; without titles
    # the test's unseen-document dense figure fell 65.85 -> 64.17); half of each kept the dense
    # gain with the same hybrid one on dev (docs/training.md).
    mix: float = 0.5


@dataclass
class TowerResult:
    tower: QueryTower  # the best dev check's layers
    improved: bool
    split: DevSplit
    gate: str  # "unseen" | "dev" | "none": the figure a kept check may not lower (and ranks by, alone)
    rank: str = ""  # the figure checks are ranked by: "dev" where split.seen is measured too, else gate
    base: dict[str, float] = field(default_factory=dict)
    best: dict[str, float] = field(default_factory=dict)
    best_epoch: float = -1.0  # epochs trained at the best check (e.g. 0.5 = half an epoch)
    stopped_early: bool = False
    history: list[dict[str, float]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    pseudo: int = 0  # unlabelled pairs from the corpus trained on
    mode: str = "dense"  # the search mode of the gate's figures ("unseen", "dev"); dense_* are dense ones
    alpha_sweep: dict[str, float] = field(default_factory=dict)  # hybrid: dev nDCG@10 by fusion weight
    # the kept check's gain over the base model on the queries it is ranked on: mean, its paired
    # standard error and the number of queries (NOISE_Z); empty where no check was kept
    noise: dict[str, float] = field(default_factory=dict)
    # trained on the corpus's pseudo-queries alone (no labelled pairs), so the dev set is
    # pseudo-queries too: it shows how titles find their own documents, not how a user's queries
    # do, and is never enough to save a head (see refuse_proxy)
    proxy: bool = False

    def refuse_proxy(self) -> None:
        """No labels: nothing measures the user's queries, so the head is not saved unless forced.
        Measured (docs/training.md, "What it gains"): on SciFact and NFCorpus such heads never
        raised hybrid search (-0.11 to -0.33 in four runs, two modes), while their dev figure,
        near its ceiling (96-100), rose or stayed."""
        self.proxy, self.improved = True, False

    def within_noise(self) -> bool:
        """Whether the kept check beats the base model, but by no more than NOISE_Z standard errors,
        or by as much as the best of its checks would by luck more often than GATE_P."""
        n = self.noise
        return bool(n) and 0 < n["gain"] and (n["gain"] <= NOISE_Z * n["se"] or n.get("p", 0.0) > GATE_P)

    def too_few(self) -> bool:
        """Whether the kept check was ranked on fewer than MIN_DEV_QUERIES dev queries."""
        return bool(self.noise) and self.noise["queries"] < MIN_DEV_QUERIES

    def verdict(self) -> str:
        if self.gate == "none":
            figs = "no dev set"
        else:
            parts = [f"{name} {self.base[k]:.2f} -> {self.best[k]:.2f}" for k, name in
                     (("unseen", f"unseen-document dev ({len(self.split.unseen)} q)"),
                      ("seen", f"trained-document dev ({len(self.split.seen)} q)"), ("dev", f"all dev ({len(self.split.dev)} q)"),
                      ("dense_unseen", "dense unseen-document dev"), ("dense_dev", "dense all dev"))
                     if k in self.base and k in self.best]
            figs = f"nDCG@10 base -> trained query layers, {self.mode}: " + ", ".join(parts)
            if not self.improved and any(self.best.get(f"dense_{k}", 1e9) < self.base.get(f"dense_{k}", 0) for k in ("unseen", "dev")):
                figs += " (no better check kept the dense dev figure at the base model's or above)"
            elif not self.improved and self.rank != self.gate and self.best.get(self.gate, 1e9) < self.base.get(self.gate, 0):
                figs += " (no better check kept the unseen-document dev figure at the base model's or above)"
            if self.noise:
                n = self.noise
                luck = (f"; the best of {int(n['checks'])} check(s) gains that much by luck in {n['p']:.1%} of sign flips"
                        f" (a head is saved at {GATE_P:.0%} or less)" if "p" in n else "")
                figs += (f"; dev gain {n['gain']:+.2f} +/- {n['se']:.2f} (paired standard error over {int(n['queries'])} queries){luck}"
                         + (", within its noise: a head must beat the base model by more than that" if self.within_noise() else "")
                         + (f"; too few dev queries to tell a gain from noise (a head is saved only when {MIN_DEV_QUERIES} or more rank it)"
                            if self.too_few() else ""))
        if self.proxy:
            figs += ("; trained on pseudo-queries alone (no labelled pairs), so the dev set is pseudo-queries too: it shows how"
                     " titles find their own documents, not how your queries do, and saves no head (on two datasets such heads"
                     " did not raise hybrid search; give labelled pairs with --beir or --pairs)")
        secs = ", ".join(f"{k.replace('_', ' ')} {v} s" for k, v in self.seconds.items())
        return (f"{figs}; best check after {self.best_epoch:g} epoch(s){' (stopped early)' if self.stopped_early else ''}; "
                f"{self.split.describe()}; {self.pseudo} pseudo-queries; {secs}")

    def metrics(self) -> dict[str, Any]:
        m: dict[str, Any] = {"gate": self.gate, "best_epoch": self.best_epoch, "history": self.history, "seconds": self.seconds,
                             "train_queries": len(self.split.train), "dev_queries": len(self.split.dev),
                             "unseen_dev_queries": len(self.split.unseen), "seen_dev_queries": len(self.split.seen),
                             "ranked_by": self.rank or self.gate, "dev_split": self.split.kind,
                             "dev_split_note": self.split.note, "pseudo_queries": self.pseudo, "mode": self.mode}
        if self.alpha_sweep:
            m["dev_ndcg@10_by_alpha"] = self.alpha_sweep
        if self.noise:
            m["dev_gain"] = {k: round(v, 4 if k == "p" else 3) for k, v in self.noise.items()}
        for k, v in self.base.items():
            m[f"{k}_ndcg@10_base"] = round(v, 2)
        for k, v in self.best.items():
            m[f"{k}_ndcg@10_head"] = round(v, 2)
        return m


def config_dict(cfg: TowerConfig) -> dict[str, Any]:
    return asdict(cfg)


# ---- pseudo-queries ------------------------------------------------------------------------
def title_query(title: str | None) -> str:
    """A passage's title as its pseudo-query, or "" where it has none usable (too short or long)."""
    t = (title or "").strip()
    return t if 3 <= len(t) <= 300 else ""


def add_corpus_queries(data: PairData, titles: list[str] | None = None) -> tuple[PairData, int]:
    """The data with an unlabelled query for each passage: its title where the data has one,
    else its first sentence (see index_states.first_sentence); passages with neither get none."""
    from semsearch.training.index_states import first_sentence

    queries, positives, unlabelled = list(data.queries), {q: set(p) for q, p in data.positives.items()}, set(data.unlabelled)
    n = 0
    for i, text in enumerate(data.passages):
        q = (title_query(titles[i]) if titles is not None else "") or first_sentence(text)
        if not q:
            continue
        qi = len(queries)
        queries.append(q)
        positives[qi] = {i}
        unlabelled.add(qi)
        n += 1
    out = copy.copy(data)
    out.queries, out.positives, out.unlabelled = queries, positives, unlabelled
    out.query_ids = None if data.query_ids is None else list(data.query_ids) + [None] * n
    return out, n


# ---- document vectors -----------------------------------------------------------------------
def passage_vectors(encoder, data: PairData, cache_dir: Path | None, progress: bool | None) -> np.ndarray:
    """The passages' vectors as the base encoder makes them (normalised, (n, D)), cached in cache_dir."""
    key = hashlib.sha256(repr((encoder.fingerprint, encoder.max_length, encoder.precision, encoder.pooling,
                               texts_checksum(data.passages))).encode()).hexdigest()[:16]
    path = Path(cache_dir) / f"vectors-{key}.npy" if cache_dir else None
    if path is not None and path.exists():
        try:
            v = np.load(path)
            if v.shape[0] == len(data.passages):
                return v
        except (OSError, ValueError):
            pass
    v = encoder.encode(data.passages, progress=progress)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npy")
        np.save(tmp, v)
        tmp.replace(path)
    return v


def index_passages(folder: Path) -> PairData:
    """PairData of an index's documents (their first chunks) and no labelled query, for training
    on the corpus alone."""
    import json

    from semsearch.store.manifest import Manifest
    from semsearch.store.segments import read_rows

    folder = Path(folder)
    m = Manifest.load(folder)
    rows = [r[1:] for r in read_rows(folder, m, "c.text, c.metadata", "c.ord = 0")]
    texts = [r[0] for r in rows]
    ids = [str((json.loads(r[1]) if r[1] else {}).get("_id", i)) for i, r in enumerate(rows)]
    return PairData([], texts, {}, passage_ids=ids, checksum=texts_checksum(texts), source=f"{folder} (unlabelled)")


def index_vectors(folder: Path, data: PairData, encoder, id_field: str = "_id") -> tuple[np.ndarray, int]:
    """The passages' vectors read from an index (a BEIR document by its `_id` in the first chunk's
    metadata, other passages by exact chunk text), encoding the few it lacks; (vectors, found).
    Sets data.corpus to the index's documents: the corpus a head trained with them is for."""
    import json

    from semsearch.encoder.heads import corpus_record, index_row_key

    from semsearch.errors import SettingsMismatch
    from semsearch.store.folder import open_index
    from semsearch.store.manifest import Manifest

    folder = Path(folder)
    m = Manifest.load(folder)
    if m.model_fingerprint != encoder.fingerprint or m.max_length != encoder.max_length:
        raise SettingsMismatch(f"{folder}: built with model weights {m.model_fingerprint} at {m.max_length} tokens, "
                               f"not {encoder.fingerprint} at {encoder.max_length}")
    if m.pooling != encoder.pooling:
        raise SettingsMismatch(f"{folder}: its vectors are {m.pooling!r}-pooled; the query layers are trained for "
                               f"{encoder.pooling!r} documents (give --pooling {m.pooling})")
    docs = open_index(folder)[2]
    try:
        by_id: dict[str, int] = {}
        by_text: dict[str, int] = {}
        keys: list[str] = []
        for cid, ord_, text, meta in docs.select("c.ord, c.text, c.metadata"):
            if ord_ == 0:
                keys.append(index_row_key(meta, text))
            if ord_ == 0 and meta:
                d = json.loads(meta).get(id_field)
                if d is not None:
                    by_id.setdefault(str(d), cid)
            by_text.setdefault(text, cid)
        data.corpus = corpus_record(keys)
        want = []
        for i, text in enumerate(data.passages):
            cid = by_id.get(data.passage_ids[i]) if data.passage_ids is not None else None
            want.append(cid if cid is not None else by_text.get(text))
        ids, vecs = docs.get_vectors([c for c in want if c is not None])
    finally:
        docs.close()
    row = {int(c): r for r, c in enumerate(ids)}
    out = np.zeros((len(data.passages), m.dim), np.float32)
    missing = [i for i, c in enumerate(want) if c is None or c not in row]
    for i, c in enumerate(want):
        if c is not None and c in row:
            out[i] = vecs[row[c]]
    if len(missing) == len(want):
        raise InputError(f"{folder}: none of the {len(want)} training passages is in this index "
                         "(a BEIR corpus must be indexed from its corpus.jsonl, with --text-column title,text)")
    if missing:
        log.warning("%d of %d training passages are not in %s: encoding them", len(missing), len(want), folder)
        out[missing] = encoder.encode([data.passages[i] for i in missing], progress=False)
    return out, len(want) - len(missing)


# ---- hybrid: BM25's part of the fused score ---------------------------------------------------
def _rows_per_block(n_passages: int) -> int:
    """Queries whose cosines with every passage are computed at once: about 64 MB of them."""
    return max(1, min(1024, (16 << 20) // max(n_passages, 1)))


class _LexicalBias:
    """BM25's part of the fused score, for each query over the passages, as a fixed addend to the
    training logits: the dense side then gets no credit for what BM25 already ranks, and is pushed
    hardest against the passages BM25 favours wrongly.

    Hybrid search (semsearch/fusion.py) ranks by alpha * minmax(cosine) + (1 - alpha) * minmax(BM25)
    over a query's candidates (the union of both sides' top DEPTH). Multiplied by
    scale * range / alpha (range: the query's cosine range over its candidates), that is the
    training logit scale * cosine plus  scale * range * (1 - alpha) / alpha * minmax(BM25),
    less a constant of the query. The candidates, the range and BM25's min and max are the base
    model's, fixed; BM25 counts for the query's top DEPTH passages (0 elsewhere: outside them a
    passage is a candidate only through its cosine)."""

    def __init__(self, passages: list[str], queries: list[str], scale: float, alpha: float):
        from semsearch.fusion import DEPTH
        from semsearch.store.lexical import LexicalIndex

        self.lex = LexicalIndex.from_texts(passages)
        self.queries, self.depth, self.scale, self.alpha = queries, DEPTH, scale, alpha
        self.cols = np.zeros(0, np.int64)
        self.vals = np.zeros(0, np.float32)
        self.ptr = np.zeros(len(queries) + 1, np.int64)

    def set_ranges(self, qv: np.ndarray, pvec: np.ndarray) -> None:
        """Each query's candidates, weight and min-max BM25 from the base model's vectors qv."""
        from semsearch.fusion import minmax

        cols, vals = [], []
        step = _rows_per_block(len(pvec))
        for s in range(0, len(qv), step):
            cos = qv[s : s + step] @ pvec.T
            top = np.argpartition(-cos, min(self.depth, cos.shape[1]) - 1, axis=1)[:, : self.depth]
            for r in range(len(cos)):
                acc = self.lex.score_all(self.queries[s + r])
                lids, _ = self.lex.top(acc, self.depth)
                cand = np.union1d(top[r], lids)
                c, b = cos[r, cand], minmax(acc[cand])
                w = self.scale * float(c.max() - c.min()) * (1 - self.alpha) / self.alpha
                keep = np.isin(cand, lids)
                cols.append(cand[keep].astype(np.int64))
                vals.append((w * b[keep]).astype(np.float32))
        self.cols = np.concatenate(cols) if cols else np.zeros(0, np.int64)
        self.vals = np.concatenate(vals) if vals else np.zeros(0, np.float32)
        self.ptr = np.concatenate([[0], np.cumsum([len(c) for c in cols])]).astype(np.int64)

    def rows(self, queries: list[int], cols: np.ndarray | None, n: int) -> torch.Tensor:
        """(len(queries), columns) addends; cols: the passage of each column (None: all n)."""
        out = np.zeros((len(queries), n if cols is None else len(cols)), np.float32)
        for r, q in enumerate(queries):
            c, v = self.cols[self.ptr[q] : self.ptr[q + 1]], self.vals[self.ptr[q] : self.ptr[q + 1]]  # c sorted
            if cols is None:
                out[r, c] = v
            elif len(c):
                at = np.minimum(np.searchsorted(c, cols), len(c) - 1)
                hit = c[at] == cols
                out[r, hit] = v[at[hit]]
        return torch.from_numpy(out)


def hybrid_ndcg10(qv: np.ndarray, pvec: np.ndarray, qidx: list[int], queries: list[str], lex, positives: dict[int, set[int]],
                  alpha: float, per_query: dict[str, dict[str, float]] | None = None) -> float:
    """nDCG@10 of the convex fusion `semsearch query` runs (semsearch/fusion.py) over the passages:
    the union of both sides' top DEPTH, each scored exactly on both sides, fused (a long query's
    candidates holding all its terms first)."""
    from semsearch.eval import trec_metrics
    from semsearch.fusion import ALL_TERMS_MIN, DEPTH, all_terms_first, fuse, top
    from semsearch.store.lexical import counted

    if not qidx:
        return 0.0
    run: dict[str, dict[str, float]] = {}
    step = _rows_per_block(len(pvec))
    for at, q in enumerate(qidx):
        if at % step == 0:
            block = qv[qidx[at : at + step]] @ pvec.T
        cos = block[at % step]
        acc = lex.score_all(queries[q])
        lids, _ = lex.top(acc, DEPTH)
        dids = np.argpartition(-cos, min(DEPTH, len(cos)) - 1)[:DEPTH]
        cand = np.union1d(dids, lids)
        fused = fuse(cos[cand], acc[cand], "convex", alpha)
        hashes = lex.query_hashes(queries[q])
        if len(hashes) >= ALL_TERMS_MIN:  # a long query's chunks holding all its terms first, as search ranks them
            fused = all_terms_first(fused, lex.terms_of(hashes, lex.ids[cand]), sum(1 for h, _, _ in lex._terms(hashes) if counted(h)))
        run[str(q)] = {str(int(cand[j])): float(fused[j]) for j in top(cand, fused, 10)}
    return trec_metrics({str(q): {str(p): 1 for p in positives[q]} for q in qidx}, run, [10], per_query=per_query)["ndcg@10"]


# ---- training -------------------------------------------------------------------------------
class _QueryInputs:
    """Every query's bottom-layer states, computed once into one fp16 buffer (a 20-token query is
    15 KB at MiniLM's width) and padded into batches on demand. One buffer, not a tensor per
    query: thousands of small allocations between the forward's large temporaries kept ~0.7 GB
    of freed heap from going back (measured on 6,200 queries: 1.19 GB RSS against 113 MB of states)."""

    def __init__(self, encoder, texts: list[str], first: int, progress: bool | None):
        self.ids = encoder.tokenize(texts)
        lens = np.array([len(i) for i in self.ids], np.int64)
        self.start = np.concatenate([[0], np.cumsum(lens)[:-1]]) if len(lens) else lens
        self.length = lens
        model = encoder.model
        self.buf = torch.empty(int(lens.sum()), model.cfg.hidden_size, dtype=torch.float16)
        order = sorted(range(len(texts)), key=lambda i: len(self.ids[i]))
        bar = progress_bar(len(texts), "frozen layers", "query", progress)
        with torch.inference_mode():
            for s in range(0, len(order), 64):
                idx = order[s : s + 64]
                ids, mask = pad_ids([self.ids[i] for i in idx])
                x = bottom_states(model, ids.to(encoder.device), mask.to(encoder.device), first).to(torch.float16).cpu()
                for r, i in enumerate(idx):
                    self.buf[self.start[i] : self.start[i] + lens[i]] = x[r, : lens[i]]
                bar.update(len(idx))
        bar.close()

    def batch(self, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        # Lengths rounded up to a multiple of 16: a few shapes, not one per batch (each new shape
        # left the allocator more fragmented: RSS grew ~0.5 GB over an epoch without this).
        T = -(-int(max(self.length[i] for i in idx)) // 16) * 16
        x = torch.zeros(len(idx), T, self.buf.shape[1])
        mask = torch.zeros(len(idx), T, dtype=torch.long)
        for r, i in enumerate(idx):
            n = int(self.length[i])
            x[r, :n] = self.buf[self.start[i] : self.start[i] + n].float()
            mask[r, :n] = 1
        return x, mask


def _encode(tower: QueryTower, inputs: _QueryInputs, idx: list[int], pool, batch: int = 64) -> np.ndarray:
    out = np.zeros((len(idx), tower.cfg.hidden_size), np.float32)
    with torch.inference_mode():
        for s in range(0, len(idx), batch):
            part = idx[s : s + batch]
            x, mask = inputs.batch(part)
            out[s : s + len(part)] = F.normalize(pool(tower(x, _bias(mask, x.dtype)), mask), dim=-1).numpy()
    return out


def _hidden(batch: list[tuple[int, int]], positives: dict[int, set[int]], cols: torch.Tensor | None) -> tuple[list[int], list[int]]:
    """(rows, columns) of the logits to leave out: each query's labelled positives other than its
    target. cols: the passage of each column (None: column j is passage j)."""
    rows: list[int] = []
    hide: list[int] = []
    where: dict[int, list[int]] = {}
    if cols is not None:
        for j, c in enumerate(cols.tolist()):
            where.setdefault(c, []).append(j)
    for r, (q, p) in enumerate(batch):
        for o in positives[q]:
            if cols is None:
                js = [] if o == p else [o]
            else:  # every column holding a positive of q (its target's too, where another row shares it) but r's own
                js = [j for j in where.get(o, ()) if j != r]
            rows += [r] * len(js)
            hide += js
    return rows, hide


class _TowerFit:
    """What one run of train_query_tower shares between its steps and dev checks: the layers, their
    cached inputs, the fixed document vectors, (hybrid) BM25's part of the score, the base model's
    dev figures and the best check so far."""

    def __init__(self, data: PairData, tower: QueryTower, inputs: _QueryInputs, pvec: np.ndarray, pooling: str,
                 cfg: TowerConfig, split: DevSplit):
        """Normalise the document vectors and (hybrid) index the passages for BM25; InputError for an unknown mode."""
        from semsearch.encoder.pooling import pool as pool_fn

        self.data, self.tower, self.inputs, self.pvec, self.cfg, self.split = data, tower, inputs, pvec, cfg, split
        self.pool = functools.partial(pool_fn, pooling)  # (states, mask) -> the encoder's pooling of them
        docs = torch.from_numpy(np.ascontiguousarray(pvec, dtype=np.float32))
        self.docs = F.normalize(docs, dim=-1)
        if cfg.mode not in ("hybrid", "dense"):
            raise InputError(f"unknown training mode {cfg.mode!r}; valid modes are: hybrid, dense")
        self.bias = _LexicalBias(data.passages, data.queries, cfg.scale, cfg.alpha) if cfg.mode == "hybrid" else None
        self.pnorm = self.docs.numpy()

    def query_vectors(self, idx: list[int]) -> np.ndarray:
        """Vectors of all queries, those of idx by the layers as they are (the others zero)."""
        qv = np.zeros((len(self.data.queries), self.docs.shape[1]), np.float32)
        if idx:
            qv[idx] = _encode(self.tower, self.inputs, idx, self.pool)
        return qv

    def figures(self) -> dict[str, float]:
        """The layers' dev figures: nDCG@10 of the mode trained for, and (hybrid) the dense ones as dense_*."""
        from semsearch.training.trainer import _dev_figures

        data, split = self.data, self.split  # (split.unseen is a subset of split.dev)
        qv = self.query_vectors(split.dev)
        out = _dev_figures(qv, self.pvec, split, data)
        if self.bias is not None:
            out = {f"dense_{k}": v for k, v in out.items()}
            for k, idx in (("dev", split.dev), ("unseen", split.unseen), ("seen", split.seen)):
                if f"dense_{k}" in out:
                    out[k] = hybrid_ndcg10(qv, self.pnorm, idx, data.queries, self.bias.lex, data.positives, self.cfg.alpha)
        return out

    def per_query(self) -> np.ndarray:
        """The layers' nDCG@10 of each query the checks are ranked on (self.rank), in the mode trained for."""
        from semsearch.training.trainer import _ndcg10

        idx = self.split.unseen if self.rank == "unseen" else self.split.dev
        qv = self.query_vectors(idx)
        got: dict[str, dict[str, float]] = {}
        if self.bias is not None:
            hybrid_ndcg10(qv, self.pnorm, idx, self.data.queries, self.bias.lex, self.data.positives, self.cfg.alpha, per_query=got)
        else:
            _ndcg10(qv, self.pvec, idx, self.data, per_query=got)
        return np.array([got.get(str(q), {}).get("ndcg@10", 0.0) for q in idx], np.float64)

    def measure_base(self) -> None:
        """Fix BM25's part of the score (hybrid) and measure the base model: its figures, the gate and the rank."""
        if self.bias is not None:
            self.bias.set_ranges(_encode(self.tower, self.inputs, list(range(len(self.data.queries))), self.pool), self.pnorm)
        self.base = base = self.figures()
        self.gate = "unseen" if "unseen" in base else ("dev" if "dev" in base else "none")
        # With held-out queries about trained documents too (split.seen), checks are ranked on the
        # whole dev set, and one below the base model on the unseen-document queries is never kept:
        # a head may help with the documents it was trained on, never at the cost of new ones.
        self.rank = "dev" if self.gate == "unseen" and "seen" in base else self.gate
        self.base_per_query = self.per_query() if self.gate != "none" else None  # what a kept check's gain is measured against

    def keeps(self, figs: dict[str, float]) -> bool:
        """Whether a check may be kept: its dense gate figure, and (ranked on all dev) its gate figure, not below the base's."""
        # hybrid: a check counts only if the dense ranking is no worse than the base model's
        # (dense is what the embeddings API and RAG frameworks use)
        gate, base = self.gate, self.base
        return (figs.get(f"dense_{gate}", 0.0) >= base.get(f"dense_{gate}", 0.0)
                and (self.rank == gate or figs[gate] >= base[gate]))

    def out_of_patience(self) -> bool:
        """Whether cfg.patience dev checks in a row found no better one (never without a dev set)."""
        return self.gate != "none" and self.since_best >= self.cfg.patience

    def train(self, rng: np.random.Generator, progress: bool | None) -> bool:
        """Train for up to cfg.epochs with cfg.evals_per_epoch dev checks an epoch; True where it stopped early."""
        from semsearch.training.trainer import epoch_pairs

        cfg, split, data = self.cfg, self.split, self.data
        params = [p for p in self.tower.parameters()]
        self.opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        n_pairs = len(epoch_pairs(split.train, data.positives, cfg.positives_per_query, np.random.default_rng(0)))
        steps = -(-n_pairs // cfg.batch_size)
        checks = sorted({max(0, int(round(steps * (k + 1) / cfg.evals_per_epoch)) - 1) for k in range(cfg.evals_per_epoch)})
        bar = progress_bar(steps * cfg.epochs, "training query layers", "step", progress)
        self.best = (-1.0, -1.0, copy.deepcopy(self.tower.state_dict()), {})
        self.unguarded = self.best  # hybrid: the best check whatever its dense figure (what --force saves if no check kept it)
        self.history: list[dict[str, float]] = []
        self.kept_gains: list[np.ndarray] = []
        self.best_gains: np.ndarray | None = None  # the kept check's gains over the base, query by query
        self.since_best, stopped = 0, False
        for epoch in range(cfg.epochs):
            pairs = epoch_pairs(split.train, data.positives, cfg.positives_per_query, rng)
            order = rng.permutation(len(pairs))
            losses: list[float] = []
            for step, s in enumerate(range(0, len(pairs), cfg.batch_size)):
                losses.append(self.step([pairs[j] for j in order[s : s + cfg.batch_size]], rng))
                bar.update(1)
                if step in checks:
                    self.check(round(epoch + (step + 1) / steps, 2), losses, bar)
                    if self.out_of_patience():
                        stopped = epoch < cfg.epochs - 1 or step < steps - 1  # True: checks were left
                        break
            if self.out_of_patience():
                break
        bar.close()
        return stopped

    def step(self, batch: list[tuple[int, int]], rng: np.random.Generator) -> float:
        """One optimiser step on a batch of (query, positive) pairs; its loss."""
        cfg, docs, tower = self.cfg, self.docs, self.tower
        tower.train()
        qs = [q for q, _ in batch]
        target = torch.tensor([p for _, p in batch])
        x, mask = self.inputs.batch(qs)
        qv = F.normalize(self.pool(tower(x, _bias(mask, x.dtype)), mask), dim=-1)
        if docs.shape[0] <= FULL_SOFTMAX:
            cols, tgt = None, target
        else:  # a sample of the corpus after the batch's positives (column r is row r's target)
            cols = torch.cat([target, torch.from_numpy(rng.choice(docs.shape[0], SAMPLED_NEGATIVES, replace=False))])
            tgt = torch.arange(len(batch))
        logits = cfg.scale * qv @ (docs if cols is None else docs[cols]).T
        # A query's other labelled positives are not its negatives: left out of its softmax.
        rows, hide = _hidden(batch, self.data.positives, cols)
        if rows:
            logits = logits.index_put((torch.tensor(rows), torch.tensor(hide)), torch.tensor(float("-inf")))
        if self.bias is not None:
            fused = logits + self.bias.rows(qs, None if cols is None else cols.numpy(), docs.shape[0])
            loss = cfg.mix * F.cross_entropy(fused, tgt) + (1 - cfg.mix) * F.cross_entropy(logits, tgt)
        else:
            loss = F.cross_entropy(logits, tgt)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return float(loss.detach())

    def check(self, epoch: float, losses: list[float], bar) -> None:
        """A dev check after `epoch` epochs: its row in history, the bar and the log; the best check updated."""
        tower, rank = self.tower, self.rank
        tower.eval()
        row: dict[str, float] = {"epoch": epoch, "loss": round(float(np.mean(losses)), 4)}
        if self.gate != "none":
            figs = self.figures()
            row.update({f"{k}_ndcg@10": round(v, 2) for k, v in figs.items()})
            if figs[rank] > self.unguarded[0]:
                self.unguarded = (figs[rank], row["epoch"], copy.deepcopy(tower.state_dict()), figs)
            kept = self.keeps(figs)
            if kept:  # one the best could be chosen from: its gains, query by query, for the gate's p value
                gains = self.per_query() - self.base_per_query
                self.kept_gains.append(gains)
            if figs[rank] > self.best[0] and kept:
                self.best, self.since_best = (figs[rank], row["epoch"], copy.deepcopy(tower.state_dict()), figs), 0
                self.best_gains = gains
            else:
                self.since_best += 1
        else:
            self.best = (0.0, row["epoch"], copy.deepcopy(tower.state_dict()), {})
        self.history.append(row)
        bar.set_postfix_str(", ".join(f"{k} {v}" for k, v in row.items() if k != "epoch"))
        log.info("check: %s", row)

    def alpha_sweep(self) -> dict[str, float]:
        """Hybrid dev nDCG@10 of the layers as they are by fusion weight, on the gate's dev queries."""
        # The fusion weight the trained layers would want: recorded (in head.json's metrics), not
        # applied. On SciFact 0.5 stayed best (docs/training.md).
        data, split = self.data, self.split
        qd = self.query_vectors(split.dev)
        sweep = {f"{a:.1f}": round(hybrid_ndcg10(qd, self.pnorm, split.unseen if self.gate == "unseen" else split.dev, data.queries,
                                                 self.bias.lex, data.positives, a), 2) for a in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)}
        log.info("hybrid nDCG@10 on dev by alpha: %s", sweep)
        return sweep


def passes_gate(noise: dict[str, float]) -> bool:
    """The kept check's dev gain over the base model (gain, se, queries, and p where measured) is
    one a head is saved for: beyond NOISE_Z standard errors, on MIN_DEV_QUERIES dev queries or
    more, and (p) beyond what the best of its checks gains by luck in more than GATE_P of flips."""
    return (noise["gain"] > NOISE_Z * noise["se"] and noise["queries"] >= MIN_DEV_QUERIES
            and noise.get("p", 0.0) <= GATE_P)


def best_check_p(gains: np.ndarray, flips: int = GATE_FLIPS, seed: int = 0) -> float:
    """How often luck alone gives the best of several dev checks its gain: gains is (checks x
    queries), each check's nDCG@10 minus the base model's, query by query. Under "training changed
    nothing" each query's differences are as likely negated, so each flip negates a random half of
    the queries (the same ones in every check) and takes the best check's mean; the share of flips,
    the observed one included, whose best mean is at least the observed best is the p value."""
    # numpy, not scipy.stats.permutation_test: that one tests one statistic, not the max over
    # checks that share their flips, and would draw its flips a check at a time.
    gains = np.atleast_2d(np.asarray(gains, np.float64))
    observed = gains.mean(axis=1).max()
    rng = np.random.default_rng(seed)
    hits, done = 0, 0
    while done < flips:
        n = min(1_000, flips - done)
        signs = rng.integers(0, 2, size=(n, gains.shape[1])) * 2.0 - 1.0
        best = (signs @ gains.T / gains.shape[1]).max(axis=1)
        hits += int((best >= observed - 1e-12).sum())
        done += n
    return (1 + hits) / (1 + flips)


def train_query_tower(data: PairData, encoder, pvec: np.ndarray, cfg: TowerConfig, split: DevSplit,
                      progress: bool | None = None, pseudo: int = 0) -> TowerResult:
    """Train the top cfg.layers layers of the query encoder so that each training query's vector
    ranks its positives first among all passages (pvec, fixed); keep the dev check with the best
    gate figure (unseen-document dev nDCG@10), stopping after cfg.patience checks without progress."""
    if encoder.backend != "native":
        raise InputError("--train-layers needs a BERT-family model on the native encoder")
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    t0 = time.perf_counter()
    tower = QueryTower.from_base(encoder.model, cfg.layers)
    inputs = _QueryInputs(encoder, data.queries, tower.first, progress)
    t_frozen = time.perf_counter() - t0
    fit = _TowerFit(data, tower, inputs, pvec, encoder.pooling, cfg, split)
    t1 = time.perf_counter()
    fit.measure_base()
    stopped = fit.train(rng, progress)
    gate, best = fit.gate, fit.best
    improved = gate != "none" and best[0] > fit.base[fit.rank]
    noise: dict[str, float] = {}
    if gate != "none" and best[3]:  # the kept check against the base, query by query
        diff = fit.best_gains
        noise = {"gain": float(diff.mean()), "se": float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else float("inf"),
                 "queries": float(len(diff))}
        if fit.kept_gains:  # every check that could have been kept, the kept one among them
            noise.update(p=best_check_p(np.array(fit.kept_gains)), checks=float(len(fit.kept_gains)))
        improved = improved and passes_gate(noise)
    if not best[3] and fit.unguarded[3]:
        best = fit.unguarded
    tower.load_state_dict(best[2])
    tower.eval()
    sweep = fit.alpha_sweep() if fit.bias is not None and gate != "none" else {}
    tower.corpus = data.corpus  # recorded in head.json by save_tower
    return TowerResult(tower=tower, improved=improved, split=split, gate=gate, rank=fit.rank, base=fit.base, best=best[3],
                       best_epoch=best[1], stopped_early=stopped, history=fit.history, pseudo=pseudo, mode=cfg.mode,
                       alpha_sweep=sweep, noise=noise,
                       seconds={"frozen_layers": round(t_frozen, 1), "training": round(time.perf_counter() - t1, 1)})


# ---- saving and loading ------------------------------------------------------------------------
def save_tower(tower: QueryTower, folder: Path, config: dict[str, Any], positive_ids: list[str] | None) -> dict[str, Any]:
    """Write a query-layers head folder: head.safetensors (the layers) + head.json (+ the training positives)."""
    from semsearch.encoder.heads import write_head_folder

    cfg = {"kind": KIND, "dim": tower.cfg.hidden_size, "first_layer": tower.first, "layers": tower.n, **config}
    return write_head_folder(folder, tower, cfg, positive_ids)
