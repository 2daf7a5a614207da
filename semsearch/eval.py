"""Retrieval quality on BEIR-format data (trec_eval metrics via pytrec_eval), and pair similarity."""
from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from semsearch.errors import CorpusError, InputError

log = logging.getLogger(__name__)

DEFAULT_KS = (10, 100)


# ---- BEIR data ---------------------------------------------------------------------------
@dataclass
class BeirData:
    folder: Path
    split: str
    doc_ids: list[str]
    doc_texts: list[str]  # title + " " + text, as the standard BEIR evaluation joins them
    query_ids: list[str]  # judged queries only
    query_texts: list[str]
    qrels: dict[str, dict[str, int]]
    missing_docs: int = 0  # judged documents absent from the corpus (ignored)
    unjudged_queries: int = 0
    zero_queries: int = 0  # queries whose relevant documents are all missing: they count as 0, as MTEB averages them
    checksum: str = ""
    doc_titles: list[str] | None = None  # each document's title ("" where it has none)

    def subset(self, n_queries: int | None = None, max_docs: int | None = None) -> "BeirData":
        """A smaller copy: the first n judged queries, and a corpus cut to max_docs that keeps every
        document judged for them (for quick runs and tests)."""
        qids = self.query_ids[:n_queries] if n_queries else self.query_ids
        keep = {d for q in qids for d in self.qrels[q]}
        docs = [(i, t) for i, t in zip(self.doc_ids, self.doc_texts) if i in keep]
        if max_docs:
            docs += [(i, t) for i, t in zip(self.doc_ids, self.doc_texts) if i not in keep][: max(0, max_docs - len(docs))]
        qt = dict(zip(self.query_ids, self.query_texts))
        return BeirData(self.folder, self.split, [d for d, _ in docs], [t for _, t in docs], qids,
                        [qt[q] for q in qids], {q: self.qrels[q] for q in qids}, checksum=self.checksum + f"/sub{n_queries}-{max_docs}",
                        zero_queries=0 if n_queries else self.zero_queries,
                        doc_titles=None if self.doc_titles is None else [dict(zip(self.doc_ids, self.doc_titles))[d] for d, _ in docs])


def _jsonl(path: Path):
    """BEIR records (with an '_id') of a JSONL file, through the corpus reader's line parser."""
    from semsearch.corpus.readers import ReadOptions, Skip, _records_from_lines

    if not path.exists():
        raise InputError(f"{path} not found (a BEIR folder has corpus.jsonl, queries.jsonl, qrels/<split>.tsv)")
    try:
        for lineno, rec in _records_from_lines(path, ReadOptions()):
            if "_id" not in rec:
                raise CorpusError(f"{path}:{lineno}: malformed line: expected a JSON object with an '_id'")
            yield rec
    except Skip as e:
        raise CorpusError(f"{path}: {e}") from e


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    """{query id: {doc id: relevance}} from a BEIR qrels TSV (header line; CRLF or LF)."""
    if not path.exists():
        splits = sorted(p.stem for p in path.parent.glob("*.tsv")) if path.parent.exists() else []
        raise InputError(f"{path} not found; splits here: {', '.join(splits) or 'none'}")
    qrels: dict[str, dict[str, int]] = {}
    with open(path, encoding="utf-8-sig", newline="") as fh:
        for lineno, line in enumerate(fh, 1):
            parts = line.rstrip("\r\n").split("\t")
            if lineno == 1 and not parts[-1].strip().lstrip("-").isdigit():
                continue  # header
            if not line.strip():
                continue
            if len(parts) == 4:  # TREC style: qid 0 docid rel
                parts = [parts[0], parts[2], parts[3]]
            if len(parts) != 3:
                raise CorpusError(f"{path}:{lineno}: expected 3 tab-separated fields (query-id, corpus-id, score), got {len(parts)}")
            q, d, s = (p.strip() for p in parts)
            try:
                qrels.setdefault(q, {})[d] = int(float(s))
            except ValueError as e:
                raise CorpusError(f"{path}:{lineno}: score {s!r} is not a number") from e
    return qrels


