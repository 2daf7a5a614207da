"""`semsearch serve` exposed: API keys, the loopback rule, Host headers, /docs, what error messages
show, the bounds of one request, a responsive /health during a big one, and text UTF-8 cannot
carry. Real uvicorn servers on loopback ports, a real index (SQLite, FAISS), the real model where
the answer depends on it and the small fake encoder elsewhere."""
from __future__ import annotations

import http.client
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from click.testing import CliRunner  # noqa: E402

import semsearch.serve as serve_mod  # noqa: E402
from semsearch.cli import main  # noqa: E402
from semsearch.errors import InputError, SettingsMismatch  # noqa: E402
from semsearch.indexing import index_corpus  # noqa: E402
from semsearch.serve import HostPolicy, Limits, Scrubber, Service, check_exposure, create_app, serve  # noqa: E402
from semsearch.store import Manifest  # noqa: E402
from semsearch.store.folder import IndexWriter  # noqa: E402

from conftest import SAMPLE, FakeEncoder  # noqa: E402
from conftest import running  # noqa: E402

KEY = "test-key-0123456789abcdefghijklmnop"
AUTH = {"Authorization": f"Bearer {KEY}"}
# (method, path, JSON body): every endpoint a key protects
PROTECTED = [("GET", "/info", None), ("GET", "/v1/models", None), ("GET", "/search?q=loan", None),
             ("POST", "/search", {"query": "loan approval", "k": 2}), ("POST", "/v1/embeddings", {"input": "loan"}),
             ("POST", "/embed", {"inputs": "loan"}), ("POST", "/documents", {"documents": [{"id": "k1", "text": "keyed note"}]}),
             ("DELETE", "/documents/k1", None)]


pytestmark = pytest.mark.xdist_group("test_serve_security")  # one worker sets the module fixtures up (pytest -n)


@pytest.fixture(scope="module")
def keyed_real_server(tmp_path_factory, real_encoder):
    folder = tmp_path_factory.mktemp("keyed") / "idx"
    index_corpus(SAMPLE, folder, real_encoder, progress=False)
    with running(create_app(Service(folder, device="cpu", encoder=real_encoder), api_key=KEY)) as url:
        yield url, folder


@pytest.fixture
def fake_index(small_corpus, tmp_path):
    folder = tmp_path / "idx"
    index_corpus(small_corpus, folder, FakeEncoder(), progress=False)
    return folder


def send(c: httpx.Client, method: str, path: str, body, headers=None) -> httpx.Response:
    return c.request(method, path, json=body, headers=headers) if body is not None else c.request(method, path, headers=headers)


# ---- API keys ---------------------------------------------------------------------------------
def test_every_endpoint_but_health_needs_the_key(keyed_real_server):
    url, folder = keyed_real_server
    g0 = Manifest.load(folder).generation
    with httpx.Client(base_url=url, timeout=60) as c:
        assert c.get("/health").status_code == 200  # probes need no key
        for method, path, body in PROTECTED:
            for headers, invalid in ((None, False), ({"Authorization": "Bearer wrong-key"}, True),
                                     ({"Authorization": f"Basic {KEY}"}, True), ({"Authorization": KEY}, True)):
                r = send(c, method, path, body, headers)
                assert r.status_code == 401, (method, path, headers, r.status_code)
                challenge = r.headers["www-authenticate"]
                assert challenge.startswith("Bearer") and ('error="invalid_token"' in challenge) == invalid
                err = r.json()["error"]
                assert err["code"] == 401 and "Authorization: Bearer" in err["message"]
        assert Manifest.load(folder).generation == g0  # nothing was written without the key
        for method, path, body in PROTECTED:  # the same requests with the key
            r = send(c, method, path, body, AUTH)
            assert r.status_code == 200, (method, path, r.text[:300])
        assert send(c, "POST", "/search", {"query": "how long does a personal loan decision take", "k": 1}, AUTH
                    ).json()["hits"][0]["location"].endswith("bank_faq.csv row 2")


