"""Dev splits that hold out documents: dev queries whose relevant documents are never training positives.

A head that memorises its training documents looks good on held-out *queries* about those same
documents and can still lose on new ones. Holding out whole groups of queries that share relevant
documents makes the dev figure speak for documents the head never saw as a positive.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class DevSplit:
    train: list[int]  # query indices trained on
    dev: list[int]  # query indices held out
    unseen: list[int]  # the dev queries none of whose relevant documents is a training positive
    kind: str  # "documents" | "queries" | "given" | "none"
    note: str = ""
    stats: dict[str, int] = field(default_factory=dict)
    # The dev queries every one of whose relevant documents is a positive of a training query: how
    # the head does for new queries about the documents it was trained on (see hold_out_seen).
    seen: list[int] = field(default_factory=list)

    def describe(self) -> str:
        what = {"documents": "held-out documents", "queries": "held-out queries (fallback)", "given": "the given dev split",
                "none": "no dev set"}[self.kind]
        s = f"{len(self.train)} train / {len(self.dev)} dev queries ({what}; {len(self.unseen)} with unseen documents"
        s += f", {len(self.seen)} about trained documents)" if self.seen else ")"
        return s + (f"; {self.note}" if self.note else "")


def _components(qids: list[int], positives: dict[int, set[int]]) -> list[list[int]]:
    """Groups of queries linked through shared relevant documents (union-find)."""
    parent = {q: q for q in qids}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    owner: dict[int, int] = {}
    for q in qids:
        for p in positives[q]:
            if p in owner:
                a, b = find(q), find(owner[p])
                if a != b:
                    parent[a] = b
            else:
                owner[p] = q
    groups: dict[int, list[int]] = {}
    for q in qids:
        groups.setdefault(find(q), []).append(q)
    return list(groups.values())


def unseen_queries(queries: list[int], train: list[int], positives: dict[int, set[int]]) -> list[int]:
    """The queries among `queries` none of whose relevant documents is a positive of a `train` query."""
    seen = {p for q in train for p in positives[q]}
    return [q for q in queries if not (positives[q] & seen)]


def split_queries(positives: dict[int, set[int]], fraction: float, rng: np.random.Generator,
                  n_passages: int | None = None) -> DevSplit:
    """Hold out about `fraction` of the queries, as whole groups sharing relevant documents, so
    that no dev query's relevant document is a training positive. Where the queries are so
    interlinked that this cannot reach half the wanted size (training positives covering nearly
    every document, many positives per query), fall back to a plain query split and say so."""
    qids = sorted(positives)
    if fraction <= 0 or len(qids) < 2:
        return DevSplit(qids, [], [], "none")
    target = max(1, int(round(len(qids) * fraction)))
    comps = _components(qids, positives)
    order = rng.permutation(len(comps))
    dev: list[int] = []
    for i in order:
        c = comps[i]
        if len(dev) >= target:
            break
        if len(dev) + len(c) <= max(target * 1.1, target + 1):
            dev += c
    covered = len({p for q in qids for p in positives[q]})
    stats = {"queries": len(qids), "components": len(comps), "largest_component": max(len(c) for c in comps),
             "positive_documents": covered}
    if n_passages:
        stats["documents"] = n_passages
    if len(dev) >= max(1, target // 2) and len(dev) < len(qids):
        dev_set = set(dev)
        train = [q for q in qids if q not in dev_set]
        return DevSplit(train, sorted(dev), sorted(dev), "documents", stats=stats)
    # Fallback: a random query split; the dev queries whose documents happen to be unseen are still reported.
    perm = [qids[i] for i in rng.permutation(len(qids))]
    dev, train = sorted(perm[:target]), sorted(perm[target:])
    cover = f"{covered} of {n_passages} documents" if n_passages else f"{covered} documents"
    note = (f"training positives link {stats['largest_component']} of {len(qids)} queries through shared documents "
            f"(they cover {cover}), so no document split of that size exists: the dev set holds out queries, "
            "and its figure includes documents the head trained on")
    return DevSplit(train, dev, unseen_queries(dev, train, positives), "queries", note, stats,
                    seen=seen_queries(dev, train, positives))


def seen_queries(queries: list[int], train: list[int], positives: dict[int, set[int]]) -> list[int]:
    """The queries among `queries` all of whose relevant documents are positives of `train` queries."""
    trained = {p for q in train for p in positives[q]}
    return [q for q in queries if positives[q] and positives[q] <= trained]


def hold_out_seen(split: DevSplit, positives: dict[int, set[int]], fraction: float, rng: np.random.Generator) -> DevSplit:
    """Also hold out about `fraction` of the queries whose relevant documents stay training
    positives through other training queries (a document with several labelled queries keeps at
    least one in training), so the dev set measures both cases a trained head meets: new
    documents (`unseen`) and new queries about the documents it trained on (`seen`). Only for a
    document split (other kinds already hold out queries, and their seen ones are counted)."""
    if split.kind != "documents" or fraction <= 0:
        return split
    target = max(1, int(round((len(split.train) + len(split.dev)) * fraction)))
    left: dict[int, int] = {}
    for q in split.train:
        for p in positives[q]:
            left[p] = left.get(p, 0) + 1
    seen: list[int] = []
    for i in rng.permutation(len(split.train)):
        q = split.train[int(i)]
        if len(seen) >= target:
            break
        if positives[q] and all(left[p] >= 2 for p in positives[q]):
            for p in positives[q]:
                left[p] -= 1
            seen.append(q)
    if not seen:
        return split
    held = set(seen)
    split.train = [q for q in split.train if q not in held]
    split.dev = sorted(split.dev + seen)
    split.seen = sorted(seen)
    return split


def given_split(train_pos: dict[int, set[int]], dev_queries: list[int]) -> DevSplit:
    """A dev split given by the caller (e.g. a dataset's own dev qrels); dev queries are not trained on."""
    dev_set = set(dev_queries)
    train = sorted(q for q in train_pos if q not in dev_set)
    dev = sorted(dev_set)
    return DevSplit(train, dev, unseen_queries(dev, train, train_pos), "given", seen=seen_queries(dev, train, train_pos))
