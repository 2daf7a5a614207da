"""The semsearch command line: parse -> call the library -> format. No logic the library lacks."""
from __future__ import annotations

import functools
import json
import logging
import sys
from pathlib import Path

import click

from semsearch.errors import SemsearchError

POOLING_CHOICES = ("cls", "mean", "max")


def handle_errors(fn):
    """Turn the library's typed errors into a one-line message and exit code 1."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SemsearchError as e:
            raise click.ClickException(str(e)) from e

    return wrapper


def index_option(fn):
    return click.option(
        "--index", "index", type=click.Path(file_okay=False), envvar="SEMSEARCH_INDEX", default=None,
        help="Index folder. Default: $SEMSEARCH_INDEX, else ./indexes/default.",
    )(fn)


DEVICE_HELP = "Where the encoder runs, and the FAISS index where faiss-gpu is installed: auto picks a CUDA GPU when one is present."
QUERY_DEVICE_HELP = ("auto and cpu: encode the query and search on the CPU (a one-shot query is faster there than "
                     "starting CUDA); cuda: the encoder, and the FAISS index where faiss-gpu is installed, on the GPU.")


def device_option(fn, help: str = DEVICE_HELP):
    return click.option(
        "--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True, help=help,
    )(fn)


def _mode_list(ctx, param, value):
    if value is None:
        return None
    from semsearch.fusion import check_mode

    try:
        return [check_mode(v.strip()) for v in value.split(",") if v.strip()] or None
    except SemsearchError as e:
        raise click.BadParameter(str(e)) from e


def fusion_options(fn):
    fn = click.option("--alpha", type=click.FloatRange(0.0, 1.0), default=None,
                      help="Weight of the dense side in convex fusion (default 0.5, chosen on SciFact train queries).")(fn)
    return click.option("--fusion", type=click.Choice(["convex", "rrf"]), default="convex", show_default=True,
                        help="How hybrid mode fuses the two rankings: convex = alpha * dense + (1 - alpha) * BM25, "
                             "each min-max normalised per query; rrf = reciprocal rank fusion (k = 60).")(fn)


def _pooling_list(ctx, param, value):
    if value is None:
        return None
    from semsearch.encoder.pooling import check_pooling

    try:
        return [check_pooling(v.strip()) for v in value.split(",") if v.strip()] or None
    except SemsearchError as e:
        raise click.BadParameter(str(e)) from e


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log more detail on stderr.")
@click.version_option(package_name="semsearch")
def main(verbose: bool) -> None:
    """semsearch: embed a folder of documents and search it by meaning.

    \b
    semsearch index data/sample/          build ./indexes/default
    semsearch query "loan approval"       ranked hits as a table
    semsearch info                        what the index holds
    semsearch eval DATASET --pooling cls,mean,max    retrieval quality on BEIR data
    semsearch train --beir DATASET --out heads/x     train a pooling head
    semsearch serve                       search and embeddings over HTTP
    """
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s: %(message)s", stream=sys.stderr)


@main.command()
@click.argument("corpus", type=click.Path(path_type=Path))
@index_option
@click.option("--model", default=None, help="Model folder or hub name. Default: the index's model, else the bundled all-MiniLM-L6-v2.")
@click.option("--pooling", default=None, callback=_pooling_list, help="cls, mean or max. Default: the index's pooling, else mean.")
@click.option("--head", "head", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None, help="A trained pooling head folder (from `semsearch train`); replaces --pooling.")
@device_option
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16", "fp16", "int8"]), default="auto", show_default=True,
              help="Encoder arithmetic. auto: fp16 on GPUs; bf16 on CPUs with AMX/AVX-512-BF16; int8 (ONNX Runtime) on other x86 CPUs with AVX2; else fp32. On an existing index, auto keeps the index's own arithmetic.")
@click.option("--chunk-tokens", type=int, default=None, help="Tokens per chunk. Default: the model's max length - 2 (254).")
@click.option("--overlap", type=int, default=None, help="Tokens shared by consecutive chunks. Default: 32.")
@click.option("--text-column", default=None, help="Column (CSV/TSV/Parquet) or field (JSON/JSONL) holding the text; 'title,text' joins several. Default: found automatically.")
@click.option("--skip-errors", is_flag=True, help="Skip malformed CSV/JSONL lines, and files that cannot be read (any format), with a warning instead of stopping; the summary lists the files.")
@click.option("--checksum", is_flag=True, help="Hash every file to find changes, instead of trusting an unchanged size, mtime, ctime and inode.")
@click.option("--include", "include", multiple=True, metavar="GLOB", help="Index only files matching GLOB (gitignore syntax, relative to CORPUS: '*.html', 'docs/**/*.md'); repeatable.")
@click.option("--exclude", "exclude", multiple=True, metavar="GLOB", help="Leave out files or folders matching GLOB (as --include); repeatable. CORPUS/.semsearchignore (gitignore syntax) is also read.")
@click.option("--rebuild", is_flag=True, help="Build the index anew (e.g. with another model or pooling) instead of updating it.")
@click.option("--keep-states", is_flag=True, help="Keep every chunk's fp16 token states (768 bytes a token for MiniLM) so a new --pooling or --head re-pools the index without re-encoding.")
@click.option("--index-type", type=click.Choice(["auto", "flat", "ivf", "ivf-fastscan", "ivf-sq8", "hnsw"]), default="auto", show_default=True,
              help="FAISS index. auto: exact (flat) below 50,000 chunks, else IVF fast scan with exact re-ranking (IVF-SQ8 under --max-bytes-per-vector).")
@click.option("--target-recall", type=click.FloatRange(0.0, 1.0), default=0.95, show_default=True,
              help="Approximate indexes: tune the search knob (nprobe / efSearch) to the cheapest setting with this recall@10 against exact search.")
@click.option("--max-bytes-per-vector", type=click.IntRange(min=1), default=None,
              help="Memory budget a vector for auto: e.g. 500 picks IVF-SQ8 (~392 B for 384-d) over full vectors (1,544 B).")
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="Where files are read, chunked and encoded: this process, or a Ray cluster (pip install 'semsearch[ray]').")
@click.option("--ray-address", default=None, envvar="RAY_ADDRESS", help="Ray cluster to use with --engine ray. Default: a new local cluster.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Encoder replicas with --engine ray. Default: one a GPU, else CPUs - 1.")
@click.option("--progress/--no-progress", default=None, help="Progress bar. Default: shown on a terminal.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@handle_errors
def index(corpus, index, model, pooling, head, device, precision, chunk_tokens, overlap, text_column, skip_errors, checksum, include, exclude,
          rebuild, keep_states, index_type, target_recall, max_bytes_per_vector, engine, ray_address, workers, progress, as_json):
    """Index the files under CORPUS (a folder or one file) into an index folder.

    Reads .txt .md .rst .csv .tsv .jsonl .json .parquet, and .pdf (text layer) .html .htm .docx,
    recursively; hidden and binary files are skipped, and a .json that is not records is skipped
    with a warning. Hits from PDFs carry their page, from HTML, Word and Markdown their section
    path (metadata: page, section, title). Running it again re-embeds only new or changed files and removes deleted ones.
    Writes are atomic: an interrupted run leaves the previous index usable.
    """
    from semsearch.corpus import ReadOptions
    from semsearch.engines import make_engine
    from semsearch.indexing import VectorSettings, encoder_for_index, index_corpus, load_base, resolve_chunking, scan_corpus
    from semsearch.store import index_path

    folder = index_path(index)
    if not corpus.exists():  # before loading a model
        raise click.ClickException(f"corpus path {str(corpus)!r} does not exist")
    if pooling and len(pooling) > 1:
        raise click.BadParameter("index takes one pooling", param_hint="--pooling")
    found = scan_corpus(corpus, include, exclude)  # an empty or unreadable corpus fails before the model loads
    runner = make_engine(engine, ray_address if engine == "ray" else None, workers)
    base = load_base(folder, rebuild)
    enc = encoder_for_index(base, model, pooling[0] if pooling else None, head, device, precision)
    chunking = resolve_chunking(base, enc, chunk_tokens, overlap)
    vs = VectorSettings(index_type=index_type, target_recall=target_recall, max_bytes_per_vector=max_bytes_per_vector, device=device)
    report = index_corpus(corpus, folder, enc, chunking, ReadOptions(text_column, skip_errors), rebuild, progress,
                          keep_states=keep_states, vectors=vs, checksum=checksum, found=found, engine=runner)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        for reason, n in report.skipped.items():
            click.echo(f"skipped {n} file(s): {reason}", err=True)
        for line in report.skipped_files[:50]:
            click.echo(f"  skipped {_printable(line)}", err=True)
        if len(report.skipped_files) > 50:
            click.echo(f"  ... and {len(report.skipped_files) - 50} more (--json lists them all)", err=True)
        click.echo(report.summary())


@main.command()
@click.argument("query", required=True)
@index_option
@click.option("-k", "k", type=click.IntRange(min=1), default=10, show_default=True, help="Number of hits per query.")
@click.option("--model", default=None, help="Check that the index was built with this model (queries always use the index's model).")
@click.option("--pooling", default=None, type=click.Choice(POOLING_CHOICES + ("head",)), help="Check that the index was built with this pooling.")
@functools.partial(device_option, help=QUERY_DEVICE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Every field as JSON: an object for one query, a list for queries from stdin.")
@click.option("--jsonl", "as_jsonl", is_flag=True, help="One JSON object per query per line: {query, hits}.")
@click.option("--width", type=int, default=100, show_default=True, help="Snippet width in the table.")
@click.option("--mode", type=click.Choice(["dense", "lexical", "hybrid"]), default=None,
              help="dense: cosine of embeddings; lexical: BM25 keyword match; hybrid: both, fused. "
                   "Default: hybrid (best on SciFact), or dense for an index built before lexical search.")
@click.option("--where", "where", multiple=True, metavar="COND",
              help="Only chunks whose metadata match (repeatable; all must hold): key=value, key!=value, "
                   "key>=n, key>n, key<=n, key<n, or path:GLOB for the source file (e.g. path:*.md).")
@fusion_options
@handle_errors
def query(query, index, k, model, pooling, device, as_json, as_jsonl, width, mode, where, fusion, alpha):
    """Search the index for QUERY ('-' reads one query per line from stdin).

    Scores: in dense mode the cosine similarity of query and chunk, in [-1, 1]; in lexical mode
    BM25 (>= 0); in hybrid mode the fused score (convex: in [0, 1]). --json gives both parts
    (dense_score, lexical_score). Higher is closer.
    """
    import os

    # Before numpy loads: a query's small matmuls run fastest on one BLAS thread (numpy_encoder.py).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from semsearch.errors import InputError
    from semsearch.search import Retriever

    if as_json and as_jsonl:
        raise click.UsageError("--json and --jsonl are exclusive: pick one")
    from_stdin = query == "-"
    queries = [line.strip() for line in sys.stdin if line.strip()] if from_stdin else [query]
    if not queries:
        raise InputError("no queries on stdin" if from_stdin else "the query is empty")
    if not from_stdin and not query.strip():
        raise InputError("the query is empty")
    from semsearch.filters import parse

    parse(list(where))  # a bad filter is reported before the model loads
    r = Retriever.load(index, model=model, pooling=pooling, device=device, fast_start=True)
    results = r.search_batch(queries, k, mode=mode, where=list(where) or None, fusion=fusion, alpha=alpha)
    if as_jsonl:
        for q, hits in zip(queries, results):
            click.echo(json.dumps({"query": q, "hits": [h.to_dict() for h in hits]}, ensure_ascii=False))
    elif as_json:
        objs = [{"query": q, "hits": [h.to_dict() for h in hits]} for q, hits in zip(queries, results)]
        click.echo(json.dumps(objs if from_stdin else objs[0], indent=2, ensure_ascii=False))
    else:
        for q, hits in zip(queries, results):
            if len(queries) > 1:
                click.echo(f"\nquery: {q}")
            click.echo(_table(hits, width))


def _table(hits, width: int) -> str:
    if not hits:
        return "no hits"
    src_w = min(max(len(_printable(h.location)) for h in hits), 50)
    lines = [f"{'rank':>4}  {'score':>6}  {'source':<{src_w}}  snippet"]
    for h in hits:
        snippet = " ".join(h.text.split())
        if len(snippet) > width:
            snippet = snippet[: width - 1] + "…"
        loc = _printable(h.location)
        loc = loc if len(loc) <= src_w else "…" + loc[-(src_w - 1):]
        lines.append(f"{h.rank:>4}  {h.score:>6.3f}  {loc:<{src_w}}  {snippet}")
    return "\n".join(lines)


def _printable(s: str) -> str:
    """s with control characters (a newline in a file name, say) escaped, so a table stays one line a row."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in s)


