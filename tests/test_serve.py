"""`semsearch serve`: a real uvicorn server on a loopback port, the real model end to end, the
fake encoder for the error paths and concurrent writes; API documents in the index folder."""
from __future__ import annotations

import base64
import inspect
import threading
import time

import numpy as np
import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from click.testing import CliRunner  # noqa: E402

from semsearch.cli import main  # noqa: E402
from semsearch.documents import Document, delete_documents, upsert_documents  # noqa: E402
from semsearch.errors import DocumentNotFound, InputError  # noqa: E402
from semsearch.indexing import index_corpus  # noqa: E402
from semsearch.search import Retriever  # noqa: E402
from semsearch.serve import Limits, Service, create_app  # noqa: E402
from semsearch.store import Manifest, open_index  # noqa: E402
from semsearch.store.folder import IndexWriter  # noqa: E402

from conftest import SAMPLE, FakeEncoder, running  # noqa: E402

HAS_MODE = "mode" in inspect.signature(Retriever.search_batch).parameters
HAS_WHERE = "where" in inspect.signature(Retriever.search_batch).parameters


pytestmark = pytest.mark.xdist_group("test_serve")  # one worker sets the module fixtures up (pytest -n)


@pytest.fixture(scope="module")
def real_server(tmp_path_factory, real_encoder):
    folder = tmp_path_factory.mktemp("serve") / "idx"
    index_corpus(SAMPLE, folder, real_encoder, progress=False)
    with running(create_app(Service(folder, device="cpu", encoder=real_encoder))) as url:
        yield url, folder


@pytest.fixture
def fake_index(small_corpus, tmp_path):
    folder = tmp_path / "idx"
    index_corpus(small_corpus, folder, FakeEncoder(), progress=False)
    return folder


@pytest.fixture
def fake_server(fake_index):
    with running(create_app(Service(fake_index, device="cpu", encoder=FakeEncoder()), Limits(max_k=50, max_request_bytes=64_000))) as url:
        yield url, fake_index


def test_end_to_end_with_the_real_model(real_server, real_encoder):
    url, folder = real_server
    with httpx.Client(base_url=url, timeout=60) as c:
        assert c.get("/health").json()["status"] == "ok"
        info = c.get("/info").json()
        m = Manifest.load(folder)
        assert (info["model"], info["pooling"], info["dim"], info["index_type"]) == (m.model, "mean", 384, "flat")
        assert info["counts"] == m.counts

        r = c.post("/search", json={"query": "how long does a personal loan decision take", "k": 3}).json()
        assert len(r["hits"]) == 3 and r["hits"][0]["location"].endswith("bank_faq.csv row 2")
        assert r["hits"][0]["metadata"]["category"] == "lending"
        scores = [h["score"] for h in r["hits"]]
        assert scores == sorted(scores, reverse=True) and -1 <= scores[-1] <= scores[0] <= 1
        local = Retriever.load(folder, encoder=real_encoder).search("how long does a personal loan decision take", k=3)
        assert [h["id"] for h in r["hits"]] == [h.id for h in local]
        assert c.get("/search", params={"q": "how long does a personal loan decision take", "k": 3}).json()["hits"] == r["hits"]
        batch = c.post("/search", json={"queries": ["sourdough starter", "meteor shower"], "k": 1}).json()["results"]
        assert [b["hits"][0]["source"].rsplit("/", 1)[-1] for b in batch] == ["sourdough_starter.md", "meteor_showers.txt"]

        texts = ["a loan approval", "lentil soup recipe"]
        ref = real_encoder.encode(texts)
        oa = c.post("/v1/embeddings", json={"input": texts, "model": "all-MiniLM-L6-v2"}).json()
        assert oa["object"] == "list" and [d["index"] for d in oa["data"]] == [0, 1] and oa["usage"]["prompt_tokens"] > 4
        np.testing.assert_allclose(np.array([d["embedding"] for d in oa["data"]]), ref, atol=1e-5)
        b64 = c.post("/v1/embeddings", json={"input": texts[0], "encoding_format": "base64"}).json()["data"][0]["embedding"]
        np.testing.assert_allclose(np.frombuffer(base64.b64decode(b64), "<f4"), ref[0], atol=1e-5)
        np.testing.assert_allclose(np.array(c.post("/embed", json={"inputs": texts}).json()), ref, atol=1e-5)
        long = c.post("/embed", json={"inputs": "word " * 600, "truncate": True})
        assert long.status_code == 200 and len(long.json()[0]) == 384

        g0 = c.get("/health").json()["generation"]
        up = c.post("/documents", json={"documents": [{"id": "note-1", "text": "The office aquarium holds three axolotls.", "metadata": {"team": "facilities"}}]})
        assert up.status_code == 200 and up.json()["added"] == 1 and up.json()["generation"] == g0 + 1
        hit = c.post("/search", json={"query": "axolotl aquarium", "k": 1}).json()
        assert hit["generation"] == g0 + 1
        assert hit["hits"][0]["path"] == "api:note-1" and hit["hits"][0]["metadata"] == {"team": "facilities"}
        assert c.delete("/documents/note-1").json()["deleted"] == 1
        after = c.post("/search", json={"query": "axolotl aquarium", "k": 5}).json()
        assert all(h["path"] != "api:note-1" for h in after["hits"])
        assert c.get("/info").json()["counts"] == Manifest.load(folder).counts


