"""The library's front door: one function per command of the CLI, which is a thin layer over them.

    >>> import semsearch
    >>> report = semsearch.index("data/sample", "indexes/doc-example", progress=False)
    >>> report.chunks > 0
    True
    >>> hits = semsearch.Retriever.load("indexes/doc-example").search("how long does a loan decision take?", k=3)
    >>> len(hits)
    3

`evaluate` and `train` take the same options as `semsearch eval` and `semsearch train`, by the
same names. Errors are typed (semsearch.errors); nothing here prints: long work shows a progress
bar where `progress` allows it, and `log` (a callable taking one line) receives what a person
watching would want to read.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from semsearch.errors import InputError, SemsearchError

Log = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


# ---- index ---------------------------------------------------------------------------------------
def index(
    corpus: str | os.PathLike,
    index: str | os.PathLike | None = None,
    *,
    model: str | None = None,
    pooling: str | None = None,
    head: str | os.PathLike | None = None,
    device: str = "auto",
    precision: str = "auto",
    chunk_tokens: int | None = None,
    overlap: int | None = None,
    text_column: str | None = None,
    skip_errors: bool = False,
    checksum: bool = False,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    rebuild: bool = False,
    keep_states: bool = False,
    index_type: str = "auto",
    target_recall: float = 0.95,
    max_bytes_per_vector: int | None = None,
    vector_storage: str | None = None,
    engine: str = "local",
    ray_address: str | None = None,
    workers: int | None = None,
    force: bool = False,
    progress: bool | None = None,
    shards: int | None = None,
):
    """Index the files under `corpus` (a folder or one file) into the index folder `index`
    (default: $SEMSEARCH_INDEX, else ./indexes/default); an existing index is updated: only new
    or changed files are embedded, deleted ones removed. A `head` trained on another corpus is
    refused (HeadCorpusMismatch) unless `force`. `vector_storage`: "fp16" stores the full vectors
    at half the size (default: the index's; "fp32" for a new one). `shards`: a new index partitioned
    by document into this many (`serve --shards N`: one each). Gives back the IndexReport.

    >>> semsearch.index("data/sample", "indexes/doc-example", include=["*.md"], rebuild=True, progress=False).added > 0
    True
    """
    from semsearch.corpus import ReadOptions
    from semsearch.engines import make_engine
    from semsearch.indexing import VectorSettings, encoder_for_index, index_corpus, load_base, resolve_chunking, scan_corpus
    from semsearch.store import index_path

    corpus = Path(corpus)
    folder = index_path(index)
    if not corpus.exists():  # before loading a model
        raise InputError(f"corpus path {str(corpus)!r} does not exist")
    found = scan_corpus(corpus, include, exclude)  # an empty or unreadable corpus fails before the model loads
    runner = make_engine(engine, ray_address if engine == "ray" else None, workers)
    base = load_base(folder, rebuild)
    enc = encoder_for_index(base, model, pooling, Path(head) if head is not None else None, device, precision)
    chunking = resolve_chunking(base, enc, chunk_tokens, overlap)
    if vector_storage not in (None, "fp32", "fp16"):
        raise InputError(f"vector_storage {vector_storage!r}: use 'fp32' or 'fp16'")
    vs = VectorSettings(index_type=index_type, target_recall=target_recall, max_bytes_per_vector=max_bytes_per_vector, device=device,
                        storage=vector_storage)
    return index_corpus(corpus, folder, enc, chunking, ReadOptions(text_column, skip_errors), rebuild, progress,
                        keep_states=keep_states, vectors=vs, checksum=checksum, found=found, engine=runner, force=force,
                        shards=shards)


# ---- evaluate ------------------------------------------------------------------------------------
def evaluate(
    dataset: str | os.PathLike | None = None,
    *,
    split: str = "test",
    pooling: Sequence[str] | None = None,
    head: str | os.PathLike | None = None,
    model: str | None = None,
    k: Sequence[int] = (10, 100),
    index: str | os.PathLike | None = None,
    pairs: str | os.PathLike | None = None,
    pair_columns: Sequence[str] | None = None,
    max_queries: int | None = None,
    max_docs: int | None = None,
    device: str = "auto",
    precision: str = "auto",
    max_length: int | None = None,
    modes: Sequence[str] | None = None,
    fusion: str = "convex",
    alpha: float | None = None,
    per_query: bool = False,
    force: bool = False,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Retrieval quality on a BEIR-format `dataset` folder (nDCG, recall, MAP, MRR at each `k`,
    in %, by trec_eval), of the model with each pooling (and `head`) by exact search, or of an
    index as built (`index`); and/or pair similarity on a `pairs` file. Gives back the report as
    a dict (what `semsearch eval --json` prints): `results` holds every row (a pair row has
    `pairs`, `spearman` and `pearson`), `settings` how they were made, `notes` what the rows
    cannot show (e.g. why there are no unseen-document rows).

    A `head` trained on another corpus than the dataset's is refused (HeadCorpusMismatch), as
    `index` refuses it, unless `force`.

    >>> rep = semsearch.evaluate("data/tiny-beir", pooling=["mean", "cls"], k=[1, 10], progress=False)
    >>> sorted(row["pooling"] for row in rep["results"])
    ['cls', 'mean']
    """
    from semsearch.indexing import encoder_for_index

    cutoffs = _eval_cutoffs(k)
    if dataset is None and pairs is None:
        raise InputError("give a BEIR dataset folder, or --pairs FILE")
    if index is not None:
        return _evaluate_index(dataset, split, index, cutoffs, max_queries=max_queries, max_docs=max_docs, device=device,
                               modes=modes, fusion=fusion, alpha=alpha)
    data, share = _eval_dataset(dataset, split, head, force, max_queries, max_docs)
    enc = encoder_for_index(None, model, None, Path(head) if head is not None else None, device, precision, max_length)
    names = list(pooling or ["mean"]) + (["head"] if head is not None else [])
    report: dict[str, Any] = {}
    notes: list[str] = []
    if data is not None:
        report = _beir_report(data, enc, names, cutoffs, head, split, share, notes, progress=progress, modes=modes,
                              fusion=fusion, alpha=alpha, per_query=per_query)
    if pairs is not None:
        report = _add_pair_rows(report, pairs, pair_columns, enc, names)
    report["notes"] = notes
    return report


def _eval_cutoffs(k: Sequence[int]) -> list[int]:
    """The distinct cutoffs of k, ascending; InputError where there is none or one is below 1."""
    cutoffs = sorted({int(x) for x in k})
    if not cutoffs or min(cutoffs) < 1:
        raise InputError(f"cutoffs must be positive integers, got {list(k)}")
    return cutoffs


def _eval_subset(data, max_queries: int | None, max_docs: int | None):
    """The dataset cut to max_queries queries and max_docs documents, where either is given."""
    return data.subset(max_queries, max_docs) if (max_queries or max_docs) else data


def _evaluate_index(dataset: str | os.PathLike | None, split: str, index: str | os.PathLike, cutoffs: list[int], *,
                    max_queries: int | None, max_docs: int | None, device: str, modes: Sequence[str] | None, fusion: str,
                    alpha: float | None) -> dict[str, Any]:
    """evaluate's report on an index as built, with unseen-document rows where its head records its documents."""
    from semsearch import eval as ev
    from semsearch.search import Retriever

    if dataset is None:
        raise InputError("--index needs a BEIR dataset folder to evaluate against")
    data = _eval_subset(ev.load_beir(Path(dataset), split), max_queries, max_docs)
    r = Retriever.load(index, device=device)
    try:
        # An index is evaluated as built in every mode it offers, unless modes are named.
        every = ["dense", "lexical", "hybrid"] if r.default_mode == "hybrid" else ["dense"]
        notes: list[str] = []
        subsets = None
        if r.manifest.head and Path(r.manifest.head["path"]).is_dir():  # rows for the documents it never trained on
            subsets = _unseen_subsets(r.manifest.head["path"], data.qrels, split, notes)
        report = ev.evaluate_index(data, r, cutoffs, modes=list(modes or every), fusion=fusion, alpha=alpha,
                                   subsets=subsets).to_dict()
        report["notes"] = notes
        return report
    finally:
        r.close()


def _eval_dataset(dataset: str | os.PathLike | None, split: str, head: str | os.PathLike | None, force: bool,
                  max_queries: int | None, max_docs: int | None) -> tuple[Any, float | None]:
    """(the BEIR dataset, cut as asked; the share of the head's training documents in its corpus), None where not given."""
    from semsearch import eval as ev

    data = share = None
    if dataset is not None:
        full = ev.load_beir(Path(dataset), split)  # before the model loads: a bad folder fails fast
        if head is not None:  # the whole corpus, not a --max-docs cut of it
            share = _check_eval_head(Path(head), full, force)
        data = _eval_subset(full, max_queries, max_docs)
    return data, share


def _beir_report(data, enc, names: list[str], cutoffs: list[int], head: str | os.PathLike | None, split: str,
                 share: float | None, notes: list[str], *, progress: bool | None, modes: Sequence[str] | None, fusion: str,
                 alpha: float | None, per_query: bool) -> dict[str, Any]:
    """evaluate's report on a BEIR dataset by exact search, with unseen-document rows for a head."""
    from semsearch import eval as ev

    subsets = _unseen_subsets(head, data.qrels, split, notes) if head is not None else None
    report = ev.evaluate_beir(data, enc, names, cutoffs, progress=progress, modes=list(modes or ["dense"]),
                              fusion=fusion, alpha=alpha, per_query=per_query, subsets=subsets).to_dict()
    if share is not None:
        report["settings"]["head_corpus_share"] = round(share, 3)
    return report


def _add_pair_rows(report: dict[str, Any], pairs: str | os.PathLike, pair_columns: Sequence[str] | None, enc,
                   names: list[str]) -> dict[str, Any]:
    """The report with the pairs file's similarity rows added (a report of them alone where it is empty)."""
    import time

    from semsearch import eval as ev

    t0 = time.perf_counter()
    cols = list(pair_columns) if pair_columns else None
    rows = ev.evaluate_pairs(Path(pairs), enc, names, cols)
    settings = ev.encoder_settings(enc)
    if not report:  # pairs alone: the same layout as a retrieval report
        report = {"dataset": str(pairs), "split": None, "results": [], "settings": settings,
                  "seconds": {"total": round(time.perf_counter() - t0, 2)}}
    report["results"] = report["results"] + rows
    report["pairs_file"] = str(pairs)
    # The earlier layout of pair rows, kept as an alias for existing readers of `pairs.results`.
    report["pairs"] = {"file": str(pairs), "results": rows, "settings": settings}
    return report


def _check_eval_head(head: Path, data, force: bool) -> float | None:
    """The share of the head's training documents in the dataset's corpus (None: it records no
    corpus); a head trained on another corpus: HeadCorpusMismatch unless force, as `index` does."""
    from semsearch.encoder.heads import check_head_corpus, document_key

    return check_head_corpus(head, (document_key(d, "") for d in data.doc_ids), force,
                             where="this dataset's corpus", train=f"semsearch train --beir {data.folder}")


def _unseen_subsets(head: str | os.PathLike, qrels: dict[str, dict[str, int]], split: str,
                    notes: list[str]) -> dict[str, list[str]] | None:
    """{'unseen documents': the queries none of whose relevant documents the head trained on}, or
    None; where there are no such rows, the reason is added to notes."""
    from semsearch.encoder.heads import unseen_document_queries

    unseen = unseen_document_queries(head, qrels)
    if unseen is None:
        notes.append("no unseen-document rows: the head does not record the documents it was trained on "
                     "(trained on a pairs file, or written before the record existed)")
        return None
    if not unseen:
        notes.append(f"no unseen-document rows: all {len(qrels)} {split} queries have a relevant document "
                     "the head was trained on")
    return {"unseen documents": unseen}


# ---- train ---------------------------------------------------------------------------------------
class NotImproved(SemsearchError):
    """A trained result that the dev set did not check, or that did not beat the base model there:
    nothing was saved (pass force=True to save it anyway)."""


@dataclass
class TrainReport:
    """What `train` made: the head folder's {'path', 'fingerprint'}, the one-line verdict on the
    dev set, each dev check, and whether it beat the base model there. `forced`: saved only
    because of force (it did not beat the base model, or no dev set checked it); `note` says so
    in words, with the dev figures ("" otherwise)."""

    head: dict[str, Any]
    kind: str  # 'query-layers' or 'pooling'
    verdict: str
    improved: bool
    history: list[dict[str, Any]] = field(default_factory=list)
    forced: bool = False
    note: str = ""


def train(
    out: str | os.PathLike,
    *,
    beir: str | os.PathLike | None = None,
    split: str = "train",
    dev_split: str | None = None,
    pairs: str | os.PathLike | None = None,
    index: str | os.PathLike | None = None,
    train_layers: int = 2,
    pseudo_queries: bool | None = None,
    model: str | None = None,
    epochs: int | None = None,
    patience: int | None = None,
    batch_size: int = 64,
    positives_per_query: int = 2,
    lr: float | None = None,
    weight_decay: float | None = None,
    scale: float = 20.0,
    hard_negatives: int = 1,
    neg_skip: int = 3,
    neg_depth: int = 50,
    symmetric: bool = False,
    projection: str = "none",
    dev_fraction: float = 0.2,
    seen_fraction: float = 0.1,
    seed: int = 0,
    mode: str = "dense",
    cache: str | os.PathLike | None = "indexes/.cache",
    force: bool = False,
    device: str = "auto",
    precision: str = "auto",
    progress: bool | None = None,
    log: Log = _quiet,
) -> TrainReport:
    """Fine-tune contrastively on (query, relevant passage) pairs from a BEIR dataset (`beir`), a
    pairs file (`pairs`), or the corpus of `index` alone (its titles / first sentences as
    queries), and save the result to the folder `out`. `train_layers` > 0 trains the top layers of
    the query encoder (documents keep their vectors); 0 trains an attention-pooling head on cached
    token states. The dev set holds queries on documents training never saw; a result that does
    not beat the base model there raises NotImproved and saves nothing, unless `force`. `mode`
    (query layers): the search mode trained for and judged on the dev set, "dense" (the default,
    chosen on two datasets) or "hybrid". `seen_fraction` (query layers): the share of queries also held out about
    documents that stay training positives; checks are then ranked on the whole dev set, never
    below the base model on the held-out documents.

    >>> rep = semsearch.train("heads/doc-example", beir="data/tiny-beir", epochs=1,
    ...                       dev_fraction=0.5, force=True, progress=False)
    >>> rep.kind, Path(rep.head["path"]).name
    ('query-layers', 'doc-example')
    """
    _check_train_sources(beir, pairs, dev_split)
    args = dict(beir=_as_path(beir), split=split, dev_split=dev_split, pairs=_as_path(pairs), index=_as_path(index), model=model,
                batch_size=batch_size, positives_per_query=positives_per_query, scale=scale, dev_fraction=dev_fraction, seed=seed,
                cache=_as_path(cache), device=device, precision=precision, progress=progress, log=log)
    if train_layers > 0:
        return _query_layers_report(Path(out), train_layers, pseudo_queries, epochs, patience, lr, weight_decay, force, mode,
                                    seen_fraction, args)
    return _pooling_head_report(Path(out), pseudo_queries, epochs, patience, lr, weight_decay, hard_negatives, neg_skip,
                                neg_depth, symmetric, projection, force, args)


def _check_train_sources(beir: str | os.PathLike | None, pairs: str | os.PathLike | None, dev_split: str | None) -> None:
    """Refuse what train cannot combine: a BEIR dataset with a pairs file, or a dev split without a BEIR dataset."""
    if beir is not None and pairs is not None:
        raise InputError("give one of --beir DATASET or --pairs FILE, not both")
    if dev_split is not None and beir is None:
        raise InputError("--dev-split needs --beir")


def _as_path(p: str | os.PathLike | None) -> Path | None:
    """p as a Path; None stays None."""
    return Path(p) if p is not None else None


def _query_layers_report(out: Path, layers: int, pseudo_queries, epochs, patience, lr, weight_decay, force: bool, mode: str,
                         seen_fraction: float, args: dict[str, Any]) -> TrainReport:
    """train with train_layers > 0: the top query layers trained for a dense or hybrid mode, saved and reported."""
    from semsearch.fusion import check_mode

    if check_mode(mode) == "lexical":
        raise InputError("--mode lexical: BM25 has nothing to train; give hybrid or dense")
    res, info = _train_query_layers(out, layers, pseudo_queries, epochs, patience, lr, weight_decay, force, mode,
                                    seen_fraction=seen_fraction, **args)
    note = _forced_note(res, "the trained query layers", f"the base model ({mode})", "they were")
    return _train_report(res, info, "query-layers", note)


def _pooling_head_report(out: Path, pseudo_queries, epochs, patience, lr, weight_decay, hard_negatives, neg_skip, neg_depth,
                         symmetric, projection, force: bool, args: dict[str, Any]) -> TrainReport:
    """train with train_layers 0: an attention-pooling head trained, saved and reported."""
    res, info = _train_pooling_head(out, pseudo_queries, epochs, patience, lr, weight_decay, hard_negatives, neg_skip,
                                    neg_depth, symmetric, projection, force, **args)
    note = _forced_note(res, "the head", "mean pooling", "it was")
    return _train_report(res, info, "pooling", note)


def _train_report(res, info: dict[str, Any], kind: str, note: str) -> TrainReport:
    """The TrainReport of a saved result; `forced` where the note says force alone saved it."""
    return TrainReport(head=info, kind=kind, verdict=res.verdict(), improved=res.improved, history=list(res.history),
                       forced=bool(note), note=note)


def _gate(res, force: bool, log: Log, what: str, base: str, were: str, them: str) -> None:
    """Log the dev checks; refuse (nothing saved) a result no dev set checked or that did not beat
    the base there, unless force."""
    for row in res.history:
        log("  " + ", ".join(f"{k} {v}" for k, v in row.items()))
    verdict = res.verdict()
    if res.gate == "none" and not force:
        raise NotImproved(f"no dev set (--dev-fraction 0), so nothing checked {what} and {were} not saved ({verdict}). "
                          f"Use --force to save {them} anyway.")
    if not res.improved and not force:
        beyond = (" of real queries: it had no labelled pairs" if getattr(res, "proxy", False)
                  else " by more than the gain's own noise" if _within_noise(res)
                  else " on enough dev queries to tell" if getattr(res, "too_few", lambda: False)() and res.noise.get("gain", 0) > 0
                  else "")
        raise NotImproved(f"{what} did not beat {base} on the {'unseen-document ' if res.gate == 'unseen' else ''}dev set{beyond}, "
                          f"so {were} not saved ({verdict}). Use --force to save {them} anyway.")


def _within_noise(res) -> bool:
    """Whether a result beat the base on dev by no more than its paired standard error (query layers' gate)."""
    return bool(getattr(res, "within_noise", lambda: False)())


def _forced_note(res, what: str, base: str, were: str) -> str:
    """A result saved only because of force, in words with its dev figures; "" for one that beat the base."""
    if res.gate == "none":
        return (f"{what} {were.split()[1]} not checked: no dev set (--dev-fraction 0), so nothing shows an improvement on "
                f"{base}; {were} saved only because of --force (head.json records improved_on_dev: false)")
    if res.improved:
        return ""
    key = getattr(res, "rank", "") or res.gate  # the dev figure a result must beat the base on
    part = {"unseen": "the unseen-document dev split", "dev": "the dev split"}.get(key, f"the {key} dev split")
    n = len(res.split.unseen) if key == "unseen" else len(res.split.dev)
    if key in res.base and key in res.best:
        figs = f"nDCG@10 {res.base[key]:.2f} for {base} -> {res.best[key]:.2f} trained, on {n} queries"
    else:
        figs = f"nDCG@10 {res.base.get(key, float('nan')):.2f} for {base}; no trained check to compare, on {n} queries"
    if _within_noise(res):
        n_ = res.noise
        figs += f"; a gain of {n_['gain']:+.2f} +/- {n_['se']:.2f} is within its noise"
    return (f"{what} did not improve on {part} ({figs}): {were} saved only because of --force "
            "(head.json records improved_on_dev: false)")


def _train_pooling_head(out, pseudo_queries, epochs, patience, lr, weight_decay, hard_negatives, neg_skip, neg_depth,
                        symmetric, projection, force, *, beir, split, dev_split, pairs, index, model, batch_size,
                        positives_per_query, scale, dev_fraction, seed, cache, device, precision, progress, log):
    import numpy as np

    from semsearch.encoder.encoder import Encoder
    from semsearch.training import data as td
    from semsearch.training.head import save_head
    from semsearch.training.trainer import TrainConfig, config_dict, train_head

    pseudo_queries = bool(pseudo_queries)
    epochs, patience, lr = epochs or 10, patience or 2, lr if lr is not None else 2e-3
    unlabelled_only = beir is None and pairs is None
    if unlabelled_only and (index is None or not pseudo_queries):
        raise InputError("give --beir DATASET or --pairs FILE, or --index DIR --pseudo-queries to train on the corpus alone")
    if pseudo_queries and index is None:
        raise InputError("--pseudo-queries needs --index DIR (an index built with --keep-states)")
    if unlabelled_only:
        data = td.PairData([], [], {}, checksum="", source=f"{index} (unlabelled)")
    else:
        data = td.from_beir(beir, split, dev_split) if beir is not None else td.from_pairs_file(pairs)
    cfg = TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, weight_decay=weight_decay or 0.0, scale=scale,
                      hard_negatives=hard_negatives, neg_skip=neg_skip, neg_depth=neg_depth, symmetric=symmetric,
                      projection=projection, positives_per_query=positives_per_query, patience=patience,
                      dev_fraction=dev_fraction, seed=seed)
    enc = Encoder(model, device=device, precision=precision)
    log(f"training on {data.source}: {len(data.queries)} queries, {data.n_pairs} pairs, {len(data.passages)} passages")
    passages = None
    if index is not None:
        from semsearch.training.index_states import add_pseudo_queries, index_chunks, passage_states
        from semsearch.training.states import StateCache

        if data.passages:
            got = passage_states(index, data.passages, data.passage_ids, enc, progress)
            passages = got.passages
            log(f"token states of {got.from_index} passages from {index}" + (f", {got.encoded} encoded" if got.encoded else ""))
        else:
            passages = StateCache.from_spans([], np.zeros((0, 3), np.int64))
        if pseudo_queries:
            data, passages = add_pseudo_queries(data, passages, index_chunks(index, enc), seed=seed)
            if unlabelled_only:  # no labels: the pseudo-queries are the dev set too (a proxy task)
                data.unlabelled = set()
                data.checksum = td.texts_checksum(data.queries, data.passages)
            log(f"{len(data.queries)} queries with the corpus's pseudo-queries, {len(data.passages)} passages")
    res = train_head(data, enc, cfg, cache, progress, passages=passages)
    _gate(res, force, log, "the head", "mean pooling", "it was", "it")
    info = save_head(res.head, out, {
        "base_model": enc.name, "base_model_fingerprint": enc.fingerprint, "max_length": enc.max_length,
        "training_data": data.source, "training_data_checksum": data.checksum, "hyperparameters": config_dict(cfg),
        "metrics": res.metrics(), "improved_on_dev": res.improved,
    }, positive_ids=td.trained_positive_ids(data, res.split.train))
    return res, info