@main.command()
@index_option
@click.option("--json", "as_json", is_flag=True, help="The whole manifest as JSON.")
@click.option("--verify", is_flag=True, help="Also read every byte: hashes of the data files, SQLite's integrity check, FAISS and SQLite id sets.")
@handle_errors
def info(index, as_json, verify):
    """Show what an index holds and how it was built."""
    from semsearch.errors import IndexFormatError
    from semsearch.store import Manifest, index_path

    folder = index_path(index)
    m = Manifest.load(folder)
    if verify:
        from semsearch.store.folder import verify as verify_index

        problems = verify_index(folder)
        if problems:
            raise IndexFormatError(problems[0] + (f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""))
        click.echo(f"verified: {folder} is whole ({', '.join(m.files.values())}: hashes, SQLite integrity, ids)", err=True)
    if as_json:
        click.echo(m.to_json())
        return
    try:
        rows = _info_rows(folder, m)
    except (KeyError, TypeError, ValueError, AttributeError) as e:  # fields a damaged manifest left out or mistyped
        from semsearch.store.files import damaged

        raise damaged(folder, "manifest.json", f"damaged manifest ({type(e).__name__}: {e})") from e
    w = max(len(k) for k, _ in rows)
    for key, val in rows:
        click.echo(f"{key:<{w}}  {val}")