def test_openai_client_sends_its_api_key_as_the_bearer_token(keyed_real_server, real_encoder):
    openai = pytest.importorskip("openai")
    import numpy as np

    url, _ = keyed_real_server
    ok = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    r = ok.embeddings.create(input=["a loan approval"], model="all-MiniLM-L6-v2")
    np.testing.assert_allclose(np.array(r.data[0].embedding), real_encoder.encode(["a loan approval"])[0], atol=1e-5)
    assert [m.id for m in ok.models.list().data] == ["all-MiniLM-L6-v2"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="not-the-key", max_retries=0).embeddings.create(input="loan", model="all-MiniLM-L6-v2")


def test_unusable_keys_are_refused(fake_index):
    svc = Service(fake_index, device="cpu", encoder=FakeEncoder())
    for bad in ("", "   ", "has space", "ключ-0123456789abcdef"):
        with pytest.raises(InputError, match="API key"):
            create_app(svc, api_key=bad)


# ---- listening beyond loopback ------------------------------------------------------------------
def test_beyond_loopback_needs_a_key_or_insecure(tmp_path):
    missing = tmp_path / "no-index-here"
    for host in ("0.0.0.0", "::", "192.168.1.20", "my-host.example.com"):
        with pytest.raises(InputError) as e:
            serve(missing, host=host)  # refused before the index is looked at
        msg = str(e.value)
        assert host in msg and all(opt in msg for opt in ("--api-key", "--api-key-file", "SEMSEARCH_API_KEY", "--insecure"))
        check_exposure(host, KEY)  # a key, or --insecure, lets it through
        check_exposure(host, None, insecure=True)
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        check_exposure(host, None)
    with pytest.raises(Exception, match="no index at"):  # past the check: then the missing index stops it
        serve(missing, host="0.0.0.0", insecure=True)


def test_cli_refuses_and_reads_keys(tmp_path, monkeypatch):
    monkeypatch.delenv("SEMSEARCH_API_KEY", raising=False)
    missing = str(tmp_path / "no-index-here")
    r = CliRunner().invoke(main, ["serve", "--index", missing, "--host", "0.0.0.0"])
    assert r.exit_code == 1 and "--api-key" in r.output and "--insecure" in r.output
    r = CliRunner().invoke(main, ["serve", "--index", missing, "--host", "0.0.0.0", "--insecure"])
    assert r.exit_code == 1 and "no index at" in r.output
    keyfile = tmp_path / "key"
    keyfile.write_text(KEY + "\n")
    r = CliRunner().invoke(main, ["serve", "--index", missing, "--host", "0.0.0.0", "--api-key-file", str(keyfile)])
    assert r.exit_code == 1 and "no index at" in r.output  # the key from the file satisfied the rule
    r = CliRunner().invoke(main, ["serve", "--index", missing, "--host", "0.0.0.0"], env={"SEMSEARCH_API_KEY": KEY})
    assert r.exit_code == 1 and "no index at" in r.output
    r = CliRunner().invoke(main, ["serve", "--index", missing, "--api-key", KEY, "--api-key-file", str(keyfile)])
    assert r.exit_code == 2 and "not both" in r.output
    (tmp_path / "empty").write_text("\n")
    r = CliRunner().invoke(main, ["serve", "--index", missing, "--api-key-file", str(tmp_path / "empty")])
    assert r.exit_code == 2 and "no key" in r.output


# ---- Host headers ---------------------------------------------------------------------------------
def test_host_header_parsing_and_policies():
    assert [HostPolicy.hostname(h) for h in ("localhost:8000", "[::1]:8000", "[::1]", "Example.COM.", "a:b", "[::1]x", "")] == \
        ["localhost", "::1", "::1", "example.com", None, None, None]
    loop = HostPolicy("127.0.0.1")
    assert all(loop.allows(h) for h in ("localhost", "localhost:1234", "127.0.0.1:8000", "[::1]:8000", "LOCALHOST"))
    assert not any(loop.allows(h) for h in ("evil.example.com", "localhost.evil.com", "10.0.0.5", "127.0.0.2", "", None))
    assert HostPolicy("127.0.0.2").allows("127.0.0.2:8000")
    named = HostPolicy("10.1.2.3", ["search.example.com", "*.corp.example"])
    assert all(named.allows(h) for h in ("search.example.com:443", "a.corp.example", "10.1.2.3:8000", "localhost:8000"))
    assert not any(named.allows(h) for h in ("evil.com", "10.9.9.9", "corp.example.evil.com", "xcorp.example"))
    everywhere = HostPolicy("0.0.0.0")
    assert all(everywhere.allows(h) for h in ("10.9.9.9:80", "[fe80::1]:8000", "127.0.0.1"))
    assert not everywhere.allows("rebound.attacker.example")
    assert HostPolicy("0.0.0.0", ["*"]).allows("anything.example")


