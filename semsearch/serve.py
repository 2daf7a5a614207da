"""`semsearch serve`: an index over HTTP (FastAPI + uvicorn, the extra `semsearch[serve]`).

A thin layer over `Retriever`, the index's `Encoder` and `semsearch.documents`, like cli.py:
    GET  /health, /info                      liveness; the manifest's model, pooling, index, counts
    POST /search {query|queries, k, mode, where}, GET /search?q=&k=     hits as `query --json`
    POST /v1/embeddings (OpenAI shape), POST /embed (text-embeddings-inference shape)
    POST /documents {documents: [{id, text, metadata}]}, DELETE /documents/{id}

Concurrency: encoding, searching and writing run on worker threads, never on the event loop.
The encoder runs one pass at a time (it uses every core already), and texts of requests that
wait meanwhile go into one pass together; searches of FAISS and the docstore run side by side. Writes are serialised and build the next generation while searches
go on against the current one; each request takes one `Retriever` (one generation's vectors
and docstore together) and keeps it to the end, so it never sees half of a write. A new
generation (from this server or from `semsearch index` in another process) is noticed by a
stat of manifest.json on each request.
"""
# No `from __future__ import annotations`: FastAPI reads the request models of the handlers
# defined inside create_app() from their annotations at run time.
import base64
import inspect
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np

from semsearch.errors import (DocumentNotFound, IndexFormatError, IndexLocked, InputError, SemsearchError,
                              SettingsMismatch)

log = logging.getLogger(__name__)

MODES = ("dense", "lexical", "hybrid")


def _require():
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise ImportError(f"`semsearch serve` needs FastAPI and uvicorn ({e.name} is missing): "
                          "pip install 'semsearch[serve]'") from e


@dataclass
class Limits:
    """Bounds on what one request may ask for (each refused with a 4xx naming the limit)."""

    max_request_bytes: int = 8 * 2**20
    max_k: int = 1000
    max_texts: int = 256  # queries in one search, inputs in one embedding request
    max_text_chars: int = 20_000  # one query or embedding input
    max_documents: int = 1000  # documents in one upsert


class _Pending:
    __slots__ = ("texts", "result", "error", "done")

    def __init__(self, texts: list[str]):
        self.texts, self.result, self.error, self.done = texts, None, None, False


class _SerialEncoder:
    """The index's encoder, one pass at a time (it already uses every core), with the texts of
    requests that arrived meanwhile encoded together in that pass: while one pass runs, callers
    queue up, and the next thread to get the encoder encodes the whole queue (up to
    `max_batch` texts) and hands each caller its rows. Everything else passes through."""

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
        item = _Pending([texts] if isinstance(texts, str) else list(texts))
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
            batch, n = [], 0
            while self._queue and (not batch or n + len(self._queue[0].texts) <= self.max_batch):
                batch.append(self._queue.pop(0))
                n += len(batch[-1].texts)
        try:
            vecs = self._enc.encode([t for it in batch for t in it.texts], progress=False)  # (n, D)
        except Exception:
            if len(batch) == 1:
                raise
            for it in batch:  # one caller's bad input must not fail the others
                try:
                    it.result = self._enc.encode(it.texts, progress=False)
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

    def encode_with_states(self, texts, progress=None):
        with self._lock:
            return self._enc.encode_with_states(texts, progress=progress)