def _info_rows(folder, m) -> list[tuple[str, object]]:
    last = m.last_run or {}
    rows = [
        ("index", str(folder)),
        ("format version", m.format_version),
        ("model", f"{m.model} (weights {m.model_fingerprint}, {m.backend})"),
        ("pooling", m.pooling + ((f" (trained query layers {m.head['path']})" if m.head.get("kind") == "query-layers" else f" (head {m.head['path']})") if m.head else "")),
        ("vectors", f"{m.dim}-d, {m.metric} (L2-normalised, inner product), index type {m.index.get('type')}"
                    + (f", built on {m.index['built_on']}" if m.index.get("built_on") else "")),
        ("max length", f"{m.max_length} tokens; chunks of {m.chunking['window']} tokens, overlap {m.chunking['overlap']}"),
        ("precision", m.precision),
        ("holds", f"{m.counts['files']} files, {m.counts['documents']} documents, {m.counts['chunks']} chunks"),
        ("created", m.created),
        ("updated", m.updated),
        ("last run", f"{last.get('added', 0)} added, {last.get('updated', 0)} updated, {last.get('removed', 0)} removed, "
                     f"{last.get('unchanged', 0)} unchanged; {last.get('chunks', 0)} chunks in {last.get('seconds', 0):.1f} s"),
    ]
    rows.append(("search modes", _modes_of(folder, m)))
    if m.index.get("params"):
        rows.append(("index params", json.dumps(m.index["params"])))
    if m.index.get("recall"):
        r = m.index["recall"]
        rows.append(("index recall", f"{r['recall']:.3f} recall@{r['k']} against exact search on {r['queries']} queries "
                                     f"(target {r['target']}{', ' + r['knob'] + '=' + str(r['value']) if 'knob' in r else ''})"))
    return rows


