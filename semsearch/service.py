"""One service layer under both servers: `semsearch serve` (HTTP) and `semsearch mcp` (Model
Context Protocol) call the same functions here for their limits, their input checks and their work,
so that a tool call and an HTTP request cannot be checked differently.

    Service     the index folder's current generation (a Retriever, reopened when a new manifest
                is published, by this process or another), the shared encoder, the writer
    Operations  what a client may ask of a Service within a server's Limits, read-only or not:
                search, fetch, info, health, embed, upsert, delete; each checks its arguments and
                answers plain data (JSON-ready), or raises an InputError / LimitExceeded /
                ReadOnly / DocumentNotFound that each server turns into its own error form

Blocking calls: the servers run them on worker threads, never on their event loops.
"""
from __future__ import annotations

import errno
import inspect
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from semsearch.errors import DocumentNotFound, IndexFormatError, InputError, SemsearchError
from semsearch.exposure import Scrubber, render_json, shown_path
from semsearch.limits import blank, check_depth, unencodable
from semsearch.store.faiss_info import faiss_build
from semsearch.store.files import manifest_stamp

log = logging.getLogger("semsearch.serve")

MODES = ("dense", "lexical", "hybrid")
DEFAULT_K = 10  # hits a search gives where it asks for no number (at most the server's --max-k)


class LimitExceeded(InputError):
    """A request over one of the server's bounds (422, naming the limit and its option)."""


class ReadOnly(SemsearchError):
    """A write asked of a server that takes none (HTTP 403; an error result in MCP)."""


@dataclass
class Limits:
    """Bounds on what one request may ask for (each refused with a 4xx naming the limit)."""

    max_request_bytes: int = 8 * 2**20
    max_k: int = 1000
    max_texts: int = 256  # queries in one search, inputs in one embedding request
    max_text_chars: int = 20_000  # one query or embedding input
    max_documents: int = 1000  # documents in one upsert
    max_results: int = 10_000  # hits in one search response: the sum over its queries of k
    max_response_bytes: int = 64 * 2**20  # one rendered response
    max_inflight_per_client: int = 0  # requests one client address may have running at once (0: no limit)
    max_explained: int = 100  # hits explained in one search (explain=true; each may encode its chunk again)
    max_body_values: int = 100_000  # JSON values in one HTTP request body (counted before it is validated)
    max_write_chunks: int = 2048  # chunks one write may encode (413 before any is: a 7.5 MB text makes ~6,800)
    header_timeout: float = 10.0  # seconds for a request's headers to arrive (HTTP: 408 and closed past it)
    body_timeout: float = 60.0  # seconds for its body to arrive once its headers have
    max_connections: int = 1000  # HTTP connections and requests at once (503 beyond)


class _Pending:
    __slots__ = ("texts", "queries", "result", "error", "done")

    def __init__(self, texts: list[str], queries: bool = False):
        self.texts, self.queries, self.result, self.error, self.done = texts, queries, None, None, False


def _pads_exactly(encoder) -> bool:
    """Whether padding a text beside longer ones leaves its vector as it is alone (to float
    rounding): so in fp32 and int8 (which pools text by text); not in bf16 or fp16, where the
    padded positions change the arithmetic (a vector 1e-3 from its own)."""
    return getattr(encoder, "pads_exactly", getattr(encoder, "precision", "fp32") not in ("bf16", "fp16"))