class Service:
    """The server's state: the current generation's Retriever, the shared encoder, the writer."""

    def __init__(self, index: str | os.PathLike | None = None, device: str = "auto", encoder=None):
        from semsearch.search import Retriever
        from semsearch.store.folder import index_path

        self.folder = index_path(index)
        self.device = device
        r = Retriever.load(self.folder, device=device, encoder=encoder)
        self.encoder = r.encoder = _SerialEncoder(r.encoder)
        self._current = r
        self._stamp = self._manifest_stamp()
        self._reload_lock = threading.Lock()
        self._write_lock = threading.Lock()
        params = inspect.signature(Retriever.search_batch).parameters
        self.supports = {name: name in params for name in ("mode", "where")}

    def _manifest_stamp(self):
        st = os.stat(self.folder / "manifest.json")
        return st.st_ino, st.st_mtime_ns, st.st_size

    def retriever(self):
        """The Retriever of the newest published generation (a stat when nothing changed)."""
        try:
            stamp = self._manifest_stamp()
        except OSError as e:
            raise IndexFormatError(f"{self.folder}: the index is gone ({e})") from e
        if stamp != self._stamp:
            with self._reload_lock:
                if stamp != self._stamp:
                    self._reload(stamp)
        return self._current

    def _reload(self, stamp) -> None:
        from semsearch.search import Retriever

        for attempt in range(3):  # another process may publish again while we open the files
            try:
                r = Retriever.load(self.folder, device=self.device, encoder=self.encoder)
                break
            except IndexFormatError:
                if attempt == 2:
                    raise
                stamp = self._manifest_stamp()
        self._current = r  # the old one closes when its last request lets go of it
        self._stamp = stamp

    # ---- operations (blocking; the app runs them on worker threads) -----------------------
    def search(self, queries: list[str], k: int, mode: str | None, where: dict | None):
        from semsearch.integrations.common import search

        r = self.retriever()
        return r.manifest.generation, search(r, queries, k, mode, where)

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.encoder.encode(texts, progress=False)

    def token_counts(self, texts: list[str]) -> list[int]:
        """Tokens the model sees for each text, with [CLS] and [SEP], before truncation."""
        return [len(self.encoder.token_offsets(t)) + 2 for t in texts]

    def upsert(self, docs):
        from semsearch.documents import upsert_documents

        with self._write_lock:
            report = upsert_documents(self.folder, docs, self.encoder)
            self.retriever()  # the writer's next request, and every later one, sees it
        return report

    def delete(self, ids: list[str]):
        from semsearch.documents import delete_documents

        with self._write_lock:
            report = delete_documents(self.folder, ids)
            self.retriever()
        return report