def _modes_of(folder, m) -> str:
    """The search modes an index offers, read from its docstore."""
    from semsearch.store.docstore import DocStore
    from semsearch.store.lexical import ANALYZER

    try:
        docs = DocStore(folder / m.files["docs"], readonly=True)
        has_lexical = "lex" in {r[1] for r in docs.db.execute("PRAGMA table_info(chunks)")}
        docs.close()
    except Exception as e:  # noqa: BLE001 - info reports, it does not fail on a damaged docstore
        return f"unknown (cannot read the docstore: {e})"
    if has_lexical:
        return f"dense, lexical (BM25, {ANALYZER}), hybrid (default)"
    return "dense only: built before lexical search; `semsearch index CORPUS` adds it without re-encoding"


@main.command("eval")
@click.argument("dataset", required=False, type=click.Path(path_type=Path))
@click.option("--split", default="test", show_default=True, help="Which qrels/<split>.tsv to evaluate on.")
@click.option("--pooling", default=None, callback=_pooling_list, help="Comma-separated poolings to compare (one encoder pass), e.g. cls,mean,max. Default: mean.")
@click.option("--head", "heads", multiple=True, type=click.Path(exists=True, file_okay=False, path_type=Path), help="Also evaluate a trained pooling head (repeatable).")
@click.option("--model", default=None, help="Model folder or hub name. Default: the bundled all-MiniLM-L6-v2.")
@click.option("--k", "ks", default="10,100", show_default=True, help="Comma-separated cutoffs for nDCG, recall, MAP, MRR.")
@click.option("--index", "index", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Evaluate this index as built (its model, pooling, head and index type) instead of exact search; reports its recall against exact search.")
@click.option("--pairs", type=click.Path(path_type=Path), default=None, help="Sentence-pair file (TSV/CSV: score, sentence1, sentence2): Spearman and Pearson of cosine vs gold.")
@click.option("--pair-columns", default=None, help="Names or 0-based positions of the score, sentence1, sentence2 columns, comma-separated.")
@click.option("--max-queries", type=int, default=None, help="Evaluate only the first N judged queries (with a corpus cut to --max-docs).")
@click.option("--max-docs", type=int, default=None, help="With --max-queries: keep the judged documents plus others up to N.")
@device_option
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16", "fp16", "int8"]), default="auto", show_default=True, help="Encoder arithmetic (see `index --help`).")
@click.option("--max-length", type=click.IntRange(min=8), default=None, help="Truncate texts at this many tokens (default: the model's, 256 for all-MiniLM-L6-v2).")
@click.option("--mode", "modes", default=None, callback=_mode_list,
              help="Comma-separated search modes to compare (one encoder pass): dense, lexical, hybrid. Default: dense.")
@fusion_options
@click.option("--json", "as_json", is_flag=True, help="Every number and the settings that produced it, as JSON.")
@click.option("--per-query", is_flag=True, help="With --json / --out: also each query's nDCG@k and recall@k.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also write the JSON report to this file.")
@click.option("--progress/--no-progress", default=None, help="Progress bar. Default: shown on a terminal.")
@handle_errors
def eval_(dataset, split, pooling, heads, model, ks, index, pairs, pair_columns, max_queries, max_docs, device, precision,
          max_length, modes, fusion, alpha, as_json, per_query, out, progress):
    """Measure retrieval quality on a BEIR-format DATASET folder, or pair similarity with --pairs.

    \b
    semsearch eval ../shared/data/beir/scifact --pooling cls,mean,max
    semsearch eval DATASET --index indexes/scifact
    semsearch eval --pairs sts.tsv --pooling cls,mean,max

    Metrics (nDCG@k, recall@k, MAP@k, MRR@k, in %) are computed by trec_eval (pytrec_eval), as
    BEIR and MTEB do. Default search is exact; every pooling and mode is computed from one encoder
    pass. As BEIR does, a hit whose document id equals the query's id is dropped; a query whose
    relevant documents are all missing from the corpus counts as 0 (as MTEB averages it).
    """
    from semsearch import eval as ev
    from semsearch.errors import InputError

    try:
        cutoffs = sorted({int(x) for x in ks.split(",") if x.strip()})
    except ValueError as e:
        raise click.BadParameter(f"{ks!r}: expected comma-separated integers", param_hint="--k") from e
    if not cutoffs or min(cutoffs) < 1:
        raise click.BadParameter(f"{ks!r}: cutoffs must be positive", param_hint="--k")
    if dataset is None and pairs is None:
        raise InputError("give a BEIR dataset folder, or --pairs FILE")
    report: dict = {}
    if index is not None:
        from semsearch.search import Retriever

        if dataset is None:
            raise InputError("--index needs a BEIR dataset folder to evaluate against")
        data = _subset(ev.load_beir(dataset, split), max_queries, max_docs)
        rep = ev.evaluate_index(data, Retriever.load(index, device=device), cutoffs, modes=modes or ["dense"], fusion=fusion, alpha=alpha)
        report = rep.to_dict()
    else:
        enc = _eval_encoder(model, pooling, heads, device, precision, max_length)
        names = (pooling or ["mean"]) + (["head"] if heads else [])
        if dataset is not None:
            data = _subset(ev.load_beir(dataset, split), max_queries, max_docs)
            subsets = None
            if heads:
                from semsearch.encoder.heads import unseen_document_queries

                unseen = unseen_document_queries(heads[0], data.qrels)
                subsets = {"unseen documents": unseen} if unseen is not None else None
            report = ev.evaluate_beir(data, enc, names, cutoffs, progress=progress, modes=modes or ["dense"],
                                      fusion=fusion, alpha=alpha, per_query=per_query, subsets=subsets).to_dict()
        if pairs is not None:
            cols = [c.strip() for c in pair_columns.split(",")] if pair_columns else None
            report["pairs"] = {"file": str(pairs), "results": ev.evaluate_pairs(pairs, enc, names, cols),
                               "settings": ev.encoder_settings(enc)}
    text = json.dumps(report, indent=2)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n", encoding="utf-8")
    if as_json:
        click.echo(text)
        return
    if "results" in report:
        s = report["settings"]
        click.echo(f"{report['dataset']} ({report['split']}): {s['queries']} queries, {s['documents']} documents; "
                   f"model {s['model']} ({s['model_fingerprint']}), {s['precision']}, max length {s['max_length']}")
        if s.get("zero_queries"):
            click.echo(f"{s['zero_queries']} of those queries are judged only on documents missing from the corpus: they count as 0")
        if s.get("fusion"):
            click.echo(f"hybrid: {s['fusion']} fusion" + (f", alpha {s['alpha']}" if s.get("alpha") is not None else "")
                       + f", top {s['depth']} of each side")
        click.echo(ev.format_table(report["results"]))
        click.echo("time: " + ", ".join(f"{k} {v}" for k, v in report["seconds"].items()))
    if "pairs" in report:
        click.echo(f"pairs: {report['pairs']['file']}")
        click.echo(ev.format_table(report["pairs"]["results"]))


def _subset(data, max_queries, max_docs):
    return data.subset(max_queries, max_docs) if (max_queries or max_docs) else data


def _eval_encoder(model, pooling, heads, device, precision, max_length=None):
    from semsearch.errors import InputError
    from semsearch.indexing import encoder_for_index

    if len(heads) > 1:
        raise InputError("evaluate one --head at a time (it is compared with the --pooling baselines)")
    return encoder_for_index(None, model, None, heads[0] if heads else None, device, precision, max_length)


@main.command()
@click.option("--beir", "beir", type=click.Path(path_type=Path), default=None, help="A BEIR-format dataset folder to train on (its --split qrels).")
@click.option("--split", default="train", show_default=True, help="With --beir: the qrels split to train on. Never the split you report.")
@click.option("--dev-split", default=None, help="With --beir: a qrels split (e.g. dev) to use as the dev set instead of holding out training queries.")
@click.option("--pairs", type=click.Path(path_type=Path), default=None, help="Or a CSV/TSV of query, positive[, negative] columns.")
@click.option("--index", "index", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="An index over the training corpus: the passages' vectors (or, with --train-layers 0, token states kept with --keep-states) come from it, not from a second encoding.")
@click.option("--train-layers", type=click.IntRange(min=0), default=2, show_default=True,
              help="Fine-tune the top N layers of the query encoder against the documents' fixed vectors (an index keeps its vectors; `index --head` only records the head). "
                   "0: train an attention-pooling head for both sides instead (re-pools the documents).")
@click.option("--pseudo-queries/--no-pseudo-queries", default=None,
              help="Also train on unlabelled pairs from the corpus: each document's title (else first sentence) as a query for it. "
                   "Default: on with --train-layers N, off with 0 (where it needs --index). With --index and no --beir/--pairs: only on those.")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path), help="Folder to write the head to.")
