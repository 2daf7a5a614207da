"""The semsearch command line: parse -> call the library -> format. No logic the library lacks."""
from __future__ import annotations

import functools
import json
import logging
import sys
from pathlib import Path

import click

from semsearch import formatting as fmt
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
    semsearch train --beir DATASET --out heads/x     fine-tune the query encoder
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
@click.option("--force", is_flag=True, help="Use a --head trained on another corpus anyway (it is refused otherwise, with the share of its training documents found here).")
@click.option("--keep-states", is_flag=True, help="Keep every chunk's fp16 token states (768 bytes a token for MiniLM) so a new --pooling or --head re-pools the index without re-encoding.")
@click.option("--index-type", type=click.Choice(["auto", "flat", "ivf", "ivf-fastscan", "ivf-sq8", "hnsw"]), default="auto", show_default=True,
              help="FAISS index. auto: exact (flat) below 50,000 chunks, else IVF fast scan (4-bit codes in memory) re-ranked exactly against the full vectors, which stay on disk (memory-mapped).")
@click.option("--target-recall", type=click.FloatRange(0.0, 1.0), default=0.95, show_default=True,
              help="Approximate indexes: tune the search knob (nprobe / efSearch) to the cheapest setting with this recall@10 against exact search.")
@click.option("--vector-storage", type=click.Choice(["fp32", "fp16"]), default=None,
              help="How the full vectors are stored on disk (IVF segments re-rank against them): fp16 halves their size and the pages a query touches; SciFact dense nDCG@10 measured unchanged (65.32). Kept by later writes; `semsearch compact` rewrites older segments. Default: the index's; fp32 for a new one.")
@click.option("--max-bytes-per-vector", type=click.IntRange(min=1), default=None,
              help="Memory budget a vector for auto: below flat's (1,544 B for 384-d), IVF fast scan (64 B in memory) even for small indexes.")
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="Where files are read, chunked and encoded: this process, or a Ray cluster (pip install 'semsearch[ray]').")
@click.option("--ray-address", default=None, envvar="RAY_ADDRESS", help="Ray cluster to use with --engine ray. Default: a new local cluster.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Encoder replicas with --engine ray. Default: one a GPU, else CPUs - 1.")
@click.option("--shards", type=click.IntRange(min=1), default=None,
              help="Partition a new index by document into N (each document's chunks in one partition, by a stable hash of its path or id; each record of a JSONL, CSV or Parquet file is a document of its own), so that `serve --shards N` gives each shard 1/N of it. Default: the index's, else 1; `compact --shards N` re-partitions.")
