"""What a server that listens on a network shows and lets in, shared by `semsearch serve` (HTTP)
and `semsearch mcp --http` (MCP over streamable HTTP): loopback detection and the refusal to listen
beyond it without an API key, the key itself, the Host allow-list (DNS-rebinding protection), the
ASGI guards that check them before a body is read, the body-size limit, error messages scrubbed of
this machine's paths, and JSON rendering that any stored text survives.

Plain ASGI and the standard library only (orjson where installed): both servers wrap their
application in the same `Guard` and `BodyLimit`, so they cannot drift apart.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Iterable

from semsearch.errors import InputError

log = logging.getLogger("semsearch.serve")

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")

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

    def allows_origin(self, origin: str) -> bool:
        """An Origin header (`scheme://host[:port]`) whose host this server answers to; "null"
        (a sandboxed or local page) and anything that is not http(s) are refused."""
        scheme, sep, rest = origin.strip().partition("://")
        if not sep or scheme.lower() not in ("http", "https") or "/" in rest:
            return False
        return self.allows(rest)


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

    def __call__(self, message: str, keep: tuple[str, ...] = ()) -> str:
        """The message scrubbed, except the texts in `keep` (the caller's own, quoted back)."""
        keep = tuple(k for k in keep if k)
        if keep:
            pattern = "(" + "|".join(re.escape(k) for k in sorted(keep, key=len, reverse=True)) + ")"
            return "".join(part if i % 2 else self(part) for i, part in enumerate(re.split(pattern, message)))
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


def render_json(payload: Any) -> bytes:
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


def json_reply(status: int, message: str, kind: str, headers: list[tuple[bytes, bytes]] = ()):
    body = render_json({"error": {"message": message, "type": kind, "code": status}})
    return ({"type": "http.response.start", "status": status,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]},
            {"type": "http.response.body", "body": body})