def load_beir(folder: str | Path, split: str = "test") -> BeirData:
    """A BEIR-format dataset: judged queries of `split`, the whole corpus, the qrels."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"dataset folder {str(folder)!r} does not exist")
    qrels = read_qrels(folder / "qrels" / f"{split}.tsv")
    ids, texts, titles = [], [], []
    for rec in _jsonl(folder / "corpus.jsonl"):
        ids.append(str(rec["_id"]))
        title, text = str(rec.get("title") or "").strip(), str(rec.get("text") or "").strip()
        texts.append(f"{title} {text}".strip())
        titles.append(title)
    known = set(ids)
    queries = {str(r["_id"]): str(r.get("text", "")) for r in _jsonl(folder / "queries.jsonl")}
    missing = zero = 0
    for q in list(qrels):
        had_relevant = any(v > 0 for v in qrels[q].values())
        for d in [d for d in qrels[q] if d not in known]:
            del qrels[q][d]
            missing += 1
        if q not in queries or not any(v > 0 for v in qrels[q].values()):
            # A judged query whose relevant documents are all missing can find nothing: MTEB
            # averages it in as 0 rather than dropping it, and so do we (zero_queries).
            zero += q in queries and had_relevant
            del qrels[q]
    if missing:
        log.warning("%s: %d judged document(s) are not in the corpus; ignored", folder, missing)
    qids = [q for q in queries if q in qrels]
    if not qids:
        raise InputError(f"{folder}: no query of split {split!r} has a judgement")
    if zero:
        log.warning("%s: %d quer%s judged only on documents missing from the corpus; counted as 0", folder, zero, "y is" if zero == 1 else "ies are")
    return BeirData(folder, split, ids, texts, qids, [queries[q] for q in qids], qrels, missing_docs=missing,
                    unjudged_queries=len(queries) - len(qids) - zero, zero_queries=zero, checksum=_checksum(folder, split),
                    doc_titles=titles)


def _checksum(folder: Path, split: str) -> str:
    h = hashlib.sha256()
    for p in (folder / "corpus.jsonl", folder / "queries.jsonl", folder / "qrels" / f"{split}.tsv"):
        with open(p, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()[:16]


# ---- metrics ----------------------------------------------------------------------------
def trec_metrics(qrels: dict[str, dict[str, int]], run: dict[str, dict[str, float]], ks: Sequence[int] = DEFAULT_KS,
                 zero_queries: int = 0, per_query: dict[str, dict[str, float]] | None = None) -> dict[str, float]:
    """Mean nDCG@k, recall@k, MAP@k, MRR@k (in %, as BEIR reports them) computed by trec_eval.

    MRR@k is trec_eval's reciprocal rank on each query's top k, as BEIR and MTEB define it.
    `zero_queries` more queries count as 0 in every mean. Where `per_query` is a dict, it is
    filled with each query's nDCG@k and recall@k.
    """
    import pytrec_eval

    ks = sorted(set(ks))
    measures = {f"ndcg_cut.{','.join(map(str, ks))}", f"recall.{','.join(map(str, ks))}", f"map_cut.{','.join(map(str, ks))}"}
    run = {q: run.get(q, {}) for q in qrels}
    scores = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
    out: dict[str, float] = {}
    n = len(qrels) + zero_queries
    if per_query is not None:
        for q, sc in scores.items():
            per_query[q] = {f"{m}@{k}": round(100 * sc[f"{t}_{k}"], 2) for k in ks for m, t in (("ndcg", "ndcg_cut"), ("recall", "recall"))}
    for k in ks:
        out[f"ndcg@{k}"] = 100 * sum(s[f"ndcg_cut_{k}"] for s in scores.values()) / n
        out[f"recall@{k}"] = 100 * sum(s[f"recall_{k}"] for s in scores.values()) / n
        out[f"map@{k}"] = 100 * sum(s[f"map_cut_{k}"] for s in scores.values()) / n
        top = {q: dict(sorted(docs.items(), key=lambda x: -x[1])[:k]) for q, docs in run.items()}
        rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top)
        out[f"mrr@{k}"] = 100 * sum(s["recip_rank"] for s in rr.values()) / n
    return out


def exact_search(queries: np.ndarray, docs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top-k: (scores (n, k), indices (n, k)), best first."""
    import faiss

    index = faiss.IndexFlatIP(docs.shape[1])
    index.add(np.ascontiguousarray(docs, np.float32))
    return index.search(np.ascontiguousarray(queries, np.float32), min(k, len(docs)))