BAD = [  # (method, path, body): malformed JSON, huge k, empty queries, unknown fields, wrong types
    ("POST", "/search", "{not json"),
    ("POST", "/search", {"query": "soup", "k": 10**9}),
    ("POST", "/search", {"query": "soup", "k": 0}),
    ("POST", "/search", {"query": "   "}),
    ("POST", "/search", {"queries": []}),
    ("POST", "/search", {"queries": ["soup", ""]}),
    ("POST", "/search", {"query": "soup", "queries": ["soup"]}),
    ("POST", "/search", {}),
    ("POST", "/search", {"query": "soup", "colour": "red"}),
    ("POST", "/search", {"query": "soup", "k": "5"}),
    ("POST", "/search", {"query": "soup", "mode": "psychic"}),
    ("POST", "/search", {"queries": ["soup"] * 300}),
    ("POST", "/search", [1, 2]),
    ("GET", "/search?q=soup&k=1000000", None),
    ("GET", "/search?q=", None),
    ("GET", "/search?k=3", None),
    ("GET", "/search?q=soup&colour=red", None),
    ("POST", "/v1/embeddings", "{not json"),
    ("POST", "/v1/embeddings", {"input": ""}),
    ("POST", "/v1/embeddings", {"input": []}),
    ("POST", "/v1/embeddings", {"input": "soup", "colour": "red"}),
    ("POST", "/v1/embeddings", {"input": [1, 2, 3]}),
    ("POST", "/v1/embeddings", {"input": "soup", "model": "text-embedding-3-large"}),
    ("POST", "/v1/embeddings", {"input": "soup", "encoding_format": "hex"}),
    ("POST", "/v1/embeddings", {"input": "soup", "dimensions": 10**6}),
    ("POST", "/v1/embeddings", {"input": ["soup"] * 10_000}),
    ("POST", "/embed", "{not json"),
    ("POST", "/embed", {"inputs": ""}),
    ("POST", "/embed", {"inputs": "soup", "colour": "red"}),
    ("POST", "/embed", {"inputs": "soup", "normalize": False}),
    ("POST", "/embed", {"inputs": "word " * 100}),  # over the fake model's 40 tokens, truncate=false
    ("POST", "/documents", "{not json"),
    ("POST", "/documents", {"documents": []}),
    ("POST", "/documents", {"documents": [{"id": "", "text": "soup"}]}),
    ("POST", "/documents", {"documents": [{"id": "a", "text": "  "}]}),
    ("POST", "/documents", {"documents": [{"id": "a", "text": "soup", "colour": "red"}]}),
    ("POST", "/documents", {"documents": [{"id": "a", "text": "soup"}, {"id": "a", "text": "stew"}]}),
    ("POST", "/documents", {"documents": [{"id": "a", "text": "soup", "metadata": [1]}]}),
    ("POST", "/documents", {"documents": [{"id": "a\x00b", "text": "soup"}]}),
    ("POST", "/documents", {"docs": []}),
    ("POST", "/documents", {"documents": [{"id": f"d{i}", "text": "soup"} for i in range(2000)]}),  # over 64 kB
    ("DELETE", "/documents/never-added", None),
    ("GET", "/no/such/endpoint", None),
    ("PUT", "/search", {"query": "soup"}),
]


