"""`semsearch serve`: an index over HTTP (FastAPI + uvicorn, the extra `semsearch[serve]`).

Routes only: every check and every piece of work is `semsearch.service.Operations` (shared with
`semsearch mcp`), and what the server lets in is `semsearch.exposure` (shared too):
    GET  /health, /info                      liveness; the manifest's model, pooling, index, counts
    POST /search {query|queries, k, mode, where}, GET /search?q=&k=     hits as `query --json`
    POST /v1/embeddings (OpenAI shape), POST /embed (text-embeddings-inference shape)
    POST /documents {documents: [{id, text, metadata}]}, DELETE /documents/{id}
    GET  /v1/models                           the served model, OpenAI shape
    GET  /                                    the search page (semsearch/static/search.html), with explain=true

Exposure: every endpoint but /health and the search page asks for `Authorization: Bearer KEY` when a key is set,
and `serve()` refuses an address beyond loopback without one unless told `insecure`. The Host
header must name this server (DNS-rebinding protection). /docs, /redoc and /openapi.json exist
only when asked for. Error messages name the index by its folder name (or its path under the
working folder), never by an absolute path. One request's work is bounded: texts, k, queries x k,
request and response bytes; responses are rendered to JSON on worker threads.

Concurrency: encoding, searching and writing run on worker threads, never on the event loop.
The encoder runs one pass at a time (it uses every core already), and texts of requests that
wait meanwhile go into one pass together; searches of FAISS and the docstore run side by side. Writes are serialised and build the next generation while searches
go on against the current one; each request takes one `Retriever` (one generation's vectors
and docstore together) and keeps it to the end, so it never sees half of a write. A new
generation (from this server or from `semsearch index` in another process) is noticed by a
stat of manifest.json on each request.
"""
# No `from __future__ import annotations`: FastAPI reads the request models of the handlers
# No `from __future__ import annotations`: FastAPI reads the request models of the handlers from
# their annotations at run time.
import base64
import hashlib
import json
import logging
import re
from pathlib import Path
from typing import Any, Iterable, Literal, Union

import numpy as np

from semsearch.errors import DocumentNotFound, IndexLocked, InputError, SemsearchError, SettingsMismatch, TooLarge
from semsearch.exposure import (BodyLimit, Guard, HostPolicy, Scrubber, check_api_key, check_exposure, is_loopback,  # noqa: F401
                                read_key_file, render_json, safe_text, server_config, shown_path)
from semsearch.exposure import _orjson  # noqa: F401  (tests check that the serve extra brings orjson)
from semsearch.limits import MAX_DEPTH, MAX_WHERE_CONDITIONS, body_problem, json_body_problem, too_deep, unencodable
from semsearch.service import (DEFAULT_K, MODES, LimitExceeded, Limits, Operations, ReadOnly, SerialEncoder, Service,  # noqa: F401
                               public_model)

log = logging.getLogger(__name__)

_render = render_json  # the names these had here before the service layer
_SerialEncoder = SerialEncoder
UNAUTHENTICATED_PATHS = ("/health",)
PAGE_PATHS = ("/",)  # the search page: a static file with no data in it; its own requests send the key
DOCS_PATHS = ("/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")
BODY_DEPTH = MAX_DEPTH + 3  # {"documents": [{"metadata": {...}}]}: the metadata's own limit sits 3 levels down


def _require():
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise ImportError(f"`semsearch serve` needs FastAPI and uvicorn ({e.name} is missing): "
                          "pip install 'semsearch[serve]'") from e


_require()  # this module is the HTTP server: cli.py imports it only for `serve`
from fastapi import APIRouter, Depends, FastAPI, Query, Request  # noqa: E402
from fastapi.exceptions import RequestValidationError  # noqa: E402
from fastapi.responses import Response  # noqa: E402
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator  # noqa: E402
from pydantic_core import PydanticCustomError  # noqa: E402
from starlette.concurrency import run_in_threadpool  # noqa: E402
from starlette.exceptions import HTTPException as StarletteHTTPException  # noqa: E402


