"""Readers per file format: each yields the Documents of one file, streaming where it can."""
from __future__ import annotations

import csv
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from semsearch.corpus.base import Skip, check_utf8 as _check_utf8  # noqa: F401  (Skip: the readers' signal)
from semsearch.corpus.formats import DOCX_EXTS, GZ_EXTS, HTML_EXTS, PDF_EXTS
from semsearch.errors import CorpusError, InputError
from semsearch.limits import MAX_DEPTH, too_deep, unencodable

log = logging.getLogger(__name__)

TEXT_EXTS = {".txt", ".md", ".markdown", ".rst", ".text"}
TABLE_EXTS = {".csv", ".tsv"}
RECORD_EXTS = {".jsonl", ".ndjson", ".json"}
PARQUET_EXTS = {".parquet"}
DOCUMENT_EXTS = PDF_EXTS | HTML_EXTS | GZ_EXTS | DOCX_EXTS  # read by semsearch.corpus.formats (.gz: x.html.gz only)
SUPPORTED_EXTS = TEXT_EXTS | TABLE_EXTS | RECORD_EXTS | PARQUET_EXTS | DOCUMENT_EXTS

# Field names tried, in order, when no text column is named.
TEXT_FIELD_NAMES = ("text", "content", "body", "passage", "document", "contents", "abstract", "description", "answer")


@dataclass
class Document:
    """One unit of text from a source file: the whole file, or one row / record of it."""

    text: str
    row: int | None = None  # 1-based row (tables) or line (JSONL); None for whole-file documents
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class ReadOptions:
    text_column: str | None = None
    skip_errors: bool = False


def read_documents(path: Path, opts: ReadOptions) -> Iterator[Document]:
    """The documents in one file, chosen by its extension."""
    ext = path.suffix.lower()
    if ext in TEXT_EXTS:
        yield Document(_read_text(path))
    elif ext in TABLE_EXTS:
        yield from _read_table(path, opts, sep="\t" if ext == ".tsv" else ",")
    elif ext == ".json":
        yield from _read_json(path, opts)
    elif ext in RECORD_EXTS:
        yield from _read_jsonl(path, opts)
    elif ext in PARQUET_EXTS:
        yield from _read_parquet(path, opts)
    elif ext in DOCUMENT_EXTS:  # the whole extracted text; indexing also marks pages and sections
        from semsearch.corpus.formats import extract_text

        text, meta = extract_text(path)
        yield Document(text, metadata=meta)
    else:
        raise InputError(f"{path}: unsupported file type {ext!r}")


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise Skip(f"not UTF-8 (byte {e.start})") from e
    except OSError as e:
        raise Skip(f"unreadable ({e.strerror})") from e


def _pick_text_field(path: Path, fields: list[str], sample: list[dict], wanted: str | None, what: str) -> str:
    if wanted is not None:
        for w in wanted.split(","):  # "title,text": several fields joined with a space
            if w not in fields:
                raise CorpusError(f"{path}: no {what} {w!r}; it has: {', '.join(map(str, fields))}")
        return wanted
    lower = {str(f).lower(): f for f in fields}
    for name in TEXT_FIELD_NAMES:
        if name in lower:
            return lower[name]
    # Otherwise the field whose values are the longest strings on average.
    best, best_len = None, 0.0
    for f in fields:
        vals = [r.get(f) for r in sample]
        strs = [v for v in vals if isinstance(v, str)]
        if not strs or len(strs) < len(vals) / 2:
            continue
        avg = sum(map(len, strs)) / len(vals)
        if avg > best_len:
            best, best_len = f, avg
    if best is None:
        raise CorpusError(f"{path}: no text {what} found among {', '.join(map(str, fields))}; name one with --text-column")
    return best


def _to_document(rec: dict, key: str, row: int) -> Document | None:
    keys = key.split(",") if key not in rec else [key]
    vals = [rec.get(k) for k in keys]
    vals = [v for v in vals if v is not None and not (isinstance(v, float) and v != v)]  # missing or NaN
    if not vals:
        return None
    text = " ".join(str(v).strip() for v in vals if str(v).strip())
    meta = {str(k): _plain(v) for k, v in rec.items() if k not in keys}
    return Document(text, row=row, metadata=meta)


def _plain(v: Any) -> Any:
    """A JSON-serialisable form of a metadata value."""
    if v is None or isinstance(v, (str, bool, int)):
        return v
    if isinstance(v, float):
        return None if v != v else v
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if hasattr(v, "item"):  # numpy scalar
        return _plain(v.item())
    return str(v)


def _read_table(path: Path, opts: ReadOptions, sep: str) -> Iterator[Document]:
    # The standard csv module rather than pandas: it streams, and its line_num lets errors name the
    # exact line and rows keep their true numbers when malformed lines are skipped (pandas' reader
    # silently turns an extra field in the first rows into an index column and shifts every value).
    _check_utf8(path)
    kind = "CSV" if sep == "," else "TSV"
    with open(path, encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh, delimiter=sep)
        try:
            header = next(reader, None)
            if header is None:
                return
            key: str | None = None
            pending: list[tuple[int, dict]] = []
            row = bad = 0
            for fields in reader:
                if not fields or (len(fields) == 1 and not fields[0].strip()):
                    continue  # blank line
                row += 1
                if len(fields) != len(header):
                    msg = f"{path}: malformed {kind}: line {reader.line_num}: expected {len(header)} fields, saw {len(fields)}"
                    if opts.skip_errors:
                        log.warning("%s; skipped", msg)
                        bad += 1
                        continue
                    raise CorpusError(f"{msg} (use --skip-errors to skip bad lines)")
                rec = dict(zip(header, fields))
                if key is None:
                    pending.append((row, rec))
                    if len(pending) < 200:
                        continue
                    key = _pick_text_field(path, header, [r for _, r in pending], opts.text_column, "column")
                    yield from _docs(pending, key)
                    continue
                yield from _docs([(row, rec)], key)
            if key is None and pending:
                key = _pick_text_field(path, header, [r for _, r in pending], opts.text_column, "column")
                yield from _docs(pending, key)
        except csv.Error as e:
            raise CorpusError(f"{path}: malformed {kind}: line {reader.line_num}: {e}") from e
    if bad:
        log.warning("%s: skipped %d malformed line(s)", path, bad)