def test_foreign_host_headers_get_400(fake_index):
    svc = Service(fake_index, device="cpu", encoder=FakeEncoder())
    with running(create_app(svc)) as url, httpx.Client(base_url=url, timeout=30) as c:
        for host in ("localhost:9", "127.0.0.1", "[::1]:8000"):
            assert c.get("/health", headers={"Host": host}).status_code == 200, host
        for host in ("evil.example.com", "localhost.evil.example.com:80", "10.0.0.5"):
            for method, path, body in [("GET", "/health", None), *PROTECTED[:4]]:
                r = send(c, method, path, body, {"Host": host})
                assert r.status_code == 400 and "Host header" in r.json()["error"]["message"], (host, path)
    # a server meant for a LAN name (tested on loopback): that name, the bound address and loopback
    with running(create_app(svc, host="10.1.2.3", allowed_hosts=["search.example.com"], api_key=KEY)) as url:
        with httpx.Client(base_url=url, timeout=30) as c:
            for host in ("search.example.com", "10.1.2.3:8000", "localhost"):
                assert c.get("/info", headers={"Host": host, **AUTH}).status_code == 200, host
            r = c.get("/info", headers={"Host": "rebound.attacker.example", **AUTH})
            assert r.status_code == 400 and "--allowed-host" in r.json()["error"]["message"]


