"""No single request body stalls `semsearch serve`: bodies are parsed and validated on a worker
thread, never on the event loop, with their counts refused before any per-item work, and a body
sent as anything but JSON is a 415 naming the header (real uvicorn on loopback, FakeEncoder)."""
from __future__ import annotations

import json
import threading

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from semsearch.indexing import index_corpus  # noqa: E402
from semsearch.serve import create_app  # noqa: E402
from semsearch.service import Service  # noqa: E402
from semsearch.store import Manifest  # noqa: E402

from conftest import FakeEncoder, running  # noqa: E402


@pytest.fixture
def server(small_corpus, tmp_path):
    folder = tmp_path / "idx"
    index_corpus(small_corpus, folder, FakeEncoder(), progress=False)
    with running(create_app(Service(folder, device="cpu", encoder=FakeEncoder()))) as url:
        yield url, folder


def test_counts_are_refused_before_any_item_is_validated(server):
    """A million empty documents: refused for their count (the old server validated each of them
    first: a million 'field required' errors, 18 s on the event loop)."""
    url, folder = server
    g = Manifest.load(folder).generation
    with httpx.Client(base_url=url, timeout=120, headers={"content-type": "application/json"}) as c:
        r = c.post("/documents", content=b'{"documents": [' + b",".join([b"{}"] * 1_000_000) + b"]}")
        assert r.status_code == 422 and "1,000,000 documents in one request; the most is 1,000" in r.json()["error"]["message"]
        r = c.post("/search", content=json.dumps({"query": "loan", "where": list(range(200_000))}))
        assert r.status_code == 422 and "200,000 fields or conditions" in r.json()["error"]["message"], r.text
        r = c.post("/search", content=json.dumps({"queries": ["loan"] * 5000}))
        assert r.status_code == 422 and "5,000 queries in one request" in r.json()["error"]["message"], r.text
        for path, field in (("/v1/embeddings", "input"), ("/embed", "inputs")):
            r = c.post(path, content=json.dumps({field: ["a"] * 300_000}))
            assert r.status_code == 422 and "300,000 inputs in one request" in r.json()["error"]["message"], (path, r.text)
        extra = {"query": "loan", **{f"x{i}": 1 for i in range(100_000)}}
        r = c.post("/search", content=json.dumps(extra))
        assert r.status_code == 422 and "unknown field(s) 'x0', 'x1'" in r.json()["error"]["message"] \
            and "and 99,995 more" in r.json()["error"]["message"], r.text
        assert c.post("/search", content=json.dumps({"query": "loan approval"})).status_code == 200
    assert Manifest.load(folder).generation == g


def test_health_answers_while_a_large_body_is_validated(server):
    """A thousand documents with large metadata (7 MB, 1.7M JSON values), the last one invalid:
    /health answers while the body is read (by a worker process: over --max-body-values). On
    the event loop (before), no /health completed from the end of the upload to the 422."""
    url, folder = server
    meta = {f"k{i}": [i, {"v": "x"}] for i in range(280)}
    docs = [{"id": f"d{i}", "text": "some text", "metadata": meta} for i in range(999)] + [{"id": "last"}]
    body = json.dumps({"documents": docs}).encode()
    assert len(body) < 8 * 2**20
    done = threading.Event()
    status: list[int] = []

    def big():
        with httpx.Client(base_url=url, timeout=120) as c:
            status.append(c.post("/documents", content=body, headers={"content-type": "application/json"}).status_code)
        done.set()

    answered_during = 0
    with httpx.Client(base_url=url, timeout=120) as c:
        assert c.get("/health").status_code == 200  # the connection is open before the body is sent
        t = threading.Thread(target=big)
        t.start()
        while not done.is_set():
            r = c.get("/health")
            assert r.status_code == 200
            answered_during += not done.is_set()
        t.join()
    assert status == [422]  # refused for its values, before validation
    assert answered_during >= 3, answered_during
    assert Manifest.load(folder).counts["files"] == 3


@pytest.mark.parametrize("ctype", [None, "application/x-www-form-urlencoded", "text/plain"])
def test_a_body_not_sent_as_json_is_a_415_naming_the_header(server, ctype):
    url, _ = server
    headers = {"content-type": ctype} if ctype else {}
    with httpx.Client(base_url=url, timeout=60) as c:
        for path in ("/search", "/documents", "/embed", "/v1/embeddings"):
            r = c.post(path, content=b'{"query": "loan"}', headers=headers)
            assert r.status_code == 415, (path, r.text)
            assert "Content-Type: application/json" in r.json()["error"]["message"]
        ok = c.post("/search", content=b'{"query": "loan"}', headers={"content-type": "application/json; charset=utf-8"})
        assert ok.status_code == 200