def test_every_bad_request_gets_a_4xx_with_a_message(fake_server):
    url, folder = fake_server
    before = Manifest.load(folder)
    with httpx.Client(base_url=url, timeout=30) as c:
        for method, path, body in BAD:
            kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, str) else (
                {"json": body} if body is not None else {})
            r = c.request(method, path, **kw)
            assert 400 <= r.status_code < 500, (method, path, body, r.status_code, r.text[:300])
            err = r.json()["error"]
            assert isinstance(err["message"], str) and len(err["message"]) > 5 and "Traceback" not in r.text, (path, body, err)
            assert err["code"] == r.status_code
        # the same bodies, sent chunked (no Content-Length), are still bounded
        r = c.post("/documents", content=iter([b'{"documents": [', b'{"id": "x", "text": "' + b"a" * 70_000 + b'"}]}']),
                   headers={"content-type": "application/json"})
        assert r.status_code == 413 and "bytes" in r.json()["error"]["message"]
        assert c.get("/health").json()["status"] == "ok"  # still serving
    assert Manifest.load(folder).generation == before.generation  # and nothing was written


def test_messages_name_the_problem(fake_server):
    url, _ = fake_server
    with httpx.Client(base_url=url, timeout=30) as c:
        assert "malformed JSON" in c.post("/search", content="{x", headers={"content-type": "application/json"}).json()["error"]["message"]
        assert "less than or equal to 50" in c.post("/search", json={"query": "a", "k": 51}).json()["error"]["message"]
        assert "colour" in c.post("/embed", json={"inputs": "a", "colour": 1}).json()["error"]["message"]
        assert "empty" in c.post("/search", json={"query": " "}).json()["error"]["message"]
        r = c.delete("/documents/ghost")
        assert r.status_code == 404 and "ghost" in r.json()["error"]["message"]


def test_searches_go_on_during_writes_and_never_see_half_a_write(fake_server):
    """Searching threads run while a writer upserts a revised document and new ones: each
    response is one generation (the revised document's text agrees with its metadata, generations
    never go back) and every write becomes visible."""
    url, folder = fake_server
    stop = threading.Event()
    failures: list[str] = []
    seen_generations: set[int] = set()

    def searcher():
        last = 0
        with httpx.Client(base_url=url, timeout=30) as c:
            while not stop.is_set():
                r = c.post("/search", json={"query": "revision marker zebra", "k": 10})
                if r.status_code != 200:
                    failures.append(f"{r.status_code} {r.text[:200]}")
                    continue
                body = r.json()
                g = body["generation"]
                if g < last:
                    failures.append(f"generation went back from {last} to {g}")
                last = g
                seen_generations.add(g)
                for h in body["hits"]:
                    if h["path"] == "api:rev":
                        if f"revision {h['metadata']['revision']} " not in h["text"] + " ":
                            failures.append(f"text and metadata of api:rev disagree: {h['text']!r} {h['metadata']}")
                ids = [h["id"] for h in body["hits"]]
                if len(ids) != len(set(ids)):
                    failures.append("a chunk came back twice")

    threads = [threading.Thread(target=searcher) for _ in range(4)]
    for t in threads:
        t.start()
    gens = []
    with httpx.Client(base_url=url, timeout=30) as c:
        for i in range(12):
            r = c.post("/documents", json={"documents": [
                {"id": "rev", "text": f"revision marker zebra revision {i}", "metadata": {"revision": i}},
                {"id": f"new-{i}", "text": f"zebra note number {i}", "metadata": {"n": i}}]})
            assert r.status_code == 200, r.text
            gens.append(r.json()["generation"])
            seen = c.post("/search", json={"query": f"zebra note number {i}", "k": 20}).json()
            assert seen["generation"] >= gens[-1]
            assert f"api:new-{i}" in {h["path"] for h in seen["hits"]}
    stop.set()
    for t in threads:
        t.join()
    assert not failures, failures[:5]
    assert gens == sorted(gens) and len(set(gens)) == 12
    assert len(seen_generations) > 1  # the searchers really ran across writes
    _, vectors, docs = open_index(folder)
    assert vectors.ntotal == docs.counts()["chunks"] == Manifest.load(folder).counts["chunks"]


