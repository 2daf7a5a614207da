"""What a long-lived server promises its clients, over MCP (the official client, in process and
over streamable HTTP on loopback) and HTTP: a --max-k below 10 still answers a search without k,
error messages quote ids as given, a query of control characters is refused like an empty one,
the MCP HTTP transport checks Origin, and duplicate Host or Authorization headers are a 400
(FakeEncoder, real FAISS and SQLite)."""
from __future__ import annotations

import asyncio
import json
import socket

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from semsearch.errors import InputError  # noqa: E402
from semsearch.indexing import index_corpus  # noqa: E402
from semsearch.search import Retriever  # noqa: E402
from semsearch.serve import create_app  # noqa: E402
from semsearch.service import Limits, Operations, Service  # noqa: E402

from conftest import FakeEncoder, running  # noqa: E402

KEY = "test-key-0123456789abcdefghij"


@pytest.fixture
def folder(tmp_path, small_corpus):
    out = tmp_path / "idx"
    index_corpus(small_corpus, out, FakeEncoder(), progress=False)
    return out


def ops_of(folder, **limits) -> Operations:
    return Operations(Service(folder, device="cpu", encoder=FakeEncoder()), Limits(**limits))


def test_a_max_k_below_10_still_answers_searches_that_give_no_k(folder):
    pytest.importorskip("mcp.server.mcpserver")
    from mcp import Client

    from semsearch.mcp_server import create_server

    ops = ops_of(folder, max_k=2)

    async def main():
        async with Client(create_server(ops)) as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            k = tools["search"].input_schema["properties"]["k"]
            assert k["default"] <= k["maximum"] == 2  # the schema's default lies within its own maximum
            r = await c.call_tool("search", {"query": "loan credit"})
            assert not r.is_error, r.content[0].text
            assert 1 <= len(r.structured_content["hits"]) <= 2

    asyncio.run(main())
    with running(create_app(ops.service, ops.limits)) as url:
        with httpx.Client(base_url=url, timeout=60) as c:
            for r in (c.get("/search", params={"q": "loan credit"}), c.post("/search", json={"query": "loan credit"})):
                assert r.status_code == 200, r.text
                assert 1 <= len(r.json()["hits"]) <= 2
            assert c.get("/search", params={"q": "loan", "k": 3}).status_code == 422  # an explicit k over it: refused


def test_errors_quote_the_callers_id_as_given(folder):
    pytest.importorskip("mcp.server.mcpserver")
    from mcp import Client

    from semsearch.mcp_server import create_server

    ops = ops_of(folder)
    ops.read_only = False

    async def main():
        async with Client(create_server(ops, allow_writes=True)) as c:
            for doc_id in ("/etc/passwd", "/usr/lib/x", "notes/../../etc/shadow"):
                r = await c.call_tool("fetch", {"id": doc_id})
                assert r.is_error and repr(doc_id) in r.content[0].text, r.content[0].text
            r = await c.call_tool("delete_document", {"id": "/etc/passwd"})
            assert r.is_error and "'/etc/passwd'" in r.content[0].text, r.content[0].text

    asyncio.run(main())
    with running(create_app(ops.service, ops.limits)) as url:
        r = httpx.delete(url + "/documents//etc/passwd", timeout=60)
        assert r.status_code == 404 and "'/etc/passwd'" in r.json()["error"]["message"], r.text
        assert str(folder) not in r.text  # the index's own path is still not shown


@pytest.mark.parametrize("query", ["\u0000\u0001\u0002", "\u200b\u200b", " \t\n\u0007 "])
def test_a_query_of_control_characters_is_refused_as_empty(folder, query):
    r = Retriever.load(folder, encoder=FakeEncoder())
    with pytest.raises(InputError, match="empty"):
        r.search(query)
    with pytest.raises(InputError, match="query 2 is empty"):
        r.search_batch(["loan", query])
    with running(create_app(Service(folder, device="cpu", encoder=FakeEncoder()))) as url:
        resp = httpx.post(url + "/search", json={"query": query}, timeout=60)
        assert resp.status_code == 422 and "empty" in resp.json()["error"]["message"]
    assert r.search("loan\u0000") is not None  # a visible character among them is a query


def _raw_request(url: str, lines: list[str]) -> str:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return data.decode("latin-1")


def test_duplicate_host_or_authorization_headers_are_a_400(folder):
    with running(create_app(Service(folder, device="cpu", encoder=FakeEncoder()), api_key=KEY)) as url:
        ok = _raw_request(url, ["GET /info HTTP/1.1", "Host: 127.0.0.1", f"Authorization: Bearer {KEY}", "Connection: close"])
        assert ok.startswith("HTTP/1.1 200"), ok[:200]
        two_hosts = _raw_request(url, ["GET /info HTTP/1.1", "Host: evil.com", "Host: 127.0.0.1",
                                       f"Authorization: Bearer {KEY}", "Connection: close"])
        assert two_hosts.startswith("HTTP/1.1 400"), two_hosts[:200]
        two_keys = _raw_request(url, ["GET /info HTTP/1.1", "Host: 127.0.0.1", "Authorization: Bearer wrong",
                                      f"Authorization: Bearer {KEY}", "Connection: close"])
        assert two_keys.startswith("HTTP/1.1 400"), two_keys[:200]