class SerialEncoder:
    """The index's encoder, one pass at a time (it already uses every core), with the texts of
    requests that arrived meanwhile encoded together in that pass: while one pass runs, callers
    queue up, and the next thread to get the encoder encodes the whole queue (up to
    `max_batch` texts) and hands each caller its rows. Queries through trained query layers
    (encode_queries) queue the same way, in passes of their own. Everything else passes through."""

    def __init__(self, encoder, max_batch: int = 256):
        self._enc = encoder
        self._lock = threading.Lock()  # one encoder pass at a time
        self._queue_lock = threading.Lock()
        self._queue: list[_Pending] = []
        self.max_batch = max_batch
        self.passes = 0  # encoder passes and texts, for tests and benchmarks
        self.texts = 0

    def __getattr__(self, name):
        return getattr(self._enc, name)

    def encode(self, texts, progress=None):
        return self._submit(texts, False)

    def encode_queries(self, texts, progress=None):
        """Query vectors: through the encoder's trained query layers where it has them."""
        return self._submit(texts, getattr(self._enc, "query_tower", None) is not None)

    def _submit(self, texts, queries: bool):
        item = _Pending([texts] if isinstance(texts, str) else list(texts), queries)
        with self._queue_lock:
            self._queue.append(item)
        with self._lock:
            while not item.done:  # a full pass may stop short of this item: go on to it
                self._encode_queued()
        if item.error is not None:
            raise item.error
        return item.result

    def _encode_queued(self) -> None:
        with self._queue_lock:
            queries = self._queue[0].queries  # a pass encodes one kind: the first waiting item's
            batch, rest, n, full = [], [], 0, False
            for it in self._queue:
                full = full or (it.queries == queries and bool(batch) and n + len(it.texts) > self.max_batch)
                if it.queries == queries and not full:
                    batch.append(it)
                    n += len(it.texts)
                else:
                    rest.append(it)
            self._queue = rest
        encode = self._enc.encode_queries if queries else self._enc.encode
        if not _pads_exactly(self._enc) and len(batch) > 1:
            self._encode_unpadded(batch, encode)
            return
        try:
            vecs = encode([t for it in batch for t in it.texts], progress=False)  # (n, D)
        except Exception as e:
            if len(batch) == 1:  # its caller raises it (the pass may run on another caller's thread)
                batch[0].error, batch[0].done = e, True
                return
            for it in batch:  # one caller's bad input must not fail the others
                try:
                    it.result = encode(it.texts, progress=False)
                except Exception as e:
                    it.error = e
                it.done = True
            return
        self.passes += 1
        self.texts += n
        start = 0
        for it in batch:
            it.result, it.done = vecs[start:start + len(it.texts)], True
            start += len(it.texts)

    def _encode_unpadded(self, batch: list[_Pending], encode) -> None:
        """A pass for an encoder whose vectors change with padding (bf16, fp16): callers' texts
        of one token length are encoded together (no padding between them), and a caller of
        several texts alone, so each gets the vectors its call would get alone."""
        groups: dict[int, list[_Pending]] = {}
        for i, it in enumerate(batch):
            key = -1 - i  # alone
            if len(it.texts) == 1:
                try:
                    key = min(len(self._enc.token_offsets(it.texts[0])), self._enc.max_length)
                except Exception:  # noqa: BLE001 - encoded alone, where its error reaches its caller
                    pass
            groups.setdefault(key, []).append(it)
        for group in groups.values():
            try:
                vecs = encode([t for it in group for t in it.texts], progress=False)
            except Exception as e:  # noqa: BLE001 - one caller's bad input must not fail the others
                for it in group:
                    try:
                        it.result = encode(it.texts, progress=False) if len(group) > 1 else None
                        it.error = None if len(group) > 1 else e
                    except Exception as e2:  # noqa: BLE001 - reported to its caller
                        it.error = e2
                    it.done = True
                continue
            self.passes += 1
            self.texts += len(vecs)
            start = 0
            for it in group:
                it.result, it.done = vecs[start:start + len(it.texts)], True
                start += len(it.texts)

    def run_alone(self, fn, *args):
        """fn(encoder, *args) while no other pass runs (an explanation encodes hits' texts itself)."""
        with self._lock:
            return fn(self._enc, *args)

    def encode_with_states(self, texts, progress=None):
        with self._lock:
            return self._enc.encode_with_states(texts, progress=progress)


