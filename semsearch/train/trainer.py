"""Contrastive training of the pooling head on cached token states, with a dev-set gate."""
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

from semsearch.encoder.pooling import AttentionHead, mean_pool
from semsearch.eval import exact_search, trec_metrics
from semsearch.train.data import PairData
from semsearch.train.loss import mnr_loss
from semsearch.train.states import StateCache

log = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    epochs: int = 10
    batch_size: int = 64
    lr: float = 2e-3
    weight_decay: float = 0.0
    scale: float = 20.0  # 1 / temperature of the InfoNCE logits
    hard_negatives: int = 1  # mined negatives per pair (0: in-batch negatives only)
    neg_skip: int = 3  # skip this many top-ranked non-relevant passages (likely unlabelled positives)
    neg_depth: int = 50  # mine from ranks [neg_skip, neg_depth) of the base pooling
    symmetric: bool = False
    projection: bool = True
    dev_fraction: float = 0.2
    seed: int = 0


@dataclass
class TrainResult:
    head: AttentionHead
    improved: bool
    base_dev: float  # dev nDCG@10 of mean pooling
    best_dev: float  # best dev nDCG@10 of the head
    best_epoch: int
    history: list[dict[str, float]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    n_train: int = 0
    n_dev: int = 0

    def metrics(self) -> dict[str, Any]:
        return {"dev_ndcg@10_base_mean": round(self.base_dev, 2), "dev_ndcg@10_head": round(self.best_dev, 2),
                "best_epoch": self.best_epoch, "history": self.history, "seconds": self.seconds,
                "train_queries": self.n_train, "dev_queries": self.n_dev}


def state_caches(encoder, data: PairData, cache_dir: Path | None, progress: bool | None) -> tuple[StateCache, StateCache, float]:
    """Token states of passages and queries, from cache_dir when built with the same settings."""
    t0 = time.perf_counter()
    meta = {"model_fingerprint": encoder.fingerprint, "max_length": encoder.max_length, "precision": encoder.precision}
    caches = []
    for name, texts in (("passages", data.passages), ("queries", data.queries)):
        key = hashlib.sha256(repr(sorted(meta.items())).encode() + data.checksum.encode() + name.encode()).hexdigest()[:16]
        m = {**meta, "texts": len(texts), "key": key}
        folder = Path(cache_dir) / f"{name}-{key}" if cache_dir else None
        cache = StateCache.load(folder, m) if folder else None
        if cache is None:
            log.info("encoding %d %s once for the state cache", len(texts), name)
            cache = StateCache.build(encoder, texts, progress if name == "passages" else False)
            if folder:
                cache.save(folder, m)
        caches.append(cache)
    return caches[0], caches[1], time.perf_counter() - t0


def _ndcg10(qvec: np.ndarray, pvec: np.ndarray, qidx: list[int], data: PairData) -> float:
    scores, idx = exact_search(qvec[qidx], pvec, 100)
    run = {str(q): {str(int(p)): float(s) for s, p in zip(sr, ir) if p >= 0} for q, sr, ir in zip(qidx, scores, idx)}
    qrels = {str(q): {str(p): 1 for p in data.positives[q]} for q in qidx}
    return trec_metrics(qrels, run, [10])["ndcg@10"]


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


def train_head(data: PairData, encoder, cfg: TrainConfig, cache_dir: Path | None = None, progress: bool | None = None) -> TrainResult:
    """Train an attention-pooling head on data; keep the epoch with the best dev nDCG@10."""
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    device = getattr(encoder, "device", "cpu")
    pstates, qstates, t_states = state_caches(encoder, data, cache_dir, progress)
    t0 = time.perf_counter()

    qids = sorted(data.positives)
    perm = [qids[i] for i in rng.permutation(len(qids))]
    n_dev = max(1, int(round(len(qids) * cfg.dev_fraction))) if len(qids) > 1 else 0
    dev, train = sorted(perm[:n_dev]), sorted(perm[n_dev:])
    if not train:
        from semsearch.errors import InputError

        raise InputError("too few training queries after holding out the dev set")

    base_p = pstates.pool_all(mean_pool, device=device)
    base_q = qstates.pool_all(mean_pool, device=device)
    base_dev = _ndcg10(base_q, base_p, dev, data) if dev else 0.0

    # Hard negatives from the base ranking: skip the very top (unlabelled positives), then sample.
    candidates: dict[int, list[int]] = {}
    if cfg.hard_negatives > 0:
        _, idx = exact_search(base_q[train], base_p, cfg.neg_depth)
        for q, row in zip(train, idx):
            ranked = [int(p) for p in row if p >= 0 and int(p) not in data.positives[q]]
            candidates[q] = data.negatives.get(q, []) + ranked[cfg.neg_skip :]

    head = AttentionHead(pstates.dim, pstates.dim if cfg.projection else None).to(device)
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    pairs = [(q, p) for q in train for p in sorted(data.positives[q])]
    best = (base_dev, -1, copy.deepcopy(head.state_dict()))  # epoch -1: the untrained head == mean pooling
    history = []
    for epoch in range(cfg.epochs):
        head.train()
        losses = []
        for batch in _batches(pairs, cfg.batch_size, rng):
            qs = [q for q, _ in batch]
            ps = [p for _, p in batch]
            in_batch = set(ps)
            negs = []
            for q in qs:
                pool = [n for n in candidates.get(q, []) if n not in in_batch]
                if pool:
                    negs += [pool[i] for i in rng.choice(len(pool), size=min(cfg.hard_negatives, len(pool)), replace=False)]
            qv = head(*qstates.batch(qs, device))  # (B, D)
            dv = head(*pstates.batch(ps + negs, device))  # (B + N, D)
            loss = mnr_loss(qv, dv, cfg.scale, cfg.symmetric)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        head.eval()
        row = {"epoch": epoch, "loss": round(float(np.mean(losses)), 4)}
        if dev:
            row["dev_ndcg@10"] = round(_ndcg10(qstates.pool_all(head, device=device), pstates.pool_all(head, device=device), dev, data), 2)
            if row["dev_ndcg@10"] > best[0]:
                best = (row["dev_ndcg@10"], epoch, copy.deepcopy(head.state_dict()))
        history.append(row)
        log.info("epoch %d: %s", epoch, row)
    if not dev:
        best = (0.0, cfg.epochs - 1, copy.deepcopy(head.state_dict()))
    head.load_state_dict(best[2])
    head.eval()
    return TrainResult(head=head.cpu(), improved=best[1] >= 0 and best[0] > base_dev, base_dev=base_dev, best_dev=best[0],
                       best_epoch=best[1], history=history, n_train=len(train), n_dev=len(dev),
                       seconds={"token_states": round(t_states, 1), "training": round(time.perf_counter() - t0, 1)})


def config_dict(cfg: TrainConfig) -> dict[str, Any]:
    return asdict(cfg)