@click.option("--progress/--no-progress", default=None, help="Progress bar. Default: shown on a terminal.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@handle_errors
def index(corpus, index, model, pooling, head, device, precision, chunk_tokens, overlap, text_column, skip_errors, checksum, include, exclude,
          rebuild, force, keep_states, index_type, target_recall, vector_storage, max_bytes_per_vector, engine, ray_address, workers, shards,
          progress, as_json):
    """Index the files under CORPUS (a folder or one file) into an index folder.

    Reads .txt .md .rst .csv .tsv .jsonl .json .parquet, and .pdf (text layer) .html .htm .docx,
    recursively; hidden and binary files are skipped, and a .json that is not records is skipped
    with a warning. Hits from PDFs carry their page, from HTML, Word and Markdown their section
    path (metadata: page, section, title). Running it again re-embeds only new or changed files and removes deleted ones.
    Writes are atomic: an interrupted run leaves the previous index usable.
    """
    from semsearch import api

    if pooling and len(pooling) > 1:
        raise click.BadParameter("index takes one pooling", param_hint="--pooling")
    report = api.index(corpus, index, model=model, pooling=pooling[0] if pooling else None, head=head, device=device,
                       precision=precision, chunk_tokens=chunk_tokens, overlap=overlap, text_column=text_column,
                       skip_errors=skip_errors, checksum=checksum, include=include, exclude=exclude, rebuild=rebuild,
                       keep_states=keep_states, index_type=index_type, target_recall=target_recall,
                       max_bytes_per_vector=max_bytes_per_vector, vector_storage=vector_storage, engine=engine, ray_address=ray_address, workers=workers,
                       force=force, progress=progress, shards=shards)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        for line in fmt.skipped_lines(report):
            click.echo(line, err=True)
        click.echo(report.summary())


@main.command()
@click.argument("folder", type=click.Path(path_type=Path))
@index_option
@click.option("--include", "include", multiple=True, metavar="GLOB", help="Index only files matching GLOB (gitignore syntax, relative to FOLDER: '*.html', 'docs/**/*.md'); repeatable.")
@click.option("--exclude", "exclude", multiple=True, metavar="GLOB", help="Leave out files or folders matching GLOB (as --include); repeatable. FOLDER/.semsearchignore (gitignore syntax) is also read, and re-read when it changes.")
@click.option("--debounce", "debounce", type=click.IntRange(min=1), default=300, show_default=True, metavar="MS",
              help="Quiet time that ends a batch: changes are gathered until none came for MS milliseconds (or for at most --max-wait), then published as one generation.")
@click.option("--max-wait", "max_wait", type=click.IntRange(min=1), default=5000, show_default=True, metavar="MS",
              help="Publish a batch after at most MS milliseconds even while changes keep coming.")
@click.option("--poll", is_flag=True, help="Poll the folder for changes instead of using file-system events (for network and other file systems that give none).")
@click.option("--poll-interval", "poll_ms", type=click.IntRange(min=10), default=300, show_default=True, metavar="MS", help="With --poll: how often the folder is scanned.")
@click.option("--model", default=None, help="Model folder or hub name for a new index. Default: the index's model, else the bundled all-MiniLM-L6-v2.")
@device_option
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16", "fp16", "int8"]), default="auto", show_default=True,
              help="Encoder arithmetic (see `index --help`). On an existing index, auto keeps the index's own arithmetic.")
@click.option("--chunk-tokens", type=int, default=None, help="Tokens per chunk for a new index. Default: the index's, else the model's max length - 2 (254).")
@click.option("--overlap", type=int, default=None, help="Tokens shared by consecutive chunks for a new index. Default: the index's, else 32.")
@click.option("--text-column", default=None, help="Column (CSV/TSV/Parquet) or field (JSON/JSONL) holding the text; 'title,text' joins several. Default: found automatically.")
@click.option("--skip-errors", is_flag=True, help="Skip malformed CSV/JSONL lines, and files that cannot be read (any format), with a warning. Without it a batch that meets one publishes nothing, says why, and the next change retries.")
@click.option("--checksum", is_flag=True, help="Hash every file to find changes, instead of trusting an unchanged size, mtime, ctime and inode.")
@click.option("--progress/--no-progress", default=None, help="Progress bar for the catch-up at start. Default: shown on a terminal.")
@handle_errors
def watch(folder, index, include, exclude, debounce, max_wait, poll, poll_ms, model, device, precision, chunk_tokens, overlap,
          text_column, skip_errors, checksum, progress):
    """Keep an index in step with FOLDER until stopped (Ctrl-C or SIGTERM).

    First catches up as `semsearch index FOLDER` would (new and changed files embedded, deleted
    ones removed), then watches: created, changed, renamed and deleted files are gathered into
    batches (see --debounce), and each batch is published as one atomic generation, with a line
    saying what it did. Files the index would not take (hidden, editor temporaries, excluded,
    the index folder itself) start no work. A batch that fails publishes nothing and watching
    goes on; a kill loses nothing published, and the next start catches up.
    """
    import time

    from semsearch.watch import Watcher

    def log(line: str) -> None:
        click.echo(f"{time.strftime('%H:%M:%S')} {line}")

    w = Watcher(folder, index, include=include, exclude=exclude, debounce_ms=debounce, max_wait_ms=max(max_wait, debounce),
                poll=poll, poll_ms=poll_ms, model=model, device=device, precision=precision, chunk_tokens=chunk_tokens,
                overlap=overlap, text_column=text_column, skip_errors=skip_errors, checksum=checksum, progress=progress, log=log)
    how = f"polling every {poll_ms} ms" if poll else "file-system events"
    click.echo(f"watching {w.corpus} into {w.folder} ({how}, debounce {debounce} ms); Ctrl-C to stop", err=True)
    _term_as_interrupt()
    try:
        w.run()
    except KeyboardInterrupt:
        click.echo("stopped watching", err=True)