def test_the_schema_still_describes_the_bodies(small_corpus, tmp_path):
    folder = tmp_path / "idx"
    index_corpus(small_corpus, folder, FakeEncoder(), progress=False)
    app = create_app(Service(folder, device="cpu", encoder=FakeEncoder()), docs=True)
    schema = app.openapi()
    body = schema["paths"]["/documents"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/UpsertRequest"}
    comps = schema["components"]["schemas"]
    assert "documents" in comps["UpsertRequest"]["properties"] and "DocumentIn" in comps
    assert set(comps["SearchRequest"]["properties"]) >= {"query", "queries", "k", "mode", "where", "explain"}


def test_the_schema_bounds_what_the_server_refuses(small_corpus, tmp_path):
    """The served schema carries this server's limits (k <= --max-k, at most --max-texts queries
    and inputs of at most --max-text-chars, exactly one of query/queries, 1..--max-documents
    documents with ids the store takes): for each body, the schema validates it exactly when the
    server answers it with 200 (blank-but-non-empty texts, refused by the server only, are the
    documented exception and not sent)."""
    from jsonschema import Draft202012Validator

    from semsearch.service import Limits

    folder = tmp_path / "idx"
    index_corpus(small_corpus, folder, FakeEncoder(), progress=False)
    limits = Limits(max_k=5, max_texts=3, max_text_chars=50, max_documents=2)
    app = create_app(Service(folder, device="cpu", encoder=FakeEncoder()), limits, docs=True)
    doc = {"id": "a", "text": "a note about loans"}
    bodies = {
        "/search": [{"query": "loan"}, {"query": "loan", "k": 5}, {"query": "loan", "k": 6}, {"query": "loan", "k": 0},
                    {"query": "loan", "queries": ["soup"]}, {}, {"query": ""}, {"queries": []}, {"queries": ["a", "b", "c"]},
                    {"queries": ["a"] * 4}, {"query": "x" * 50}, {"query": "x" * 51}, {"queries": ["soup", "x" * 51]},
                    {"query": "loan", "mode": "dense"}, {"query": "loan", "mode": "fast"}, {"query": "loan", "k": "5"}],
        "/embed": [{"inputs": "soup"}, {"inputs": ["soup"] * 3}, {"inputs": ["soup"] * 4}, {"inputs": []}, {"inputs": ""},
                   {"inputs": "x" * 51}],
        "/v1/embeddings": [{"input": "soup"}, {"input": ["soup", "loan"]}, {"input": ["soup"] * 4}, {"input": []},
                           {"input": ["x" * 51]}],
        "/documents": [{"documents": [doc]}, {"documents": [doc, {**doc, "id": "b"}]},
                       {"documents": [doc, {**doc, "id": "b"}, {**doc, "id": "c"}]}, {"documents": []},
                       {"documents": [{**doc, "id": ""}]}, {"documents": [{**doc, "id": "a\x01"}]},
                       {"documents": [{**doc, "id": "i" * 256}]}, {"documents": [{**doc, "id": "i" * 257}]},
                       {"documents": [{**doc, "text": ""}]}],
    }
    with running(app) as url, httpx.Client(base_url=url, timeout=60) as c:
        schema = c.get("/openapi.json").json()
        outcomes = []
        for path, cases in bodies.items():
            ref = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
            validator = Draft202012Validator({"components": schema["components"], **ref})
            for body in cases:
                status = c.post(path, json=body).status_code
                outcomes.append((path, body, status, validator.is_valid(body)))
        params = {p["name"]: p["schema"] for p in schema["paths"]["/search"]["get"]["parameters"]}
        for k in (1, 5, 6):
            status = c.get("/search", params={"q": "loan", "k": k}).status_code
            outcomes.append(("GET /search", {"k": k}, status, Draft202012Validator(params["k"]).is_valid(k)))
    wrong = [(path, str(body)[:80], status, valid) for path, body, status, valid in outcomes if (status == 200) != valid]
    assert not wrong, wrong
    assert sum(status == 200 for *_, status, _ in outcomes) >= 10 and sum(status != 200 for *_, status, _ in outcomes) >= 15
    assert schema["components"]["schemas"]["SearchRequest"]["properties"]["k"]["maximum"] == 5