class Guard:
    """ASGI middleware, before the body is read: the Host header (HostPolicy; 400), the API key
    (401 with `WWW-Authenticate: Bearer`; compared in constant time, as SHA-256 digests so the
    key's length does not show either), and requests in flight per client address (429).

    Our own rather than Starlette's TrustedHostMiddleware: that one answers in plain text, not
    the API's JSON errors, and takes the host as everything before the first ':' (so bracketed
    IPv6 literals such as [::1]:8000 never match)."""

    def __init__(self, app, key: str | None, hosts: HostPolicy, open_paths: tuple[str, ...], per_client: int = 0,
                 check_origin: bool = False):
        self.app = app
        self.key_digest = hashlib.sha256(key.encode()).digest() if key is not None else None
        self.hosts = hosts
        self.open_paths = set(open_paths)
        self.per_client = per_client
        self.check_origin = check_origin  # an Origin header, where sent, must name a host of the allow-list
        self.inflight: dict[str, int] = {}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        raw = scope.get("headers") or []
        for name in (b"host", b"authorization"):  # RFC 9112 3.2: more than one Host is a 400; so for the key
            if sum(k == name for k, _ in raw) > 1:
                return await self._reply(send, *json_reply(
                    400, f"more than one {name.decode().title()} header: send it once", "invalid_request_error"))
        headers = dict(raw)
        host = headers.get(b"host")
        if not self.hosts.allows(host.decode("latin-1") if host is not None else None):
            shown = host.decode("latin-1")[:100] if host is not None else None
            return await self._reply(send, *json_reply(
                400, f"Host header {shown!r} is not one this server answers to (--allowed-host)" if shown is not None
                else "a Host header is required", "invalid_host"))
        origin = headers.get(b"origin")
        if self.check_origin and origin is not None and not self.hosts.allows_origin(origin.decode("latin-1")):
            return await self._reply(send, *json_reply(
                403, f"Origin {origin.decode('latin-1')[:100]!r} is not one this server answers to (--allowed-host)",
                "invalid_origin"))
        if self.key_digest is not None and scope.get("path") not in self.open_paths:
            given = headers.get(b"authorization")
            scheme, _, token = (given or b"").partition(b" ")
            ok = scheme.lower() == b"bearer" and hmac.compare_digest(hashlib.sha256(token.strip()).digest(), self.key_digest)
            if not ok:
                message = ("an API key is required: send the header `Authorization: Bearer KEY`" if given is None
                           else "the API key is wrong (or not sent as `Authorization: Bearer KEY`)")
                challenge = b'Bearer realm="semsearch"' + (b'' if given is None else b', error="invalid_token"')
                return await self._reply(send, *json_reply(401, message, "authentication_error", [(b"www-authenticate", challenge)]))
        if not self.per_client or scope.get("path") in self.open_paths:
            return await self._answer(scope, receive, send)
        client = (scope.get("client") or ("?", 0))[0]
        if self.inflight.get(client, 0) >= self.per_client:
            return await self._reply(send, *json_reply(
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
            await self._reply(send, *json_reply(500, f"internal error ({type(e).__name__}); see the server log", "internal_error"))

    @staticmethod
    async def _reply(send, start, body):
        await send(start)
        await send(body)


class BodyLimit:
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


def check_exposure(host: str, api_key: str | None, insecure: bool = False) -> None:
    """InputError for listening beyond loopback without an API key, unless `insecure`."""
    if is_loopback(host) or api_key is not None:
        return
    if not insecure:
        raise InputError(f"refusing to listen on {host} without an API key: anyone who can reach it could search and change "
                         "the index. Give --api-key KEY (or --api-key-file PATH, or set SEMSEARCH_API_KEY), "
                         "or --insecure to serve without one (e.g. behind a proxy that checks keys)")
    log.warning("listening on %s without an API key (--insecure): anyone who can reach it can search the index", host)


# ---- connections: what the HTTP server (uvicorn) holds open for a client --------------------------
# uvicorn closes a kept-alive connection idle between requests (5 s), but holds one forever that
# never completes a request: a socket that sends nothing, headers at a byte a second, a body that
# trickles. Neither uvicorn nor h11/httptools has a request-read timeout, so the protocol is
# extended here (the smallest change that bounds it: two timers per connection); the number of
# connections is uvicorn's own bound (limit_concurrency: a 503 beyond it).
TIMEOUT_REPLY = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
                 b"content-length: %d\r\n\r\n%s")


class _Deadlines:
    """Mixed into uvicorn's HTTP protocol (server_config): a request's headers must arrive whole
    within `header_s` of the connection's start or of the previous response, and its body within
    `body_s` of its headers; past one, the client gets a 408 and the connection closes."""

    header_s = 10.0
    body_s = 60.0
    _timer = None
    _phase: str | None = None  # "headers", "body", or None (a request is being answered)
    _seen = None  # the request cycle whose headers arrived last

    def _arm(self, phase: str, seconds: float) -> None:
        self._disarm()
        self._phase = phase
        self._timer = self.loop.call_later(seconds, self._too_slow)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._phase = None, None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm("headers", self.header_s)

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        c = self.cycle
        if self._phase is None or c is None:
            return
        if c is not self._seen:  # a new request's headers are in
            self._seen = c
            if c.more_body and self._phase == "headers":
                self._arm("body", self.body_s)
            else:
                self._disarm()
        elif self._phase == "body" and not c.more_body:
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return
        c = self._seen = self.cycle
        if c is not None and not c.response_complete:  # a pipelined request, already read, is being answered
            if c.more_body:
                self._arm("body", self.body_s)
            else:
                self._disarm()
        else:
            self._arm("headers", self.header_s)

    def on_headers_complete(self) -> None:
        """(httptools) An absolute-form target (`GET http://host/path`): its authority is the
        request's host, not the Host header (RFC 9112 3.2.2), so the Host check sees that one."""
        url = getattr(self, "url", b"")
        if url[:1] not in (b"/", b"*"):
            import httptools

            try:
                u = httptools.parse_url(url)
            except Exception:  # noqa: BLE001 - the parser's own handling answers it
                u = None
            if u is not None and u.host:
                host = u.host + (b":%d" % u.port if u.port else b"")
                self.headers[:] = [(k, v) for k, v in self.headers if k != b"host"] + [(b"host", host)]
        super().on_headers_complete()

    def _too_slow(self) -> None:
        phase, limit = self._phase, self.header_s if self._phase == "headers" else self.body_s
        self._timer, self._phase = None, None
        if self.transport.is_closing():
            return
        if not (phase == "body" and self.cycle is not None and self.cycle.response_started):
            what = "request headers" if phase == "headers" else "request body"
            body = json.dumps({"error": {"message": f"the {what} did not arrive within {limit:g} s", "type": "timeout",
                                         "code": 408}}).encode()
            self.transport.write(TIMEOUT_REPLY % (len(body), body))
        self.transport.close()


def server_config(app, host: str, port: int, log_level: str = "info", *, header_timeout: float = 10.0,
                  body_timeout: float = 60.0, max_connections: int = 1000):
    """The uvicorn.Config that serve and mcp --http run: the request deadlines above, at most
    `max_connections` connections and requests at once (a 503 beyond), no Server header."""
    import uvicorn

    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:  # uvicorn without httptools: its pure-Python parser
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, server_header=False,
                          http=type(f"Bounded{base.__name__}", (_Deadlines, base), {"header_s": header_timeout, "body_s": body_timeout}),
                          limit_concurrency=max_connections)