class _Published:
    """What a server holds of an index, whatever serves its searches: the folder, the newest
    published generation (one stat per request tells whether a newer one exists), the shared
    serial encoder, and single-writer writes. Subclasses open a generation (`_open`) and search it."""

    encoder: SerialEncoder

    def __init__(self, index: str | os.PathLike | None, device: str):
        from semsearch.store.folder import index_path

        self.folder = index_path(index)
        self.shown = shown_path(self.folder)  # what clients see of it
        self.scrub = Scrubber(self.folder)
        self.device = device
        self._reload_lock = threading.Lock()
        self._stamp = manifest_stamp(self.folder)  # before the first load: a generation published during it is newer
        self._current: Any = None

    def _open(self):
        """What searches of the newest generation read (IndexFormatError while a writer replaces it)."""
        raise NotImplementedError

    def _manifest_stamp(self):
        """store.files.manifest_stamp, or FileNotFoundError where the index is gone."""
        stamp = manifest_stamp(self.folder)
        if stamp is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(self.folder / "manifest.json"))
        return stamp

    def retriever(self):
        """The state of the newest published generation (a stat when nothing changed)."""
        try:
            stamp = self._manifest_stamp()
        except OSError as e:
            raise IndexFormatError(f"{self.shown}: the index is gone ({e.strerror or type(e).__name__})") from e
        if stamp != self._stamp:
            with self._reload_lock:
                if stamp != self._stamp:
                    self._reload(stamp)
        return self._current

    def current_if_fresh(self):
        """The current state if no newer generation was published (one stat), else None: for
        handlers that must not load an index on the event loop."""
        return self._current if manifest_stamp(self.folder) == self._stamp else None

    def _reload(self, stamp) -> None:
        for attempt in range(3):  # another process may publish again while we open the files
            try:
                current = self._open()
                break
            except IndexFormatError:
                if attempt == 2:
                    raise
                stamp = self._manifest_stamp()
        self._current = current  # the old one closes when its last request lets go of it
        self._stamp = stamp

    def embed(self, texts: list[str], input_type: str = "document") -> np.ndarray:
        """Vectors of texts as documents, or as queries ("query": through the index's trained
        query layers where it has them; the same vectors as documents where it has none)."""
        if input_type == "query":
            return self.encoder.encode_queries(texts, progress=False)
        return self.encoder.encode(texts, progress=False)

    def token_counts(self, texts: list[str]) -> list[int]:
        """Tokens the model sees for each text, with [CLS] and [SEP], before truncation."""
        return [len(self.encoder.token_offsets(t)) + 2 for t in texts]

    def upsert(self, docs, max_chunks: int | None = None):
        from semsearch.documents import upsert_documents
        from semsearch.store import writer_lock

        with writer_lock(self.folder):  # shared with a watcher of this process (--watch)
            report = upsert_documents(self.folder, docs, self.encoder, max_chunks=max_chunks)
            self.retriever()  # the writer's next request, and every later one, sees it
        return report

    def delete(self, ids: list[str]):
        from semsearch.documents import delete_documents
        from semsearch.store import writer_lock

        with writer_lock(self.folder):
            report = delete_documents(self.folder, ids)
            self.retriever()
        return report


class Service(_Published):
    """The server's state for an index searched in this process: the current generation's
    Retriever, the shared encoder, the writer."""

    def __init__(self, index: str | os.PathLike | None = None, device: str = "auto", encoder=None):
        from semsearch.search import Retriever

        super().__init__(index, device)
        r = Retriever.load(self.folder, device=device, encoder=encoder)
        self.encoder = r.encoder = SerialEncoder(r.encoder)
        self._current = r
        params = inspect.signature(Retriever.search_batch).parameters
        self.supports = {name: name in params for name in ("mode", "where")}

    def _open(self):
        from semsearch.search import Retriever

        return Retriever.load(self.folder, device=self.device, encoder=self.encoder)

    # ---- operations (blocking; the app runs them on worker threads) -----------------------
    def search(self, queries: list[str], k: int, mode: str | None, where: dict | None, explain: bool = False):
        from semsearch.integrations.common import search_kwargs

        r = self.retriever()
        # The generation the hits came from: the Retriever may open a newer one than the one
        # this call found (it refreshes on its own), so the label is read from the search itself.
        return r.search_at(queries, k, explain=explain, **search_kwargs(r, mode, where))


def public_model(m) -> str:
    """The model's name as clients see it: a hub or package name as it is, a local folder by its
    last part (not the absolute path the manifest records)."""
    return Path(m.model).name if os.path.isabs(m.model) else m.model


def _title(hit) -> str:
    """A hit's title for a reader: its document's own (metadata `title`), else its file's name or
    its API document's id."""
    from semsearch.documents import doc_id_of

    meta = hit.metadata or {}
    if isinstance(meta.get("title"), str) and meta["title"].strip():
        return meta["title"]
    return doc_id_of(hit.path) or Path(hit.source).name