def test_the_mcp_http_transport_checks_origin(folder):
    pytest.importorskip("mcp.server.mcpserver")
    from semsearch.mcp_server import MCP_PATH, create_server, http_app

    ops = ops_of(folder)
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    with running(http_app(create_server(ops), ops)) as url:
        with httpx.Client(base_url=url, timeout=60) as c:
            bad = c.post(MCP_PATH, json=init, headers={**headers, "origin": "http://evil.example"})
            assert bad.status_code == 403 and "Origin" in bad.json()["error"]["message"], bad.text
            assert c.post(MCP_PATH, json=init, headers={**headers, "origin": "null"}).status_code == 403
            for origin in (None, "http://127.0.0.1:1234", "http://localhost"):
                h = headers if origin is None else {**headers, "origin": origin}
                r = c.post(MCP_PATH, json=init, headers=h)
                assert r.status_code == 200, (origin, r.status_code, r.text[:300])


def test_stdio_answers_every_message_it_cannot_read(folder):
    """Over stdio (the transport's reader fed in process), truncated JSON, a message that is no
    JSON-RPC, and a lone surrogate anywhere in a call each get an answer; the session goes on."""
    pytest.importorskip("mcp.server.mcpserver")
    import anyio

    from semsearch.mcp_server import create_server, serve_stdio

    ops = ops_of(folder)
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    call = {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "search", "arguments": {"query": "loan credit"}}}
    lines = [json.dumps(init), json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
             '{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "search"',  # truncated
             json.dumps({**call, "id": 3, "params": {"name": "search", "arguments": {"query": "soup\ud800"}}}),
             json.dumps({**call, "id": 4, "params": {"name": "search", "arguments": {"query": "x", "w\ud800": 1}}}),
             json.dumps({"jsonrpc": "2.0", "id": 5, "method": "tools/list", "params": {"cursor": "\udfff"}}),
             json.dumps({"hello": "world", "id": 6}),
             json.dumps({**call, "id": 7})]
    out: list[dict] = []

    class Stdout:
        async def write(self, text):
            out.extend(json.loads(t) for t in text.splitlines() if t.strip())

        async def flush(self):
            pass

    async def stdin():
        for line in lines:
            yield line + "\n"
        with anyio.fail_after(60):
            while len(out) < 7:
                await anyio.sleep(0.02)

    anyio.run(lambda: serve_stdio(create_server(ops), stdin=stdin(), stdout=Stdout()))
    by_id = {m.get("id"): m for m in out}
    assert by_id[None]["error"]["code"] == -32700  # the truncated line: its id cannot be known
    for i in (3, 4):
        assert by_id[i]["result"]["isError"] is True and "lone surrogate" in by_id[i]["result"]["content"][0]["text"]
    assert "arguments.query" in by_id[3]["result"]["content"][0]["text"]
    assert by_id[5]["error"]["code"] == -32602 and "params.cursor" in by_id[5]["error"]["message"]
    assert by_id[6]["error"]["code"] == -32600
    assert not by_id[7]["result"].get("isError") and by_id[7]["result"]["structuredContent"]["hits"]


def test_fetch_ids_of_three_forms_never_mix(folder, small_corpus):
    """An API document with id "5" beside chunk 5 of a file; ids past 64 bits; a file's id."""
    from semsearch.documents import Document, upsert_documents

    upsert_documents(folder, [Document("5", "kelp forests grow fast in cold water", {"lang": "en"}),
                              Document(str(2**64), "a document whose id is past 64 bits", {})], FakeEncoder())
    ops = ops_of(folder)
    doc = ops.fetch("5")
    assert doc["kind"] == "document" and doc["text"].startswith("kelp") and doc["id"] == "doc:5"
    assert ops.fetch("doc:5")["text"] == doc["text"]
    assert ops.fetch(str(2**64))["text"].startswith("a document whose id")
    for missing in ("chunk:" + str(2**64), str(2**70), "chunk:99999", "doc:nope", "file:nowhere.txt", "chunk:x"):
        with pytest.raises(InputError, match="no chunk or document"):
            ops.fetch(missing)
    hits = ops.find("meteor comet debris", k=5)["hits"]
    hit = next(h for h in hits if h.get("file", "").endswith("space.txt"))
    assert hit["id"].startswith("chunk:") and hit["source_id"] == "file:" + hit["file"]
    chunk = ops.fetch(hit["id"])
    assert chunk["kind"] == "chunk" and chunk["text"] == hit["text"] and chunk["id"] == hit["id"]
    whole = ops.fetch(hit["source_id"])
    assert whole["kind"] == "document" and hit["text"] in whole["text"] and whole["id"] == hit["source_id"]
    assert ops.fetch(hit["id"], whole_document=True)["text"] == whole["text"]
    assert ops.fetch(hit["id"].removeprefix("chunk:"))["text"] == hit["text"]  # the bare form of older hit ids
    kelp = next(h for h in ops.find("kelp forests", k=5, mode="lexical")["hits"] if h.get("document") == "5")
    assert kelp["source_id"] == "doc:5" and ops.fetch(kelp["id"])["text"] == kelp["text"]