def test_request_without_host_header_is_refused(fake_index):
    with running(create_app(Service(fake_index, device="cpu", encoder=FakeEncoder()))) as url:
        port = int(url.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.putrequest("GET", "/health", skip_host=True)  # HTTP/1.1 without Host: h11 refuses it
        conn.endheaders()
        assert conn.getresponse().status == 400
        conn.close()


# ---- /docs --------------------------------------------------------------------------------------
def test_docs_only_when_asked(fake_index):
    svc = Service(fake_index, device="cpu", encoder=FakeEncoder())
    with running(create_app(svc)) as url:
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert httpx.get(url + path).status_code == 404, path
    with running(create_app(svc, docs=True, api_key=KEY)) as url:
        assert httpx.get(url + "/docs").status_code == 200 and httpx.get(url + "/redoc").status_code == 200
        schema = httpx.get(url + "/openapi.json").json()  # readable without the key, naming the scheme
        assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
        assert schema["paths"]["/search"]["post"]["security"] == [{"bearer": []}] and "security" not in schema["paths"]["/health"]["get"]
        assert httpx.get(url + "/info").status_code == 401


# ---- what error messages show --------------------------------------------------------------------------
class Failing(Service):
    """A Service whose operations fail as a broken disk or a changed model would, with the absolute
    index path in the exception text."""

    def search(self, queries, k, mode, where):
        if queries[0] == "crash":
            raise RuntimeError(f"cannot read {self.folder.resolve()}/docs.1.sqlite")
        return super().search(queries, k, mode, where)

    def upsert(self, docs, max_chunks=None):
        raise SettingsMismatch(f"{self.folder} was built with pooling 'mean'; documents must be encoded with it, not 'cls'")


def test_error_messages_never_show_absolute_paths(fake_index, tmp_path):
    svc = Failing(fake_index, device="cpu", encoder=FakeEncoder())
    secret = str(tmp_path)
    with running(create_app(svc)) as url, httpx.Client(base_url=url, timeout=30) as c:
        seen = []

        def check(r: httpx.Response, status: int) -> str:
            assert r.status_code == status, (r.status_code, r.text[:300])
            msg = r.json()["error"]["message"]
            assert secret not in r.text and "/tmp" not in r.text, msg
            seen.append(msg)
            return msg

        assert "ghost" in check(c.delete("/documents/ghost"), 404)  # DocumentNotFound names the index: "idx"
        assert "idx" in seen[-1]
        assert "pooling" in check(c.post("/documents", json={"documents": [{"id": "a", "text": "soup"}]}), 409)  # SettingsMismatch
        crash = c.post("/search", json={"query": "crash"})
        assert check(crash, 500).startswith("internal error (RuntimeError)")
        assert crash.headers.get("connection", "").lower() != "close"
        assert c.post("/search", json={"query": "soup"}).status_code == 200  # the connection and server go on
        w = IndexWriter(fake_index, 64, Manifest.load(fake_index))
        try:  # IndexLocked, through the real writer lock
            svc2 = Service(fake_index, device="cpu", encoder=FakeEncoder())
            with running(create_app(svc2)) as url2:
                assert "another semsearch process" in check(httpx.post(url2 + "/documents", json={"documents": [{"id": "a", "text": "soup"}]}), 409)
        finally:
            w.abort()
        assert check(c.post("/search", json={"query": "soup", "where": "year>>2"}), 422)  # InputError from the filter parser
        (fake_index / "manifest.json").write_text("{ damaged")  # IndexFormatError on the next request
        msg = check(c.post("/search", json={"query": "soup"}), 503)
        assert "damaged manifest" in msg and "idx" in msg
        (fake_index / "manifest.json").unlink()
        assert "the index is gone" in check(c.get("/health"), 503)


def test_scrubber_shows_paths_under_the_working_folder_relative(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    inside = tmp_path / "indexes" / "main"
    scrub = Scrubber(inside)
    assert scrub(f"{inside} is damaged") == "indexes/main is damaged"
    assert scrub(f"no document with id 'x' in {inside}") == "no document with id 'x' in indexes/main"
    assert scrub(f"cannot open {tmp_path}/other/file.sqlite") == "cannot open other/file.sqlite"
    assert scrub("DELETE /documents/{id} needs an id; see http://host/docs") == "DELETE /documents/{id} needs an id; see http://host/docs"
    assert Scrubber(None)("model folder '/usr/lib/models/minilm' is missing") == "model folder 'minilm' is missing"


# ---- bounds of one request ----------------------------------------------------------------------
def test_queries_times_k_and_response_bytes_are_bounded(fake_index):
    svc = Service(fake_index, device="cpu", encoder=FakeEncoder())
    with running(create_app(svc, Limits(max_k=50, max_results=100))) as url, httpx.Client(base_url=url, timeout=30) as c:
        r = c.post("/search", json={"queries": ["soup"] * 3, "k": 50})
        assert r.status_code == 422 and "3 queries x k=50 = 150" in r.json()["error"]["message"]
        assert "--max-results" in r.json()["error"]["message"] and r.json()["error"]["type"] == "LimitExceeded"
        assert c.post("/search", json={"queries": ["soup"] * 2, "k": 50}).status_code == 200  # 100: at the limit
    with running(create_app(svc, Limits(max_response_bytes=1500))) as url, httpx.Client(base_url=url, timeout=30) as c:
        r = c.post("/search", json={"query": "soup lentils loan meteor", "k": 10})
        assert r.status_code == 422 and "--max-response-bytes" in r.json()["error"]["message"]
        r = c.post("/v1/embeddings", json={"input": ["soup"] * 10})
        assert r.status_code == 422 and "bytes" in r.json()["error"]["message"]
        assert c.post("/search", json={"query": "soup", "k": 1}).status_code == 200


@pytest.fixture
def gated_render(monkeypatch):
    """Holds the rendering of search responses of several queries until released: a big response
    being built, for as long as the test needs."""
    entered, release = threading.Event(), threading.Event()
    real = serve_mod._render

    def render(payload):
        if isinstance(payload, dict) and "results" in payload:
            entered.set()
            release.wait(60)
        return real(payload)

    monkeypatch.setattr(serve_mod, "_render", render)
    yield entered, release
    release.set()


def test_health_answers_while_a_big_response_is_built(fake_index, gated_render):
    entered, release = gated_render
    enc = FakeEncoder()
    from semsearch.documents import Document, upsert_documents

    upsert_documents(fake_index, [Document(f"n{i}", f"note {i} about soup lentils and meteor {i % 7}", {"n": i}) for i in range(400)], enc)
    svc = Service(fake_index, device="cpu", encoder=enc)
    with running(create_app(svc)) as url, ThreadPoolExecutor(1) as pool:
        big = pool.submit(httpx.post, url + "/search", json={"queries": [f"soup {i}" for i in range(40)], "k": 250}, timeout=120)
        assert entered.wait(60), "the big search never reached rendering"
        health = httpx.get(url + "/health", timeout=120)  # a rendering on the event loop would hold this until release
        assert health.status_code == 200 and not big.done()  # /health finished while the big response was being built
        release.set()
        r = big.result(120)
        assert r.status_code == 200 and sum(len(x["hits"]) for x in r.json()["results"]) == 40 * 250


def test_requests_in_flight_per_client_are_bounded(fake_index, gated_render):
    entered, release = gated_render
    svc = Service(fake_index, device="cpu", encoder=FakeEncoder())
    with running(create_app(svc, Limits(max_inflight_per_client=1))) as url, ThreadPoolExecutor(1) as pool:
        held = pool.submit(httpx.post, url + "/search", json={"queries": ["soup", "loan"], "k": 2}, timeout=120)
        assert entered.wait(60)
        r = httpx.post(url + "/search", json={"query": "soup"}, timeout=60)
        assert r.status_code == 429 and r.headers["retry-after"] == "1" and "--max-inflight-per-client" in r.json()["error"]["message"]
        assert httpx.get(url + "/health", timeout=60).status_code == 200  # not counted
        release.set()
        assert held.result(120).status_code == 200
        assert httpx.post(url + "/search", json={"query": "soup"}, timeout=60).status_code == 200


# ---- text UTF-8 cannot carry ------------------------------------------------------------------------------
LONE = "\ud800"
SURROGATE_BODIES = [  # (path, body, the field the message must name)
    ("/search", {"query": "soup" + LONE}, "query"),
    ("/search", {"queries": ["soup", LONE + "x"]}, "queries.1"),
    ("/search", {"query": "soup", "where": {"lang": LONE}}, "where.lang"),
    ("/search", {"query": "soup", "where": {LONE: "en"}}, "where (a key)"),
    ("/v1/embeddings", {"input": [LONE]}, "input.0"),
    ("/v1/embeddings", {"input": "soup", "model": "m" + LONE}, "model"),
    ("/embed", {"inputs": "a\udfffb"}, "inputs"),
    ("/documents", {"documents": [{"id": "a", "text": "soup " + LONE}]}, "documents.0.text"),
    ("/documents", {"documents": [{"id": LONE, "text": "soup"}]}, "documents.0.id"),
    ("/documents", {"documents": [{"id": "a", "text": "soup", "metadata": {"tag": ["x", LONE]}}]}, "documents.0.metadata.tag.1"),
    ("/documents", {"documents": [{"id": "a", "text": "soup", "metadata": {LONE: 1}}]}, "documents.0.metadata (a key)"),
    ("/documents", {"docs" + LONE: []}, "body (a key)"),
]


def test_lone_surrogates_are_a_422_on_one_keep_alive_connection(fake_index):
    g0 = Manifest.load(fake_index).generation
    with running(create_app(Service(fake_index, device="cpu", encoder=FakeEncoder()))) as url:
        port = int(url.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.auto_open = 0  # a dropped connection fails the next request instead of quietly reconnecting
        conn.connect()
        local = conn.sock.getsockname()

        def call(method: str, path: str, body: str | None = None) -> tuple[int, dict, http.client.HTTPResponse]:
            conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body is not None else {})
            resp = conn.getresponse()
            data = json.loads(resp.read())
            assert resp.getheader("connection", "").lower() != "close"
            return resp.status, data, resp

        for path, body, field in SURROGATE_BODIES:
            raw = json.dumps(body)  # ASCII JSON with \ud800 escapes: valid JSON
            assert "\\ud" in raw
            status, data, _ = call("POST", path, raw)
            assert status == 422, (path, body, data)
            msg = data["error"]["message"]
            assert msg.startswith(field + ":") and "lone surrogate" in msg and "\\ud" in msg, (field, msg)
        status, data, _ = call("DELETE", "/documents/%ED%A0%80")  # the UTF-8 bytes of a surrogate, percent-encoded
        assert status == 404
        status, data, _ = call("GET", "/search?q=soup%ED%A0%80")
        assert status == 200
        status, data, _ = call("POST", "/search", json.dumps({"query": "lentils with cumin", "k": 1}))
        assert status == 200 and data["hits"][0]["path"].endswith("cook.md")
        assert conn.sock is not None and conn.sock.getsockname() == local  # every request on the one connection
        conn.close()
    assert Manifest.load(fake_index).generation == g0