def _located(hit) -> dict[str, Any]:
    """Where a hit or a fetched chunk comes from, in the form an assistant quotes: file (or
    document id), page, section, line, row, and the one-line location."""
    from semsearch.documents import doc_id_of

    meta = hit.metadata or {}
    doc = doc_id_of(hit.path)
    out = {"document": doc, "file": None if doc is not None else hit.source, "location": hit.location,
           "page": meta.get("page") if isinstance(meta.get("page"), int) else None,
           "section": meta.get("section") if isinstance(meta.get("section"), str) else None,
           "line": hit.line, "row": hit.row}
    return {k: v for k, v in out.items() if v is not None}


CHUNK_ID, DOC_ID, FILE_ID = "chunk:", "doc:", "file:"  # the three forms of a fetch id
ROW_MARK = "#row="
INT64_MAX = 2**63 - 1  # chunk ids are SQLite integers


def _source_id(path: str, source: str, row: int | None) -> str:
    """The fetch id of a hit's whole document: `doc:ID` for an API document, `file:PATH` for a
    file (PATH as hits show it), with `#row=N` for a row of a table (a document of its own)."""
    from semsearch.documents import doc_id_of

    doc = doc_id_of(path)
    if doc is not None:
        return DOC_ID + doc
    return FILE_ID + source + (f"{ROW_MARK}{row}" if row is not None else "")


def _parse_fetch_id(given: str) -> tuple[str, Any]:
    """(kind, key) of a fetch id: ("chunk", int or None), ("doc", docstore path, row), ("file", ...)
    or ("bare", the id): see Operations.fetch."""
    from semsearch.documents import doc_path

    number = _number
    if given.startswith(CHUNK_ID):
        return "chunk", number(given[len(CHUNK_ID):])
    if given.startswith(DOC_ID):
        return "doc", (doc_path(given[len(DOC_ID):]), None)
    if given.startswith(FILE_ID):
        shown, mark, row = given[len(FILE_ID):].rpartition(ROW_MARK)
        if not mark or number(row) is None:
            shown, row = given[len(FILE_ID):], None
        return "file", (os.path.abspath(shown) if shown else "", number(row) if row is not None else None)
    return "bare", given