def _term_as_interrupt() -> None:
    """SIGTERM (what `kill`, systemd and `docker stop` send) ends a long-running command as
    Ctrl-C does: a batch under way publishes nothing, what was published stays, and the
    command says it stopped and exits 0. Also the way to stop one started in the background of
    a script, where the shell has it ignore SIGINT."""
    import signal
    import threading

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)


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
@click.option("--explain", is_flag=True, help="Show why each hit matched: each token's share of the dense score, each query term's "
                                           "BM25 share, the fusion arithmetic (JSON: an `explanation` per hit).")
@fusion_options
@handle_errors
def query(query, index, k, model, pooling, device, as_json, as_jsonl, width, mode, where, fusion, alpha, explain):
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
    results = r.search_batch(queries, k, mode=mode, where=list(where) or None, fusion=fusion, alpha=alpha, explain=explain)
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
            click.echo(fmt.table(hits, width, explain=explain))


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
        from semsearch.api import verify as verify_index

        problems = verify_index(folder)
        if problems:
            raise IndexFormatError(problems[0] + (f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""))
        click.echo(f"verified: {folder} is whole ({len(m.segments)} segment(s), {len(m.data_files())} data files: hashes, SQLite integrity, ids)", err=True)
    if as_json:
        click.echo(m.to_json())
        return
    try:
        rows = fmt.info_rows(folder, m)
    except (KeyError, TypeError, ValueError, AttributeError) as e:  # fields a damaged manifest left out or mistyped
        from semsearch.store.files import damaged

        raise damaged(folder, "manifest.json", f"damaged manifest ({type(e).__name__}: {e})") from e
    w = max(len(k) for k, _ in rows)
    for key, val in rows:
        click.echo(f"{key:<{w}}  {val}")