# ---- request bodies ------------------------------------------------------------------------------
class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Body(Strict):
    """A request body: before anything else, it must not nest too deeply and every string in it
    must be text UTF-8 can carry."""

    @model_validator(mode="before")
    @classmethod
    def _encodable(cls, data: Any) -> Any:
        deep = too_deep(data, BODY_DEPTH)
        if deep is not None:  # before anything walks it: deep values broke later steps
            raise PydanticCustomError("too_deep", "{message}", {"message": (
                f"{deep[:80]}: nested too deeply (metadata and filters take {MAX_DEPTH} levels)")})
        bad = unencodable(data)
        if bad is not None:
            where, text, at = bad
            raise PydanticCustomError("unencodable_text", "{message}", {"message": (
                f"{where}: not valid Unicode text ({ascii(text[at])} at character {at + 1} is a lone surrogate, "
                "which UTF-8 cannot encode)")})
        return data


class SearchRequest(Body):
    @staticmethod
    def bounds(limits: Limits):
        return (("queries", limits.max_texts, "{n} queries in one request; the most is {most} (--max-texts)"),
                ("where", MAX_WHERE_CONDITIONS, "{n} fields or conditions in one filter (where); the most is {most}"))

    query: StrictStr | None = None
    queries: list[StrictStr] | None = None
    k: StrictInt | None = Field(None, ge=1, description="hits per query: 10 by default (or --max-k where lower), at most the server's --max-k")
    mode: StrictStr | None = None
    where: dict[str, Any] | list[StrictStr] | StrictStr | None = None
    explain: StrictBool = False


class OpenAIEmbeddingRequest(Body):
    @staticmethod
    def bounds(limits: Limits):
        return (("input", limits.max_texts, "{n} inputs in one request; the most is {most} (--max-texts)"),)

    input: Union[StrictStr, list[StrictStr]]
    model: StrictStr | None = None
    encoding_format: StrictStr = "float"
    dimensions: StrictInt | None = None
    user: StrictStr | None = None
    input_type: Literal["query", "document"] = "document"


class TEIEmbedRequest(Body):
    @staticmethod
    def bounds(limits: Limits):
        return (("inputs", limits.max_texts, "{n} inputs in one request; the most is {most} (--max-texts)"),)

    inputs: Union[StrictStr, list[StrictStr]]
    normalize: StrictBool = True
    truncate: StrictBool = False
    truncation_direction: StrictStr = "Right"
    prompt_name: StrictStr | None = None
    input_type: Literal["query", "document"] = "document"


class DocumentIn(Strict):
    id: StrictStr
    text: StrictStr
    metadata: dict[str, Any] = Field(default_factory=dict)


class UpsertRequest(Body):
    @staticmethod
    def bounds(limits: Limits):
        return (("documents", limits.max_documents, "{n} documents in one request; the most is {most}"),)

    documents: list[DocumentIn]


JSON_TYPES = ("application/json",)
LARGE_BODY = 256 * 2**10  # bytes: a body this large is read first by another process (_prechecked)


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media in JSON_TYPES or (media.startswith("application/") and media.endswith("+json"))


async def parse_body(request: Request, model: type[Body], limits: Limits) -> Body:
    """A request body as `model`, never parsed on the event loop: a body of a million items must
    not stall /health or other requests (FastAPI parses and validates a declared body model on
    the loop). Counts (documents, queries, inputs, filter conditions), unknown fields and the
    number of JSON values are refused before any per-item work (limits.body_problem). A large
    body is parsed and counted first in another process: parsing is one call into C that holds
    the interpreter's lock throughout (~0.1 s for a million values), so in a thread of this
    process it would still stall the loop; what passes holds at most `max_body_values` values,
    and is parsed and validated again here on a worker thread, in milliseconds."""
    if not _is_json(request.headers.get("content-type", "")):
        raise StarletteHTTPException(415, "send the body as JSON with the header `Content-Type: application/json` "
                                          f"(got {request.headers.get('content-type') or 'none'!r})")
    raw = await request.body()  # within --max-request-bytes (BodyLimit)
    if len(raw) >= LARGE_BODY:
        _raise_problem(await _prechecked(raw, model, limits))
    return await run_in_threadpool(_validated, raw, model, limits)


