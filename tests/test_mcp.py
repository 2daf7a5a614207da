"""`semsearch mcp`: the official MCP SDK's client against the server, over stdio (a subprocess, as
a desktop assistant launches it) and streamable HTTP (a subprocess with an API key), and in
process for the write tools; hits and scores equal `Retriever.search`'s; malformed calls are
tool errors and the server goes on answering; `--watch` keeps what the tools see in step with a
folder."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp.server.mcpserver")
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")  # with the SDK

from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402

from semsearch.indexing import index_corpus  # noqa: E402
from semsearch.search import Retriever  # noqa: E402

from conftest import REPO, SAMPLE, FakeEncoder  # noqa: E402

KEY = "test-key-0123456789abcdefghij"
QUERIES = ["How long does a loan decision take?", "lentil soup with cumin", "sleep and recovery after exercise"]
WHERES = [{"lang": "en"}, ["year>=2005", "year<2020"], "path:*.jsonl"]


pytestmark = pytest.mark.xdist_group("test_mcp")  # one worker sets the module fixtures up (pytest -n)


@pytest.fixture(scope="module")
def index(tmp_path_factory, real_encoder):
    """The sample corpus plus records with year and language metadata, with the real model."""
    root = tmp_path_factory.mktemp("mcp")
    corpus = root / "corpus"
    shutil.copytree(SAMPLE, corpus)
    topics = ["loan approval takes one business day", "lentil soup simmers with cumin",
              "sleep helps muscles recover after exercise"]
    with open(corpus / "papers.jsonl", "w") as f:
        for i in range(30):
            f.write(json.dumps({"text": f"Paper {i}: {topics[i % 3]}.", "year": 2000 + i % 25,
                                "lang": "de" if i % 4 == 0 else "en"}) + "\n")
    folder = root / "index"
    index_corpus(corpus, folder, real_encoder, progress=False)
    return folder


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def stdio(*args: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "semsearch.cli", "mcp", *args], env=env(), cwd=str(REPO))


_RETRIEVERS: dict[Path, Retriever] = {}


def retriever(folder: Path) -> Retriever:
    if folder not in _RETRIEVERS:
        _RETRIEVERS[folder] = Retriever.load(folder, device="cpu")
    return _RETRIEVERS[folder]


def expected(folder: Path, query: str, k: int, where=None) -> list[tuple[str, float]]:
    return [(f"chunk:{h.id}", h.score) for h in retriever(folder).search(query, k, where=where)]


def got(result) -> list[tuple[str, float]]:
    assert not result.is_error, result.content[0].text
    return [(h["id"], h["score"]) for h in result.structured_content["hits"]]


def same(a, b) -> bool:
    return [i for i, _ in a] == [i for i, _ in b] and all(abs(x - y) <= 1e-5 for (_, x), (_, y) in zip(a, b))


def malformed_calls(long: int) -> list[tuple[str, object]]:
    """50 calls a model or a broken client might make (lone surrogates, which the SDK's client
    cannot send, are sent in process: test_lone_surrogates_are_tool_errors)."""
    bad: list[tuple[str, object]] = [
        ("search", {}), ("search", {"query": ""}), ("search", {"query": "   "}), ("search", {"query": 5}),
        ("search", {"query": None}), ("search", {"query": ["a", "b"]}), ("search", {"query": {"x": 1}}),
        ("search", {"query": "a", "k": 0}), ("search", {"query": "a", "k": -3}), ("search", {"query": "a", "k": 10**9}),
        ("search", {"query": "a", "k": 10**30}), ("search", {"query": "a", "k": "ten"}), ("search", {"query": "a", "k": 2.5}),
        ("search", {"query": "a", "k": True}), ("search", {"query": "a", "mode": "fuzzy"}), ("search", {"query": "a", "mode": 3}),
        ("search", {"query": "a", "where": 7}), ("search", {"query": "a", "where": {"year": {"~": 3}}}),
        ("search", {"query": "a", "where": {"year": {">=": 10**400}}}), ("search", {"query": "a", "where": {"year": {">=": "NaN"}}}),
        ("search", {"query": "a", "where": "year>=nan"}), ("search", {"query": "a", "where": ["year>>3"]}),
        ("search", {"query": "a", "where": {"$or": [{"a": 1}]}}),
        ("search", {"query": "a", "where": {f"f{i}": i for i in range(200)}}),
        ("search", {"query": "a", "where": {"tag": list(range(5000))}}),
        ("search", {"query": "a", "where": {"tag": "x" * 10_000}}),
        ("search", {"query": "a", "where": json.loads("[" * 100 + "]" * 100)}),
        ("search", {"query": "a", "where": ["lang=en"] * 100}), ("search", {"query": "a", "where": {"year": [[1]]}}),
        ("search", {"query": "x" * long}), ("search", {"query": "a", "unknown": 1}),
        ("fetch", {}), ("fetch", {"id": ""}), ("fetch", {"id": 12}), ("fetch", {"id": "999999999"}),
        ("fetch", {"id": "no-such-document"}), ("fetch", {"id": "\x00\x01"}), ("fetch", {"id": "1 OR 1=1"}),
        ("fetch", {"id": "x" * 5000}), ("fetch", {"id": "1", "whole_document": "yes please"}),
        ("info", {"extra": 1}), ("nope", {}), ("", {}), ("search ", {"query": "a"}),
        ("upsert_document", {"id": "a", "text": "b"}), ("delete_document", {"id": "a"}),
        ("search", {"query": "a", "k": [1]}), ("search", {"query": "a", "mode": None, "where": {"year": {}}}),
        ("search", {"query": "a", "where": {"": 1}}), ("search", {"query": "a", "where": ["path:"]}),
    ]
    assert len(bad) == 50
    return bad


async def check_malformed(c: Client, long: int) -> list[str]:
    """Each malformed call's outcome: an error result (or a protocol error the client raises)."""
    outcomes = []
    for name, args in malformed_calls(long):
        try:
            r = await c.call_tool(name, args)
        except Exception as e:  # noqa: BLE001 - a protocol-level error is an MCP error too
            outcomes.append(f"raised {type(e).__name__}")
            continue
        assert r.is_error, f"{name} {str(args)[:100]}: not an error: {r.content[0].text[:200]}"
        text = r.content[0].text
        assert text and "Traceback" not in text and "internal error" not in text, (name, str(args)[:100], text)
        outcomes.append(text)
    return outcomes