def create_app(service: Service, limits: Limits | None = None, read_only: bool = False):
    """The FastAPI application over a Service."""
    _require()
    from fastapi import FastAPI, Query, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException as StarletteHTTPException

    import semsearch

    limits = limits or Limits()
    app = FastAPI(title="semsearch", version=semsearch.__version__,
                  description=f"Semantic search over the index at {service.folder.name}")
    app.add_middleware(_BodyLimit, limit=limits.max_request_bytes)

    class Strict(BaseModel):
        model_config = ConfigDict(extra="forbid")

    class SearchRequest(Strict):
        query: StrictStr | None = None
        queries: list[StrictStr] | None = None
        k: StrictInt = Field(10, ge=1, le=limits.max_k)
        mode: StrictStr | None = None
        where: dict[str, Any] | None = None

    class OpenAIEmbeddingRequest(Strict):
        input: Union[StrictStr, list[StrictStr]]
        model: StrictStr | None = None
        encoding_format: StrictStr = "float"
        dimensions: StrictInt | None = None
        user: StrictStr | None = None

    class TEIEmbedRequest(Strict):
        inputs: Union[StrictStr, list[StrictStr]]
        normalize: StrictBool = True
        truncate: StrictBool = False
        truncation_direction: StrictStr = "Right"
        prompt_name: StrictStr | None = None

    class DocumentIn(Strict):
        id: StrictStr
        text: StrictStr
        metadata: dict[str, Any] = Field(default_factory=dict)

    class UpsertRequest(Strict):
        documents: list[DocumentIn]

    def error(status: int, message: str, kind: str = "invalid_request_error", **extra) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": kind, "code": status, **extra}}, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        errs = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errs):
            e = next(e for e in errs if e.get("type") == "json_invalid")
            return error(400, f"malformed JSON: {e.get('ctx', {}).get('error', e.get('msg'))}")
        parts = []
        for e in errs[:5]:
            loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
            missing_body = e.get("type") == "missing" and tuple(e.get("loc", ())) == ("body",)
            parts.append("the request body is missing (a JSON object is expected)" if missing_body else f"{loc}: {e.get('msg')}")
        return error(422, "; ".join(parts), details=[{"loc": [str(x) for x in e.get("loc", ())], "msg": str(e.get("msg"))} for e in errs[:20]])

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return error(exc.status_code, str(exc.detail), "not_found" if exc.status_code == 404 else "invalid_request_error")

    @app.exception_handler(SemsearchError)
    async def _semsearch(request: Request, exc: SemsearchError):
        status = (404 if isinstance(exc, DocumentNotFound) else 422 if isinstance(exc, InputError)
                  else 409 if isinstance(exc, (IndexLocked, SettingsMismatch)) else 503)
        return error(status, str(exc), type(exc).__name__)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        log.exception("internal error on %s %s", request.method, request.url.path)
        return error(500, f"internal error ({type(exc).__name__}); see the server log", "internal_error")

    def check_texts(texts: list[str], what: str, whats: str) -> None:
        if not texts:
            raise InputError(f"no {whats} given")
        if len(texts) > limits.max_texts:
            raise InputError(f"{len(texts)} {whats} in one request; the most is {limits.max_texts}")
        for i, t in enumerate(texts):
            if not t.strip():
                raise InputError(f"{what} {i + 1} is empty" if len(texts) > 1 else f"the {what} is empty")
            if len(t) > limits.max_text_chars:
                raise InputError(f"{what} {i + 1} has {len(t)} characters; the most is {limits.max_text_chars}")

    async def run_search(queries: list[str], k: int, mode: str | None, where: dict | None):
        check_texts(queries, "query", "queries")
        if mode is not None and mode not in MODES:
            raise InputError(f"unknown mode {mode!r}; valid modes are: {', '.join(MODES)}")
        return await run_in_threadpool(service.search, queries, k, mode, where)

    def hits_json(hits) -> list[dict]:
        return [h.to_dict() for h in hits]

    @app.get("/health")
    async def health():
        r = service.retriever()
        return {"status": "ok", "generation": r.manifest.generation, "chunks": len(r)}

    @app.get("/info")
    async def info():
        r = service.retriever()
        m = r.manifest
        return {"index": service.folder.name, "model": m.model, "model_fingerprint": m.model_fingerprint,
                "pooling": m.pooling, "head": m.head, "dim": m.dim, "metric": m.metric, "max_length": m.max_length,
                "chunking": m.chunking, "index_type": m.index.get("type"), "index_params": m.index.get("params"),
                "counts": m.counts, "generation": m.generation, "updated": m.updated,
                "modes": list(MODES) if service.supports["mode"] else ["dense"], "read_only": read_only,
                "limits": limits.__dict__, "version": semsearch.__version__,
                "encoder_passes": {"passes": service.encoder.passes, "texts": service.encoder.texts}}

    @app.post("/search")
    async def search_post(req: SearchRequest):
        if (req.query is None) == (req.queries is None):
            raise InputError("give exactly one of `query` (a string) or `queries` (a list of strings)")
        queries = [req.query] if req.query is not None else req.queries
        gen, results = await run_search(queries, req.k, req.mode, req.where)
        if req.query is not None:
            return {"query": req.query, "generation": gen, "hits": hits_json(results[0])}
        return {"generation": gen, "results": [{"query": q, "hits": hits_json(h)} for q, h in zip(queries, results)]}

    @app.get("/search")
    async def search_get(request: Request, q: StrictStr, k: int = Query(10, ge=1, le=limits.max_k), mode: str | None = None):
        unknown = sorted(set(request.query_params) - {"q", "k", "mode"})
        if unknown:
            raise InputError(f"unknown query parameter(s): {', '.join(unknown)}; known: q, k, mode")
        gen, results = await run_search([q], k, mode, None)
        return {"query": q, "generation": gen, "hits": hits_json(results[0])}

    @app.post("/v1/embeddings")
    async def openai_embeddings(req: OpenAIEmbeddingRequest):
        texts = [req.input] if isinstance(req.input, str) else req.input
        check_texts(texts, "input", "inputs")
        m = service.retriever().manifest
        names = {m.model, Path(m.model).name, "semsearch"}
        if req.model is not None and req.model not in names:
            raise InputError(f"this server embeds with {m.model!r} only (pass model={Path(m.model).name!r} or leave it out), not {req.model!r}")
        if req.encoding_format not in ("float", "base64"):
            raise InputError(f"unknown encoding_format {req.encoding_format!r}; valid: float, base64")
        if req.dimensions is not None and req.dimensions != m.dim:
            raise InputError(f"this model gives {m.dim}-d vectors; dimensions={req.dimensions} is not available")
        vecs = await run_in_threadpool(service.embed, texts)
        tokens = sum(min(n, m.max_length) for n in await run_in_threadpool(service.token_counts, texts))
        data = []
        for i, v in enumerate(vecs):
            emb = base64.b64encode(np.ascontiguousarray(v, "<f4").tobytes()).decode() if req.encoding_format == "base64" else v.tolist()
            data.append({"object": "embedding", "index": i, "embedding": emb})
        return {"object": "list", "data": data, "model": req.model or Path(m.model).name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    @app.post("/embed")
    async def tei_embed(req: TEIEmbedRequest):
        texts = [req.inputs] if isinstance(req.inputs, str) else req.inputs
        check_texts(texts, "input", "inputs")
        if not req.normalize:
            raise InputError("this server gives L2-normalised vectors only (normalize=false is not available)")
        if req.truncation_direction not in ("Right", "right"):
            raise InputError(f"only truncation_direction 'Right' is available, not {req.truncation_direction!r}")
        if req.prompt_name is not None:
            raise InputError("prompt_name is not available: this model has no prompts")
        if not req.truncate:
            limit = service.retriever().manifest.max_length
            counts = await run_in_threadpool(service.token_counts, texts)
            over = [i for i, n in enumerate(counts) if n > limit]
            if over:
                raise InputError(f"input {over[0] + 1} has {counts[over[0]]} tokens, more than the model's {limit}; "
                                 "send truncate=true to embed its first tokens")
        vecs = await run_in_threadpool(service.embed, texts)
        return vecs.tolist()

    @app.post("/documents")
    async def upsert(req: UpsertRequest):
        from semsearch.documents import Document

        if read_only:
            return error(403, "this server is read-only (started with --read-only)", "permission_error")
        if not req.documents:
            raise InputError("no documents given")
        if len(req.documents) > limits.max_documents:
            raise InputError(f"{len(req.documents)} documents in one request; the most is {limits.max_documents}")
        docs = [Document(d.id, d.text, d.metadata) for d in req.documents]
        report = await run_in_threadpool(service.upsert, docs)
        return report.as_dict()

    @app.delete("/documents/{doc_id:path}")
    async def delete(doc_id: str):
        if read_only:
            return error(403, "this server is read-only (started with --read-only)", "permission_error")
        report = await run_in_threadpool(service.delete, [doc_id])
        return report.as_dict()

    return app


class _BodyLimit:
    """ASGI middleware: refuse a request body over `limit` bytes with 413, before parsing it."""

    def __init__(self, app, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._refuse(send)
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await self._refuse(send)
            if not msg.get("more_body"):
                break
        body, sent = b"".join(chunks), False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)

    async def _refuse(self, send):
        import json

        body = json.dumps({"error": {"message": f"request body over {self.limit} bytes (--max-request-bytes)",
                                     "type": "invalid_request_error", "code": 413}}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def serve(index=None, host: str = "127.0.0.1", port: int = 8000, device: str = "auto", limits: Limits | None = None,
          read_only: bool = False, log_level: str = "info") -> None:
    """Load the index and serve it until interrupted."""
    _require()
    import uvicorn

    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("listening on %s: anyone who can reach this address can search%s the index", host,
                    "" if read_only else " and change")
    app = create_app(Service(index, device), limits, read_only)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