def _number(text: str) -> int | None:
    """A chunk id written as digits, within SQLite's integers; None for anything else."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 19 and int(text) <= INT64_MAX else None


def _doc_key(key: Any) -> tuple[str, int | None]:
    """(docstore path, row) of a parsed fetch id's document: a bare id is an API document's."""
    from semsearch.documents import doc_path

    return key if isinstance(key, tuple) else (doc_path(key) if isinstance(key, str) else "", None)


def _document(docs, path: str, row: int | None):
    from semsearch.documents import joined_documents

    return joined_documents(docs, [path], row).get(path) if path else None


def _not_found(given: str) -> DocumentNotFound:
    return DocumentNotFound(f"no chunk or document with id {given!r} in the index (ids: chunk:N, doc:ID, "
                            "file:PATH, as search gives them)").quoting(repr(given))


class Operations:
    """What a client may ask of a Service, within `limits`, refusing writes when `read_only`.
    The HTTP endpoints and the MCP tools call these (on worker threads); each checks its
    arguments before any work and gives plain data back."""

    def __init__(self, service: Service, limits: Limits | None = None, read_only: bool = False):
        self.service = service
        self.limits = limits or Limits()
        self.read_only = read_only

    # ---- checks ------------------------------------------------------------------------------------
    def check_texts(self, texts: list[str], what: str, whats: str) -> None:
        """Texts to search or embed: some, each non-empty and within --max-text-chars, at most --max-texts."""
        limits = self.limits
        if not texts:
            raise InputError(f"no {whats} given")
        if len(texts) > limits.max_texts:
            raise LimitExceeded(f"{len(texts)} {whats} in one request; the most is {limits.max_texts}")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise InputError(f"{what} {i + 1} must be a string, not {type(t).__name__}")
            if blank(t):  # nothing but spaces or control characters
                raise InputError(f"{what} {i + 1} is empty" if len(texts) > 1 else f"the {what} is empty")
            if len(t) > limits.max_text_chars:
                raise LimitExceeded(f"{what} {i + 1} has {len(t)} characters; the most is {limits.max_text_chars}")
        self.check_encodable(texts, whats)

    @staticmethod
    def check_encodable(value: Any, what: str) -> None:
        """InputError where a string in value holds a lone surrogate (UTF-8 cannot carry it)."""
        bad = unencodable(value)
        if bad is not None:
            where, text, at = bad
            raise InputError(f"{what}{where if where.startswith('[') else ''}: not valid Unicode text ({ascii(text[at])} "
                             f"at character {at + 1} is a lone surrogate, which UTF-8 cannot encode)")

    @property
    def default_k(self) -> int:
        """k where a search gives none: 10, or --max-k where that is lower."""
        return min(DEFAULT_K, self.limits.max_k)

    def check_k(self, k: Any) -> int:
        if k is None:
            return self.default_k
        if isinstance(k, bool) or not isinstance(k, int):
            raise InputError(f"k must be an integer, not {k!r}")
        if k < 1:
            raise InputError(f"k={k}: k must be at least 1")
        if k > self.limits.max_k:
            raise LimitExceeded(f"k={k}: k must be less than or equal to {self.limits.max_k} (the server's --max-k)")
        return k

    def check_search(self, queries: list[str], k: Any, mode: str | None, where: Any, explain: bool) -> int:
        """Everything a search is refused for, before it runs; gives back k (the default for None)."""
        limits = self.limits
        self.check_texts(queries, "query", "queries")
        k = self.check_k(k)
        if mode is not None and mode not in MODES:
            raise InputError(f"unknown mode {mode!r}; valid modes are: {', '.join(MODES)}")
        if where is not None:
            check_depth(where, "where")
            self.check_encodable(where, "where")
        if len(queries) * k > limits.max_results:
            raise LimitExceeded(f"{len(queries)} queries x k={k} = {len(queries) * k:,} results in one request; the most is "
                                f"{limits.max_results:,} (--max-results): send fewer queries or a smaller k")
        if explain and len(queries) * k > limits.max_explained:
            raise LimitExceeded(f"explain=true for {len(queries)} queries x k={k} = {len(queries) * k:,} results; the most "
                                f"explained in one request is {limits.max_explained:,}: send fewer queries or a smaller k")
        return k

    def rendered(self, payload: Any, render=render_json) -> bytes:
        """The payload's JSON bytes (by `render`), within --max-response-bytes (LimitExceeded past it)."""
        body = render(payload)
        if len(body) > self.limits.max_response_bytes:
            raise LimitExceeded(f"the response would be {len(body):,} bytes; the most is {self.limits.max_response_bytes:,} "
                                "(--max-response-bytes): ask for fewer queries, a smaller k, or fewer inputs")
        return body

    def _writable(self) -> None:
        if self.read_only:
            raise ReadOnly("this server is read-only (started with --read-only)")

    # ---- reading -----------------------------------------------------------------------------------
    def search(self, queries: list[str], k: int | None = None, mode: str | None = None, where: Any = None,
               single: bool = False, explain: bool = False) -> dict[str, Any]:
        """Hits as `semsearch query --json` gives them: {query, generation, hits} for one query
        (`single`), else {generation, results: [{query, hits}]}."""
        k = self.check_search(queries, k, mode, where, explain)
        gen, results = (self.service.search(queries, k, mode, where, True) if explain
                        else self.service.search(queries, k, mode, where))
        if single:
            return {"query": queries[0], "generation": gen, "hits": [h.to_dict() for h in results[0]]}
        return {"generation": gen, "results": [{"query": q, "hits": [h.to_dict() for h in hits]}
                                               for q, hits in zip(queries, results)]}

    def find(self, query: str, k: int | None = None, mode: str | None = None, where: Any = None) -> dict[str, Any]:
        """One query's hits in the compact form an assistant reads: id (`chunk:N`, for fetch), title,
        where it comes from (file or document id, page, section, line), the fetch id of its whole
        document (`source_id`: `doc:ID` or `file:PATH`), score and text."""
        k = self.check_search([query], k, mode, where, False)
        gen, results = self.service.search([query], k, mode, where)
        return {"query": query, "generation": gen,
                "hits": [{"id": CHUNK_ID + str(h.id), "rank": h.rank, "title": _title(h), "score": h.score,
                          **_located(h), "source_id": _source_id(h.path, h.source, h.row), "chunk": h.chunk,
                          "text": h.text, "metadata": h.metadata} for h in results[0]]}

    def fetch(self, id: Any, whole_document: bool = False) -> dict[str, Any]:
        """A passage or a whole document by an id of one of three forms, each unambiguous:
        `chunk:N` (a hit's `id`), `doc:ID` (a document written through the API) and `file:PATH`
        (an indexed file as hits show it; `file:PATH#row=N` for a row of a table); a bare id is
        a document id, or, where no document has it and it is a number, a chunk (the form of
        earlier versions). `whole_document`: a chunk's whole document, its chunks joined. An id
        that names nothing is `not found`, whatever the string."""
        from semsearch.documents import check_id

        given = check_id(id)
        self.check_encodable(given, "id")
        r = self.service.retriever()
        gen = r.manifest.generation
        kind, key = _parse_fetch_id(given)
        found = None
        if kind == "bare":  # a document's id first; a number no document has: a chunk's (older hit ids)
            found = _document(r.docs, *_doc_key(key))
            if found is None and _number(key) is not None:
                kind, key = "chunk", _number(key)
        chunk = None
        if kind == "chunk":
            chunk = r.docs.get_chunks([key]).get(key) if key is not None else None
            if chunk is None:
                raise _not_found(given)
            if not whole_document:
                hit = _chunk_hit(chunk)
                return {"id": CHUNK_ID + str(key), "kind": "chunk", "generation": gen, "title": _title(hit), **_located(hit),
                        "source_id": _source_id(hit.path, hit.source, hit.row), "chunk": hit.chunk, "start": hit.start,
                        "end": hit.end, "text": hit.text, "metadata": hit.metadata}
        path, row = (chunk["path"], chunk["row"]) if chunk is not None else _doc_key(key)
        found = found or _document(r.docs, path, row)
        if found is None:
            raise _not_found(given)
        text, meta, n = found
        hit = _chunk_hit({"path": path, "metadata": meta, "start": 0, "end": len(text), "text": text, "row": row})
        located = {k: v for k, v in _located(hit).items() if k in ("document", "file", "row", "location")}
        return {"id": _source_id(path, hit.source, row), "kind": "document", "generation": gen, "title": _title(hit),
                **located, "chunks": n, "text": text, "metadata": meta}

    def info(self) -> dict[str, Any]:
        """What the index holds: model, pooling, counts, generation, modes, limits."""
        import semsearch

        service = self.service
        m = service.retriever().manifest
        fb = faiss_build()
        head = dict(m.head, path=Path(m.head["path"]).name) if isinstance(m.head, dict) and m.head.get("path") else m.head
        return {"index": service.folder.name, "model": public_model(m), "model_fingerprint": m.model_fingerprint,
                "pooling": m.pooling, "head": head, "dim": m.dim, "metric": m.metric, "max_length": m.max_length,
                "chunking": m.chunking, "index_type": m.index.get("type"), "index_params": m.index.get("params"),
                "counts": m.counts, "generation": m.generation, "updated": m.updated,
                "modes": list(MODES) if service.supports["mode"] else ["dense"], "read_only": self.read_only,
                "limits": self.limits.__dict__, "version": semsearch.__version__,
                "encoder_passes": {"passes": service.encoder.passes, "texts": service.encoder.texts},
                "faiss": {k: fb[k] for k in ("version", "gpu_build", "gpus")}}

    def health(self, r=None) -> dict[str, Any]:
        """What a probe needs, and nothing more (it is answered without the key): the build of
        faiss and the GPUs are in info()."""
        r = r if r is not None else self.service.retriever()
        return {"status": "ok", "generation": r.manifest.generation, "chunks": len(r)}

    # ---- writing -----------------------------------------------------------------------------------
    def upsert(self, documents: list) -> dict[str, Any]:
        """Add or replace documents (semsearch.documents.Document, or dicts {id, text, metadata})."""
        from semsearch.documents import Document

        self._writable()
        if not documents:
            raise InputError("no documents given")
        if len(documents) > self.limits.max_documents:
            raise LimitExceeded(f"{len(documents)} documents in one request; the most is {self.limits.max_documents}")
        docs = [d if isinstance(d, Document) else Document(d.get("id"), d.get("text"), d.get("metadata") or {})
                for d in documents]
        for i, d in enumerate(docs):
            size = len(d.text.encode("utf-8", "surrogatepass")) if isinstance(d.text, str) else 0
            if size > self.limits.max_request_bytes:  # bytes, as the option says (a character may take 4)
                raise LimitExceeded(f"document {i + 1} has {size:,} bytes of text; the most is "
                                    f"{self.limits.max_request_bytes:,} (--max-request-bytes)")
        return self.service.upsert(docs, self.limits.max_write_chunks).as_dict()

    def delete(self, ids: list[str]) -> dict[str, Any]:
        self._writable()
        return self.service.delete(ids).as_dict()