def test_stdio_server_answers_as_the_retriever_and_survives_50_malformed_calls(index):
    async def main():
        async with Client(stdio("--index", str(index)), read_timeout_seconds=300) as c:
            names = sorted(t.name for t in (await c.list_tools()).tools)
            assert names == ["fetch", "info", "search"]  # read-only: no write tools without --allow-writes
            schema = {t.name: t for t in (await c.list_tools()).tools}["search"].input_schema
            assert schema["properties"]["k"]["maximum"] == 1000 and "query" in schema["required"]
            for q in QUERIES:
                assert same(got(await c.call_tool("search", {"query": q, "k": 5})), expected(index, q, 5))
                for w in WHERES:
                    want = expected(index, q, 5, w)
                    assert want and same(got(await c.call_tool("search", {"query": q, "k": 5, "where": w})), want), (q, w)
            for mode in ("dense", "lexical"):
                hits = (await c.call_tool("search", {"query": QUERIES[0], "k": 3, "mode": mode})).structured_content["hits"]
                assert [(h["id"], round(h["score"], 5)) for h in hits] == [
                    (f"chunk:{h.id}", round(h.score, 5)) for h in retriever(index).search(QUERIES[0], 3, mode=mode)]
            hit = (await c.call_tool("search", {"query": "lentil soup", "k": 1, "where": "path:*.jsonl"})).structured_content["hits"][0]
            assert hit["file"].endswith("papers.jsonl") and hit["row"] >= 1 and hit["title"] and hit["location"]
            one = (await c.call_tool("fetch", {"id": hit["id"]})).structured_content
            assert one["kind"] == "chunk" and one["text"] == hit["text"] and one["metadata"] == hit["metadata"]
            whole = (await c.call_tool("fetch", {"id": hit["id"], "whole_document": True})).structured_content
            assert whole["kind"] == "document" and hit["text"] in whole["text"] and whole["chunks"] >= 1
            info = (await c.call_tool("info", {})).structured_content
            assert info["read_only"] is True and info["counts"]["chunks"] == len(retriever(index))
            outcomes = await check_malformed(c, 30_000)
            after = got(await c.call_tool("search", {"query": QUERIES[1], "k": 5}))
            return outcomes, after

    outcomes, after = asyncio.run(main())
    assert len(outcomes) == 50
    assert any("64 conditions" in o or "conditions" in o for o in outcomes) and any("less than or equal to 1000" in o for o in outcomes)
    assert any("no chunk or document" in o for o in outcomes) and any("Unknown tool" in o for o in outcomes)
    assert any("unknown argument(s) 'unknown'" in o for o in outcomes)
    assert same(after, expected(index, QUERIES[1], 5))  # the server still answers, and rightly


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, limit: float = 180) -> None:
    deadline = time.time() + limit
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited: {proc.stderr.read()[-3000:]}")
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.3)
    raise AssertionError("the server did not start")