def _train_query_layers(out, layers, pseudo_queries, epochs, patience, lr, weight_decay, force, mode, *, beir, split, dev_split,
                        pairs, index, model, batch_size, positives_per_query, scale, dev_fraction, seed, cache, device, seen_fraction,
                        precision, progress, log):
    """See semsearch/training/query_tower.py."""
    import numpy as np

    from semsearch.encoder.encoder import Encoder
    from semsearch.training import data as td
    from semsearch.training import query_tower as qt
    from semsearch.training.trainer import TrainConfig, make_split

    pseudo_queries = True if pseudo_queries is None else pseudo_queries
    unlabelled_only = beir is None and pairs is None
    if unlabelled_only and (index is None or not pseudo_queries):
        raise InputError("give --beir DATASET or --pairs FILE, or --index DIR (with pseudo-queries) to train on the corpus alone")
    cfg = qt.TowerConfig(layers=layers, epochs=epochs or 5, patience=patience or 3, batch_size=batch_size,
                         lr=lr if lr is not None else 4e-5, weight_decay=0.01 if weight_decay is None else weight_decay, scale=scale,
                         positives_per_query=positives_per_query, pseudo_queries=pseudo_queries, seed=seed, mode=mode)
    enc = Encoder(model, device=device, precision=precision)
    if enc.backend != "native":
        raise InputError("--train-layers needs a BERT-family model on the native encoder; use --train-layers 0 for this model")
    if unlabelled_only:
        data = qt.index_passages(index)
    else:
        data = td.from_beir(beir, split, dev_split) if beir is not None else td.from_pairs_file(pairs)
    log(f"training on {data.source}: {len(data.queries)} queries, {data.n_pairs} pairs, {len(data.passages)} passages")
    if index is not None:
        pvec, found = qt.index_vectors(index, data, enc)
        log(f"vectors of {found} of {len(data.passages)} passages from {index}")
    else:
        pvec = qt.passage_vectors(enc, data, cache, progress)
    n_pseudo = 0
    if pseudo_queries:
        data, n_pseudo = qt.add_corpus_queries(data, data.titles)
        if unlabelled_only:  # no labels: the pseudo-queries are the dev set too (a proxy task)
            data.unlabelled = set()
        titled = sum(1 for t in data.titles or () if qt.title_query(t))
        source = "titles" if titled == len(data.passages) else ("titles, else first sentences" if titled else "first sentences")
        log(f"+ {n_pseudo} pseudo-queries from the corpus ({source})")
    sp = make_split(data, TrainConfig(dev_fraction=dev_fraction, seed=seed), np.random.default_rng(seed), seen_fraction)
    if not sp.train:
        raise InputError("too few training queries after holding out the dev set")
    if sp.note:
        log(f"note: {sp.note}")
    res = qt.train_query_tower(data, enc, pvec, cfg, sp, progress, pseudo=n_pseudo)
    if unlabelled_only:
        res.refuse_proxy()
    _gate(res, force, log, "the trained query layers", f"the base model ({mode})", "they were", "them")
    info = qt.save_tower(res.tower, out, {
        "base_model": enc.name, "base_model_fingerprint": enc.fingerprint, "max_length": enc.max_length, "doc_pooling": enc.pooling,
        "training_data": data.source, "training_data_checksum": data.checksum, "hyperparameters": qt.config_dict(cfg),
        "metrics": res.metrics(), "improved_on_dev": res.improved,
    }, positive_ids=td.trained_positive_ids(data, res.split.train))
    return res, info