@main.command()
@index_option
@click.option("--shards", type=click.IntRange(min=1), default=None,
              help="Partition the index by document into N, each partition then one segment (as `index --shards N` builds); re-partitions an index partitioned otherwise (1: not partitioned). Default: as it is.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@handle_errors
def compact(index, shards, as_json):
    """Merge an index's segments into one, without its deleted chunks.

    Writes add small segments and record deletions beside them; a merge policy keeps their
    number bounded as part of later writes. This does all the merging at once, as one new
    generation (readers keep the previous one until it is published): before copying the index
    elsewhere, or after deleting much of it. A lone segment is rewritten too where an earlier
    version wrote it, or where its vectors are stored otherwise than the index now asks
    (`semsearch index --vector-storage fp16` on an unchanged corpus records that, then this
    rewrites them).
    """
    from semsearch.store import index_path
    from semsearch.store.folder import compact as compact_index

    out = compact_index(index_path(index), shards=shards)
    if as_json:
        click.echo(json.dumps(out))
    else:
        parts = f" in {out['shards']} partitions" if out["shards"] > 1 else ""
        click.echo(f"{out['segments_before']} segment(s) -> {out['segments']}{parts}; {out['chunks']} chunks "
                   f"({out['rows_before'] - out['chunks']} deleted dropped) in {out['seconds']:.2f} s")


@main.command()
@index_option
@click.option("--target-recall", type=click.FloatRange(0.0, 1.0, min_open=True), default=0.95, show_default=True,
              help="Tune each approximate segment to the cheapest search setting with this recall@10 against exact search.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@handle_errors
def tune(index, target_recall, as_json):
    """Tune an index's approximate search knobs again, without rebuilding it.

    A build tunes each IVF or HNSW segment to --target-recall on a sample of its own vectors
    (nprobe / efSearch; for ivf-fastscan also how many candidates are re-ranked exactly,
    k_factor). This runs the same tuning on the index as it is and publishes the new knobs as a
    new generation (only the manifest is written; running servers pick it up): for another
    recall target, or for an index built by a version whose tuner knew fewer knobs.

    \b
    semsearch tune --index indexes/big --target-recall 0.97
    """
    from semsearch.api import tune as tune_index

    out = tune_index(index, target_recall)
    if as_json:
        click.echo(json.dumps(out))
        return
    if not out["segments"]:
        click.echo("nothing to tune: every segment is searched exactly (flat)")
        return
    for t in out["segments"]:
        def knobs(side):
            p = side["params"]
            return ", ".join(f"{k}={p[k]}" for k in ("nprobe", "efSearch", "k_factor") if k in p)
        was = (t["before"].get("recall") or {}).get("recall")
        click.echo(f"segment {t['segment']} ({t['rows']} chunks): {knobs(t['before'])} -> {knobs(t['after'])}; "
                   f"recall@10 {'?' if was is None else f'{was:.3f}'} -> {t['after']['recall']['recall']:.3f} "
                   f"(target {out['target']})")
    click.echo(f"tuned in {out['seconds']:.1f} s")


@main.command("eval")
@click.argument("dataset", required=False, type=click.Path(path_type=Path))
@click.option("--split", default="test", show_default=True, help="Which qrels/<split>.tsv to evaluate on.")
@click.option("--pooling", default=None, callback=_pooling_list, help="Comma-separated poolings to compare (one encoder pass), e.g. cls,mean,max. Default: mean.")
@click.option("--head", "heads", multiple=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Also evaluate a head from `semsearch train` (query layers or a pooling head), beside the --pooling baselines; "
                   "one per run. A head trained on another corpus than DATASET's is refused (see --force).")
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
              help="Comma-separated search modes to compare (one encoder pass): dense, lexical, hybrid. Default: dense; "
                   "with --index, every mode the index offers.")
@fusion_options
@click.option("--json", "as_json", is_flag=True, help="Every number and the settings that produced it, as JSON.")
@click.option("--per-query", is_flag=True, help="With --json / --out: also each query's nDCG@k and recall@k.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also write the JSON report to this file.")
@click.option("--force", is_flag=True, help="Evaluate a --head trained on another corpus anyway (it is refused otherwise, with the share of its training documents found in DATASET).")
@click.option("--progress/--no-progress", default=None, help="Progress bar. Default: shown on a terminal.")
@handle_errors
def eval_(dataset, split, pooling, heads, model, ks, index, pairs, pair_columns, max_queries, max_docs, device, precision,
          max_length, modes, fusion, alpha, as_json, per_query, out, force, progress):
    """Measure retrieval quality on a BEIR-format DATASET folder, or pair similarity with --pairs.

    \b
    semsearch eval ../shared/data/beir/scifact --pooling cls,mean,max
    semsearch eval DATASET --index indexes/scifact
    semsearch eval --pairs sts.tsv --pooling cls,mean,max

    Metrics (nDCG@k, recall@k, MAP@k, MRR@k, in %) are computed by trec_eval (pytrec_eval), as
    BEIR and MTEB do. Default search is exact; every pooling and mode is computed from one encoder
    pass. As BEIR does, a hit whose document id equals the query's id is dropped; a query whose
    relevant documents are all missing from the corpus counts as 0 (as MTEB averages it).

    --head evaluates one head (to compare two, run eval once for each), with rows for the test
    queries none of whose relevant documents it trained on. --json: every report, --pairs too,
    has its rows under `results` (`pairs.results` is kept as an alias).
    """
    from semsearch import api

    try:
        cutoffs = sorted({int(x) for x in ks.split(",") if x.strip()})
    except ValueError as e:
        raise click.BadParameter(f"{ks!r}: expected comma-separated integers", param_hint="--k") from e
    if not cutoffs or min(cutoffs) < 1:
        raise click.BadParameter(f"{ks!r}: cutoffs must be positive", param_hint="--k")
    if len(heads) > 1:
        raise click.BadParameter("evaluate one --head at a time (it is compared with the --pooling baselines)", param_hint="--head")
    report = api.evaluate(dataset, split=split, pooling=pooling, head=heads[0] if heads else None, model=model, k=cutoffs,
                          index=index, pairs=pairs, pair_columns=pair_columns.split(",") if pair_columns else None,
                          max_queries=max_queries, max_docs=max_docs, device=device, precision=precision,
                          max_length=max_length, modes=modes, fusion=fusion, alpha=alpha, per_query=per_query, force=force,
                          progress=progress)
    text = json.dumps(report, indent=2)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n", encoding="utf-8")
    if as_json:
        click.echo(text)
        for note in report.get("notes", ()):
            click.echo(note, err=True)
        return
    click.echo(fmt.eval_report(report))
    for note in report.get("notes", ()):
        click.echo(note)


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
@click.option("--epochs", type=click.IntRange(min=1), default=None, help="At most this many epochs (see --patience). Default: 5 for query layers, 10 for a pooling head.")
@click.option("--patience", type=click.IntRange(min=1), default=None, help="Stop after this many dev checks without a better figure (query layers check twice an epoch). Default: 3 / 2.")
@click.option("--batch-size", type=click.IntRange(min=2), default=64, show_default=True, help="Pairs per batch; the other pairs' passages are the in-batch negatives.")
@click.option("--positives-per-query", type=click.IntRange(min=1), default=2, show_default=True, help="Positives sampled per query per epoch (bounds an epoch's cost).")
@click.option("--lr", type=float, default=None, help="AdamW learning rate. Default: 4e-5 for query layers, 2e-3 for a pooling head.")
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
@click.option("--seen-fraction", type=click.FloatRange(0.0, 0.5), default=0.1, show_default=True,
              help="Query layers: also hold out this share of the queries about documents that stay training positives "
                   "(through other queries). Checks are then ranked on the whole dev set, and never kept below the base "
                   "model on the held-out documents. 0: judge on held-out documents alone.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--mode", type=click.Choice(["hybrid", "dense"]), default="dense", show_default=True,
              help="Query layers: the search mode to train for and to judge on the dev set. dense: the cosine ranking "
                   "alone (chosen on two datasets: it helped both, hybrid search included); hybrid adds BM25's part of "
                   "the fused score to the loss, so the layers learn what BM25 misses (better on SciFact, refused on NFCorpus).")
@click.option("--cache", type=click.Path(file_okay=False, path_type=Path), default=Path("indexes/.cache"), show_default=True,
              help="Where token states are cached, so a second run does not encode again.")
@click.option("--force", is_flag=True, help="Save the best trained check even if it does not beat the base model on the dev set (it then says so, and head.json records improved_on_dev: false).")
@device_option
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16", "fp16", "int8"]), default="auto", show_default=True, help="Encoder arithmetic for the token states.")
@click.option("--progress/--no-progress", default=None, help="Progress bar. Default: shown on a terminal.")
@handle_errors
def train(beir, split, dev_split, pairs, index, train_layers, pseudo_queries, out, model, epochs, patience, batch_size, positives_per_query, lr,
          weight_decay, scale, hard_negatives, neg_skip, neg_depth, symmetric, projection, dev_fraction, seen_fraction, seed, mode, cache, force,
          device, precision, progress):
    """Fine-tune contrastively on (query, relevant passage) pairs.

    By default (--train-layers 2) the top two layers of the *query* encoder are trained so that
    each query ranks its relevant passages first among every passage of the corpus, whose vectors
    stay the base model's: an index built before training stays valid, and `semsearch index
    --head` only records the head. Each document's title (else first sentence) is added as an
    unlabelled query for it (--no-pseudo-queries: labels only). With --train-layers 0, an
    attention-pooling head is trained for both sides on cached token states instead.

    By default the layers are trained for hybrid search, the default of `semsearch query`: half
    of the loss ranks by the fused score with BM25's part fixed, so the dense side learns what
    BM25 misses (--mode dense: the dense ranking alone).

    Queries on held-out *documents* are the dev set, ranked in that mode (hybrid: dense must not
    fall either): the best check on them is kept, and a result that does not beat the base model
    there is not saved (unless --force).

    \b
    semsearch index corpus/ --index indexes/x --text-column title,text
    semsearch train --beir ../shared/data/beir/scifact --index indexes/x --out heads/scifact
    semsearch eval ../shared/data/beir/scifact --head heads/scifact
    semsearch index corpus/ --index indexes/x --head heads/scifact     # re-encodes nothing
    """
    from semsearch import api

    rep = api.train(out, beir=beir, split=split, dev_split=dev_split, pairs=pairs, index=index, train_layers=train_layers,
                    pseudo_queries=pseudo_queries, model=model, epochs=epochs, patience=patience, batch_size=batch_size,
                    positives_per_query=positives_per_query, lr=lr, weight_decay=weight_decay, scale=scale,
                    hard_negatives=hard_negatives, neg_skip=neg_skip, neg_depth=neg_depth, symmetric=symmetric,
                    projection=projection, dev_fraction=dev_fraction, seen_fraction=seen_fraction, seed=seed, mode=mode, cache=cache,
                    force=force, device=device,
                    precision=precision, progress=progress, log=lambda line: click.echo(line, err=True))
    click.echo(rep.verdict)
    if rep.forced:
        click.echo(f"warning: {rep.note}")
    if rep.kind == "pooling":
        click.echo(f"saved head to {out} (fingerprint {rep.head['fingerprint']})")
    else:
        click.echo(f"saved query layers to {out} (fingerprint {rep.head['fingerprint']}); documents keep their vectors: "
                   f"`semsearch index CORPUS --head {out}` records it on an index without re-encoding")


def exposure_options(fn):
    """--api-key, --api-key-file, --insecure, --allowed-host: who may reach a server beyond loopback."""
    for opt in reversed([
        click.option("--api-key", default=None, envvar="SEMSEARCH_API_KEY", show_envvar=True, metavar="KEY",
                     help="Require `Authorization: Bearer KEY` on every request (for `serve`: every endpoint but /health)."),
        click.option("--api-key-file", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="PATH",
                     help="Read the API key from this file (its first line), rather than from the command line."),
        click.option("--insecure", is_flag=True, help="Allow listening beyond loopback without an API key."),
        click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
                     help="Repeatable: a Host name clients may use beyond loopback (`*.example.com` for subdomains, `*` for any). "
                          "Loopback names and the listening address are always allowed."),
    ]):
        fn = opt(fn)
    return fn