def test_streamable_http_needs_the_key_and_answers_as_the_retriever(index):
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "semsearch.cli", "mcp", "--index", str(index), "--http", f"127.0.0.1:{port}"],
                            env={**env(), "SEMSEARCH_API_KEY": KEY}, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        _wait_http(url, proc)
        hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        bare = httpx.post(url, json=hello, headers={"accept": "application/json, text/event-stream"}, timeout=30)
        assert bare.status_code == 401 and "API key" in bare.json()["error"]["message"]
        assert bare.headers["www-authenticate"].startswith("Bearer")
        wrong = httpx.post(url, json=hello, headers={"authorization": "Bearer nope"}, timeout=30)
        assert wrong.status_code == 401
        rebound = httpx.post(url, json=hello, headers={"authorization": f"Bearer {KEY}", "host": "evil.example"}, timeout=30)
        assert rebound.status_code == 400  # DNS rebinding: a Host this server does not answer to

        async def main():
            async with Client(streamable_http_client(url)) as c:  # no key: the handshake itself is refused
                await c.list_tools()

        with pytest.raises(Exception):
            asyncio.run(main())

        async def keyed():
            transport = streamable_http_client(url, http_client=create_mcp_http_client(headers={"Authorization": f"Bearer {KEY}"}))
            async with Client(transport, read_timeout_seconds=300) as c:
                out = []
                for q in QUERIES:
                    out.append((got(await c.call_tool("search", {"query": q, "k": 5})),
                                got(await c.call_tool("search", {"query": q, "k": 5, "where": WHERES[0]}))))
                return out

        for q, (plain, filtered) in zip(QUERIES, asyncio.run(keyed())):
            assert same(plain, expected(index, q, 5)) and same(filtered, expected(index, q, 5, WHERES[0]))
    finally:
        proc.terminate()
        proc.wait(30)