def to_run(qids: Sequence[str], doc_ids: Sequence[str], scores: np.ndarray, idx: np.ndarray) -> dict[str, dict[str, float]]:
    run = {}
    for q, srow, irow in zip(qids, scores, idx):
        # BEIR drops a document whose id equals the query's (ignore_identical_ids).
        run[q] = {doc_ids[i]: float(s) for s, i in zip(srow, irow) if i >= 0 and doc_ids[i] != q}
    return run


@dataclass
class EvalReport:
    dataset: str
    split: str
    rows: list[dict[str, Any]] = field(default_factory=list)  # one per pooling / mode / index
    settings: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    per_query: dict[str, dict[str, dict[str, float]]] | None = None  # {"mode/pooling": {query id: {metric: value}}}

    def to_dict(self) -> dict[str, Any]:
        d = {"dataset": self.dataset, "split": self.split, "results": self.rows, "settings": self.settings, "seconds": self.seconds}
        if self.per_query is not None:
            d["per_query"] = self.per_query
        return d


def _encode_many_queries(encoder, texts, poolings) -> dict[str, np.ndarray]:
    """encode_many for queries: 'head' goes through trained query layers where the encoder has them."""
    if getattr(encoder, "query_tower", None) is not None:
        return encoder.encode_many(texts, poolings, progress=False, queries=True)
    return encoder.encode_many(texts, poolings, progress=False)


def evaluate_beir(data: BeirData, encoder, poolings: Sequence[str], ks: Sequence[int] = DEFAULT_KS, progress: bool | None = None,
                  modes: Sequence[str] = ("dense",), fusion: str = "convex", alpha: float | None = None,
                  per_query: bool = False, subsets: dict[str, Sequence[str]] | None = None) -> EvalReport:
    """Exact-search metrics for each pooling and search mode, from one encoder pass over corpus
    and queries. Modes: dense (cosine), lexical (BM25 over the full document text), hybrid (both,
    fused as Retriever.search fuses them). With `subsets` ({name: query ids}), also a row per
    pooling and mode on each subset of the queries."""
    from semsearch import fusion as fusion_

    for m in modes:
        fusion_.check_mode(m)
    fusion_.check_fusion(fusion)
    alpha = fusion_.ALPHA if alpha is None else alpha
    t0 = time.perf_counter()
    dense_modes = [m for m in modes if m != "lexical"]
    docs = encoder.encode_many(data.doc_texts, poolings, progress=progress) if dense_modes else {}
    t1 = time.perf_counter()
    queries = _encode_many_queries(encoder, data.query_texts, poolings) if dense_modes else {}
    t2 = time.perf_counter()
    lex = None
    if "lexical" in modes or "hybrid" in modes:
        from semsearch.store.lexical import LexicalIndex

        lex = LexicalIndex.from_texts(data.doc_texts)
    t3 = time.perf_counter()
    depth = max(max(ks), 100)
    rep = EvalReport(str(data.folder), data.split, settings=_settings(encoder, data))
    rep.settings.update({"modes": list(modes), "ignore_identical_ids": True})
    if "hybrid" in modes:
        rep.settings.update({"fusion": fusion, "alpha": alpha if fusion == "convex" else None, "depth": fusion_.DEPTH})
    per_q: dict[str, dict] | None = {} if per_query else None
    for mode in modes:
        if mode == "lexical":
            run = {q: {data.doc_ids[i]: s for i, s in lex.search(qt, depth)} for q, qt in zip(data.query_ids, data.query_texts)}
            _add_beir_rows(rep, per_q, data, ks, subsets, "lexical", "-", "bm25", _drop_identical(run))
            continue
        for p in poolings:
            scores, idx = exact_search(queries[p], docs[p], depth)
            if mode == "dense":
                _add_beir_rows(rep, per_q, data, ks, subsets, "dense", p, "exact", to_run(data.query_ids, data.doc_ids, scores, idx))
            else:
                run = hybrid_run(data, queries[p], docs[p], scores, idx, lex, depth, fusion, alpha)
                _add_beir_rows(rep, per_q, data, ks, subsets, "hybrid", p, f"exact+bm25 {fusion}", run)
    rep.seconds = {"encode_corpus": round(t1 - t0, 2), "encode_queries": round(t2 - t1, 2), "lexical_index": round(t3 - t2, 2),
                   "total": round(time.perf_counter() - t0, 2)}
    if dense_modes:
        rep.seconds["docs_per_s"] = round(len(data.doc_texts) / max(t1 - t0, 1e-9), 1)
    if per_query:
        rep.per_query = per_q
    return rep