def limit_options(fn):
    """The bounds on one request of a server (semsearch.service.Limits)."""
    for opt in reversed([
        click.option("--max-k", type=click.IntRange(min=1), default=1000, show_default=True, help="Largest k a search may ask for."),
        click.option("--max-results", type=click.IntRange(min=1), default=10_000, show_default=True,
                     help="Most hits in one search request: its number of queries times k."),
        click.option("--max-request-bytes", type=click.IntRange(min=1024), default=8 * 2**20, show_default=True,
                     help="Largest request body (and, for document writes, the largest document text)."),
        click.option("--max-response-bytes", type=click.IntRange(min=1024), default=64 * 2**20, show_default=True,
                     help="Largest response body."),
        click.option("--max-inflight-per-client", type=click.IntRange(min=0), default=0, show_default=True,
                     help="Requests one client address may have running at once over HTTP; more get 429 (0: no limit)."),
        click.option("--max-write-chunks", type=click.IntRange(min=1), default=2048, show_default=True,
                     help="Most chunks one document write may make (and encode); a larger write is refused before "
                          "any is encoded (HTTP 413, an MCP tool error)."),
        click.option("--header-timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
                     help="Seconds a request's headers may take to arrive (from the connection, or the previous "
                          "response); past it, a 408 and the connection closes."),
        click.option("--body-timeout", type=click.FloatRange(min=0.1), default=60.0, show_default=True,
                     help="Seconds a request's body may take to arrive once its headers have (a 408 past it)."),
        click.option("--max-connections", type=click.IntRange(min=1), default=1000, show_default=True,
                     help="HTTP connections and requests at once; a request beyond gets a 503."),
    ]):
        fn = opt(fn)
    return fn