@click.option("--model", default=None, help="Base model (frozen). Default: the bundled all-MiniLM-L6-v2.")
@click.option("--epochs", type=click.IntRange(min=1), default=None, help="At most this many epochs (see --patience). Default: 3 for query layers, 10 for a pooling head.")
@click.option("--patience", type=click.IntRange(min=1), default=None, help="Stop after this many dev checks without a better figure (query layers check twice an epoch). Default: 3 / 2.")
@click.option("--batch-size", type=click.IntRange(min=2), default=64, show_default=True, help="Pairs per batch; the other pairs' passages are the in-batch negatives.")
@click.option("--positives-per-query", type=click.IntRange(min=1), default=2, show_default=True, help="Positives sampled per query per epoch (bounds an epoch's cost).")
@click.option("--lr", type=float, default=None, help="AdamW learning rate. Default: 2e-5 for query layers, 2e-3 for a pooling head.")
@click.option("--weight-decay", type=click.FloatRange(min=0.0), default=None,
              help="Query layers: AdamW's weight decay (default 0.01). Pooling head: decay toward the starting point (mean pooling), per unit of learning rate (default 0).")
@click.option("--scale", type=float, default=20.0, show_default=True, help="Similarity scale (1 / temperature) of the InfoNCE loss.")
@click.option("--hard-negatives", type=click.IntRange(min=0), default=1, show_default=True, help="Pooling head: mined hard negatives per pair (0: in-batch only). Query layers see every document as a negative.")
@click.option("--neg-skip", type=click.IntRange(min=0), default=3, show_default=True, help="Skip this many top-ranked non-relevant passages when mining (likely unlabelled positives).")
@click.option("--neg-depth", type=click.IntRange(min=2), default=50, show_default=True, help="Mine hard negatives from the top N of the base ranking.")
@click.option("--symmetric", is_flag=True, help="Also train passage -> query.")
@click.option("--projection", type=click.Choice(["none", "diagonal", "full"]), default="none", show_default=True,
              help="What follows the attention pooling: a full linear map, a scale per dimension, or nothing.")
