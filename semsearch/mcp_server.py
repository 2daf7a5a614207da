"""`semsearch mcp`: an index for AI assistants and agents, over the Model Context Protocol
(the official `mcp` SDK, the extra `semsearch[mcp]`).

Tools (JSON schemas and descriptions written for a language model):
    search(query, k, mode, where)       ranked hits: id, title, file or document, page, section, line, score, text
    fetch(id, whole_document)           one hit's chunk, or its whole document, with its metadata
    info()                              what the index holds
    upsert_document(id, text, metadata), delete_document(id)     only with --allow-writes

Transports: stdio (what desktop assistants launch) and streamable HTTP (`--http HOST:PORT`, the
endpoint /mcp). Over HTTP the server applies `semsearch serve`'s exposure rules from
semsearch.exposure: the same API key (`Authorization: Bearer KEY`), the Host allow-list, the
refusal to listen beyond loopback without a key, the request-size limit.

Every tool is a thin call of `semsearch.service.Operations`, which the HTTP server calls too: the
same checks, limits and work, on a worker thread (never on the event loop). An error is a tool
error result with a message that names the argument and the limit; nothing a client sends can
stop the server.
"""
# No `from __future__ import annotations`: the SDK builds each tool's JSON schema from its
# annotations at run time, and those name values known only when a server is created (its --max-k).
import contextlib
import inspect
import logging
import re
import sys
from typing import Annotated, Any, Iterable, Literal

from semsearch.errors import InputError, SemsearchError
from semsearch.limits import MAX_WHERE_CONDITIONS, MAX_WHERE_VALUES
from semsearch.exposure import (BodyLimit, Guard, HostPolicy, check_api_key, check_exposure, is_loopback, safe_text)
from semsearch.service import Limits, Operations, Service

log = logging.getLogger(__name__)

MCP_PATH = "/mcp"
INSTRUCTIONS = (
    "Search a document collection indexed by semsearch. Call `search` with a natural-language question "
    "or keywords; each hit has an `id`, a `title`, where it comes from (file or document, page, section, line) "
    "and the matching text. Call `fetch` with a hit's id to read that passage with its metadata, or with "
    "whole_document=true to read its whole document. Quote the location when you cite a hit.")


def _require():
    try:
        import mcp.server.mcpserver  # noqa: F401
    except ImportError as e:
        raise ImportError(f"`semsearch mcp` needs the Model Context Protocol SDK, version 2 or later ({e.name} is missing "
                          "or too old): pip install 'semsearch[mcp]'") from e


def create_server(ops: Operations, allow_writes: bool = False):
    """The MCP server (an `mcp.server.mcpserver.MCPServer`) whose tools call `ops`; the write
    tools exist only with `allow_writes` (and refuse even then where `ops` is read-only)."""
    _require()
    from mcp.server.mcpserver import MCPServer

    import semsearch

    known: dict[str, tuple[str, ...]] = {}  # each tool's argument names, filled in below
    server = MCPServer(name="semsearch", title=f"semsearch: {ops.service.folder.name}", version=semsearch.__version__,
                       instructions=INSTRUCTIONS, log_level="WARNING", middleware=[_unknown_argument_refusal(known)])
    call = _tool_caller(ops)
    tools = _add_read_tools(server, ops, call)
    if allow_writes:
        tools += _add_write_tools(server, ops, call)
    for fn in tools:
        known[fn.__name__] = tuple(p for p in inspect.signature(fn).parameters)
    return server


def _unknown_argument_refusal(known: dict[str, tuple[str, ...]]):
    """The server's middleware: `known` maps each tool's name to its argument names, and is
    filled in once the tools exist."""
    async def refuse_unknown_arguments(ctx, call_next):
        """A tools/call naming an argument the tool does not take is an error result, not a call
        with that argument silently dropped (a model that sends `top_k` would get 10 hits and
        never learn why). The SDK's argument models ignore extra keys."""
        params = ctx.params if isinstance(ctx.params, dict) else None
        if ctx.method == "tools/call" and params is not None and params.get("name") in known:
            args = params.get("arguments") or {}
            extra = sorted(str(a) for a in args) if isinstance(args, dict) else []
            extra = [a for a in extra if a not in known[params["name"]]]
            if extra:
                from mcp_types import CallToolResult, TextContent

                names = ", ".join(known[params["name"]]) or "none"
                return CallToolResult(content=[TextContent(type="text", text=safe_text(
                    f"{params['name']}: unknown argument(s) {', '.join(repr(a[:40]) for a in extra[:5])}; it takes: {names}"))],
                    is_error=True)
        return await call_next(ctx)

    return refuse_unknown_arguments