def watch_options(fn):
    fn = click.option("--poll", "watch_poll", is_flag=True, help="With --watch: poll the folder instead of using file-system events.")(fn)
    return click.option("--watch", "watch_dir", type=click.Path(path_type=Path), default=None, metavar="DIR",
                        help="Keep the index in step with the folder DIR while serving (as `semsearch watch DIR` does, "
                             "after catching up at start; a new index is made where there is none).")(fn)


def _api_key(api_key: str | None, api_key_file: Path | None) -> str | None:
    from semsearch.exposure import read_key_file

    if api_key_file is None:
        return api_key
    if api_key is not None and click.get_current_context().get_parameter_source("api_key") != click.core.ParameterSource.ENVIRONMENT:
        raise click.UsageError("give --api-key or --api-key-file, not both")  # the file wins over SEMSEARCH_API_KEY
    try:
        return read_key_file(api_key_file)
    except SemsearchError as e:
        raise click.BadParameter(str(e), param_hint="--api-key-file") from e


def _limits(max_k, max_results, max_request_bytes, max_response_bytes, max_inflight_per_client, max_write_chunks,
            header_timeout, body_timeout, max_connections):
    from semsearch.service import Limits

    return Limits(max_request_bytes=max_request_bytes, max_k=max_k, max_results=max_results,
                  max_response_bytes=max_response_bytes, max_inflight_per_client=max_inflight_per_client,
                  max_write_chunks=max_write_chunks, header_timeout=header_timeout, body_timeout=body_timeout,
                  max_connections=max_connections)