def test_head_wherever_get_is_and_405_says_allow(folder):
    with running(create_app(Service(folder, device="cpu", encoder=FakeEncoder()))) as url:
        with httpx.Client(base_url=url, timeout=60) as c:
            for path in ("/health", "/", "/info", "/v1/models"):
                r = c.head(path)
                assert r.status_code == 200 and r.content == b"", (path, r.status_code)
                assert r.headers["content-type"] == c.get(path).headers["content-type"]
            r = c.put("/health")
            assert r.status_code == 405 and "GET" in r.headers.get("allow", "") and r.json()["error"]["code"] == 405
            r = c.get("/documents")
            assert r.status_code == 405 and "POST" in r.headers.get("allow", "")


def test_a_write_is_bounded_by_the_chunks_it_would_encode_and_the_bytes_of_its_text(folder):
    from semsearch.service import LimitExceeded
    from semsearch.store import Manifest

    g = Manifest.load(folder).generation
    enc = FakeEncoder()
    long_text = " ".join(f"word{i} kelp forest" for i in range(400))  # ~1,200 tokens: dozens of chunks
    with running(create_app(Service(folder, device="cpu", encoder=enc), Limits(max_write_chunks=10))) as url:
        with httpx.Client(base_url=url, timeout=60) as c:
            r = c.post("/documents", json={"documents": [{"id": "long", "text": long_text}]})
            assert r.status_code == 413 and "one write encodes at most 10" in r.json()["error"]["message"], r.text
            assert Manifest.load(folder).generation == g and enc.calls == 0  # refused before anything was encoded
            ok = c.post("/documents", json={"documents": [{"id": "short", "text": "kelp forests grow fast"}]})
            assert ok.status_code == 200 and ok.json()["added"] == 1
    ops = ops_of(folder, max_request_bytes=1000)
    ops.read_only = False
    with pytest.raises(LimitExceeded, match="1,200 bytes of text"):
        ops.upsert([{"id": "wide", "text": "\U0001f600" * 300}])  # 300 characters, 1,200 bytes


def test_the_cli_passes_max_write_chunks_to_the_server(folder, monkeypatch):
    """`serve --max-write-chunks N` bounds the server's writes (the default: 2,048)."""
    from click.testing import CliRunner

    import semsearch.serve
    from semsearch.cli import main

    got = []
    monkeypatch.setattr(semsearch.serve, "serve", lambda index, host, port, device, limits, *a, **kw: got.append(limits))
    for args, want in (([], 2048), (["--max-write-chunks", "7"], 7)):
        r = CliRunner().invoke(main, ["serve", "--index", str(folder), *args])
        assert r.exit_code == 0, r.output
        assert got[-1].max_write_chunks == want
    r = CliRunner().invoke(main, ["serve", "--index", str(folder), "--max-write-chunks", "0"])
    assert r.exit_code != 0 and "--max-write-chunks" in r.output


def test_tool_schemas_carry_the_limits_and_grammar_an_assistant_needs(folder):
    """Descriptions without the source's indentation, `query` bounded as the server bounds it,
    `where` naming its operators, forms and limits; a longer query is an error result."""
    pytest.importorskip("mcp.server.mcpserver")
    from mcp import Client

    from semsearch.limits import MAX_WHERE_CONDITIONS
    from semsearch.mcp_server import create_server

    ops = ops_of(folder, max_text_chars=500)

    async def main():
        async with Client(create_server(ops, allow_writes=True)) as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            assert set(tools) == {"search", "fetch", "info", "upsert_document", "delete_document"}
            for t in tools.values():
                assert t.description and "\n" not in t.description and "  " not in t.description, t.description
            props = tools["search"].input_schema["properties"]
            assert props["query"]["maxLength"] == 500
            where = props["where"]["description"]
            for part in (">=", "!=", "$path", "path:", "any of", f"{MAX_WHERE_CONDITIONS} conditions"):
                assert part in where, part
            r = await c.call_tool("search", {"query": "kelp " * 200})
            assert r.is_error and "500" in r.content[0].text

    asyncio.run(main())
