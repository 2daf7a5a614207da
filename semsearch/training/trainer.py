"""Contrastive training of the pooling head on cached token states, gated on held-out documents."""
from __future__ import annotations

import copy
import hashlib
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from semsearch.encoder.pooling import AttentionHead, mean_pool
from semsearch.errors import InputError
from semsearch.eval import exact_search, trec_metrics
from semsearch.progress import bar as progress_bar
from semsearch.training.data import PairData
from semsearch.training.loss import mnr_loss, positive_mask
from semsearch.training.split import DevSplit, given_split, hold_out_seen, split_queries
from semsearch.training.states import StateCache

log = logging.getLogger(__name__)

PROJECTIONS = ("full", "diagonal", "none")
MIN_UNSEEN = 10  # fewer unseen-document dev queries than this: the gate uses the whole dev set


@dataclass
class TrainConfig:
    epochs: int = 10  # at most; training stops after `patience` epochs without a better dev figure
    batch_size: int = 64
    lr: float = 2e-3
    weight_decay: float = 0.0  # decoupled decay toward the starting point (mean pooling), not toward 0
    scale: float = 20.0  # 1 / temperature of the InfoNCE logits
    hard_negatives: int = 1  # mined negatives per pair (0: in-batch negatives only)
    neg_skip: int = 3  # skip this many top-ranked non-relevant passages (likely unlabelled positives)
    neg_depth: int = 50  # mine from ranks [neg_skip, neg_depth) of the base pooling
    symmetric: bool = False
    projection: str = "none"  # none | diagonal | full: what follows the attention pooling (none measured best on unseen documents)
    positives_per_query: int = 2  # positives sampled per query per epoch (bounds an epoch's cost)
    patience: int = 2
    dev_fraction: float = 0.2
    seed: int = 0

    def check(self) -> "TrainConfig":
        if self.projection not in PROJECTIONS:
            raise InputError(f"unknown projection {self.projection!r}; valid: {', '.join(PROJECTIONS)}")
        if self.positives_per_query < 1:
            raise InputError("positives per query must be at least 1")
        return self