def _tool_caller(ops: Operations):
    """`call(fn, *args)`, which every tool awaits to do its work through `ops`."""
    import anyio
    from mcp.server.mcpserver.exceptions import ToolError

    async def call(fn, *args) -> Any:
        """fn(*args) on a worker thread, its answer within --max-response-bytes; semsearch's
        errors as tool errors (this machine's paths scrubbed), anything else logged and reported
        as an internal error."""
        def work():
            out = fn(*args)
            ops.rendered(out)  # LimitExceeded past --max-response-bytes, before the SDK renders it
            return out

        try:
            return await anyio.to_thread.run_sync(work)
        except SemsearchError as e:
            raise ToolError(safe_text(ops.service.scrub(f"{type(e).__name__}: {e}", e.given))) from None
        except Exception as e:
            log.exception("internal error in an MCP tool")
            raise ToolError(f"internal error ({type(e).__name__}); see the server log") from None

    return call


def _tool(server, name: str, title: str, annotations):
    """server.tool() with the function's docstring, dedented, as the description: the SDK would
    give clients the docstring as it stands, indentation and all."""

    def register(fn):
        text = re.sub(r"(?<!\n)\n(?!\n)", " ", inspect.cleandoc(fn.__doc__ or ""))  # lines of a paragraph joined
        return server.tool(name=name, title=title, description=text, annotations=annotations)(fn)

    return register


WHERE_HELP = (
    "Optional metadata filter; every condition must hold. As an object: {\"lang\": \"en\"} (equals), "
    "{\"lang\": [\"en\", \"de\"]} (any of), {\"year\": {\">=\": 2020, \"<\": 2024}} (operators =, !=, >, >=, <, <=), "
    "{\"$path\": \"docs/*.md\"} (the source file, a glob). As strings: [\"year>=2020\", \"lang!=de\", \"path:*.md\"]. "
    "Field names are the documents' metadata fields (each hit shows its own); \"2020\" matches the string and the "
    f"number; != also matches passages without the field. At most {MAX_WHERE_CONDITIONS} conditions and "
    f"{MAX_WHERE_VALUES:,} values in one any-of list."
)


# ---- what the tools give: their output schemas ---------------------------------------------------
# The SDK builds a tool's outputSchema from its return type and validates each answer against it.
# pydantic needs typing_extensions' TypedDict below Python 3.12. Keys not listed are kept
# (extra="allow"), never dropped: a field added to Operations' answers reaches the client.
try:
    from pydantic import ConfigDict, Field, with_config
    from typing_extensions import NotRequired, TypedDict
except ImportError as e:  # both come with the SDK
    raise ImportError(f"`semsearch mcp` needs the Model Context Protocol SDK ({e.name} is missing): "
                      "pip install 'semsearch[mcp]'") from e

_OPEN = ConfigDict(extra="allow")


@with_config(_OPEN)
class _Located(TypedDict):
    """Where a passage or document comes from (service._located): in hits and in fetch's answers."""
    document: NotRequired[Annotated[str, Field(description="the id of the document it comes from, for a document written through the API")]]
    file: NotRequired[Annotated[str, Field(description="the indexed file it comes from (where it is not an API document)")]]
    location: Annotated[str, Field(description="file:line, file p. N or file row N: what to quote")]
    page: NotRequired[int]
    section: NotRequired[str]
    line: NotRequired[int]
    row: NotRequired[int]