def _watcher(watch_dir: Path | None, index, device: str, poll: bool):
    if watch_dir is None:
        return None
    from semsearch.service import start_watcher

    return start_watcher(watch_dir, index, device=device, poll=poll)


@main.command()
@index_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on. Beyond loopback it needs --api-key (or --insecure).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@device_option
@click.option("--read-only", is_flag=True, help="Refuse POST /documents and DELETE /documents/{id}.")
@exposure_options
@click.option("--docs", is_flag=True, help="Serve interactive API docs at /docs and /redoc, and /openapi.json.")
@limit_options
@watch_options
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: one process holds the index. ray: a Ray Serve application, the index split into --shards "
                   "shards of --replicas replicas each, behind a router with the same HTTP API (every node must see "
                   "the index folder at the same path).")
@click.option("--shards", type=click.IntRange(min=1), default=1, show_default=True, help="With --engine ray: shards (each holds one partition of an index built with `index --shards N`, else some of its segments).")
@click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True, help="With --engine ray: replicas of each shard.")
@click.option("--ray-address", default=None, envvar="RAY_ADDRESS", help="With --engine ray: the cluster to join. Default: a new local one.")
@handle_errors
def serve(index, host, port, device, read_only, api_key, api_key_file, insecure, allowed_hosts, docs, max_k, max_results,
          max_request_bytes, max_response_bytes, max_inflight_per_client, max_write_chunks, header_timeout, body_timeout,
          max_connections, watch_dir, watch_poll, engine, shards, replicas, ray_address):
    """Serve the index over HTTP: search, embeddings (OpenAI and TEI shapes), document upserts.

    Needs `pip install 'semsearch[serve]'`. Listens on loopback unless --host says otherwise;
    beyond loopback it refuses to start without --api-key / --api-key-file / SEMSEARCH_API_KEY
    (or --insecure). With --docs, interactive docs at http://HOST:PORT/docs.
    """
    api_key = _api_key(api_key, api_key_file)
    limits = _limits(max_k, max_results, max_request_bytes, max_response_bytes, max_inflight_per_client,
                     max_write_chunks, header_timeout, body_timeout, max_connections)
    try:
        from semsearch.exposure import check_exposure
        from semsearch.serve import serve as run_server

        check_exposure(host, api_key, insecure)  # before a watcher's catch-up
        if engine == "local" and (shards != 1 or replicas != 1):
            raise click.UsageError("--shards and --replicas go with --engine ray")
        watcher = _watcher(watch_dir, index, device, watch_poll)
        try:
            if engine == "ray":
                from semsearch.serve_ray import serve_ray

                serve_ray(index, host, port, shards=shards, replicas=replicas, ray_address=ray_address,
                          device="cpu" if device == "auto" else device, limits=limits, read_only=read_only,
                          api_key=api_key, insecure=insecure, allowed_hosts=allowed_hosts)
                return
            run_server(index, host, port, device, limits, read_only, api_key=api_key, insecure=insecure,
                       allowed_hosts=allowed_hosts, docs=docs)
        finally:
            if watcher is not None:
                watcher.stop()
    except ImportError as e:
        raise click.ClickException(str(e)) from e