def _problem_args(model: type[Body], limits: Limits) -> tuple:
    return tuple(model.model_fields), model.bounds(limits), limits.max_body_values


def _raise_problem(problem: tuple[str, str] | None) -> None:
    if problem is None:
        return
    kind, message = problem
    if kind == "json_invalid":
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", 0), "msg": "JSON decode error",
                                       "ctx": {"error": message}}])
    raise LimitExceeded(message) if kind == "limit" else InputError(message)


async def _prechecked(raw: bytes, model: type[Body], limits: Limits) -> tuple[str, str] | None:
    """limits.json_body_problem of a large body, in a new Python process (about 50 ms to start,
    for bodies of 256 KiB or more). A plain subprocess, not multiprocessing: its spawn and
    forkserver starts import the server's main module again in the child. Where the process
    cannot run, on a worker thread."""
    import asyncio
    import os
    import sys

    known, bounds, most = _problem_args(model, limits)
    here = str(Path(__file__).resolve().parent.parent)  # semsearch importable as in this process
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import sys; from semsearch.limits import precheck_main; precheck_main(sys.argv[1])",
            json.dumps([known, bounds, most]), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env)
        out, err = await proc.communicate(raw)
        if proc.returncode == 0:
            found = json.loads(out)
            return tuple(found) if found else None
        log.warning("the process reading a large body failed (%s); read on a thread", err.decode(errors="replace")[-300:])
    except (OSError, ValueError) as e:
        log.warning("no process to read a large body (%s); read on a thread", e)
    return await run_in_threadpool(json_body_problem, raw, known, bounds, most)


def _validated(raw: bytes, model: type[Body], limits: Limits) -> Body:
    from pydantic import ValidationError

    if not raw.strip():
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required"}])
    try:
        # The standard library's parser, as FastAPI's: orjson refuses what JSON allows and the
        # checks after it name (a lone surrogate escape, an integer past 64 bits).
        data = json.loads(raw)
    except ValueError as e:
        _raise_problem(("json_invalid", str(e).split(":")[0]))
    _raise_problem(body_problem(data, *_problem_args(model, limits)))
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise RequestValidationError(e.errors(include_url=False)) from None


# ---- errors --------------------------------------------------------------------------------------
def _error(request: Request, status: int, message: str, kind: str = "invalid_request_error", given: tuple = (),
           **extra) -> Response:
    scrub = request.app.state.ops.service.scrub
    body = {"error": {"message": safe_text(scrub(message, given)), "type": kind, "code": status, **extra}}
    return Response(render_json(body), status_code=status, media_type="application/json")


async def _invalid(request: Request, exc: RequestValidationError):
    errs = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errs):
        e = next(e for e in errs if e.get("type") == "json_invalid")
        return _error(request, 400, f"malformed JSON: {e.get('ctx', {}).get('error', e.get('msg'))}")
    for kind in ("unencodable_text", "too_deep"):
        if any(e.get("type") == kind for e in errs):
            return _error(request, 422, next(e for e in errs if e.get("type") == kind)["msg"], "InputError")
    parts = []
    for e in errs[:5]:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        missing_body = e.get("type") == "missing" and tuple(e.get("loc", ())) == ("body",)
        parts.append("the request body is missing (a JSON object is expected)" if missing_body else f"{loc}: {e.get('msg')}")
    return _error(request, 422, "; ".join(parts), details=[{"loc": [safe_text(str(x)) for x in e.get("loc", ())],
                                                           "msg": safe_text(str(e.get("msg")))} for e in errs[:20]])


async def _http(request: Request, exc: StarletteHTTPException):
    response = _error(request, exc.status_code, str(exc.detail), "not_found" if exc.status_code == 404 else "invalid_request_error")
    response.headers.update(exc.headers or {})  # a 405's Allow, among others
    return response


def status_of(exc: SemsearchError) -> tuple[int, str]:
    """The HTTP status and error type of one of semsearch's errors."""
    if isinstance(exc, ReadOnly):
        return 403, "permission_error"
    status = (404 if isinstance(exc, DocumentNotFound) else 413 if isinstance(exc, TooLarge) else 422 if isinstance(exc, InputError)
              else 409 if isinstance(exc, (IndexLocked, SettingsMismatch)) else 503)
    return status, type(exc).__name__