@with_config(_OPEN)
class HitOut(_Located):
    """One passage that matched, best first."""
    id: Annotated[str, Field(description="the passage's fetch id, chunk:N")]
    rank: int
    title: Annotated[str, Field(description="its document's title, else the file's name or the document id")]
    score: Annotated[float, Field(description="the ranking's score: hybrid in [0, 1], dense cosine, lexical BM25")]
    source_id: Annotated[str, Field(description="the fetch id of its whole document: doc:ID or file:PATH")]
    chunk: Annotated[int, Field(description="the passage's number within its document")]
    text: str
    metadata: dict[str, Any]


@with_config(_OPEN)
class SearchOut(TypedDict):
    query: str
    generation: Annotated[int, Field(description="the index generation the hits came from")]
    hits: list[HitOut]


@with_config(_OPEN)
class FetchOut(_Located):
    """A passage (kind "chunk") or a whole document (kind "document")."""
    id: str
    kind: Literal["chunk", "document"]
    generation: int
    title: str
    source_id: NotRequired[Annotated[str, Field(description="a passage's whole document")]]
    chunk: NotRequired[int]
    start: NotRequired[Annotated[int, Field(description="a passage's character offsets in its document")]]
    end: NotRequired[int]
    chunks: NotRequired[Annotated[int, Field(description="how many passages a whole document has")]]
    text: str
    metadata: dict[str, Any]


@with_config(_OPEN)
class InfoOut(TypedDict):
    index: str
    model: str
    pooling: str
    dim: int
    counts: dict[str, Any]
    generation: int
    updated: str | None
    modes: list[Literal["dense", "lexical", "hybrid"]]
    read_only: bool
    limits: dict[str, Any]
    version: str


@with_config(_OPEN)
class WriteOut(TypedDict):
    added: int
    updated: int
    unchanged: int
    deleted: int
    chunks: Annotated[int, Field(description="passages embedded")]
    generation: Annotated[int, Field(description="the index generation that holds the change")]
    seconds: float


def _add_read_tools(server, ops: Operations, call) -> list:
    """Register search, fetch and info on `server`; returns their functions. The schema of `k`
    takes its bounds and default from `ops` (the server's --max-k and default k)."""
    from mcp_types import ToolAnnotations
    from pydantic import Field

    max_k = ops.limits.max_k
    read = ToolAnnotations(readOnlyHint=True, destructiveHint=False, idempotentHint=True, openWorldHint=False)

    @_tool(server, "search", "Search the index", read)
    async def search(
        # maxLength is advertised, not validated by pydantic: the server's own check answers
        # (its messages name the limit, and a lone surrogate as such)
        query: Annotated[str, Field(json_schema_extra={"maxLength": ops.limits.max_text_chars},
                                    description="What to look for: a question or keywords, in natural language.")],
        k: Annotated[int, Field(strict=True, ge=1, le=max_k, description="How many hits to return, best first.")] = ops.default_k,
        mode: Annotated[Literal["dense", "lexical", "hybrid"] | None, Field(
            description="hybrid (the default where the index has BM25): meaning and words together; dense: by "
                        "meaning; lexical: by words (BM25), best for exact names, codes and rare terms.")] = None,
        where: Annotated[dict[str, Any] | list[str] | str | None, Field(
            description=WHERE_HELP)] = None,
    ) -> SearchOut:
        """Search the indexed documents. Gives the best-matching passages, each with an id (for
        `fetch`), a title, where it comes from (file or document id, page, section, line), a score
        and its text."""
        return await call(ops.find, query, k, mode, where)

    @_tool(server, "fetch", "Read a passage or document", read)
    async def fetch(
        id: Annotated[str, Field(description="What to read: a hit's `id` from `search` (`chunk:N`, one passage), or its "
                                             "`source_id` (`doc:ID` or `file:PATH`, a whole document).")],
        whole_document: Annotated[bool, Field(strict=True, 
            description="Give the whole document the passage belongs to, not only the passage.")] = False,
    ) -> FetchOut:
        """Read one passage by its id (from `search`) with its metadata and location, or, with
        whole_document=true or a hit's source_id, the whole document it comes from."""
        return await call(ops.fetch, id, whole_document)

    @_tool(server, "info", "What the index holds", read)
    async def info() -> InfoOut:
        """What the index holds: its model, how many documents and passages, when it was last
        updated, which search modes it offers and the server's limits."""
        return await call(ops.info)

    return [search, fetch, info]