@click.option("--dev-fraction", type=click.FloatRange(0.0, 0.9), default=0.2, show_default=True,
              help="Training queries held out, as whole groups on held-out documents, to pick the best epoch and gate the head. 0: none (then only --force saves).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--cache", type=click.Path(file_okay=False, path_type=Path), default=Path("indexes/.cache"), show_default=True,
              help="Where token states are cached, so a second run does not encode again.")
@click.option("--force", is_flag=True, help="Save the best trained epoch's head even if it does not beat mean pooling on the dev set.")
@device_option
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16", "fp16", "int8"]), default="auto", show_default=True, help="Encoder arithmetic for the token states.")
@click.option("--progress/--no-progress", default=None, help="Progress bar. Default: shown on a terminal.")
@handle_errors
def train(beir, split, dev_split, pairs, index, train_layers, pseudo_queries, out, model, epochs, patience, batch_size, positives_per_query, lr,
          weight_decay, scale, hard_negatives, neg_skip, neg_depth, symmetric, projection, dev_fraction, seed, cache, force, device, precision, progress):
    """Fine-tune contrastively on (query, relevant passage) pairs.

    By default (--train-layers 2) the top two layers of the *query* encoder are trained so that
    each query ranks its relevant passages first among every passage of the corpus, whose vectors
    stay the base model's: an index built before training stays valid, and `semsearch index
    --head` only records the head. Each document's title (else first sentence) is added as an
    unlabelled query for it (--no-pseudo-queries: labels only). With --train-layers 0, an
    attention-pooling head is trained for both sides on cached token states instead.

    Queries on held-out *documents* are the dev set: the best check on them is kept, and a result
    that does not beat the base model there is not saved (unless --force).

    \b
    semsearch index corpus/ --index indexes/x --text-column title,text
    semsearch train --beir ../shared/data/beir/scifact --index indexes/x --out heads/scifact
    semsearch eval ../shared/data/beir/scifact --head heads/scifact
    semsearch index corpus/ --index indexes/x --head heads/scifact     # re-encodes nothing
    """
    import numpy as np

    from semsearch.encoder.encoder import Encoder
    from semsearch.errors import InputError
    from semsearch.train import data as td
    from semsearch.train.head import save_head
    from semsearch.train.trainer import TrainConfig, config_dict, train_head

    if beir is not None and pairs is not None:
        raise InputError("give one of --beir DATASET or --pairs FILE, not both")
    if dev_split is not None and beir is None:
        raise InputError("--dev-split needs --beir")
    if train_layers > 0:
        return _train_query_layers(beir, split, dev_split, pairs, index, train_layers, pseudo_queries, out, model, epochs, patience,
                                   batch_size, positives_per_query, lr, weight_decay, scale, dev_fraction, seed, cache, force, device,
                                   precision, progress)
    pseudo_queries = bool(pseudo_queries)
    epochs, patience, lr = epochs or 10, patience or 2, lr if lr is not None else 2e-3
    weight_decay = weight_decay or 0.0
    unlabelled_only = beir is None and pairs is None
    if unlabelled_only and (index is None or not pseudo_queries):
        raise InputError("give --beir DATASET or --pairs FILE, or --index DIR --pseudo-queries to train on the corpus alone")
    if pseudo_queries and index is None:
        raise InputError("--pseudo-queries needs --index DIR (an index built with --keep-states)")
    if unlabelled_only:
        data = td.PairData([], [], {}, checksum="", source=f"{index} (unlabelled)")
    else:
        data = td.from_beir(beir, split, dev_split) if beir is not None else td.from_pairs_file(pairs)
    cfg = TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, weight_decay=weight_decay, scale=scale, hard_negatives=hard_negatives,
                      neg_skip=neg_skip, neg_depth=neg_depth, symmetric=symmetric, projection=projection,
                      positives_per_query=positives_per_query, patience=patience, dev_fraction=dev_fraction, seed=seed)
    enc = Encoder(model, device=device, precision=precision)
    click.echo(f"training on {data.source}: {len(data.queries)} queries, {data.n_pairs} pairs, {len(data.passages)} passages", err=True)
    passages = None
    if index is not None:
        from semsearch.train.index_states import passage_states

        from semsearch.train.states import StateCache

        if data.passages:
            got = passage_states(index, data.passages, data.passage_ids, enc, progress)
            passages = got.passages
            click.echo(f"token states of {got.from_index} passages from {index}" + (f", {got.encoded} encoded" if got.encoded else ""), err=True)
        else:
            passages = StateCache.from_spans([], np.zeros((0, 3), np.int64))
        if pseudo_queries:
            from semsearch.train.index_states import add_pseudo_queries, index_chunks

            data, passages = add_pseudo_queries(data, passages, index_chunks(index, enc), seed=seed)
            if unlabelled_only:  # no labels: the pseudo-queries are the dev set too (a proxy task)
                data.unlabelled = set()
                data.checksum = td.texts_checksum(data.queries, data.passages)
            click.echo(f"{len(data.queries)} queries with the corpus's pseudo-queries, {len(data.passages)} passages", err=True)
    res = train_head(data, enc, cfg, cache, progress, passages=passages)
    verdict = _report_and_gate(res, force, "the head", "mean pooling", "it was", "it")
    info = save_head(res.head, out, {
        "base_model": enc.name, "base_model_fingerprint": enc.fingerprint, "max_length": enc.max_length,
        "training_data": data.source, "training_data_checksum": data.checksum, "hyperparameters": config_dict(cfg),
        "metrics": res.metrics(), "improved_on_dev": res.improved,
    }, positive_ids=td.trained_positive_ids(data, res.split.train))
    click.echo(verdict)
    click.echo(f"saved head to {out} (fingerprint {info['fingerprint']})")