@dataclass
class TrainResult:
    head: AttentionHead  # the best trained epoch's head (never the untrained one)
    improved: bool  # it beats mean pooling on the gate's dev figure
    split: DevSplit
    gate: str  # "unseen" | "dev" | "none": which dev figure gates the head
    base: dict[str, float] = field(default_factory=dict)  # {"dev", "unseen"} nDCG@10 of mean pooling
    best: dict[str, float] = field(default_factory=dict)  # the same figures of the best trained epoch
    best_epoch: int = -1
    stopped_early: bool = False
    history: list[dict[str, float]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def n_train(self) -> int:
        return len(self.split.train)

    @property
    def n_dev(self) -> int:
        return len(self.split.dev)

    def verdict(self) -> str:
        """One line: base and head on the dev figures, the epoch, the split and the time."""
        if self.gate == "none":
            figs = "no dev set"
        else:
            parts = [f"{name} {self.base[k]:.2f} -> {self.best[k]:.2f}" for k, name in
                     (("unseen", f"unseen-document dev ({len(self.split.unseen)} q)"), ("dev", f"all dev ({self.n_dev} q)"))
                     if k in self.base]
            figs = "nDCG@10 mean pooling -> head: " + ", ".join(parts)
        return (f"{figs}; best trained epoch {self.best_epoch}{' (stopped early)' if self.stopped_early else ''}; "
                f"{self.split.describe()}; token states {self.seconds.get('token_states', 0)} s, training {self.seconds.get('training', 0)} s")

    def metrics(self) -> dict[str, Any]:
        m = {"gate": self.gate, "best_epoch": self.best_epoch, "history": self.history, "seconds": self.seconds,
             "train_queries": self.n_train, "dev_queries": self.n_dev, "unseen_dev_queries": len(self.split.unseen),
             "dev_split": self.split.kind, "dev_split_note": self.split.note}
        for k, v in self.base.items():
            m[f"{k}_ndcg@10_base_mean"] = round(v, 2)
        for k, v in self.best.items():
            m[f"{k}_ndcg@10_head"] = round(v, 2)
        # Names of the first format, kept for readers of head.json.
        if "dev" in self.base:
            m["dev_ndcg@10_base_mean"], m["dev_ndcg@10_head"] = round(self.base["dev"], 2), round(self.best["dev"], 2)
        return m


# ---- token states ----------------------------------------------------------------------
def state_caches(encoder, data: PairData, cache_dir: Path | None, progress: bool | None,
                 passages: StateCache | None = None, queries: StateCache | None = None) -> tuple[StateCache, StateCache, float]:
    """Token states of passages and queries: those given (e.g. an index's kept states), else from
    cache_dir when built with the same settings and texts, else encoded (and cached)."""
    t0 = time.perf_counter()
    if passages is not None and queries is not None:
        return passages, queries, 0.0
    meta = {"model_fingerprint": encoder.fingerprint, "max_length": encoder.max_length, "precision": encoder.precision}
    caches = []
    for name, texts, given in (("passages", data.passages, passages), ("queries", data.queries, queries)):
        if given is not None:
            caches.append(given)
            continue
        key = hashlib.sha256(repr(sorted(meta.items())).encode() + _texts_key(texts).encode() + name.encode()).hexdigest()[:16]
        m = {**meta, "texts": len(texts), "key": key}
        folder = Path(cache_dir) / f"{name}-{key}" if cache_dir else None
        cache = StateCache.load(folder, m) if folder else None
        if cache is None:
            log.info("encoding %d %s once for the state cache", len(texts), name)
            cache = StateCache.build(encoder, texts, progress)
            if folder:
                cache.save(folder, m)
        caches.append(cache)
    return caches[0], caches[1], time.perf_counter() - t0


def _texts_key(texts: list[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:16]


# ---- the trainable head ----------------------------------------------------------------
class _Trainable(nn.Module):
    """An AttentionHead with the projection parametrised as asked: full (D x D), diagonal
    (a scale per dimension) or none. export() gives back a plain AttentionHead whose saved form
    is the same for all three (score weights + an optional projection matrix)."""

    def __init__(self, dim: int, projection: str):
        super().__init__()
        self.kind = projection
        self.attn = AttentionHead(dim, dim if projection == "full" else None)
        self.diag = nn.Parameter(torch.ones(dim)) if projection == "diagonal" else None

    def forward(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        v = self.attn(states, mask)  # (B, D)
        return v * self.diag if self.diag is not None else v

    def export(self) -> AttentionHead:
        if self.diag is None:
            return copy.deepcopy(self.attn).cpu().eval()
        head = AttentionHead(self.attn.dim, self.attn.dim)
        head.load_state_dict({**{k: v.detach().cpu() for k, v in self.attn.state_dict().items()},
                              "proj.weight": torch.diag(self.diag.detach().cpu())})
        return head.eval()


# ---- dev metric --------------------------------------------------------------------------
def _ndcg10(qvec: np.ndarray, pvec: np.ndarray, qidx: list[int], data: PairData,
            per_query: dict[str, dict[str, float]] | None = None) -> float:
    if not qidx:
        return 0.0
    scores, idx = exact_search(qvec[qidx], pvec, 100)
    run = {str(q): {str(int(p)): float(s) for s, p in zip(sr, ir) if p >= 0} for q, sr, ir in zip(qidx, scores, idx)}
    qrels = {str(q): {str(p): 1 for p in data.positives[q]} for q in qidx}
    return trec_metrics(qrels, run, [10], per_query=per_query)["ndcg@10"]


def _dev_figures(qvec: np.ndarray, pvec: np.ndarray, split: DevSplit, data: PairData) -> dict[str, float]:
    out: dict[str, float] = {}
    if split.dev:
        out["dev"] = _ndcg10(qvec, pvec, split.dev, data)
    if len(split.unseen) >= MIN_UNSEEN:
        out["unseen"] = out["dev"] if split.unseen == split.dev else _ndcg10(qvec, pvec, split.unseen, data)
    if len(split.seen) >= MIN_UNSEEN:
        out["seen"] = _ndcg10(qvec, pvec, split.seen, data)
    return out


# ---- batches -----------------------------------------------------------------------------
def _batches(pairs: list[tuple[int, int]], size: int, rng: np.random.Generator) -> list[list[tuple[int, int]]]:
    """Shuffled batches in which no passage and no query appears twice (a repeat would be its own negative)."""
    order = [pairs[i] for i in rng.permutation(len(pairs))]
    batches: list[list[tuple[int, int]]] = []
    while order:
        batch, qs, ps, rest = [], set(), set(), []
        for q, p in order:
            if len(batch) < size and q not in qs and p not in ps:
                batch.append((q, p))
                qs.add(q)
                ps.add(p)
            else:
                rest.append((q, p))
        batches.append(batch)
        order = rest
    return batches


def epoch_pairs(train: list[int], positives: dict[int, set[int]], k: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """(query, positive) pairs of one epoch: up to k positives sampled per query, so a query with
    forty positives costs an epoch no more than one with two."""
    pairs = []
    for q in train:
        pos = sorted(positives[q])
        if len(pos) > k:
            pos = [pos[i] for i in sorted(rng.choice(len(pos), size=k, replace=False))]
        pairs += [(q, p) for p in pos]
    return pairs


def make_split(data: PairData, cfg: TrainConfig, rng: np.random.Generator, seen_fraction: float = 0.0) -> DevSplit:
    """The dev split of data's labelled queries (unlabelled ones always train); with
    seen_fraction, a document split also holds out that share of queries about documents that
    stay training positives (split.seen; see split.hold_out_seen)."""
    labelled = {q: p for q, p in data.positives.items() if q not in data.unlabelled}
    if data.dev_queries is not None:
        split = given_split(labelled, data.dev_queries)
    else:
        split = split_queries(labelled, cfg.dev_fraction, rng, len(data.passages))
        split = hold_out_seen(split, labelled, seen_fraction, rng)
    split.train = sorted(split.train + sorted(data.unlabelled))
    return split


def _hard_negative_candidates(base_q: np.ndarray, base_p: np.ndarray, split: DevSplit, data: PairData,
                              cfg: TrainConfig) -> dict[int, list[int]]:
    """Each training query's hard-negative candidates: its given negatives, then the base ranking's other non-positives."""
    # Hard negatives from the base ranking: skip the very top (unlabelled positives), then sample.
    candidates: dict[int, list[int]] = {}
    if cfg.hard_negatives > 0:
        _, idx = exact_search(base_q[split.train], base_p, cfg.neg_depth)
        for q, row in zip(split.train, idx):
            ranked = [int(p) for p in row if p >= 0 and int(p) not in data.positives[q]]
            candidates[q] = data.negatives.get(q, []) + ranked[cfg.neg_skip :]
    return candidates


@dataclass
class _HeadSteps:
    """What every optimiser step of train_head uses: the head, its optimiser, the starting point
    weight decay pulls toward, the token states, the data and the hard-negative candidates."""

    model: _Trainable
    opt: torch.optim.Optimizer
    start: list[torch.Tensor]
    pstates: StateCache
    qstates: StateCache
    data: PairData
    candidates: dict[int, list[int]]
    cfg: TrainConfig
    device: Any

    def epoch(self, batches: list[list[tuple[int, int]]], rng: np.random.Generator, bar) -> list[float]:
        """Train on one epoch's batches; each step's loss."""
        self.model.train()
        losses = []
        for batch in batches:
            losses.append(self.step(batch, rng))
            bar.update(1)
        return losses

    def step(self, batch: list[tuple[int, int]], rng: np.random.Generator) -> float:
        """One optimiser step on a batch and the hard negatives sampled for its queries; its loss."""
        cfg, device, model = self.cfg, self.device, self.model
        qs = [q for q, _ in batch]
        ps = [p for _, p in batch]
        in_batch = set(ps)
        negs: list[int] = []
        for q in qs:
            pool = [n for n in self.candidates.get(q, []) if n not in in_batch]
            if pool:
                negs += [pool[i] for i in rng.choice(len(pool), size=min(cfg.hard_negatives, len(pool)), replace=False)]
        qv = model(*self.qstates.batch(qs, device))  # (B, D)
        dv = model(*self.pstates.batch(ps + negs, device))  # (B + N, D)
        exclude = positive_mask(qs, ps + negs, self.data.positives).to(device)  # (B, B + N)
        loss = mnr_loss(qv, dv, cfg.scale, cfg.symmetric, exclude)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        if cfg.weight_decay:
            with torch.no_grad():  # decay toward the start (mean pooling), decoupled from the gradient
                for p, p0 in zip(model.parameters(), self.start):
                    p.sub_(cfg.lr * cfg.weight_decay * (p - p0))
        return float(loss.detach())


def train_head(data: PairData, encoder, cfg: TrainConfig, cache_dir: Path | None = None, progress: bool | None = None,
               passages: StateCache | None = None, queries: StateCache | None = None) -> TrainResult:
    """Train an attention-pooling head on data; keep the trained epoch with the best dev nDCG@10
    on held-out documents (the gate figure), stopping after cfg.patience epochs without progress."""
    cfg.check()
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    device = getattr(encoder, "device", "cpu")
    pstates, qstates, t_states = state_caches(encoder, data, cache_dir, progress, passages, queries)
    t0 = time.perf_counter()
    split = make_split(data, cfg, rng)
    if not split.train:
        raise InputError("too few training queries after holding out the dev set")
    if split.note:
        log.warning("%s", split.note)

    base_p = pstates.pool_all(mean_pool, device=device)
    base_q = qstates.pool_all(mean_pool, device=device)
    base = _dev_figures(base_q, base_p, split, data)
    gate = "unseen" if "unseen" in base else ("dev" if "dev" in base else "none")
    candidates = _hard_negative_candidates(base_q, base_p, split, data, cfg)

    model = _Trainable(pstates.dim, cfg.projection).to(device)
    start = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    fit = _HeadSteps(model, opt, start, pstates, qstates, data, candidates, cfg, device)
    steps = -(-len(epoch_pairs(split.train, data.positives, cfg.positives_per_query, np.random.default_rng(0))) // cfg.batch_size)
    bar = progress_bar(steps * cfg.epochs, "training head", "step", progress)
    best: tuple[float, int, AttentionHead | None, dict[str, float]] = (-1.0, -1, None, {})
    history, since_best, stopped = [], 0, False
    for epoch in range(cfg.epochs):
        batches = _batches(epoch_pairs(split.train, data.positives, cfg.positives_per_query, rng), cfg.batch_size, rng)
        losses = fit.epoch(batches, rng, bar)
        model.eval()
        row: dict[str, float] = {"epoch": epoch, "loss": round(float(np.mean(losses)), 4)}
        if gate != "none":
            figs = _dev_figures(qstates.pool_all(model, device=device), pstates.pool_all(model, device=device), split, data)
            row.update({f"{k}_ndcg@10": round(v, 2) for k, v in figs.items()})
            if figs[gate] > best[0]:
                best, since_best = (figs[gate], epoch, model.export(), figs), 0
            else:
                since_best += 1
        else:
            best = (0.0, epoch, model.export(), {})
        history.append(row)
        bar.set_postfix_str(", ".join(f"{k} {v}" for k, v in row.items() if k != "epoch"))
        log.info("epoch %d: %s", epoch, row)
        if gate != "none" and since_best >= cfg.patience:
            stopped = epoch < cfg.epochs - 1
            break
    bar.close()
    head = best[2]
    head.corpus = data.corpus  # recorded in head.json by save_head
    improved = gate != "none" and best[0] > base[gate]
    return TrainResult(head=head, improved=improved, split=split, gate=gate, base=base, best=best[3], best_epoch=best[1],
                       stopped_early=stopped, history=history,
                       seconds={"token_states": round(t_states, 1), "training": round(time.perf_counter() - t0, 1)})


def config_dict(cfg: TrainConfig) -> dict[str, Any]:
    return asdict(cfg)