def test_read_only_and_locked_index(fake_index):
    with running(create_app(Service(fake_index, device="cpu", encoder=FakeEncoder()), read_only=True)) as url:
        r = httpx.post(url + "/documents", json={"documents": [{"id": "a", "text": "soup"}]})
        assert r.status_code == 403 and "read-only" in r.json()["error"]["message"]
        assert httpx.delete(url + "/documents/a").status_code == 403
    with running(create_app(Service(fake_index, device="cpu", encoder=FakeEncoder()))) as url:
        w = IndexWriter(fake_index, 64, Manifest.load(fake_index))  # another process writing
        try:
            r = httpx.post(url + "/documents", json={"documents": [{"id": "a", "text": "soup"}]})
            assert r.status_code == 409 and "another semsearch process" in r.json()["error"]["message"]
            assert httpx.post(url + "/search", json={"query": "soup"}).status_code == 200
        finally:
            w.abort()


def test_server_notices_a_write_by_another_process(fake_index, small_corpus):
    svc = Service(fake_index, device="cpu", encoder=FakeEncoder())
    with running(create_app(svc)) as url:
        g0 = httpx.get(url + "/health").json()["generation"]
        (small_corpus / "garden.txt").write_text("Prune the roses in early spring before new growth.\n")
        index_corpus(small_corpus, fake_index, FakeEncoder(), progress=False)
        r = httpx.post(url + "/search", json={"query": "prune roses spring", "k": 1}).json()
        assert r["generation"] == g0 + 1 and r["hits"][0]["path"].endswith("garden.txt")


def test_api_documents_survive_reindexing_the_corpus(small_corpus, tmp_path):
    folder, enc = tmp_path / "idx", FakeEncoder()
    index_corpus(small_corpus, folder, enc, progress=False)
    rep = upsert_documents(folder, [Document("n1", "Axolotls regrow their limbs.", {"kind": "note"}),
                                    Document("n2", "Tardigrades survive in space.")], enc)
    assert (rep.added, rep.chunks) == (2, 2)
    assert upsert_documents(folder, [Document("n1", "Axolotls regrow their limbs.", {"kind": "note"})], enc).unchanged == 1
    rep = upsert_documents(folder, [Document("n1", "Axolotls regrow limbs and hearts.", {"kind": "note"})], enc)
    assert rep.updated == 1
    (small_corpus / "cook.md").unlink()
    (small_corpus / "space.txt").write_text("Saturn has rings of ice.\n")
    index_corpus(small_corpus, folder, enc, progress=False)  # removes cook.md, updates space.txt
    r = Retriever.load(folder, encoder=enc)
    paths = {c["path"] for c in r.docs.get_chunks(range(1, 1000)).values()}
    assert {"api:n1", "api:n2"} <= paths and not any(p.endswith("cook.md") for p in paths)
    hit = r.search("axolotls regrow hearts", k=1)[0]
    # (the fake encoder's tokens are words: the chunk ends at the last one, without the full stop)
    assert (hit.path, hit.text, hit.metadata) == ("api:n1", "Axolotls regrow limbs and hearts", {"kind": "note"})
    assert len(r) == r.docs.counts()["chunks"] == Manifest.load(folder).counts["chunks"]
    assert delete_documents(folder, ["n1", "n2"]).deleted == 2
    with pytest.raises(DocumentNotFound, match="n1"):
        delete_documents(folder, ["n1"])
    r = Retriever.load(folder, encoder=enc)
    assert not any(c["path"].startswith("api:") for c in r.docs.get_chunks(range(1, 1000)).values())
    with pytest.raises(InputError, match="twice"):
        upsert_documents(folder, [Document("x", "a"), Document("x", "b")], enc)


def test_long_api_document_is_chunked_with_lines(fake_index):
    enc = FakeEncoder()  # 40 tokens: chunks of 38 with overlap 32 -> many chunks
    text = "\n".join(f"line {i} talks about topic number {i}" for i in range(30))
    rep = upsert_documents(fake_index, [Document("long", text)], enc)
    r = Retriever.load(fake_index, encoder=enc)
    chunks = [c for c in r.docs.get_chunks(range(1, 1000)).values() if c["path"] == "api:long"]
    assert rep.chunks == len(chunks) > 1
    for c in chunks:
        assert text[c["start"]:c["end"]] == c["text"] and c["line"] == text.count("\n", 0, c["start"]) + 1