def _add_beir_rows(rep: EvalReport, per_q: dict[str, dict] | None, data: BeirData, ks: Sequence[int],
                   subsets: dict[str, Sequence[str]] | None, name: str, pooling: str, search: str, run: dict) -> None:
    """The rows of one run (a mode with a pooling) into `rep`: over every query, then over each
    subset; its per-query metrics into `per_q` where that is asked for (not None)."""
    pq: dict[str, dict[str, float]] | None = {} if per_q is not None else None
    m = trec_metrics(data.qrels, run, ks, data.zero_queries, pq)
    rep.rows.append({"pooling": pooling, "mode": name, "search": search, **{k: round(v, 2) for k, v in m.items()}})
    for sub, qids in (subsets or {}).items():
        if qids:
            ms = trec_metrics({q: data.qrels[q] for q in qids}, run, ks)
            rep.rows.append({"pooling": pooling, "mode": name, "search": search, "queries": f"{sub} ({len(qids)})",
                             **{k: round(v, 2) for k, v in ms.items()}})
    if per_q is not None:
        per_q[f"{name}/{pooling}"] = pq


def hybrid_run(data: BeirData, qv: np.ndarray, dv: np.ndarray, scores: np.ndarray, idx: np.ndarray, lex, depth: int,
               fusion: str, alpha: float) -> dict[str, dict[str, float]]:
    """A run of fused dense + BM25 scores: the union of each side's top DEPTH documents, each
    scored on both sides, fused (semsearch.fusion, as Retriever.search does)."""
    from semsearch import fusion as fusion_

    run = {}
    n = max(depth, fusion_.DEPTH)
    for qi, (q, qt) in enumerate(zip(data.query_ids, data.query_texts)):
        p = lex.prune(lex.query_hashes(qt), fusion_.DEPTH)
        lids = lex.finish(p)[0]
        c = np.union1d(idx[qi][: fusion_.DEPTH][idx[qi][: fusion_.DEPTH] >= 0], lids).astype(np.int64)
        d = dv[c] @ qv[qi]
        _, _, b, _, held = lex.finish(p, c, terms=True)
        fused = fusion_.all_terms_first(fusion_.fuse(d, b, fusion, alpha), held, p.n_terms)
        best = fusion_.top(c, fused, n)
        run[q] = {data.doc_ids[c[j]]: float(fused[j]) for j in best if data.doc_ids[c[j]] != q}
    return run