# ---- info ----------------------------------------------------------------------------------------
def verify(index: str | os.PathLike | None = None) -> list[str]:
    """Every problem found by reading every byte of an index folder (hashes, SQLite's integrity
    check, FAISS and SQLite id sets); an empty list: the index is whole."""
    from semsearch.store import index_path
    from semsearch.store.folder import verify as verify_folder

    return verify_folder(index_path(index))


def tune(index: str | os.PathLike | None = None, target_recall: float = 0.95) -> dict[str, Any]:
    """Tune an index's approximate search again to `target_recall` (recall@10 against exact
    search), as a build does, publishing only a new manifest; gives back what changed."""
    from semsearch.store import index_path
    from semsearch.store.folder import tune as tune_folder

    return tune_folder(index_path(index), target_recall)


def search_modes(folder: Path, manifest) -> str:
    """The search modes an index offers, read from its docstore (for `semsearch info`)."""
    from semsearch.store.lexical import ANALYZER
    from semsearch.store.segments import has_lexical as lexical_in

    try:
        has_lexical = lexical_in(folder, manifest)
    except Exception as e:  # noqa: BLE001 - info reports, it does not fail on a damaged docstore
        return f"unknown (cannot read the docstore: {e})"
    if has_lexical:
        return f"dense, lexical (BM25, {ANALYZER}), hybrid (default)"
    return "dense only: built before lexical search; `semsearch index CORPUS` adds it without re-encoding"