def test_api_documents_keep_token_states_where_the_index_does(small_corpus, tmp_path, real_encoder):
    folder = tmp_path / "idx"
    index_corpus(small_corpus, folder, real_encoder, progress=False, keep_states=True)
    upsert_documents(folder, [Document("n1", "Axolotls regrow their limbs.")], real_encoder)
    _, _, docs = open_index(folder)
    refs = [r for batch in docs.iter_states_refs() for r in batch]
    assert refs and all(r[1] is not None and r[3] > 0 for r in refs)


def test_health_says_only_what_a_probe_needs_and_info_which_faiss_is_loaded(fake_server):
    """/health (open without a key) gives the status, generation and chunk count only; the build
    of faiss and the GPUs are in /info (behind the key where one is set)."""
    import faiss

    url, _ = fake_server
    h = httpx.get(url + "/health", timeout=30).json()
    assert set(h) == {"status", "generation", "chunks"} and h["status"] == "ok"
    f = httpx.get(url + "/info", timeout=30).json()["faiss"]
    assert f["version"] == faiss.__version__ and f["gpu_build"] == hasattr(faiss, "StandardGpuResources")
    assert isinstance(f["gpus"], int) and (f["gpu_build"] or f["gpus"] == 0)


@pytest.mark.skipif(not HAS_WHERE, reason="Retriever.search_batch has no `where` yet (issue #9)")
def test_where_passes_through(fake_server):
    url, _ = fake_server
    with httpx.Client(base_url=url, timeout=30) as c:
        c.post("/documents", json={"documents": [{"id": "en", "text": "soup of lentils", "metadata": {"lang": "en"}},
                                                 {"id": "fr", "text": "soup of lentils", "metadata": {"lang": "fr"}}]})
        r = c.post("/search", json={"query": "lentil soup", "k": 10, "where": {"lang": "fr"}})
        assert r.status_code == 200 and [h["path"] for h in r.json()["hits"]] == ["api:fr"]


@pytest.mark.skipif(not HAS_MODE, reason="Retriever.search_batch has no `mode` yet (issue #9)")
def test_mode_passes_through(fake_server):
    url, _ = fake_server
    with httpx.Client(base_url=url, timeout=30) as c:
        for mode in ("dense", "lexical", "hybrid"):
            r = c.post("/search", json={"query": "lentils cumin", "k": 1, "mode": mode})
            assert r.status_code == 200 and r.json()["hits"][0]["path"].endswith("cook.md"), (mode, r.text)
        assert c.get("/search", params={"q": "lentils", "mode": "lexical"}).status_code == 200


@pytest.mark.skipif(HAS_MODE and HAS_WHERE, reason="Retriever takes mode and where")
def test_mode_and_where_refused_clearly_before_they_exist(fake_server):
    url, _ = fake_server
    body = {"query": "soup"}
    body.update({"where": {"lang": "en"}} if not HAS_WHERE else {"mode": "lexical"})
    r = httpx.post(url + "/search", json=body)
    assert r.status_code == 422 and "not supported" in r.json()["error"]["message"]


def test_cli_serve_help_and_missing_extra_message():
    r = CliRunner().invoke(main, ["serve", "--help"])
    assert r.exit_code == 0 and "--host" in r.output and "127.0.0.1" in r.output
    from semsearch.integrations.common import require

    with pytest.raises(ImportError, match=r"pip install 'semsearch\[serve\]'"):
        require("no_such_framework_module", "serve")
    r = CliRunner().invoke(main, ["serve", "--index", "/nonexistent/idx"])
    assert r.exit_code == 1 and "no index at" in r.output