def _add_write_tools(server, ops: Operations, call) -> list:
    """Register upsert_document and delete_document on `server` (for --allow-writes); returns
    their functions."""
    from mcp_types import ToolAnnotations
    from pydantic import Field

    write = ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=True, openWorldHint=False)

    @_tool(server, "upsert_document", "Add or replace a document", write)
    async def upsert_document(
        id: Annotated[str, Field(description="The document's id: a document with this id is replaced.")],
        text: Annotated[str, Field(description="The document's text.")],
        metadata: Annotated[dict[str, Any] | None, Field(
            description="Optional fields to filter on later (`where`), e.g. {\"lang\": \"en\"}.")] = None,
    ) -> WriteOut:
        """Add a document to the index, or replace the one with the same id. It is searchable
        as soon as this returns."""
        return await call(ops.upsert, [{"id": id, "text": text, "metadata": metadata or {}}])

    @_tool(server, "delete_document", "Delete a document",
           ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=False, openWorldHint=False))
    async def delete_document(
        id: Annotated[str, Field(description="The id of a document added with upsert_document.")],
    ) -> WriteOut:
        """Remove a document (added with upsert_document) from the index."""
        return await call(ops.delete, [id])

    return [upsert_document, delete_document]


def http_app(server, ops: Operations, *, api_key: str | None = None, host: str = "127.0.0.1",
             allowed_hosts: Iterable[str] = ()):
    """The streamable-HTTP ASGI application of `server` at /mcp, behind semsearch.exposure's
    guards: the Host allow-list, the API key, requests in flight per client, the body limit.
    The SDK's own DNS-rebinding check is off: the Guard's is the same check as `serve`'s, on the
    Host header and on the Origin header where one is sent."""
    from mcp.server.transport_security import TransportSecuritySettings

    app = server.streamable_http_app(streamable_http_path=MCP_PATH, host=host,
                                     max_request_body_size=ops.limits.max_request_bytes,
                                     transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
    key = check_api_key(api_key) if api_key is not None else None
    # Origin checked too, as the MCP specification asks of streamable HTTP servers (DNS rebinding)
    return Guard(BodyLimit(app, ops.limits.max_request_bytes), key=key, hosts=HostPolicy(host, allowed_hosts),
                 open_paths=(), per_client=ops.limits.max_inflight_per_client, check_origin=True)


def screen_line(line: str) -> tuple[Any, bool]:
    """(the reply to send at once, or None; whether to pass the line on to the SDK) for one line
    read over stdio. The SDK's reader drops a line it cannot read without any reply, and a
    client then waits for its timeout; JSON-RPC asks for an error: -32700 for text that is not
    JSON (id null), -32600 for JSON that is no JSON-RPC message, and for a string UTF-8 cannot
    carry (a lone surrogate escape, valid JSON) an error naming the argument: a tool error result
    for tools/call (as the HTTP transport gives), -32602 for other methods. A notification
    (no id) that cannot be read gets no reply, as JSON-RPC says."""
    import json

    import mcp_types as types
    from pydantic import ValidationError

    from semsearch.limits import unencodable

    if not line.strip():
        return None, False

    def error(id_, code: int, message: str):
        return types.JSONRPCError(jsonrpc="2.0", id=id_, error=types.ErrorData(code=code, message=message))

    try:
        data = json.loads(line.strip())
    except ValueError as e:
        return error(None, -32700, f"Parse error: not JSON ({e})"), False
    request_id = data.get("id") if isinstance(data, dict) else None
    if isinstance(request_id, bool) or not isinstance(request_id, (int, str)):
        request_id = None
    bad = unencodable(data)
    if bad is not None:
        where, text, at = bad
        message = (f"{where[:120]}: not valid Unicode text ({ascii(text[at])} at character {at + 1} is a lone "
                   "surrogate, which UTF-8 cannot encode)")
        if request_id is None:
            return None, False
        if data.get("method") == "tools/call":
            return types.JSONRPCResponse(jsonrpc="2.0", id=request_id, result={
                "content": [{"type": "text", "text": safe_text(message)}], "isError": True}), False
        return error(request_id, -32602, f"Invalid params: {safe_text(message)}"), False
    try:
        types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValidationError as e:
        first = e.errors()[0] if e.errors() else {}
        shown = ".".join(str(x) for x in first.get("loc", ())[-3:]) or "message"
        return (error(request_id, -32600, f"Invalid Request: not a JSON-RPC 2.0 message ({shown}: {first.get('msg')})")
                if request_id is not None or not isinstance(data, dict) or "method" not in data else None), False
    return None, True


async def serve_stdio(server, stdin=None, stdout=None) -> None:
    """`server.run("stdio")`, with each line screened first (screen_line), its replies sent
    through the SDK's own writer. A work-around of the SDK's stdio transport, which answers
    nothing to a line it cannot read: it takes the SDK's private pieces (the standard-input
    claim that points fd 0 at the null device while serving, and the server's low-level half,
    as MCPServer.run_stdio_async does), falling back to the plain stdin where they moved."""
    import io

    import anyio
    from mcp.server.stdio import stdio_server
    from mcp.shared.message import SessionMessage

    restore = None
    if stdin is None:
        try:
            from mcp.server.stdio import _claim_fd, _open_stdin_diversion, _UnownedTextWrapper

            buffer, restore = _claim_fd(0, sys.stdin, "rb", _open_stdin_diversion)
            text = _UnownedTextWrapper(buffer, encoding="utf-8", errors="replace")  # never closes the buffer
        except (ImportError, RuntimeError, OSError):
            text = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
        stdin = anyio.wrap_file(text)
    ready, writer = anyio.Event(), []

    async def screened():
        async for line in stdin:
            reply, forward = screen_line(line)
            if reply is not None:
                await ready.wait()
                await writer[0].send(SessionMessage(reply))
            if forward:
                yield line

    lowlevel = server._lowlevel_server
    try:
        async with stdio_server(stdin=screened(), stdout=stdout) as (read_stream, write_stream):
            writer.append(write_stream)
            ready.set()
            await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())
    finally:
        if restore is not None:
            restore()