async def _semsearch(request: Request, exc: SemsearchError):
    status, kind = status_of(exc)
    return _error(request, status, str(exc), kind, exc.given)


async def _internal(request: Request, exc: Exception):
    log.exception("internal error on %s %s", request.method, request.url.path)
    return _error(request, 500, f"internal error ({type(exc).__name__}); see the server log", "internal_error")


# ---- routes --------------------------------------------------------------------------------------
router = APIRouter()


def _get(path: str, **kwargs):
    """A GET route, answered to HEAD too (load balancers probe with HEAD), as one route so that a
    405 names both in `Allow`; _openapi leaves HEAD out of the schema (it would repeat the GET
    operation's id)."""
    return router.api_route(path, methods=["GET", "HEAD"], **kwargs)
BODY_MODELS = (SearchRequest, OpenAIEmbeddingRequest, TEIEmbedRequest, UpsertRequest)


def _body_schema(model: type[Body]) -> dict[str, Any]:
    """The OpenAPI request body of a route that parses `model` itself (parse_body); the model's
    schema is added to the components by _openapi."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


def _ops(request: Request) -> Operations:
    return request.app.state.ops


def _json(ops: Operations, payload: Any) -> Response:
    """Called on a worker thread: the response's JSON, within --max-response-bytes."""
    return Response(ops.rendered(payload, _render), media_type="application/json")


async def _current(ops: Operations):
    return ops.service.current_if_fresh() or await run_in_threadpool(ops.service.retriever)


async def _search(ops: Operations, queries, k, mode, where, single: bool, explain: bool) -> Response:
    ops.check_search(queries, k, mode, where, explain)  # on the loop: cheap, and refuses before a thread is taken
    return await run_in_threadpool(lambda: _json(ops, ops.search(queries, k, mode, where, single, explain)))


@_get("/health")
async def health(ops: Operations = Depends(_ops)):
    return ops.health(await _current(ops))


@_get("/info")
async def info(ops: Operations = Depends(_ops)):
    await _current(ops)  # a new generation is opened on a worker thread, not here
    return ops.info()


@_get("/v1/models")
async def models(ops: Operations = Depends(_ops)):
    m = (await _current(ops)).manifest
    created = 0
    try:
        import datetime as dt

        created = int(dt.datetime.fromisoformat(m.created or m.updated).timestamp())
    except (TypeError, ValueError):
        pass
    return {"object": "list", "data": [{"id": public_model(m), "object": "model", "created": created, "owned_by": "semsearch"}]}


@router.post("/search", openapi_extra=_body_schema(SearchRequest))
async def search_post(request: Request, ops: Operations = Depends(_ops)):
    req = await parse_body(request, SearchRequest, ops.limits)
    if (req.query is None) == (req.queries is None):
        raise InputError("give exactly one of `query` (a string) or `queries` (a list of strings)")
    queries = [req.query] if req.query is not None else req.queries
    return await _search(ops, queries, req.k, req.mode, req.where, req.query is not None, req.explain)


@_get("/search")
async def search_get(request: Request, q: StrictStr, k: int | None = Query(None, ge=1), mode: str | None = None,
                     where: list[str] = Query([], description="repeatable, all must hold: key=value, key!=value, key>=n, key>n, key<=n, key<n, path:GLOB"),
                     explain: bool = False, ops: Operations = Depends(_ops)):
    unknown = sorted(set(request.query_params) - {"q", "k", "mode", "where", "explain"})
    if unknown:
        raise InputError(f"unknown query parameter(s): {', '.join(unknown)}; known: q, k, mode, where, explain")
    return await _search(ops, [q], k, mode, where or None, True, explain)


@_get("/", include_in_schema=False)
async def page(request: Request):
    body, headers = request.app.state.page
    return Response(body, media_type="text/html; charset=utf-8", headers=headers)