def test_concurrent_encodes_share_passes_and_get_their_own_rows():
    from concurrent.futures import ThreadPoolExecutor

    from semsearch.serve import _SerialEncoder

    class Picky(FakeEncoder):
        def encode(self, texts, progress=None):
            if any("boom" in t for t in texts):
                raise InputError("cannot encode boom")
            time.sleep(0.005)  # a pass takes a while, so callers queue up behind it
            return super().encode(texts, progress)

    ref, enc = FakeEncoder(), _SerialEncoder(Picky(), max_batch=8)
    texts = [[f"text {i} about topic {i % 7}"] * (1 + i % 3) for i in range(64)]
    with ThreadPoolExecutor(8) as pool:
        out = list(pool.map(enc.encode, texts))
        assert enc.texts == sum(map(len, texts)) and enc.passes <= 64
        futures = [pool.submit(enc.encode, ["fine text"]), pool.submit(enc.encode, ["boom"]), pool.submit(enc.encode, ["also fine"])]
    for t, v in zip(texts, out):
        np.testing.assert_allclose(v, ref.encode(t), atol=1e-6)
    np.testing.assert_allclose(futures[0].result(), ref.encode(["fine text"]), atol=1e-6)
    np.testing.assert_allclose(futures[2].result(), ref.encode(["also fine"]), atol=1e-6)
    with pytest.raises(InputError, match="boom"):
        futures[1].result()


def test_openai_client_reads_the_embeddings(fake_server):
    """The official `openai` client (which asks for base64) against /v1/embeddings."""
    openai = pytest.importorskip("openai")  # comes with llama-index-core
    url, _ = fake_server
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    r = client.embeddings.create(input=["lentil soup", "comet debris"], model="fake-bow")
    np.testing.assert_allclose(np.array([d.embedding for d in r.data]), FakeEncoder().encode(["lentil soup", "comet debris"]), atol=1e-6)
    with pytest.raises(openai.UnprocessableEntityError, match="fake-bow"):
        client.embeddings.create(input="soup", model="text-embedding-3-small")


def test_models_lists_the_served_model(fake_server):
    url, _ = fake_server
    r = httpx.get(url + "/v1/models")
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list" and len(body["data"]) == 1
    m = body["data"][0]
    assert (m["id"], m["object"], m["owned_by"]) == ("fake-bow", "model", "semsearch") and isinstance(m["created"], int)
    openai = pytest.importorskip("openai")
    assert [x.id for x in openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0).models.list().data] == ["fake-bow"]


@pytest.mark.skipif(not HAS_WHERE, reason="Retriever.search_batch has no `where` yet (issue #9)")
def test_get_search_takes_where_in_the_cli_syntax(fake_server):
    url, _ = fake_server
    docs = [{"id": f"{lang}-{year}", "text": "soup of lentils", "metadata": {"lang": lang, "year": year}}
            for lang in ("en", "fr") for year in (2005, 2015)]
    with httpx.Client(base_url=url, timeout=30) as c:
        assert c.post("/documents", json={"documents": docs}).status_code == 200

        def paths(*where: str) -> set[str]:
            r = c.get("/search", params=[("q", "lentil soup"), ("k", "10"), *(("where", w) for w in where)])
            assert r.status_code == 200, r.text
            return {h["path"] for h in r.json()["hits"] if h["path"].startswith("api:")}

        assert paths() == {"api:en-2005", "api:en-2015", "api:fr-2005", "api:fr-2015"}
        assert paths("lang=fr") == {"api:fr-2005", "api:fr-2015"}
        assert paths("year>=2010") == {"api:en-2015", "api:fr-2015"}
        assert paths("lang=en", "year<2010") == {"api:en-2005"}
        assert paths("path:api:fr-*") == {"api:fr-2005", "api:fr-2015"}
        # the same conditions in POST bodies: a list of strings, or the dict form
        r = c.post("/search", json={"query": "lentil soup", "k": 10, "where": ["lang=en", "year<2010"]}).json()
        assert {h["path"] for h in r["hits"]} == {"api:en-2005"}
        r = c.post("/search", json={"query": "lentil soup", "k": 10, "where": {"year": {">=": 2010}, "lang": "fr"}}).json()
        assert {h["path"] for h in r["hits"]} == {"api:fr-2015"}
        bad = c.get("/search", params={"q": "soup", "where": "year>>2010"})
        assert bad.status_code == 422 and "year" in bad.json()["error"]["message"]