@main.command()
@index_option
@click.option("--http", "http", default=None, metavar="HOST:PORT",
              help="Serve over streamable HTTP at http://HOST:PORT/mcp instead of stdio. Beyond loopback it needs --api-key (or --insecure).")
@device_option
@click.option("--allow-writes", is_flag=True, help="Offer the upsert_document and delete_document tools (read-only without it).")
@exposure_options
@limit_options
@watch_options
@handle_errors
def mcp(index, http, device, allow_writes, api_key, api_key_file, insecure, allowed_hosts, max_k, max_results,
        max_request_bytes, max_response_bytes, max_inflight_per_client, max_write_chunks, header_timeout, body_timeout,
        max_connections, watch_dir, watch_poll):
    """Serve the index to AI assistants and agents over the Model Context Protocol.

    Tools: search (query, k, mode, where), fetch (a hit's id, or a document id; whole_document),
    info; with --allow-writes also upsert_document and delete_document. Over stdio by default
    (what a desktop assistant launches: command `semsearch`, arguments `mcp --index PATH`);
    --http HOST:PORT serves streamable HTTP at /mcp, with `serve`'s rules: loopback unless an
    API key is given (or --insecure), Host names checked. Needs `pip install 'semsearch[mcp]'`.
    """
    api_key = _api_key(api_key, api_key_file)
    limits = _limits(max_k, max_results, max_request_bytes, max_response_bytes, max_inflight_per_client,
                     max_write_chunks, header_timeout, body_timeout, max_connections)
    try:
        from semsearch.exposure import check_exposure
        from semsearch.mcp_server import parse_http, run

        if http is not None:
            check_exposure(parse_http(http)[0], api_key, insecure)  # before a watcher's catch-up
        watcher = _watcher(watch_dir, index, device, watch_poll)
        run(index, http=http, device=device, limits=limits, allow_writes=allow_writes, api_key=api_key, insecure=insecure,
            allowed_hosts=allowed_hosts, watch=watcher)
    except ImportError as e:
        raise click.ClickException(str(e)) from e


if __name__ == "__main__":  # pragma: no cover
    main()