@router.post("/v1/embeddings", openapi_extra=_body_schema(OpenAIEmbeddingRequest))
async def openai_embeddings(request: Request, ops: Operations = Depends(_ops)):
    req = await parse_body(request, OpenAIEmbeddingRequest, ops.limits)
    texts = [req.input] if isinstance(req.input, str) else req.input
    ops.check_texts(texts, "input", "inputs")
    m = (await _current(ops)).manifest
    name = public_model(m)
    if req.model is not None and req.model not in {m.model, name, Path(m.model).name, "semsearch"}:
        raise InputError(f"this server embeds with {name!r} only (pass model={name!r} or leave it out), not {req.model!r}")
    if req.encoding_format not in ("float", "base64"):
        raise InputError(f"unknown encoding_format {req.encoding_format!r}; valid: float, base64")
    if req.dimensions is not None and req.dimensions != m.dim:
        raise InputError(f"this model gives {m.dim}-d vectors; dimensions={req.dimensions} is not available")

    def work() -> Response:
        vecs = ops.service.embed(texts, req.input_type)
        tokens = sum(min(n, m.max_length) for n in ops.service.token_counts(texts))
        b64 = req.encoding_format == "base64"
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(np.ascontiguousarray(v, "<f4").tobytes()).decode() if b64 else v.tolist()}
                for i, v in enumerate(vecs)]
        return _json(ops, {"object": "list", "data": data, "model": req.model or name,
                           "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    return await run_in_threadpool(work)


@router.post("/embed", openapi_extra=_body_schema(TEIEmbedRequest))
async def tei_embed(request: Request, ops: Operations = Depends(_ops)):
    req = await parse_body(request, TEIEmbedRequest, ops.limits)
    texts = [req.inputs] if isinstance(req.inputs, str) else req.inputs
    ops.check_texts(texts, "input", "inputs")
    if not req.normalize:
        raise InputError("this server gives L2-normalised vectors only (normalize=false is not available)")
    if req.truncation_direction not in ("Right", "right"):
        raise InputError(f"only truncation_direction 'Right' is available, not {req.truncation_direction!r}")
    if req.prompt_name is not None:
        raise InputError("prompt_name is not available: this model has no prompts")
    limit = (await _current(ops)).manifest.max_length

    def work() -> Response:
        if not req.truncate:
            counts = ops.service.token_counts(texts)
            over = [i for i, n in enumerate(counts) if n > limit]
            if over:
                raise InputError(f"input {over[0] + 1} has {counts[over[0]]} tokens, more than the model's {limit}; "
                                 "send truncate=true to embed its first tokens")
        return _json(ops, ops.service.embed(texts, req.input_type).tolist())

    return await run_in_threadpool(work)


@router.post("/documents", openapi_extra=_body_schema(UpsertRequest))
async def upsert(request: Request, ops: Operations = Depends(_ops)):
    req = await parse_body(request, UpsertRequest, ops.limits)
    docs = [d.model_dump() for d in req.documents]
    return await run_in_threadpool(ops.upsert, docs)


@router.delete("/documents/{doc_id:path}")
async def delete(doc_id: str, ops: Operations = Depends(_ops)):
    return await run_in_threadpool(ops.delete, [doc_id])


# ---- the application -----------------------------------------------------------------------------
def create_app(service: Service, limits: Limits | None = None, read_only: bool = False, *, api_key: str | None = None,
               host: str = "127.0.0.1", allowed_hosts: Iterable[str] = (), docs: bool = False):
    """The FastAPI application over a Service: the routes above, their error handlers, and the
    guards of semsearch.exposure.

    api_key: every endpoint but /health asks for `Authorization: Bearer <api_key>` (None: no key).
    host: the address the server listens on; with allowed_hosts, which Host headers it answers
    (see HostPolicy). docs: serve /docs, /redoc and /openapi.json (off by default)."""
    import semsearch

    ops = Operations(service, limits, read_only)
    key = check_api_key(api_key) if api_key is not None else None
    app = FastAPI(title="semsearch", version=semsearch.__version__,
                  description=f"Semantic search over the index {service.folder.name}",
                  docs_url="/docs" if docs else None, redoc_url="/redoc" if docs else None,
                  openapi_url="/openapi.json" if docs else None)
    app.state.ops = ops
    app.state.page = search_page()
    app.include_router(router)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(SemsearchError, _semsearch)
    app.add_exception_handler(Exception, _internal)
    app.add_middleware(BodyLimit, limit=ops.limits.max_request_bytes)
    open_paths = UNAUTHENTICATED_PATHS + PAGE_PATHS + (DOCS_PATHS if docs else ())
    app.add_middleware(Guard, key=key, hosts=HostPolicy(host, allowed_hosts), open_paths=open_paths,
                       per_client=ops.limits.max_inflight_per_client)
    _openapi(app, bearer=docs and key is not None, limits=ops.limits)
    return app


ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "code"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"}, "code": {"type": "integer"},
                   "details": {"type": "array", "items": {"type": "object"}}}}}}
