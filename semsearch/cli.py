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


def device_option(fn):
    return click.option(
        "--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
        help="Where the encoder runs: auto picks a CUDA GPU when one is present.",
    )(fn)


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
    """
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s: %(message)s", stream=sys.stderr)


@main.command()
@click.argument("corpus", type=click.Path(path_type=Path))
@index_option
@click.option("--model", default=None, help="Model folder or hub name. Default: the index's model, else the bundled all-MiniLM-L6-v2.")
@click.option("--pooling", default=None, callback=_pooling_list, help="cls, mean or max. Default: the index's pooling, else mean.")
@click.option("--head", "head", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None, help="A trained pooling head folder (from `semsearch train`); replaces --pooling.")
@device_option
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16", "fp16"]), default="auto", show_default=True,
              help="Encoder arithmetic. auto: bf16 on CPUs with AMX/AVX-512-BF16, fp16 on GPUs, else fp32.")
@click.option("--chunk-tokens", type=int, default=None, help="Tokens per chunk. Default: the model's max length - 2 (254).")
@click.option("--overlap", type=int, default=None, help="Tokens shared by consecutive chunks. Default: 32.")
@click.option("--text-column", default=None, help="Column (CSV/TSV/Parquet) or field (JSON/JSONL) holding the text. Default: found automatically.")
@click.option("--skip-errors", is_flag=True, help="Skip malformed CSV/JSONL lines with a warning instead of stopping.")
@click.option("--rebuild", is_flag=True, help="Build the index anew (e.g. with another model or pooling) instead of updating it.")
@click.option("--progress/--no-progress", default=None, help="Progress bar. Default: shown on a terminal.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@handle_errors
def index(corpus, index, model, pooling, head, device, precision, chunk_tokens, overlap, text_column, skip_errors, rebuild, progress, as_json):
    """Index the files under CORPUS (a folder or one file) into an index folder.

    Reads .txt .md .rst .csv .tsv .jsonl .json .parquet, recursively; hidden and binary files are
    skipped. Running it again re-embeds only new or changed files and removes deleted ones.
    Writes are atomic: an interrupted run leaves the previous index usable.
    """
    from semsearch.corpus import ChunkSettings, ReadOptions
    from semsearch.encoder.encoder import Encoder
    from semsearch.indexing import index_corpus, load_base
    from semsearch.store import index_path

    folder = index_path(index)
    if not corpus.exists():  # before loading a model
        raise click.ClickException(f"corpus path {str(corpus)!r} does not exist")
    if pooling and len(pooling) > 1:
        raise click.BadParameter("index takes one pooling", param_hint="--pooling")
    base = load_base(folder, rebuild) if (folder / "manifest.json").exists() else None
    head_mod = head_info = None
    if head is not None:
        from semsearch.train.head import head_info as _info, load_head

        head_mod, head_info = load_head(head), _info(head)
        pool = "head"
    else:
        pool = pooling[0] if pooling else (base.pooling if base else "mean")
    if base is not None and base.pooling == "head" and head is None and not pooling:
        from semsearch.train.head import load_head

        head_mod, head_info, pool = load_head(base.head["path"]), base.head, "head"
    enc = Encoder(
        model if model else (base.model if base else None), pooling=pool, device=device, precision=precision,
        max_length=base.max_length if base and not model else None, head=head_mod,
    )
    enc.head_info = head_info
    chunking = None
    if chunk_tokens is not None or overlap is not None or base is None:
        d = ChunkSettings(window=enc.max_length - 2)
        if base is not None:
            d = ChunkSettings(**base.chunking)
        chunking = ChunkSettings(chunk_tokens if chunk_tokens is not None else d.window, overlap if overlap is not None else d.overlap)
    report = index_corpus(corpus, folder, enc, chunking, ReadOptions(text_column, skip_errors), rebuild, progress)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        for reason, n in report.skipped.items():
            click.echo(f"skipped {n} file(s): {reason}", err=True)
        click.echo(report.summary())


@main.command()
@click.argument("query", required=True)
@index_option
@click.option("-k", "k", type=click.IntRange(min=1), default=10, show_default=True, help="Number of hits per query.")
@click.option("--model", default=None, help="Check that the index was built with this model (queries always use the index's model).")
@click.option("--pooling", default=None, type=click.Choice(POOLING_CHOICES + ("head",)), help="Check that the index was built with this pooling.")
@device_option
@click.option("--json", "as_json", is_flag=True, help="Every field as JSON: an object for one query, a list for queries from stdin.")
@click.option("--jsonl", "as_jsonl", is_flag=True, help="One JSON object per query per line: {query, hits}.")
@click.option("--width", type=int, default=100, show_default=True, help="Snippet width in the table.")
@handle_errors
def query(query, index, k, model, pooling, device, as_json, as_jsonl, width):
    """Search the index for QUERY ('-' reads one query per line from stdin).

    Scores are cosine similarities between the query and each chunk, in [-1, 1]; higher is closer.
    """
    from semsearch.errors import InputError
    from semsearch.search import Retriever

    from_stdin = query == "-"
    queries = [line.strip() for line in sys.stdin if line.strip()] if from_stdin else [query]
    if not queries:
        raise InputError("no queries on stdin" if from_stdin else "the query is empty")
    if not from_stdin and not query.strip():
        raise InputError("the query is empty")
    r = Retriever.load(index, model=model, pooling=pooling, device=device)
    results = r.search_batch(queries, k)
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
    src_w = min(max(len(h.location) for h in hits), 50)
    lines = [f"{'rank':>4}  {'score':>6}  {'source':<{src_w}}  snippet"]
    for h in hits:
        snippet = " ".join(h.text.split())
        if len(snippet) > width:
            snippet = snippet[: width - 1] + "…"
        loc = h.location if len(h.location) <= src_w else "…" + h.location[-(src_w - 1):]
        lines.append(f"{h.rank:>4}  {h.score:>6.3f}  {loc:<{src_w}}  {snippet}")
    return "\n".join(lines)


@main.command()
@index_option
@click.option("--json", "as_json", is_flag=True, help="The whole manifest as JSON.")
@handle_errors
def info(index, as_json):
    """Show what an index holds and how it was built."""
    from semsearch.store import Manifest, index_path

    folder = index_path(index)
    m = Manifest.load(folder)
    if as_json:
        click.echo(m.to_json())
        return
    last = m.last_run or {}
    rows = [
        ("index", str(folder)),
        ("format version", m.format_version),
        ("model", f"{m.model} (weights {m.model_fingerprint}, {m.backend})"),
        ("pooling", m.pooling + (f" (head {m.head['path']})" if m.head else "")),
        ("vectors", f"{m.dim}-d, {m.metric} (L2-normalised, inner product), index type {m.index.get('type')}"),
        ("max length", f"{m.max_length} tokens; chunks of {m.chunking['window']} tokens, overlap {m.chunking['overlap']}"),
        ("precision", m.precision),
        ("holds", f"{m.counts['files']} files, {m.counts['documents']} documents, {m.counts['chunks']} chunks"),
        ("created", m.created),
        ("updated", m.updated),
        ("last run", f"{last.get('added', 0)} added, {last.get('updated', 0)} updated, {last.get('removed', 0)} removed, "
                     f"{last.get('unchanged', 0)} unchanged; {last.get('chunks', 0)} chunks in {last.get('seconds', 0):.1f} s"),
    ]
    for extra in ("recall", "params"):
        if extra in m.index:
            rows.append((f"index {extra}", json.dumps(m.index[extra])))
    w = max(len(k) for k, _ in rows)
    for key, val in rows:
        click.echo(f"{key:<{w}}  {val}")


if __name__ == "__main__":  # pragma: no cover
    main()