def _report_and_gate(res, force: bool, what: str, base: str, were: str, them: str) -> str:
    """Print the dev checks; refuse (nothing saved) a result no dev set checked or that did not beat
    the base there, unless force; gives back the one-line verdict."""
    for row in res.history:
        click.echo("  " + ", ".join(f"{k} {v}" for k, v in row.items()), err=True)
    verdict = res.verdict()
    if res.gate == "none" and not force:
        raise click.ClickException(f"no dev set (--dev-fraction 0), so nothing checked {what} and {were} not saved ({verdict}). "
                                   f"Use --force to save {them} anyway.")
    if not res.improved and not force:
        raise click.ClickException(f"{what} did not beat {base} on the {'unseen-document ' if res.gate == 'unseen' else ''}dev set, "
                                   f"so {were} not saved ({verdict}). Use --force to save {them} anyway.")
    return verdict


def _train_query_layers(beir, split, dev_split, pairs, index, layers, pseudo_queries, out, model, epochs, patience, batch_size,
                        positives_per_query, lr, weight_decay, scale, dev_fraction, seed, cache, force, device, precision, progress):
    """`semsearch train --train-layers N`: see train/query_tower.py."""
    import numpy as np

    from semsearch.encoder.encoder import Encoder
    from semsearch.errors import InputError
    from semsearch.train import data as td
    from semsearch.train import query_tower as qt
    from semsearch.train.trainer import TrainConfig, make_split

    pseudo_queries = True if pseudo_queries is None else pseudo_queries
    unlabelled_only = beir is None and pairs is None
    if unlabelled_only and (index is None or not pseudo_queries):
        raise InputError("give --beir DATASET or --pairs FILE, or --index DIR (with pseudo-queries) to train on the corpus alone")
    cfg = qt.TowerConfig(layers=layers, epochs=epochs or 3, patience=patience or 3, batch_size=batch_size,
                         lr=lr if lr is not None else 2e-5, weight_decay=0.01 if weight_decay is None else weight_decay, scale=scale,
                         positives_per_query=positives_per_query, pseudo_queries=pseudo_queries, seed=seed)
    enc = Encoder(model, device=device, precision=precision)
    if enc.backend != "native":
        raise InputError("--train-layers needs a BERT-family model on the native encoder; use --train-layers 0 for this model")
    if unlabelled_only:
        data = qt.index_passages(index)
    else:
        data = td.from_beir(beir, split, dev_split) if beir is not None else td.from_pairs_file(pairs)
    click.echo(f"training on {data.source}: {len(data.queries)} queries, {data.n_pairs} pairs, {len(data.passages)} passages", err=True)
    if index is not None:
        pvec, found = qt.index_vectors(index, data, enc)
        click.echo(f"vectors of {found} of {len(data.passages)} passages from {index}", err=True)
    else:
        pvec = qt.passage_vectors(enc, data, cache, progress)
    n_pseudo = 0
    if pseudo_queries:
        data, n_pseudo = qt.add_corpus_queries(data, data.titles)
        if unlabelled_only:  # no labels: the pseudo-queries are the dev set too (a proxy task)
            data.unlabelled = set()
        click.echo(f"+ {n_pseudo} pseudo-queries from the corpus ({'titles' if data.titles else 'first sentences'})", err=True)
    split_cfg = TrainConfig(dev_fraction=dev_fraction, seed=seed)
    sp = make_split(data, split_cfg, np.random.default_rng(seed))
    if not sp.train:
        raise InputError("too few training queries after holding out the dev set")
    if sp.note:
        click.echo(f"note: {sp.note}", err=True)
    res = qt.train_query_tower(data, enc, pvec, cfg, sp, progress, pseudo=n_pseudo)
    verdict = _report_and_gate(res, force, "the trained query layers", "the base model", "they were", "them")
    info = qt.save_tower(res.tower, out, {
        "base_model": enc.name, "base_model_fingerprint": enc.fingerprint, "max_length": enc.max_length, "doc_pooling": enc.pooling,
        "training_data": data.source, "training_data_checksum": data.checksum, "hyperparameters": qt.config_dict(cfg),
        "metrics": res.metrics(), "improved_on_dev": res.improved,
    }, positive_ids=td.trained_positive_ids(data, res.split.train))
    click.echo(verdict)
    click.echo(f"saved query layers to {out} (fingerprint {info['fingerprint']}); documents keep their vectors: "
               f"`semsearch index CORPUS --head {out}` records it on an index without re-encoding")