ERRORS = {400: "malformed request: its JSON, or a header given twice (Host, Authorization)",
          401: "no API key, or a wrong one", 403: "a write to a read-only server",
          404: "no such document (or path)", 408: "the request did not arrive in time (--header-timeout, --body-timeout)",
          409: "another process is writing the index, or the write's settings differ from the index's",
          413: "the body, or the chunks a write would encode, past the server's limits",
          415: "a body that is not JSON (Content-Type)", 422: "a value outside what the operation takes (the message names it)",
          429: "too many requests of this client at once (--max-inflight-per-client)",
          500: "an internal error (the server log has it)", 503: "the index is not available now, or --max-connections is reached"}


_INT, _NUM, _STR = {"type": "integer"}, {"type": "number"}, {"type": "string"}
_OPT_INT, _OPT_NUM = {"type": ["integer", "null"]}, {"type": ["number", "null"]}
HIT_SCHEMA = {"type": "object", "required": ["rank", "score", "text", "source", "path", "start", "end", "chunk", "id",
                                             "metadata", "mode", "location"],
              "properties": {"rank": _INT, "score": _NUM, "text": _STR, "source": _STR, "path": _STR, "start": _INT,
                             "end": _INT, "row": _OPT_INT, "line": _OPT_INT, "chunk": _INT, "id": _INT,
                             "metadata": {"type": "object"}, "mode": {"enum": list(MODES)}, "dense_score": _OPT_NUM,
                             "lexical_score": _OPT_NUM, "explanation": {"type": ["object", "null"]}, "location": _STR}}
_HITS = {"type": "array", "items": {"$ref": "#/components/schemas/Hit"}}
WRITE_SCHEMA = {"type": "object", "required": ["added", "updated", "unchanged", "deleted", "chunks", "generation"],
                "properties": {k: _INT for k in ("added", "updated", "unchanged", "deleted", "chunks", "generation")}
                | {"seconds": _NUM}}
# Each operation's 200 answer (the routes build plain JSON, so FastAPI's own schema was empty).
OK_SCHEMAS = {
    ("/health", "get"): {"type": "object", "required": ["status", "generation", "chunks"],
                         "properties": {"status": {"const": "ok"}, "generation": _INT, "chunks": _INT}},
    ("/info", "get"): {"type": "object", "required": ["index", "model", "pooling", "dim", "counts", "generation", "modes",
                                                      "read_only", "limits", "version"],
                       "properties": {"index": _STR, "model": _STR, "pooling": _STR, "dim": _INT, "counts": {"type": "object"},
                                      "generation": _INT, "modes": {"type": "array", "items": {"enum": list(MODES)}},
                                      "read_only": {"type": "boolean"}, "limits": {"type": "object"}, "version": _STR}},
    ("/v1/models", "get"): {"type": "object", "required": ["object", "data"], "properties": {
        "object": {"const": "list"}, "data": {"type": "array", "items": {
            "type": "object", "required": ["id", "object", "created", "owned_by"],
            "properties": {"id": _STR, "object": {"const": "model"}, "created": _INT, "owned_by": _STR}}}}},
    ("/search", "get"): {"$ref": "#/components/schemas/SearchResult"},
    ("/search", "post"): {"anyOf": [{"$ref": "#/components/schemas/SearchResult"}, {
        "type": "object", "required": ["generation", "results"],
        "properties": {"generation": _INT, "results": {"type": "array", "items": {
            "type": "object", "required": ["query", "hits"], "properties": {"query": _STR, "hits": _HITS}}}}}]},
    ("/v1/embeddings", "post"): {"type": "object", "required": ["object", "data", "model", "usage"], "properties": {
        "object": {"const": "list"}, "model": _STR,
        "usage": {"type": "object", "required": ["prompt_tokens", "total_tokens"],
                  "properties": {"prompt_tokens": _INT, "total_tokens": _INT}},
        "data": {"type": "array", "items": {"type": "object", "required": ["object", "index", "embedding"], "properties": {
            "object": {"const": "embedding"}, "index": _INT,
            "embedding": {"anyOf": [{"type": "array", "items": _NUM}, {"type": "string", "description": "base64 of little-endian float32"}]}}}}}},
    ("/embed", "post"): {"type": "array", "items": {"type": "array", "items": _NUM}},
    ("/documents", "post"): {"$ref": "#/components/schemas/WriteReport"},
    ("/documents/{doc_id}", "delete"): {"$ref": "#/components/schemas/WriteReport"},
}