def _drop_identical(run: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    # BEIR drops a document whose id equals the query's (ignore_identical_ids).
    return {q: {d: s for d, s in docs.items() if d != q} for q, docs in run.items()}


def encoder_settings(encoder) -> dict[str, Any]:
    """The settings that make an encoder's numbers reproducible."""
    return {
        "model": encoder.name, "model_fingerprint": encoder.fingerprint, "max_length": encoder.max_length,
        "precision": encoder.precision, "device": getattr(encoder, "device", "cpu"),
        "head": getattr(encoder, "head_info", None),
    }


def _settings(encoder, data: BeirData) -> dict[str, Any]:
    return {
        **encoder_settings(encoder), "dataset_checksum": data.checksum,
        "queries": len(data.query_ids) + data.zero_queries, "documents": len(data.doc_ids),
        "missing_judged_docs": data.missing_docs, "unjudged_queries": data.unjudged_queries,
        "zero_queries": data.zero_queries,
    }


def evaluate_index(data: BeirData, retriever, ks: Sequence[int] = DEFAULT_KS, id_field: str = "_id",
                   modes: Sequence[str] = ("dense",), fusion: str = "convex", alpha: float | None = None,
                   subsets: dict[str, Sequence[str]] | None = None) -> EvalReport:
    """Metrics of an existing index as built (its model, pooling, head, index type), with the
    index's recall@k against exact search over its own stored vectors. `modes` other than dense
    (lexical, hybrid) are searched as Retriever.search searches them, a row each. With `subsets`
    ({name: query ids}), also a row per subset of each.

    Chunks map to BEIR documents through the metadata field `id_field`, or, for a chunk of a
    whole file without it (a PDF, an HTML page), through the file's name: `<doc id>.pdf`.
    A document scores its best chunk.
    """
    t0 = time.perf_counter()
    from semsearch.search import encode_queries

    qv = encode_queries(retriever.encoder, data.query_texts)
    depth = max(max(ks), 100)
    per_chunk = max(depth * 3, 300)
    approx_s, approx_i = retriever.vectors.search(qv, per_chunk)
    ids, vecs = zip(*retriever.docs.iter_vectors()) if len(retriever) else ((), ())
    all_ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    exact_s, exact_pos = exact_search(qv, np.concatenate(vecs), per_chunk)
    exact_i = all_ids[exact_pos]
    doc_of = _chunk_doc_ids(retriever, id_field)
    runs: dict[str, dict] = {}
    rep = EvalReport(str(data.folder), data.split, settings=_settings(retriever.encoder, data))
    rep.settings["index"] = str(retriever.folder)
    rep.settings["index_type"] = retriever.manifest.index.get("type", "flat")
    pooling = retriever.manifest.pooling
    for name, s, i in (("index", approx_s, approx_i), ("exact", exact_s, exact_i)):
        runs[name] = _best_chunk_run(data.query_ids, (zip(srow, irow) for srow, irow in zip(s, i)), doc_of)
        _add_index_row(rep, data, ks, pooling, name, runs[name])
    for k in ks:
        a, e = approx_i[:, :k], exact_i[:, :k]
        rep.rows[0][f"ann_recall@{k}"] = round(float(np.mean([len(set(x) & set(y)) / max(len(set(y)), 1) for x, y in zip(a, e)])), 4)
    for mode in [m for m in modes if m != "dense"]:
        found = retriever.search_batch(data.query_texts, per_chunk, mode=mode, fusion=fusion, alpha=alpha)
        runs[mode] = _best_chunk_run(data.query_ids, (((h.score, h.id) for h in hits) for hits in found), doc_of)
        _add_index_row(rep, data, ks, pooling, mode, runs[mode])
    for sub, qids in (subsets or {}).items():
        for name, run in runs.items():
            if qids:
                ms = trec_metrics({q: data.qrels[q] for q in qids}, run, ks)
                rep.rows.append({"pooling": pooling, "search": name, "queries": f"{sub} ({len(qids)})",
                                 **{k: round(v, 2) for k, v in ms.items()}})
    rep.seconds = {"total": round(time.perf_counter() - t0, 2)}
    return rep


def _best_chunk_run(query_ids: Sequence[str], ranked, doc_of: dict[int, str]) -> dict[str, dict[str, float]]:
    """A run of documents from each query's ranked chunks ((score, chunk id) each): a document
    scores its best chunk; a chunk of no known document, or of the query's own id, is left out."""
    run = {}
    for q, chunks in zip(query_ids, ranked):
        best: dict[str, float] = {}
        for sc, cid in chunks:
            d = doc_of.get(int(cid))
            if d is not None and d != q and sc > best.get(d, -2.0):
                best[d] = float(sc)
        run[q] = best
    return run


def _add_index_row(rep: EvalReport, data: BeirData, ks: Sequence[int], pooling: str, search: str, run: dict) -> None:
    """The row of one run of evaluate_index over every query."""
    m = trec_metrics(data.qrels, run, ks, data.zero_queries)
    rep.rows.append({"pooling": pooling, "search": search, **{k: round(v, 2) for k, v in m.items()}})


DOCUMENT_NAMED_EXTS = {".pdf", ".html", ".htm", ".xhtml", ".docx", ".txt", ".md"}


def _chunk_doc_ids(retriever, id_field: str) -> dict[int, str]:
    out = {}
    for cid, meta, row, path in retriever.docs.select("c.metadata, c.row, f.path"):
        m = json.loads(meta) if meta else {}
        if id_field in m:
            out[cid] = str(m[id_field])
        elif row is None and Path(path).suffix.lower() in DOCUMENT_NAMED_EXTS:
            out[cid] = Path(path).stem  # one file a document, named by its id
    if not out:
        raise InputError(f"{retriever.folder}: no chunk carries a {id_field!r} metadata field; index the dataset's corpus.jsonl to evaluate it")
    return out


# ---- sentence pairs ---------------------------------------------------------------------
def load_pairs(path: str | Path, columns: Sequence[str] | None = None) -> tuple[np.ndarray, list[str], list[str]]:
    """(gold scores, sentences 1, sentences 2) from a TSV/CSV. `columns`: names or 0-based
    positions of score, sentence1, sentence2 (default: those names, else the first three columns)."""
    import pandas as pd

    path = Path(path)
    if not path.exists():
        raise InputError(f"pairs file {str(path)!r} does not exist")
    sep = "\t" if path.suffix.lower() in (".tsv", ".tab") else ","
    try:
        df = pd.read_csv(path, sep=sep, dtype=str, keep_default_na=False, quoting=3 if sep == "\t" else 0)
    except Exception as e:  # noqa: BLE001 - pandas parser errors
        raise CorpusError(f"{path}: cannot parse: {e}") from e
    names = list(columns) if columns else ["score", "sentence1", "sentence2"]
    if len(names) != 3:
        raise InputError("--pair-columns takes three names or positions: score,sentence1,sentence2")
    cols = []
    for n in names:
        if n in df.columns:
            cols.append(n)
        elif str(n).isdigit() and int(n) < len(df.columns):
            cols.append(df.columns[int(n)])
        elif not columns and len(df.columns) >= 3:
            cols = list(df.columns[:3])
            break
        else:
            raise InputError(f"{path}: no column {n!r}; it has: {', '.join(df.columns)}")
    try:
        gold = df[cols[0]].astype(float).to_numpy()
    except ValueError as e:
        raise CorpusError(f"{path}: score column {cols[0]!r} is not numeric: {e}") from e
    return gold, df[cols[1]].tolist(), df[cols[2]].tolist()


def evaluate_pairs(path: str | Path, encoder, poolings: Sequence[str], columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Spearman and Pearson (×100) of cosine similarity against gold scores, per pooling."""
    from scipy.stats import pearsonr, spearmanr

    gold, a, b = load_pairs(path, columns)
    if len(gold) < 2:
        raise InputError(f"{path}: need at least two pairs")
    va = encoder.encode_many(a, poolings, progress=False)
    vb = encoder.encode_many(b, poolings, progress=False)
    rows = []
    for p in poolings:
        cos = (va[p] * vb[p]).sum(1)
        rows.append({"pooling": p, "pairs": len(gold), "spearman": round(100 * float(spearmanr(cos, gold).statistic), 2),
                     "pearson": round(100 * float(pearsonr(cos, gold).statistic), 2)})
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table of result rows (same keys in each)."""
    if not rows:
        return "(no results)"
    keys = list(rows[0])
    for r in rows[1:]:
        keys += [k for k in r if k not in keys]
    cells = [[str(r.get(k, "")) for k in keys] for r in rows]
    w = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    line = lambda vals: "  ".join(v.rjust(w[i]) if i else v.ljust(w[i]) for i, v in enumerate(vals))  # noqa: E731
    return "\n".join([line(keys), line(["-" * x for x in w])] + [line(c) for c in cells])