@main.command()
@index_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on. Beyond loopback it needs --api-key (or --insecure).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@device_option
@click.option("--read-only", is_flag=True, help="Refuse POST /documents and DELETE /documents/{id}.")
@click.option("--api-key", default=None, envvar="SEMSEARCH_API_KEY", show_envvar=True, metavar="KEY",
              help="Require `Authorization: Bearer KEY` on every endpoint but /health.")
@click.option("--api-key-file", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="PATH",
              help="Read the API key from this file (its first line), rather than from the command line.")
@click.option("--insecure", is_flag=True, help="Allow listening beyond loopback without an API key.")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="Repeatable: a Host name clients may use beyond loopback (`*.example.com` for subdomains, `*` for any). "
                   "Loopback names and the --host address are always allowed.")
@click.option("--docs", is_flag=True, help="Serve interactive API docs at /docs and /redoc, and /openapi.json.")
@click.option("--max-k", type=click.IntRange(min=1), default=1000, show_default=True, help="Largest k a search may ask for.")
@click.option("--max-results", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="Most hits in one search request: its number of queries times k.")
@click.option("--max-request-bytes", type=click.IntRange(min=1024), default=8 * 2**20, show_default=True, help="Largest request body.")
@click.option("--max-response-bytes", type=click.IntRange(min=1024), default=64 * 2**20, show_default=True, help="Largest response body.")
@click.option("--max-inflight-per-client", type=click.IntRange(min=0), default=0, show_default=True,
              help="Requests one client address may have running at once; more get 429 (0: no limit).")
@handle_errors
def serve(index, host, port, device, read_only, api_key, api_key_file, insecure, allowed_hosts, docs, max_k, max_results,
          max_request_bytes, max_response_bytes, max_inflight_per_client):
    """Serve the index over HTTP: search, embeddings (OpenAI and TEI shapes), document upserts.

    Needs `pip install 'semsearch[serve]'`. Listens on loopback unless --host says otherwise;
    beyond loopback it refuses to start without --api-key / --api-key-file / SEMSEARCH_API_KEY
    (or --insecure). With --docs, interactive docs at http://HOST:PORT/docs.
    """
    from semsearch.serve import Limits, serve as run_server

    if api_key_file is not None:
        if api_key is not None and click.get_current_context().get_parameter_source("api_key") != click.core.ParameterSource.ENVIRONMENT:
            raise click.UsageError("give --api-key or --api-key-file, not both")  # the file wins over SEMSEARCH_API_KEY
        try:
            lines = api_key_file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise click.BadParameter(f"cannot read {str(api_key_file)!r}: {getattr(e, 'strerror', None) or e}", param_hint="--api-key-file")
        api_key = lines[0].strip() if lines else ""
        if not api_key:
            raise click.BadParameter(f"{str(api_key_file)!r} holds no key on its first line", param_hint="--api-key-file")
    limits = Limits(max_request_bytes=max_request_bytes, max_k=max_k, max_results=max_results,
                    max_response_bytes=max_response_bytes, max_inflight_per_client=max_inflight_per_client)
    try:
        run_server(index, host, port, device, limits, read_only, api_key=api_key, insecure=insecure,
                   allowed_hosts=allowed_hosts, docs=docs)
    except ImportError as e:
        raise click.ClickException(str(e)) from e


if __name__ == "__main__":  # pragma: no cover
    main()