def _ok_responses(schema: dict) -> None:
    components = schema["components"]["schemas"]
    components.update(Hit=HIT_SCHEMA, WriteReport=WRITE_SCHEMA, SearchResult={
        "type": "object", "required": ["query", "generation", "hits"],
        "properties": {"query": _STR, "generation": _INT, "hits": _HITS}})
    for (path, method), body in OK_SCHEMAS.items():
        op = schema.get("paths", {}).get(path, {}).get(method)
        if op is not None:
            op.setdefault("responses", {})["200"] = {"description": "OK", "content": {"application/json": {"schema": body}}}


def _error_responses(schema: dict, bearer: bool) -> None:
    """Each operation's error answers, all of one shape ({"error": {message, type, code}}), in
    place of FastAPI's validation-error schema (the server never gives that shape)."""
    schema.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    schema["components"]["schemas"].pop("HTTPValidationError", None)
    schema["components"]["schemas"].pop("ValidationError", None)
    for path, ops in schema.get("paths", {}).items():
        for method, op in ops.items():
            codes = {400, 408, 422, 429, 500, 503}
            if method in ("post", "put", "patch"):
                codes |= {413, 415}
            if path == "/documents" or path.startswith("/documents/"):
                codes |= {403, 404, 409, 413}
            if bearer and path not in UNAUTHENTICATED_PATHS:
                codes.add(401)
            responses = op.setdefault("responses", {})
            for code in sorted(codes):
                responses[str(code)] = {"description": ERRORS[code],
                                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def _openapi(app, bearer: bool, limits: Limits) -> None:
    """/openapi.json: FastAPI's schema, with the request bodies the routes parse themselves
    (BODY_MODELS) as components, bounded by this server's limits (_constraints), and (`bearer`)
    the bearer scheme named, so /docs offers an Authorize button."""
    from fastapi.openapi.utils import get_openapi

    def openapi():
        if app.openapi_schema is None:
            import warnings

            with warnings.catch_warnings():  # HEAD beside GET repeats its operation id: dropped below
                warnings.filterwarnings("ignore", message="Duplicate Operation ID")
                schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            for ops in schema.get("paths", {}).values():
                ops.pop("head", None)
            _error_responses(schema, bearer)
            _ok_responses(schema)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in BODY_MODELS:
                own = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(own.pop("$defs", {}))
                components[model.__name__] = own
            _constraints(schema, limits)
            if bearer:
                schema["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
                for path, ops in schema.get("paths", {}).items():
                    if path not in UNAUTHENTICATED_PATHS:
                        for op in ops.values():
                            op["security"] = [{"bearer": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi


def _constraints(schema: dict, limits: Limits) -> None:
    """What the routes' own checks refuse (Operations.check_texts, check_k, search_post's
    one-of, the upsert's count and ids), said in the schema with this server's limits, so that a
    client generated from it, or a validator, refuses what the server would. The server stays the
    judge: a text of only spaces or control characters meets minLength and is still refused as
    blank (JSON Schema's patterns cannot name Unicode categories portably)."""
    from semsearch.documents import MAX_ID_CHARS

    text = {"type": "string", "minLength": 1, "maxLength": limits.max_text_chars,
            "description": "not blank (not only spaces, control or format characters)"}
    texts = {"type": "array", "items": text, "minItems": 1, "maxItems": limits.max_texts}
    one_or_many = {"anyOf": [text, texts]}
    k = {"type": "integer", "minimum": 1, "maximum": limits.max_k, "default": min(DEFAULT_K, limits.max_k),
         "description": f"hits per query (at most this server's --max-k, {limits.max_k})"}
    c = schema["components"]["schemas"]
    search = c["SearchRequest"]
    search["properties"].update(query={**text, "description": "one query (give `query` or `queries`, not both)"},
                                queries={**texts, "description": "several queries, answered in one batch"},
                                k=k, mode={"type": "string", "enum": list(MODES),
                                           "description": "the index's default where left out (hybrid unless built otherwise)"})
    search["oneOf"] = [{"required": ["query"]}, {"required": ["queries"]}]
    c["OpenAIEmbeddingRequest"]["properties"]["input"] = one_or_many
    c["TEIEmbedRequest"]["properties"]["inputs"] = one_or_many
    c["UpsertRequest"]["properties"]["documents"].update(minItems=1, maxItems=limits.max_documents)
    doc_id = c["DocumentIn"]["properties"]["id"]
    doc_id.update(minLength=1, maxLength=MAX_ID_CHARS, pattern="^[^\\x00-\\x1f\\x7f]*$")
    c["DocumentIn"]["properties"]["text"].update(minLength=1)
    for ops in schema.get("paths", {}).values():
        for op in ops.values():
            for param in op.get("parameters", ()):
                if param.get("in") == "query" and param.get("name") == "k":
                    param["schema"] = k
                elif param.get("in") == "query" and param.get("name") == "q":
                    param["schema"] = text


def search_page() -> tuple[bytes, dict[str, str]]:
    """The search page (semsearch/static/search.html) and its headers. Its Content-Security-Policy
    lets run only the page's own inline script and style (by their SHA-256), and lets it fetch
    only from this server: text from the index is put into the page as text, and even markup that
    slipped in could not run a script of its own or send anything elsewhere."""
    from importlib import resources

    html = resources.files("semsearch").joinpath("static/search.html").read_text(encoding="utf-8")

    def digest(tag: str) -> str:
        m = re.search(rf"<{tag}>(.*?)</{tag}>", html, re.S)
        return "'sha256-" + base64.b64encode(hashlib.sha256(m.group(1).encode("utf-8")).digest()).decode() + "'"

    csp = (f"default-src 'none'; script-src {digest('script')}; style-src {digest('style')}; connect-src 'self'; "
           "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
    return html.encode("utf-8"), {"content-security-policy": csp, "x-content-type-options": "nosniff",
                                  "referrer-policy": "no-referrer", "x-frame-options": "DENY", "cache-control": "no-cache"}


def serve(index=None, host: str = "127.0.0.1", port: int = 8000, device: str = "auto", limits: Limits | None = None,
          read_only: bool = False, log_level: str = "info", *, api_key: str | None = None, insecure: bool = False,
          allowed_hosts: Iterable[str] = (), docs: bool = False) -> None:
    """Load the index and serve it until interrupted. Beyond loopback, an api_key is required
    unless `insecure` (see create_app for the rest)."""
    import uvicorn

    if api_key is not None:
        api_key = check_api_key(api_key)
    check_exposure(host, api_key, insecure)  # before the index and the model load
    if not is_loopback(host) and not read_only:
        log.warning("listening on %s: whoever has the API key can search and change the index (--read-only to refuse writes)", host)
    app = create_app(Service(index, device), limits, read_only, api_key=api_key, host=host, allowed_hosts=allowed_hosts, docs=docs)
    lim = limits or Limits()
    uvicorn.Server(server_config(app, host, port, log_level, header_timeout=lim.header_timeout, body_timeout=lim.body_timeout,
                                 max_connections=lim.max_connections)).run()
