"""`semsearch serve`: an index over HTTP (FastAPI + uvicorn, the extra `semsearch[serve]`).

A thin layer over `Retriever`, the index's `Encoder` and `semsearch.documents`, like cli.py:
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
# defined inside create_app() from their annotations at run time.
import base64
import hashlib
import hmac
import inspect
import ipaddress
import json
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Literal, Union

import numpy as np

from semsearch.errors import (DocumentNotFound, IndexFormatError, IndexLocked, InputError, SemsearchError,
                              SettingsMismatch)
from semsearch.limits import MAX_DEPTH, too_deep, unencodable
from semsearch.store.faiss_info import faiss_build

log = logging.getLogger(__name__)

MODES = ("dense", "lexical", "hybrid")
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
UNAUTHENTICATED_PATHS = ("/health",)
PAGE_PATHS = ("/",)  # the search page: a static file with no data in it; its own requests send the key
DOCS_PATHS = ("/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")
BODY_DEPTH = MAX_DEPTH + 3  # {"documents": [{"metadata": {...}}]}: the metadata's own limit sits 3 levels down


class LimitExceeded(InputError):
    """A request over one of the server's bounds (422, naming the limit and its option)."""


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
    max_results: int = 10_000  # hits in one search response: the sum over its queries of k
    max_response_bytes: int = 64 * 2**20  # one rendered response
    max_inflight_per_client: int = 0  # requests one client address may have running at once (0: no limit)
    max_explained: int = 100  # hits explained in one search (explain=true; each may encode its chunk again)