def test_http_beyond_loopback_without_a_key_is_refused_before_loading(index):
    p = subprocess.run([sys.executable, "-m", "semsearch.cli", "mcp", "--index", str(index), "--http", "0.0.0.0:1"],
                       env={k: v for k, v in env().items() if k != "SEMSEARCH_API_KEY"}, cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode != 0 and "without an API key" in p.stderr
    p = subprocess.run([sys.executable, "-m", "semsearch.cli", "mcp", "--index", str(index), "--http", "localhost"],
                       env=env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "HOST:PORT" in p.stderr


def test_write_tools_only_with_allow_writes(tmp_path, small_corpus):
    from semsearch.mcp_server import create_server
    from semsearch.service import Operations, Service

    folder = tmp_path / "idx"
    index_corpus(small_corpus, folder, FakeEncoder(), progress=False)

    async def main():
        ro = Operations(Service(folder, device="cpu", encoder=FakeEncoder()), read_only=True)
        async with Client(create_server(ro, allow_writes=False)) as c:
            assert "upsert_document" not in {t.name for t in (await c.list_tools()).tools}
        rw = Operations(Service(folder, device="cpu", encoder=FakeEncoder()), read_only=False)
        async with Client(create_server(rw, allow_writes=True)) as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            assert tools["delete_document"].annotations.destructive_hint is True
            assert tools["search"].annotations.read_only_hint is True
            out = {name: t.output_schema for name, t in tools.items()}  # real output schemas, not open objects
            assert set(out["search"]["required"]) == {"query", "generation", "hits"}
            hit_schema = out["search"]["$defs"]["HitOut"]
            assert {"id", "rank", "title", "score", "location", "source_id", "chunk", "text", "metadata"} <= set(hit_schema["required"])
            assert {"page", "section", "line", "row", "file", "document"} <= set(hit_schema["properties"]) - set(hit_schema["required"])
            assert out["fetch"]["properties"]["kind"]["enum"] == ["chunk", "document"]
            assert {"index", "model", "counts", "generation", "modes", "limits"} <= set(out["info"]["required"])
            assert {"added", "updated", "deleted", "chunks", "generation"} <= set(out["delete_document"]["required"])
            answers = []
            long = " ".join(f"kelp{i} forest grows" for i in range(60))
            up = await c.call_tool("upsert_document", {"id": "note-1", "text": long, "metadata": {"lang": "en"}})
            assert not up.is_error and up.structured_content["added"] == 1
            hits = (await c.call_tool("search", {"query": "kelp3 forest", "k": 3, "where": {"lang": "en"}})).structured_content["hits"]
            assert hits and hits[0]["document"] == "note-1" and hits[0]["title"] == "note-1"
            doc = (await c.call_tool("fetch", {"id": "note-1"})).structured_content
            assert doc["kind"] == "document" and doc["text"] == long and doc["metadata"] == {"lang": "en"} and doc["chunks"] > 1
            deep = await c.call_tool("upsert_document", {"id": "deep", "text": "x", "metadata": json.loads('{"a":' * 40 + "1" + "}" * 40)})
            assert deep.is_error and "deep" in deep.content[0].text
            gone = await c.call_tool("delete_document", {"id": "note-1"})
            assert not gone.is_error and gone.structured_content["deleted"] == 1
            again = await c.call_tool("delete_document", {"id": "note-1"})
            assert again.is_error and "note-1" in again.content[0].text
            fetched = await c.call_tool("fetch", {"id": "note-1"})
            assert fetched.is_error
            answers += [("upsert_document", up), ("delete_document", gone), ("info", await c.call_tool("info", {}))]
            for kind in (False, True):
                found = await c.call_tool("search", {"query": "bank loan", "k": 2})
                answers += [("search", found), ("fetch", await c.call_tool(
                    "fetch", {"id": found.structured_content["hits"][0]["id"], "whole_document": kind}))]
            for name, answer in answers:  # each answer within its tool's schema, every field kept
                assert not answer.is_error, (name, answer.content[0].text[:200])
                jsonschema.validate(answer.structured_content, out[name])
                assert json.loads(answer.content[0].text) == answer.structured_content, name
            info = (await c.call_tool("info", {})).structured_content
            assert info["read_only"] is False and info["generation"] == 3

    asyncio.run(main())


def test_responses_stay_within_max_response_bytes(tmp_path, small_corpus):
    from semsearch.mcp_server import create_server
    from semsearch.service import Limits, Operations, Service

    folder = tmp_path / "idx"
    index_corpus(small_corpus, folder, FakeEncoder(), progress=False)
    # (one hit with its ids and location: ~0.5 KB; three hits, or the index's info: over 0.8 KB)
    ops = Operations(Service(folder, device="cpu", encoder=FakeEncoder()), Limits(max_response_bytes=800, max_k=5))

    async def main():
        async with Client(create_server(ops)) as c:
            small = await c.call_tool("search", {"query": "soup", "k": 1})
            big = await c.call_tool("search", {"query": "soup", "k": 3, "mode": "dense"})
            over = await c.call_tool("search", {"query": "soup", "k": 6})
            return small, big, over

    small, big, over = asyncio.run(main())
    assert not small.is_error
    assert big.is_error and "--max-response-bytes" in big.content[0].text
    assert over.is_error and "less than or equal to 5" in over.content[0].text


def test_watch_keeps_what_the_tools_see_in_step_with_the_folder(tmp_path):
    """`semsearch mcp --watch DIR` over stdio with no index yet: the catch-up makes it, and a file
    written while serving is found by the search tool."""
    corpus = tmp_path / "notes"
    corpus.mkdir()
    (corpus / "a.md").write_text("# Soup\nSimmer lentils with onion and cumin.\n")
    folder = tmp_path / "idx"

    async def main():
        async with Client(stdio("--index", str(folder), "--watch", str(corpus)), read_timeout_seconds=300) as c:
            first = (await c.call_tool("search", {"query": "lentils", "k": 5})).structured_content["hits"]
            (corpus / "b.txt").write_text("The comet's debris trail makes a meteor shower.\n")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                hits = (await c.call_tool("search", {"query": "meteor shower", "k": 1})).structured_content["hits"]
                if hits and hits[0]["file"].endswith("b.txt"):
                    return first, hits
                await asyncio.sleep(0.5)
            raise AssertionError("the new file was not searchable within 60 s")

    first, hits = asyncio.run(main())
    assert [h["file"].endswith("a.md") for h in first] == [True]
    assert "meteor" in hits[0]["text"]


def test_lone_surrogates_are_tool_errors(tmp_path, small_corpus):
    """Text UTF-8 cannot carry (a JSON "\\ud800" escape decodes to it) in any argument: a tool error
    naming the argument, never a failed response."""
    from semsearch.mcp_server import create_server
    from semsearch.service import Operations, Service

    folder = tmp_path / "idx"
    index_corpus(small_corpus, folder, FakeEncoder(), progress=False)
    ops = Operations(Service(folder, device="cpu", encoder=FakeEncoder()), read_only=False)

    async def main():
        async with Client(create_server(ops, allow_writes=True)) as c:
            out = [await c.call_tool(name, args) for name, args in [
                ("search", {"query": "lone \ud800 surrogate"}), ("search", {"query": "soup", "where": {"lang": "\udfff"}}),
                ("search", {"query": "soup", "where": ["lang=\ud800"]}), ("fetch", {"id": "\ud800"}),
                ("upsert_document", {"id": "a", "text": "b \ud800"}), ("upsert_document", {"id": "a\ud800", "text": "b"}),
                ("upsert_document", {"id": "a", "text": "b", "metadata": {"k": "\udc00"}})]]
            after = await c.call_tool("search", {"query": "soup", "k": 1})
            return out, after

    out, after = asyncio.run(main())
    for r in out:
        assert r.is_error and ("lone surrogate" in r.content[0].text or "Unicode" in r.content[0].text), r.content[0].text
    assert not after.is_error and after.structured_content["hits"]


def test_fuzzed_tool_calls_are_answers_or_tool_errors(tmp_path_factory):
    """Arbitrary JSON arguments (hypothesis) to every tool, writes allowed: each call is a result
    or a tool error naming the problem, never an internal error; the server answers afterwards."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from semsearch.mcp_server import create_server
    from semsearch.service import Operations, Service

    root = tmp_path_factory.mktemp("mcpfuzz")
    corpus = root / "c"
    corpus.mkdir()
    (corpus / "a.txt").write_text("The bank approved the loan.\nLentil soup with cumin.\n")
    index_corpus(corpus, root / "idx", FakeEncoder(), progress=False)
    server = create_server(Operations(Service(root / "idx", device="cpu", encoder=FakeEncoder())), allow_writes=True)
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30)
    values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                          max_leaves=12)
    names = ["query", "k", "mode", "where", "id", "whole_document", "text", "metadata"]
    args = st.dictionaries(st.sampled_from(names) | st.text(max_size=6), values, max_size=5)
    tools = st.sampled_from(["search", "fetch", "info", "upsert_document", "delete_document"])

    @settings(max_examples=int(150 * float(os.environ.get("SEMSEARCH_FUZZ_SCALE", "1"))), deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(tools, args)
    def one(tool, arguments):
        async def call():
            async with Client(server) as c:
                return await c.call_tool(tool, arguments)

        r = asyncio.run(call())
        if r.is_error:
            text = r.content[0].text
            assert text and "internal error" not in text and "Traceback" not in text, (tool, arguments, text)

    one()

    async def after():
        async with Client(server) as c:
            return await c.call_tool("search", {"query": "loan", "k": 1})

    assert not asyncio.run(after()).is_error
