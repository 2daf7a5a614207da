"""`input_type` on POST /v1/embeddings and POST /embed: "query" goes through the index's trained
query layers, "document" (the default) gives the documents' vectors. A real uvicorn server on
loopback, the real model, an index with trained query layers."""
from __future__ import annotations

import base64

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from semsearch.search import Retriever  # noqa: E402
from semsearch.serve import Service, create_app  # noqa: E402

from test_numpy_query_layers import _index_with_tower  # noqa: E402
from test_serve import fake_index, fake_server, running  # noqa: E402,F401

TEXTS = ["what about comet?", "a garden in winter"]


@pytest.fixture(scope="module")
def tower_server(tmp_path_factory, real_encoder):
    idx, enc = _index_with_tower(real_encoder, tmp_path_factory.mktemp("serve-tower"), "fp32")
    service = Service(idx, device="cpu", encoder=enc)
    with running(create_app(service)) as url:
        yield url, idx, enc, service


def test_query_input_type_goes_through_the_query_layers(tower_server):
    url, idx, enc, service = tower_server
    queries, docs = enc.encode_queries(TEXTS), enc.encode(TEXTS)
    assert np.abs(queries - docs).max() > 1e-3  # the layers do change queries
    with httpx.Client(base_url=url, timeout=60) as c:
        def openai(**extra):
            r = c.post("/v1/embeddings", json={"input": TEXTS, **extra})
            assert r.status_code == 200, r.text
            return np.array([d["embedding"] for d in r.json()["data"]])

        np.testing.assert_allclose(openai(input_type="query"), queries, atol=1e-5)
        np.testing.assert_allclose(openai(input_type="document"), docs, atol=1e-5)
        np.testing.assert_allclose(openai(), docs, atol=1e-5)  # the default: documents, as before
        b64 = c.post("/v1/embeddings", json={"input": TEXTS[0], "input_type": "query", "encoding_format": "base64"}).json()
        np.testing.assert_allclose(np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), "<f4"), queries[0], atol=1e-5)

        def tei(**extra):
            r = c.post("/embed", json={"inputs": TEXTS, **extra})
            assert r.status_code == 200, r.text
            return np.array(r.json())

        np.testing.assert_allclose(tei(input_type="query"), queries, atol=1e-5)
        np.testing.assert_allclose(tei(input_type="document"), docs, atol=1e-5)
        np.testing.assert_allclose(tei(), docs, atol=1e-5)

        # a search on the server encodes its query as input_type "query" does
        hits = c.post("/search", json={"query": TEXTS[0], "k": 3, "mode": "dense"}).json()["hits"]
        local = Retriever.load(idx, encoder=enc).search(TEXTS[0], k=3, mode="dense")
        assert [h["id"] for h in hits] == [h.id for h in local] and "comet" in hits[0]["text"]
        assert abs(hits[0]["score"] - float(queries[0] @ enc.encode([local[0].text])[0])) < 1e-3


def test_queries_and_documents_queued_together_get_their_own_vectors(tower_server):
    """The server's encoder batches waiting requests into one pass: a pass never mixes kinds."""
    import threading

    _, _, enc, service = tower_server
    queries, docs = enc.encode_queries(TEXTS), enc.encode(TEXTS)
    got: dict[int, np.ndarray] = {}

    def call(i):
        got[i] = service.embed([TEXTS[i % 2]], "query" if i % 3 else "document")

    threads = [threading.Thread(target=call, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, v in got.items():
        want = queries if i % 3 else docs
        np.testing.assert_allclose(v[0], want[i % 2], atol=1e-5)
    assert len(got) == 12


@pytest.mark.parametrize("path,body", [("/v1/embeddings", {"input": "soup"}), ("/embed", {"inputs": "soup"})])
@pytest.mark.parametrize("value", ["passage", "Query", 1, None])
def test_an_unknown_input_type_is_a_422_naming_the_field(fake_server, path, body, value):
    url, _ = fake_server
    with httpx.Client(base_url=url, timeout=30) as c:
        r = c.post(path, json={**body, "input_type": value})
    assert r.status_code == 422
    err = r.json()["error"]
    assert "input_type" in err["message"] and "'query' or 'document'" in err["message"]


def test_input_type_query_without_query_layers_gives_the_document_vectors(fake_server):
    url, _ = fake_server
    with httpx.Client(base_url=url, timeout=30) as c:
        q = c.post("/v1/embeddings", json={"input": TEXTS, "input_type": "query"}).json()["data"]
        d = c.post("/v1/embeddings", json={"input": TEXTS}).json()["data"]
        assert [x["embedding"] for x in q] == [x["embedding"] for x in d]
        assert c.post("/embed", json={"inputs": TEXTS, "input_type": "query"}).json() == c.post("/embed", json={"inputs": TEXTS}).json()