def _chunk_hit(c: dict[str, Any]):
    """A docstore chunk record as a Hit (rank 0, no score): one shape for `_title` and `_located`."""
    from semsearch.search import Hit, _display

    return Hit(rank=0, score=0.0, text=c["text"], source=_display(c["path"]), path=c["path"], start=c["start"],
               end=c["end"], row=c.get("row"), line=c.get("line"), chunk=c.get("chunk", 0), id=c.get("id", 0),
               metadata=c.get("metadata") or {})


def start_watcher(corpus: str | os.PathLike, index: str | os.PathLike | None, *, device: str = "auto", poll: bool = False,
                  log=None):
    """`--watch DIR` of a server: a semsearch.watch.Watcher of `corpus` into `index`, started on a
    daemon thread, after its catch-up (which creates the index where there is none yet), so the
    server opens an index that matches the folder. Its own encoder: the server's runs queries."""
    import sys

    from semsearch.watch import Watcher

    def to_stderr(line: str) -> None:  # stdout may carry a protocol (MCP over stdio)
        print(f"watch: {line}", file=sys.stderr, flush=True)

    w = Watcher(corpus, index, device=device, poll=poll, log=log or to_stderr).start()
    w.ready.wait()
    if w.error is not None:
        raise w.error
    if not (w.folder / "manifest.json").exists():  # the catch-up failed (a bad file: its line says which)
        w.stop()
        raise InputError(f"watching {str(corpus)!r} made no index yet (see the line above); fix that file or "
                         "add --skip-errors (with `semsearch watch`), then start again")
    return w