def _docs(rows: list[tuple[int, dict]], key: str) -> Iterator[Document]:
    for row, rec in rows:
        doc = _to_document(rec, key, row)
        if doc is not None and doc.text.strip():
            yield doc


def _records_from_lines(path: Path, opts: ReadOptions) -> Iterator[tuple[int, dict]]:
    _check_utf8(path)
    try:
        with open(path, encoding="utf-8-sig") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    if not isinstance(rec, dict):
                        raise ValueError("not a JSON object")
                except (ValueError, RecursionError) as e:
                    if opts.skip_errors:
                        log.warning("%s:%d: skipped malformed line: %s", path, lineno, e)
                        continue
                    raise CorpusError(f"{path}:{lineno}: malformed JSON line: {e} (use --skip-errors to skip it)") from e
                yield lineno, rec
    except UnicodeDecodeError as e:
        raise Skip(f"not UTF-8 (byte {e.start})") from e


def _read_records(path: Path, opts: ReadOptions, records: Iterator[tuple[int, dict]]) -> Iterator[Document]:
    key = None
    pending: list[tuple[int, dict]] = []
    for row, rec in records:
        if key is None:
            pending.append((row, rec))
            if len(pending) < 50:
                continue
            key = _pick_field_from(path, pending, opts)
            for r, p in pending:
                yield from _doc_or_error(path, p, key, r, opts)
            continue
        yield from _doc_or_error(path, rec, key, row, opts)
    if key is None and pending:
        key = _pick_field_from(path, pending, opts)
        for r, p in pending:
            yield from _doc_or_error(path, p, key, r, opts)


def _pick_field_from(path: Path, pending: list[tuple[int, dict]], opts: ReadOptions) -> str:
    fields: list[str] = []
    for _, rec in pending:
        fields += [k for k in rec if k not in fields]
    return _pick_text_field(path, fields, [r for _, r in pending], opts.text_column, "field")


def _doc_or_error(path: Path, rec: dict, key: str, row: int, opts: ReadOptions) -> Iterator[Document]:
    deep = too_deep(rec, MAX_DEPTH)
    bad = unencodable(rec, "record") if deep is None else None  # "\ud800" in JSON: SQLite cannot store it
    doc = None if deep is not None or bad is not None else _to_document(rec, key, row)
    if doc is None:
        msg = (f"{path}:{row}: record nested more than {MAX_DEPTH} levels deep (at {deep[:80]}); the most is {MAX_DEPTH}"
               if deep is not None else
               f"{path}:{row}: {bad[0][:80]} is not valid Unicode text ({ascii(bad[1][bad[2]])} at character {bad[2] + 1} "
               "is a lone surrogate)" if bad is not None else f"{path}:{row}: record has no {key!r} field")
        if opts.skip_errors:
            log.warning("%s; skipped", msg)
            return
        raise CorpusError(msg + " (use --skip-errors to skip it)")
    if doc.text.strip():
        yield doc


def _read_jsonl(path: Path, opts: ReadOptions) -> Iterator[Document]:
    yield from _read_records(path, opts, _records_from_lines(path, opts))


def _read_json(path: Path, opts: ReadOptions) -> Iterator[Document]:
    try:
        data = json.loads(path.read_bytes().decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        raise Skip(f"not UTF-8 (byte {e.start})") from e
    except (ValueError, RecursionError) as e:
        raise CorpusError(f"{path}: malformed JSON: {e}") from e
    # A .json in a folder is often not a corpus (a site's settings, a search index, a manifest):
    # one that is not records with a text field is skipped with a warning, not a stop.
    if isinstance(data, dict):
        if opts.text_column is None and not {str(k).lower() for k in data} & set(TEXT_FIELD_NAMES):
            raise Skip("not a JSON corpus (an object with no text field; name one with --text-column)")
        data = [data]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise Skip("not a JSON corpus (expected a JSON object or a list of objects)")
    if opts.text_column is None and data:
        try:
            _pick_field_from(path, list(enumerate(data[:50], 1)), opts)
        except CorpusError as e:
            raise Skip("not a JSON corpus (no text field; name one with --text-column)") from e
    yield from _read_records(path, opts, iter(enumerate(data, 1)))


def _read_parquet(path: Path, opts: ReadOptions) -> Iterator[Document]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several error types for a bad file
        raise CorpusError(f"{path}: not a readable Parquet file: {' '.join(str(e).split())}") from e
    def rows():
        try:
            for batch in pf.iter_batches(batch_size=2000):
                yield from batch.to_pylist()
        except Exception as e:  # noqa: BLE001 - a damaged row group shows only when it is read
            raise CorpusError(f"{path}: damaged Parquet data: {' '.join(str(e).split()) or type(e).__name__}") from e

    yield from _read_records(path, opts, enumerate(rows(), 1))