def parse_http(address: str) -> tuple[str, int]:
    """(host, port) of --http HOST:PORT (or :PORT, or [::1]:PORT); InputError naming the option otherwise."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"--http {address!r}: give HOST:PORT, e.g. 127.0.0.1:8765")
    return host, int(port)


def run(index=None, *, http: str | None = None, device: str = "auto", limits: Limits | None = None,
        allow_writes: bool = False, api_key: str | None = None, insecure: bool = False,
        allowed_hosts: Iterable[str] = (), watch=None, log_level: str = "warning") -> None:
    """Load the index and serve it over stdio (http None) or streamable HTTP until interrupted.
    `watch`: a started semsearch.watch.Watcher (semsearch.service.start_watcher), stopped when
    the server ends; the tools see each of its batches once it is published."""
    _require()
    host = port = None
    if http is not None:
        host, port = parse_http(http)
        if api_key is not None:
            api_key = check_api_key(api_key)
        check_exposure(host, api_key, insecure)  # before the index and the model load
        if not is_loopback(host) and allow_writes:
            log.warning("listening on %s with --allow-writes: whoever has the API key can change the index", host)
    with contextlib.redirect_stdout(sys.stderr):  # over stdio, stdout carries the protocol and nothing else
        ops = Operations(Service(index, device), limits, read_only=not allow_writes)
        server = create_server(ops, allow_writes)
    try:
        if http is None:
            import anyio

            anyio.run(serve_stdio, server)
        else:
            import uvicorn

            from semsearch.exposure import server_config

            lim = ops.limits
            uvicorn.Server(server_config(http_app(server, ops, api_key=api_key, host=host, allowed_hosts=allowed_hosts),
                                         host, port, log_level, header_timeout=lim.header_timeout,
                                         body_timeout=lim.body_timeout, max_connections=lim.max_connections)).run()
    finally:
        if watch is not None:
            watch.stop()