class _ShardedDocs:
    """The docstore reads Operations makes (fetch: chunk records, whole documents), answered by
    the shards of one generation."""

    def __init__(self, fanout, generation: int):
        self.fanout, self.generation = fanout, generation

    def get_chunks(self, ids) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for part in self.fanout("chunks", self.generation, [int(i) for i in ids]):
            out.update(part)
        return out

    def select(self, columns: str, where: str = "", params: tuple = ()):
        rows = [r for part in self.fanout("select", self.generation, columns, where, tuple(params)) for r in part]
        return iter(sorted(rows, key=lambda r: r[0]))


class _ShardedView:
    """What Operations reads of a generation (manifest, chunk count, docstore), for a sharded index."""

    def __init__(self, manifest, fanout):
        self.manifest = manifest
        self.docs = _ShardedDocs(fanout, manifest.generation)

    def __len__(self) -> int:
        return int(self.manifest.counts.get("chunks", 0))


class ShardedService(_Published):
    """The server's state for an index whose searches fan out to its shards (semsearch/shards.py)
    through `fanout` (local Shard objects, or Ray Serve deployments: semsearch/serve_ray.py): the
    router holds the query encoder and the manifest, the shards hold the vectors and postings.
    Writes stay single-writer: this process publishes a new generation as `Service` does, and
    the shards open it when a search names it."""

    def __init__(self, index: str | os.PathLike | None, fanout, device: str = "auto", encoder=None):
        from semsearch.search import _query_encoder
        from semsearch.shards import ShardedSearch

        super().__init__(index, device)
        self.fanout = fanout
        self._current = self._open()
        m = self._current.manifest
        self.encoder = SerialEncoder(encoder if encoder is not None else _query_encoder(self.folder, m, None, device, False))
        self.router = ShardedSearch(self.folder, fanout, self.encoder)
        self.supports = {"mode": True, "where": True}

    def _open(self):
        from semsearch.store.manifest import Manifest

        return _ShardedView(Manifest.load(self.folder), self.fanout)

    def search(self, queries: list[str], k: int, mode: str | None, where: dict | None, explain: bool = False):
        self.retriever()  # the view follows the newest generation
        return self.router.search_at(queries, k, mode, where, explain=explain)