# ---- exposure: loopback, keys, hosts ---------------------------------------------------------
def is_loopback(host: str) -> bool:
    """Whether listening on `host` reaches this machine only (localhost, 127.0.0.0/8, ::1)."""
    h = host.strip().strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def read_key_file(path) -> str:
    """The API key on the first line of a file (`--api-key-file`); InputError naming the file otherwise."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read {str(path)!r}: {getattr(e, 'strerror', None) or e}") from e
    key = lines[0].strip() if lines else ""
    if not key:
        raise InputError(f"{str(path)!r} holds no key on its first line")
    return key


def check_api_key(key: str) -> str:
    """`key` if it can be a bearer token (visible ASCII, no spaces), else InputError."""
    if not isinstance(key, str) or not key.strip():
        raise InputError("the API key is empty")
    key = key.strip()
    if not all(33 <= ord(c) <= 126 for c in key):
        raise InputError("the API key must be visible ASCII characters without spaces (it travels in an HTTP header)")
    if len(key) < 16:
        log.warning("the API key has %d characters; a random one of 32 or more is safer "
                    "(python -c 'import secrets; print(secrets.token_urlsafe(32))')", len(key))
    return key


class HostPolicy:
    """Which Host headers a server answers (DNS-rebinding protection).

    A rebinding attack makes a browser send the attacker's own host name to this server, so
    names are checked; loopback names are always allowed (an attacker cannot make a browser
    send them for its own page). Also the bound address, `extra` names (`*.example.com` for
    subdomains, `*` for any), and where the server listens on every address (0.0.0.0, ::), any
    IP literal (a page cannot be served from an IP address and rebind it)."""

    def __init__(self, bound: str = "127.0.0.1", extra: Iterable[str] = ()):
        self.names = set(LOOPBACK_NAMES)
        self.suffixes: list[str] = []
        self.any = False
        self.any_ip = False
        b = bound.strip().strip("[]").lower()
        if b in ("0.0.0.0", "::", ""):
            self.any_ip = True
        else:
            self.names.add(b)  # the address itself (127.0.0.2 is loopback too)
        for name in extra:
            n = name.strip().lower().rstrip(".")
            if n == "*":
                self.any = True
            elif n.startswith("*."):
                self.suffixes.append(n[1:])
            elif n:
                self.names.add(n.strip("[]"))

    @staticmethod
    def hostname(header: str) -> str | None:
        """The host of a Host header without its port ('[::1]:8000' -> '::1'); None if malformed."""
        h = header.strip().lower()
        if h.startswith("["):
            end = h.find("]")
            if end < 0 or (h[end + 1:] and not re.fullmatch(r":\d{1,5}", h[end + 1:])):
                return None
            return h[1:end]
        name, _, port = h.partition(":")
        if (port and not port.isdigit()) or ":" in port or not name:
            return None
        return name.rstrip(".")

    def allows(self, header: str | None) -> bool:
        if self.any:
            return True
        name = self.hostname(header) if header else None
        if name is None:
            return False
        if name in self.names or any(name.endswith(s) for s in self.suffixes):
            return True
        if self.any_ip:
            try:
                ipaddress.ip_address(name)
                return True
            except ValueError:
                return False
        return False


# ---- what error messages may show --------------------------------------------------------------
_ABS_PATH = re.compile(r"(?<![\w/.:~-])/(?:[\w.@+~%-]+/)*[\w.@+~%-]+/?")


def shown_path(path: str | os.PathLike) -> str:
    """A path as a client may see it: relative to the working folder where inside it, else its
    last part only."""
    p = Path(os.path.abspath(path))
    try:
        rel = p.relative_to(Path.cwd())
        return str(rel) if str(rel) != "." else p.name
    except ValueError:
        return p.name or "/"


class Scrubber:
    """Replaces absolute paths of this machine in messages (the index folder first, as given and
    resolved, then any other path whose top folder exists here) by `shown_path`."""

    def __init__(self, folder: Path | None = None):
        self.known: list[tuple[str, str]] = []
        if folder is not None:
            shown = shown_path(folder)
            forms = {str(Path(folder)), os.path.abspath(folder), str(Path(folder).resolve())}
            self.known = sorted(((f, shown) for f in forms if os.path.isabs(f)), key=lambda x: -len(x[0]))

    def __call__(self, message: str) -> str:
        for form, shown in self.known:
            message = message.replace(form, shown)
        return _ABS_PATH.sub(self._one, message)

    @staticmethod
    def _one(m: re.Match) -> str:
        path = m.group(0)
        top = path.split("/")[1]
        return shown_path(path) if top and os.path.exists("/" + top) else path


# ---- text the JSON encoder can write -------------------------------------------------------------
def safe_text(s: str) -> str:
    """s with anything UTF-8 cannot carry written as a backslash escape."""
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


try:  # in the serve extra: an explained search's JSON (thousands of small records) in a tenth of the time
    import orjson as _orjson
except ImportError:  # pragma: no cover - the standard library gives the same JSON, slower
    _orjson = None


def _render(payload: Any) -> bytes:
    """JSON bytes of a response (compact; ASCII escapes where a stored text holds a lone surrogate).
    orjson where installed (it writes a NaN or infinity as null, where the standard library
    refuses); the standard library where it is not, or where orjson refuses the payload (a lone
    surrogate in a stored text, an integer past 64 bits in metadata)."""
    if _orjson is not None:
        try:
            return _orjson.dumps(payload)
        except (TypeError, _orjson.JSONEncodeError):
            pass
    text = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(payload, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


class _Pending:
    __slots__ = ("texts", "queries", "result", "error", "done")

    def __init__(self, texts: list[str], queries: bool = False):
        self.texts, self.queries, self.result, self.error, self.done = texts, queries, None, None, False


class _SerialEncoder:
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
        try:
            vecs = encode([t for it in batch for t in it.texts], progress=False)  # (n, D)
        except Exception:
            if len(batch) == 1:
                raise
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

    def run_alone(self, fn, *args):
        """fn(encoder, *args) while no other pass runs (an explanation encodes hits' texts itself)."""
        with self._lock:
            return fn(self._enc, *args)

    def encode_with_states(self, texts, progress=None):
        with self._lock:
            return self._enc.encode_with_states(texts, progress=progress)


class Service:
    """The server's state: the current generation's Retriever, the shared encoder, the writer."""

    def __init__(self, index: str | os.PathLike | None = None, device: str = "auto", encoder=None):
        from semsearch.search import Retriever
        from semsearch.store.folder import index_path

        self.folder = index_path(index)
        self.shown = shown_path(self.folder)  # what clients see of it
        self.scrub = Scrubber(self.folder)
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
            raise IndexFormatError(f"{self.shown}: the index is gone ({e.strerror or type(e).__name__})") from e
        if stamp != self._stamp:
            with self._reload_lock:
                if stamp != self._stamp:
                    self._reload(stamp)
        return self._current

    def current_if_fresh(self):
        """The current Retriever if no newer generation was published (one stat), else None:
        for handlers that must not load an index on the event loop."""
        try:
            return self._current if self._manifest_stamp() == self._stamp else None
        except OSError:
            return None

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
    def search(self, queries: list[str], k: int, mode: str | None, where: dict | None, explain: bool = False):
        from semsearch.integrations.common import search, search_kwargs

        r = self.retriever()
        if explain:
            return r.manifest.generation, r.search_batch(queries, k, explain=True, **search_kwargs(r, mode, where))
        return r.manifest.generation, search(r, queries, k, mode, where)

    def embed(self, texts: list[str], input_type: str = "document") -> np.ndarray:
        """Vectors of texts as documents, or as queries ("query": through the index's trained
        query layers where it has them; the same vectors as documents where it has none)."""
        if input_type == "query":
            return self.encoder.encode_queries(texts, progress=False)
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


def public_model(m) -> str:
    """The model's name as clients see it: a hub or package name as it is, a local folder by its
    last part (not the absolute path the manifest records)."""
    return Path(m.model).name if os.path.isabs(m.model) else m.model


def create_app(service: Service, limits: Limits | None = None, read_only: bool = False, *, api_key: str | None = None,
               host: str = "127.0.0.1", allowed_hosts: Iterable[str] = (), docs: bool = False):
    """The FastAPI application over a Service.

    api_key: every endpoint but /health asks for `Authorization: Bearer <api_key>` (None: no key).
    host: the address the server listens on; with allowed_hosts, which Host headers it answers
    (see HostPolicy). docs: serve /docs, /redoc and /openapi.json (off by default)."""
    _require()
    from fastapi import FastAPI, Query, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import Response
    from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator
    from pydantic_core import PydanticCustomError
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException as StarletteHTTPException

    import semsearch

    limits = limits or Limits()
    key = check_api_key(api_key) if api_key is not None else None
    scrub = service.scrub
    app = FastAPI(title="semsearch", version=semsearch.__version__,
                  description=f"Semantic search over the index {service.folder.name}",
                  docs_url="/docs" if docs else None, redoc_url="/redoc" if docs else None,
                  openapi_url="/openapi.json" if docs else None)
    app.add_middleware(_BodyLimit, limit=limits.max_request_bytes)
    app.add_middleware(_Guard, key=key, hosts=HostPolicy(host, allowed_hosts), open_paths=UNAUTHENTICATED_PATHS + PAGE_PATHS + (DOCS_PATHS if docs else ()),
                       per_client=limits.max_inflight_per_client)
    if docs and key is not None:
        _document_bearer_auth(app)

    class Strict(BaseModel):
        model_config = ConfigDict(extra="forbid")

    class Body(Strict):
        """A request body: before anything else, every string in it must be text UTF-8 can carry."""

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
        query: StrictStr | None = None
        queries: list[StrictStr] | None = None
        k: StrictInt = Field(10, ge=1, le=limits.max_k)
        mode: StrictStr | None = None
        where: dict[str, Any] | list[StrictStr] | StrictStr | None = None
        explain: StrictBool = False

    class OpenAIEmbeddingRequest(Body):
        input: Union[StrictStr, list[StrictStr]]
        model: StrictStr | None = None
        encoding_format: StrictStr = "float"
        dimensions: StrictInt | None = None
        user: StrictStr | None = None
        input_type: Literal["query", "document"] = "document"

    class TEIEmbedRequest(Body):
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
        documents: list[DocumentIn]

    def error(status: int, message: str, kind: str = "invalid_request_error", **extra) -> Response:
        body = {"error": {"message": safe_text(scrub(message)), "type": kind, "code": status, **extra}}
        return Response(_render(body), status_code=status, media_type="application/json")

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        errs = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errs):
            e = next(e for e in errs if e.get("type") == "json_invalid")
            return error(400, f"malformed JSON: {e.get('ctx', {}).get('error', e.get('msg'))}")
        for kind in ("unencodable_text", "too_deep"):
            if any(e.get("type") == kind for e in errs):
                return error(422, next(e for e in errs if e.get("type") == kind)["msg"], "InputError")
        parts = []
        for e in errs[:5]:
            loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
            missing_body = e.get("type") == "missing" and tuple(e.get("loc", ())) == ("body",)
            parts.append("the request body is missing (a JSON object is expected)" if missing_body else f"{loc}: {e.get('msg')}")
        return error(422, "; ".join(parts), details=[{"loc": [safe_text(str(x)) for x in e.get("loc", ())], "msg": safe_text(str(e.get("msg")))}
                                                     for e in errs[:20]])

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
            raise LimitExceeded(f"{len(texts)} {whats} in one request; the most is {limits.max_texts}")
        for i, t in enumerate(texts):
            if not t.strip():
                raise InputError(f"{what} {i + 1} is empty" if len(texts) > 1 else f"the {what} is empty")
            if len(t) > limits.max_text_chars:
                raise LimitExceeded(f"{what} {i + 1} has {len(t)} characters; the most is {limits.max_text_chars}")

    def rendered(payload: Any) -> Response:
        """Called on a worker thread: the response's JSON, within --max-response-bytes."""
        body = _render(payload)
        if len(body) > limits.max_response_bytes:
            raise LimitExceeded(f"the response would be {len(body):,} bytes; the most is {limits.max_response_bytes:,} "
                                "(--max-response-bytes): ask for fewer queries, a smaller k, or fewer inputs")
        return Response(body, media_type="application/json")

    async def run_search(queries: list[str], k: int, mode: str | None, where, single: bool, explain: bool = False) -> Response:
        check_texts(queries, "query", "queries")
        if mode is not None and mode not in MODES:
            raise InputError(f"unknown mode {mode!r}; valid modes are: {', '.join(MODES)}")
        if len(queries) * k > limits.max_results:
            raise LimitExceeded(f"{len(queries)} queries x k={k} = {len(queries) * k:,} results in one request; the most is "
                                f"{limits.max_results:,} (--max-results): send fewer queries or a smaller k")
        if explain and len(queries) * k > limits.max_explained:
            raise LimitExceeded(f"explain=true for {len(queries)} queries x k={k} = {len(queries) * k:,} results; the most "
                                f"explained in one request is {limits.max_explained:,}: send fewer queries or a smaller k")

        def work() -> Response:  # search, hits to dicts, JSON: all off the event loop
            gen, results = service.search(queries, k, mode, where, explain) if explain else service.search(queries, k, mode, where)
            if single:
                return rendered({"query": queries[0], "generation": gen, "hits": [h.to_dict() for h in results[0]]})
            return rendered({"generation": gen, "results": [{"query": q, "hits": [h.to_dict() for h in hits]}
                                                           for q, hits in zip(queries, results)]})

        return await run_in_threadpool(work)

    async def current():
        return service.current_if_fresh() or await run_in_threadpool(service.retriever)

    @app.get("/health")
    async def health():
        r = await current()
        fb = faiss_build()
        return {"status": "ok", "generation": r.manifest.generation, "chunks": len(r),
                "faiss": {"version": fb["version"], "gpu_build": fb["gpu_build"], "gpus": fb["gpus"]}}

    @app.get("/info")
    async def info():
        r = await current()
        m = r.manifest
        head = dict(m.head, path=Path(m.head["path"]).name) if isinstance(m.head, dict) and m.head.get("path") else m.head
        return {"index": service.folder.name, "model": public_model(m), "model_fingerprint": m.model_fingerprint,
                "pooling": m.pooling, "head": head, "dim": m.dim, "metric": m.metric, "max_length": m.max_length,
                "chunking": m.chunking, "index_type": m.index.get("type"), "index_params": m.index.get("params"),
                "counts": m.counts, "generation": m.generation, "updated": m.updated,
                "modes": list(MODES) if service.supports["mode"] else ["dense"], "read_only": read_only,
                "limits": limits.__dict__, "version": semsearch.__version__,
                "encoder_passes": {"passes": service.encoder.passes, "texts": service.encoder.texts}}

    @app.get("/v1/models")
    async def models():
        m = (await current()).manifest
        created = 0
        try:
            import datetime as dt

            created = int(dt.datetime.fromisoformat(m.created or m.updated).timestamp())
        except (TypeError, ValueError):
            pass
        return {"object": "list", "data": [{"id": public_model(m), "object": "model", "created": created, "owned_by": "semsearch"}]}

    @app.post("/search")
    async def search_post(req: SearchRequest):
        if (req.query is None) == (req.queries is None):
            raise InputError("give exactly one of `query` (a string) or `queries` (a list of strings)")
        queries = [req.query] if req.query is not None else req.queries
        return await run_search(queries, req.k, req.mode, req.where, req.query is not None, req.explain)

    @app.get("/search")
    async def search_get(request: Request, q: StrictStr, k: int = Query(10, ge=1, le=limits.max_k), mode: str | None = None,
                         where: list[str] = Query([], description="repeatable, all must hold: key=value, key!=value, key>=n, key>n, key<=n, key<n, path:GLOB"),
                         explain: bool = False):
        unknown = sorted(set(request.query_params) - {"q", "k", "mode", "where", "explain"})
        if unknown:
            raise InputError(f"unknown query parameter(s): {', '.join(unknown)}; known: q, k, mode, where, explain")
        return await run_search([q], k, mode, where or None, True, explain)

    page_body, page_headers = search_page()

    @app.get("/", include_in_schema=False)
    async def page():
        return Response(page_body, media_type="text/html; charset=utf-8", headers=page_headers)

    @app.post("/v1/embeddings")
    async def openai_embeddings(req: OpenAIEmbeddingRequest):
        texts = [req.input] if isinstance(req.input, str) else req.input
        check_texts(texts, "input", "inputs")
        m = (await current()).manifest
        name = public_model(m)
        if req.model is not None and req.model not in {m.model, name, Path(m.model).name, "semsearch"}:
            raise InputError(f"this server embeds with {name!r} only (pass model={name!r} or leave it out), not {req.model!r}")
        if req.encoding_format not in ("float", "base64"):
            raise InputError(f"unknown encoding_format {req.encoding_format!r}; valid: float, base64")
        if req.dimensions is not None and req.dimensions != m.dim:
            raise InputError(f"this model gives {m.dim}-d vectors; dimensions={req.dimensions} is not available")

        def work() -> Response:
            vecs = service.embed(texts, req.input_type)
            tokens = sum(min(n, m.max_length) for n in service.token_counts(texts))
            data = []
            for i, v in enumerate(vecs):
                emb = base64.b64encode(np.ascontiguousarray(v, "<f4").tobytes()).decode() if req.encoding_format == "base64" else v.tolist()
                data.append({"object": "embedding", "index": i, "embedding": emb})
            return rendered({"object": "list", "data": data, "model": req.model or name,
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

        return await run_in_threadpool(work)

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
        limit = (await current()).manifest.max_length

        def work() -> Response:
            if not req.truncate:
                counts = service.token_counts(texts)
                over = [i for i, n in enumerate(counts) if n > limit]
                if over:
                    raise InputError(f"input {over[0] + 1} has {counts[over[0]]} tokens, more than the model's {limit}; "
                                     "send truncate=true to embed its first tokens")
            return rendered(service.embed(texts, req.input_type).tolist())

        return await run_in_threadpool(work)

    @app.post("/documents")
    async def upsert(req: UpsertRequest):
        from semsearch.documents import Document

        if read_only:
            return error(403, "this server is read-only (started with --read-only)", "permission_error")
        if not req.documents:
            raise InputError("no documents given")
        if len(req.documents) > limits.max_documents:
            raise LimitExceeded(f"{len(req.documents)} documents in one request; the most is {limits.max_documents}")
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


def _document_bearer_auth(app) -> None:
    """/openapi.json names the bearer scheme, so /docs offers an Authorize button."""
    from fastapi.openapi.utils import get_openapi

    def openapi():
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            schema.setdefault("components", {})["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            for path, ops in schema.get("paths", {}).items():
                if path not in UNAUTHENTICATED_PATHS:
                    for op in ops.values():
                        op["security"] = [{"bearer": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi


def _json_reply(status: int, message: str, kind: str, headers: list[tuple[bytes, bytes]] = ()):
    body = _render({"error": {"message": message, "type": kind, "code": status}})
    return ({"type": "http.response.start", "status": status,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]},
            {"type": "http.response.body", "body": body})


class _Guard:
    """ASGI middleware, before the body is read: the Host header (HostPolicy; 400), the API key
    (401 with `WWW-Authenticate: Bearer`; compared in constant time, as SHA-256 digests so the
    key's length does not show either), and requests in flight per client address (429).

    Our own rather than Starlette's TrustedHostMiddleware: that one answers in plain text, not
    the API's JSON errors, and takes the host as everything before the first ':' (so bracketed
    IPv6 literals such as [::1]:8000 never match)."""

    def __init__(self, app, key: str | None, hosts: HostPolicy, open_paths: tuple[str, ...], per_client: int = 0):
        self.app = app
        self.key_digest = hashlib.sha256(key.encode()).digest() if key is not None else None
        self.hosts = hosts
        self.open_paths = set(open_paths)
        self.per_client = per_client
        self.inflight: dict[str, int] = {}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        host = headers.get(b"host")
        if not self.hosts.allows(host.decode("latin-1") if host is not None else None):
            shown = host.decode("latin-1")[:100] if host is not None else None
            return await self._reply(send, *_json_reply(
                400, f"Host header {shown!r} is not one this server answers to (--allowed-host)" if shown is not None
                else "a Host header is required", "invalid_host"))
        if self.key_digest is not None and scope.get("path") not in self.open_paths:
            given = headers.get(b"authorization")
            scheme, _, token = (given or b"").partition(b" ")
            ok = scheme.lower() == b"bearer" and hmac.compare_digest(hashlib.sha256(token.strip()).digest(), self.key_digest)
            if not ok:
                message = ("an API key is required: send the header `Authorization: Bearer KEY`" if given is None
                           else "the API key is wrong (or not sent as `Authorization: Bearer KEY`)")
                challenge = b'Bearer realm="semsearch"' + (b'' if given is None else b', error="invalid_token"')
                return await self._reply(send, *_json_reply(401, message, "authentication_error", [(b"www-authenticate", challenge)]))
        if not self.per_client or scope.get("path") in self.open_paths:
            return await self._answer(scope, receive, send)
        client = (scope.get("client") or ("?", 0))[0]
        if self.inflight.get(client, 0) >= self.per_client:
            return await self._reply(send, *_json_reply(
                429, f"{self.per_client} requests from this client are running already (--max-inflight-per-client)",
                "rate_limit_error", [(b"retry-after", b"1")]))
        self.inflight[client] = self.inflight.get(client, 0) + 1
        try:
            return await self._answer(scope, receive, send)
        finally:
            self.inflight[client] -= 1
            if not self.inflight[client]:
                del self.inflight[client]

    async def _answer(self, scope, receive, send):
        """The app's answer; an exception no handler took becomes a 500 here, so that the
        connection stays open (Starlette's outermost handler re-raises it to the server, which
        then drops a keep-alive connection)."""
        started = False

        async def tracked(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as e:
            log.exception("internal error on %s %s", scope.get("method"), scope.get("path"))
            if started:
                raise
            await self._reply(send, *_json_reply(500, f"internal error ({type(e).__name__}); see the server log", "internal_error"))

    @staticmethod
    async def _reply(send, start, body):
        await send(start)
        await send(body)


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


def check_exposure(host: str, api_key: str | None, insecure: bool = False) -> None:
    """InputError for listening beyond loopback without an API key, unless `insecure`."""
    if is_loopback(host) or api_key is not None:
        return
    if not insecure:
        raise InputError(f"refusing to listen on {host} without an API key: anyone who can reach it could search and change "
                         "the index. Give --api-key KEY (or --api-key-file PATH, or set SEMSEARCH_API_KEY), "
                         "or --insecure to serve without one (e.g. behind a proxy that checks keys)")
    log.warning("listening on %s without an API key (--insecure): anyone who can reach it can search the index", host)


def serve(index=None, host: str = "127.0.0.1", port: int = 8000, device: str = "auto", limits: Limits | None = None,
          read_only: bool = False, log_level: str = "info", *, api_key: str | None = None, insecure: bool = False,
          allowed_hosts: Iterable[str] = (), docs: bool = False) -> None:
    """Load the index and serve it until interrupted. Beyond loopback, an api_key is required
    unless `insecure` (see create_app for the rest)."""
    _require()
    import uvicorn

    if api_key is not None:
        api_key = check_api_key(api_key)
    check_exposure(host, api_key, insecure)  # before the index and the model load
    if not is_loopback(host) and not read_only:
        log.warning("listening on %s: whoever has the API key can search and change the index (--read-only to refuse writes)", host)
    app = create_app(Service(index, device), limits, read_only, api_key=api_key, host=host, allowed_hosts=allowed_hosts, docs=docs)
    uvicorn.run(app, host=host, port=port, log_level=log_level, server_header=False)