def test_an_upsert_that_changes_nothing_publishes_no_generation(fake_server):
    url, folder = fake_server
    docs = {"documents": [{"id": "same", "text": "an unchanging note about kelp", "metadata": {"v": 1}},
                          {"id": "same-2", "text": "another one about coral"}]}
    with httpx.Client(base_url=url, timeout=30) as c:
        first = c.post("/documents", json=docs).json()
        assert first["added"] == 2
        files = sorted(p.name for p in folder.iterdir())
        again = c.post("/documents", json=docs).json()
        assert (again["added"], again["updated"], again["unchanged"], again["chunks"]) == (0, 0, 2, 0)
        assert again["generation"] == first["generation"] == Manifest.load(folder).generation
        assert sorted(p.name for p in folder.iterdir()) == files  # no new docstore or vector file either
        assert c.get("/health").json()["generation"] == first["generation"]
        changed = c.post("/documents", json={"documents": [{"id": "same", "text": "an unchanging note about kelp", "metadata": {"v": 2}}]}).json()
        assert changed["updated"] == 1 and changed["generation"] == first["generation"] + 1  # metadata counts as a change


def test_rendered_json_is_the_standard_librarys():
    """Responses go out through orjson where installed: the same JSON values as the standard
    library's, and the standard library's where orjson refuses (a lone surrogate, a big integer)."""
    import json

    from semsearch import serve

    assert serve._orjson is not None  # the serve extra holds it
    payload = {"hits": [{"score": 0.1 + 0.2, "tiny": 1e-300, "neg": -0.0, "text": "caf\u00e9 \u4e2d <script>", "n": 2**63 - 1,
                         "metadata": {"year": 2010, "tags": ["a", "b"], "nested": {"x": None, "y": True}}}]}
    assert json.loads(serve._render(payload)) == payload
    odd = {"text": "lone \ud800 surrogate", "big": 2**70}
    out = serve._render(odd)
    assert json.loads(out) == odd and b"\\ud800" in out


def test_concurrent_queries_get_the_vectors_they_get_alone_where_padding_changes_them():
    """An encoder whose vectors change with padding (as bf16's do): texts queued together are
    encoded in passes without padding between them, so every caller gets exactly the vectors of
    its call alone, one text or several, however the calls interleave."""
    from concurrent.futures import ThreadPoolExecutor

    from semsearch.serve import _SerialEncoder

    class PadsLikeBf16(FakeEncoder):
        precision = "bf16"

        def encode(self, texts, progress=None):
            time.sleep(0.003)  # a pass takes a while, so callers queue up behind it
            v = super().encode(texts, progress)
            lens = np.array([len(self.token_offsets(t)) for t in texts])
            return v + 1e-3 * (lens.max() - lens)[:, None]  # what padding does to a shorter text

    ref, enc = PadsLikeBf16(), _SerialEncoder(PadsLikeBf16(), max_batch=16)
    calls = [[f"query {'word ' * (i % 3)}{i}"] if i % 5 else [f"a {i}", f"longer text number {i} here"] for i in range(80)]
    with ThreadPoolExecutor(8) as pool:
        out = list(pool.map(enc.encode, calls))
    assert enc.passes < len(calls)  # callers did share passes
    for c, v in zip(calls, out):
        assert np.array_equal(v, ref.encode(c)), c


def test_a_failed_pass_reaches_the_caller_whose_text_failed():
    """A pass runs on whichever caller's thread holds the encoder: when it encodes another
    caller's text alone and that fails, the error goes to that caller, and this one's own text
    is encoded next (it used to get the other's error, and the other an empty queue)."""
    from semsearch.service import _Pending
    from semsearch.serve import _SerialEncoder

    class Picky(FakeEncoder):
        def encode(self, texts, progress=None):
            if any("boom" in t for t in texts):
                raise InputError("cannot encode boom")
            return super().encode(texts, progress)

    enc = _SerialEncoder(Picky())
    other = _Pending(["boom"], queries=False)
    enc._queue.append(other)  # queued by another thread before this one took the encoder
    enc._enc.query_tower = object()  # this caller's queries go in passes of their own kind
    enc._enc.encode_queries = enc._enc.encode
    out = enc.encode_queries(["fine text"])
    np.testing.assert_allclose(out, FakeEncoder().encode(["fine text"]), atol=1e-6)
    assert other.done and isinstance(other.error, InputError)
