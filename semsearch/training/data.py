"""Training pairs: (query, relevant passage) from a BEIR split or a pairs file."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from semsearch.errors import CorpusError, InputError


@dataclass
class PairData:
    queries: list[str]
    passages: list[str]  # the corpus the queries retrieve from
    positives: dict[int, set[int]]  # query index -> relevant passage indices
    negatives: dict[int, list[int]] = field(default_factory=dict)  # given hard negatives, if any
    passage_ids: list[str] | None = None
    query_ids: list[str] | None = None
    checksum: str = ""
    source: str = ""
    dev_queries: list[int] | None = None  # queries held out as given by the data (e.g. a BEIR dev split)
    unlabelled: set[int] = field(default_factory=set)  # pseudo-queries made from the corpus: trained on, never dev
    titles: list[str] | None = None  # each passage's title, where the data has titles (BEIR)
    corpus: dict | None = None  # the corpus trained on, as head.json records it (encoder.heads.corpus_record)

    @property
    def n_pairs(self) -> int:
        return sum(len(v) for v in self.positives.values())


def trained_positive_ids(data: PairData, train: Sequence[int]) -> list[str] | None:
    """Ids of the documents that were labelled positives of the training queries (None without ids)."""
    if data.passage_ids is None:
        return None
    return sorted({data.passage_ids[p] for q in train if q not in data.unlabelled for p in data.positives[q]})


def texts_checksum(*groups: Sequence[str]) -> str:
    h = hashlib.sha256()
    for g in groups:
        for t in g:
            h.update(t.encode("utf-8"))
            h.update(b"\0")
        h.update(b"\1")
    return h.hexdigest()[:16]


def from_beir(folder: str | Path, split: str = "train", dev_split: str | None = None) -> PairData:
    """Pairs from a BEIR split: each judged (query, relevant document); the corpus is the whole
    corpus (so hard negatives and the dev metric see every document). With dev_split, the
    queries of that split are the dev set (a query in both is only dev)."""
    from semsearch.eval import load_beir

    d = load_beir(folder, split)
    pos_of = {pid: i for i, pid in enumerate(d.doc_ids)}
    qids, qtexts, qrels = list(d.query_ids), list(d.query_texts), dict(d.qrels)
    dev: list[int] | None = None
    checksum = d.checksum
    if dev_split is not None:
        if dev_split == split:
            raise InputError(f"--dev-split {dev_split!r} is the training split; name another qrels split")
        dv = load_beir(folder, dev_split)
        q_of = {q: i for i, q in enumerate(qids)}
        dev = []
        for q, text in zip(dv.query_ids, dv.query_texts):
            if q not in q_of:
                q_of[q] = len(qids)
                qids.append(q)
                qtexts.append(text)
            qrels[q] = dv.qrels[q]
            dev.append(q_of[q])
        checksum = texts_checksum([d.checksum, dv.checksum])
    positives = {qi: {pos_of[doc] for doc, rel in qrels[q].items() if rel > 0} for qi, q in enumerate(qids)}
    from semsearch.encoder.heads import corpus_record, document_key

    return PairData(qtexts, d.doc_texts, positives, passage_ids=d.doc_ids, query_ids=qids, checksum=checksum,
                    source=f"{folder} ({split}{', dev ' + dev_split if dev_split else ''})", dev_queries=dev,
                    titles=d.doc_titles, corpus=corpus_record(document_key(i, "") for i in d.doc_ids))


def from_pairs_file(path: str | Path) -> PairData:
    """Pairs from a CSV/TSV with columns query, positive[, negative] (by name, else the first
    two or three columns). Passages are the distinct positives and negatives."""
    import csv

    path = Path(path)
    if not path.exists():
        raise InputError(f"pairs file {str(path)!r} does not exist")
    sep = "\t" if path.suffix.lower() in (".tsv", ".tab") else ","
    queries: list[str] = []
    passages: list[str] = []
    q_of: dict[str, int] = {}
    p_of: dict[str, int] = {}
    positives: dict[int, set[int]] = {}
    negatives: dict[int, list[int]] = {}

    def pid(text: str) -> int:
        if text not in p_of:
            p_of[text] = len(passages)
            passages.append(text)
        return p_of[text]

    with open(path, encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh, delimiter=sep)
        header = next(reader, None)
        if header is None:
            raise InputError(f"{path}: empty")
        names = [h.strip().lower() for h in header]
        cols = [names.index(n) if n in names else i for i, n in enumerate(("query", "positive", "negative"))]
        for fields in reader:
            if not fields:
                continue
            if len(fields) < 2 or not fields[cols[0]].strip() or not fields[cols[1]].strip():
                raise CorpusError(f"{path}: line {reader.line_num}: needs a query and a positive passage")
            q, p = fields[cols[0]].strip(), fields[cols[1]].strip()
            if q not in q_of:
                q_of[q] = len(queries)
                queries.append(q)
            qi = q_of[q]
            positives.setdefault(qi, set()).add(pid(p))
            if len(fields) > cols[2] and len(header) > 2 and fields[cols[2]].strip():
                negatives.setdefault(qi, []).append(pid(fields[cols[2]].strip()))
    if not positives:
        raise InputError(f"{path}: no pairs")
    return PairData(queries, passages, positives, negatives, checksum=texts_checksum(queries, passages), source=str(path))
