"""The LlamaIndex vector store (SemsearchVectorStore) and embedding (SemsearchEmbedding) against
the real llama-index-core, the real model, FAISS and SQLite.

llama-index-core ships no standard test suite for vector stores (unlike langchain-tests): what
VectorStoreIndex, its retriever and its query engine ask of a store is exercised here instead."""
from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

pytest.importorskip("llama_index.core")

from llama_index.core import Document, StorageContext, VectorStoreIndex  # noqa: E402
from llama_index.core.base.embeddings.base import BaseEmbedding  # noqa: E402
from llama_index.core.embeddings import MockEmbedding  # noqa: E402
from llama_index.core.llms import MockLLM  # noqa: E402
from llama_index.core.node_parser import SentenceSplitter  # noqa: E402
from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode  # noqa: E402
from llama_index.core.vector_stores.types import (BasePydanticVectorStore, FilterCondition, MetadataFilter,  # noqa: E402
                                                  MetadataFilters, VectorStoreQuery, VectorStoreQueryMode)

from semsearch.documents import doc_id_of  # noqa: E402
from semsearch.errors import InputError  # noqa: E402
from semsearch.indexing import index_corpus  # noqa: E402
from semsearch.integrations.llamaindex import SemsearchEmbedding, SemsearchVectorStore  # noqa: E402
from semsearch.search import encode_queries  # noqa: E402

from conftest import SAMPLE  # noqa: E402

# (node id, ref_doc_id, text, metadata)
NOTES = [("n1", "memo", "Loan decisions now take two business days.", {"lang": "en", "year": 2024, "team": "credit"}),
         ("n2", "memo", "Les décisions de prêt prennent deux jours.", {"lang": "fr", "year": 2023, "team": "credit"}),
         ("n3", "recipes", "Simmer red lentils with cumin for twenty minutes.", {"lang": "en", "year": 2019, "team": "kitchen"}),
         ("n4", "sky", "Meteor showers come when Earth crosses a comet's trail.", {"lang": "en", "year": 2021, "team": "sky"})]
QUERY = "how long does a loan decision take"


def note_nodes(notes=NOTES) -> list[TextNode]:
    return [TextNode(id_=i, text=t, metadata=dict(m), relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=ref)})
            for i, ref, t, m in notes]


def q(text: str | None = QUERY, k: int = 4, **kw) -> VectorStoreQuery:
    return VectorStoreQuery(query_str=text, similarity_top_k=k, **kw)


def f(*filters: tuple, condition: FilterCondition = FilterCondition.AND) -> MetadataFilters:
    return MetadataFilters(filters=[MetadataFilter(key=k, operator=op, value=v) for k, op, v in filters], condition=condition)


pytestmark = pytest.mark.xdist_group("test_llamaindex_store")  # one worker sets the module fixtures up (pytest -n)


@pytest.fixture(scope="module")
def store(tmp_path_factory, real_encoder):
    """The sample corpus (files: chunks found as nodes of their own) plus NOTES added as nodes.
    Read-only for the tests that use it."""
    folder = tmp_path_factory.mktemp("li-store") / "idx"
    index_corpus(SAMPLE, folder, real_encoder, progress=False)
    s = SemsearchVectorStore.from_index(folder, encoder=real_encoder)
    assert s.add(note_nodes()) == [n[0] for n in NOTES]
    yield s
    s.retriever.close()


@pytest.fixture
def empty_store(tmp_path, real_encoder):
    s = SemsearchVectorStore.from_index(tmp_path / "idx", encoder=real_encoder)
    yield s
    s.retriever.close()


def ids(store, query: VectorStoreQuery, **kw) -> list[str]:
    return store.query(query, **kw).ids


# ---- through LlamaIndex's own index, retriever and query engine ---------------------------------
def test_query_engine_over_the_store(store):
    assert isinstance(store, BasePydanticVectorStore) and store.stores_text
    index = VectorStoreIndex.from_vector_store(store, embed_model=store.embed_model)
    response = index.as_query_engine(llm=MockLLM(max_tokens=8), similarity_top_k=3).query(QUERY)
    assert str(response).strip()  # MockLLM answers with placeholder text; the nodes are the point
    top = response.source_nodes[0]
    assert top.node.node_id == "n1" and top.node.get_content() == NOTES[0][2]
    assert top.node.metadata == NOTES[0][3] and top.node.ref_doc_id == "memo"
    scores = [n.score for n in response.source_nodes]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True)

    retriever = index.as_retriever(similarity_top_k=4, filters=f(("team", "==", "credit")))
    assert sorted(n.node.node_id for n in retriever.retrieve(QUERY)) == ["n1", "n2"]
    assert [n.node.node_id for n in asyncio.run(retriever.aretrieve(QUERY))] == [n.node.node_id for n in retriever.retrieve(QUERY)]
    hybrid = index.as_retriever(similarity_top_k=2, vector_store_query_mode="hybrid", alpha=0.5).retrieve(QUERY)
    assert hybrid[0].node.node_id == "n1"
    lexical = index.as_retriever(similarity_top_k=2, vector_store_query_mode="text_search").retrieve("lentils cumin")
    assert lexical[0].node.node_id == "n3"


def test_from_documents_inserts_finds_and_deletes(empty_store):
    store = empty_store
    long_text = " ".join(f"Paragraph {i}: the harbour ferry to the island leaves every {i + 2} hours in summer." for i in range(12))
    docs = [Document(text=long_text, id_="ferry", metadata={"kind": "timetable"}),
            Document(text="Sourdough needs a starter fed with flour and water every day.", id_="bread", metadata={"kind": "recipe"})]
    index = VectorStoreIndex.from_documents(docs, storage_context=StorageContext.from_defaults(vector_store=store),
                                            embed_model=store.embed_model,
                                            transformations=[SentenceSplitter(chunk_size=48, chunk_overlap=0)])
    stored = store.get_nodes()
    ferry = [n for n in stored if n.ref_doc_id == "ferry"]
    assert len(ferry) > 1 and len(stored) == len(ferry) + 1  # the long document became several nodes
    assert all(n.metadata == {"kind": "timetable"} for n in ferry)

    found = index.as_retriever(similarity_top_k=2).retrieve("how often does the island ferry leave")
    assert {n.node.ref_doc_id for n in found} == {"ferry"}
    assert index.as_retriever(similarity_top_k=1).retrieve("feeding a sourdough starter")[0].node.ref_doc_id == "bread"

    index.insert(Document(text="The museum opens at nine on weekdays.", id_="museum"))
    assert index.as_retriever(similarity_top_k=1).retrieve("when does the museum open")[0].node.ref_doc_id == "museum"

    index.delete_ref_doc("ferry")  # every node of the document goes
    assert {n.ref_doc_id for n in store.get_nodes()} == {"bread", "museum"}
    assert {n.node.ref_doc_id for n in index.as_retriever(similarity_top_k=5).retrieve("island ferry")} == {"bread", "museum"}


# ---- add / query / filters ------------------------------------------------------------------------
def test_query_filters_and_restrictions(store):
    assert ids(store, q(filters=f(("lang", "==", "fr")))) == ["n2"]
    assert sorted(ids(store, q(filters=f(("year", ">=", 2021), ("team", "!=", "kitchen"))))) == ["n1", "n2", "n4"]
    assert ids(store, q(filters=f(("team", "in", ["credit", "sky"]), ("lang", "nin", ["fr"]), ("year", "<", 2024)))) == ["n4"]
    nested = MetadataFilters(filters=[f(("lang", "==", "en")), MetadataFilter(key="year", operator=">", value=2020)])
    assert sorted(ids(store, q(filters=nested))) == ["n1", "n4"]  # nested AND groups flatten
    assert ids(store, q(filters=f(("lang", "==", "de")))) == []
    assert sorted(ids(store, q(doc_ids=["memo", "sky"]))) == ["n1", "n2", "n4"]
    assert ids(store, q(doc_ids=["memo"], filters=f(("lang", "==", "en")))) == ["n1"]
    assert sorted(ids(store, q(node_ids=["n3", "n4"]))) == ["n3", "n4"]
    # an empty node_ids list (VectorIndexRetriever's for stores that keep text) restricts nothing
    assert len(ids(store, q(node_ids=[], k=6))) == 6

    res = store.query(q(k=4, filters=f(("team", "==", "credit"))))
    assert [n.node_id for n in res.nodes] == res.ids and len(res.similarities) == 2
    assert res.nodes[0].metadata == NOTES[0][3] and res.nodes[0].get_content() == NOTES[0][2]
    # the corpus' file chunks are nodes too: the chunk id, the chunk's text, where it comes from
    files = [n for n in store.query(q("meteor showers", k=6)).nodes if n.node_id not in {"n1", "n2", "n3", "n4"}]
    assert files and all(n.node_id.isdigit() and n.metadata["source"] for n in files)


def test_unsupported_filters_and_modes_are_refused_clearly(store):
    with pytest.raises(InputError, match="only AND filters.*not OR"):
        store.query(q(filters=f(("lang", "==", "fr"), ("lang", "==", "en"), condition=FilterCondition.OR)))
    with pytest.raises(InputError, match="not NOT"):
        store.query(q(filters=f(("lang", "==", "fr"), condition=FilterCondition.NOT)))
    for op, value in (("contains", "x"), ("text_match", "loan"), ("any", ["a"])):
        with pytest.raises(InputError, match=f"filter operator '{op}' on 'team' is not supported"):
            store.query(q(filters=f(("team", op, value))))
    with pytest.raises(InputError, match="cannot both hold"):
        store.query(q(filters=f(("lang", "==", "fr"), ("lang", "==", "en"))))
    for mode in ("svm", "semantic_hybrid", "nonsense"):
        with pytest.raises(InputError, match=f"query mode '{mode}' is not supported.*default, hybrid"):
            store.query(q(mode=mode))
    with pytest.raises(InputError, match="needs query_str"):
        store.query(VectorStoreQuery(query_embedding=[0.1] * 384, mode="hybrid"))
    with pytest.raises(InputError, match="neither query_str nor query_embedding"):
        store.query(VectorStoreQuery())
    with pytest.raises(InputError, match="384"):
        store.query(VectorStoreQuery(query_embedding=[1.0, 0.0]))
    with pytest.raises(InputError, match="unknown argument"):
        store.query(q(), fetch_k=3)
    with pytest.raises(InputError, match="alpha"):
        store.query(q(mode="hybrid", alpha=1.5))


# ---- modes: what semsearch's own Retriever.search gives -------------------------------------------
def node_id(hit) -> str:
    """The node a hit stands for: its document's id, or for a file's chunk the chunk id."""
    return doc_id_of(hit.path) or str(hit.id)


@pytest.mark.parametrize("mode, kw, ours", [
    ("hybrid", {}, {}),
    ("hybrid", {"alpha": 0.2}, {"alpha": 0.2}),
    ("text_search", {}, {"mode": "lexical"}),
    ("sparse", {}, {"mode": "lexical"}),
    ("default", {}, {"mode": "dense"}),
])
def test_modes_match_the_retrievers_search(store, mode, kw, ours):
    for text in (QUERY, "meteor showers comet", "tomato seedlings"):
        res = store.query(q(text, k=6, mode=mode, **kw))
        hits = store.retriever.search(text, 6, mode=ours.get("mode", "hybrid"), alpha=ours.get("alpha"))
        assert len(hits) >= 3 and len({node_id(h) for h in hits}) == len(hits)  # one chunk a node: results comparable
        assert res.ids == [node_id(h) for h in hits]
        assert res.similarities == [h.score for h in hits]
    # filters apply as semsearch's where does
    res = store.query(q(QUERY, k=3, mode=mode, filters=f(("year", ">=", 2020)), **kw))
    hits = store.retriever.search(QUERY, 3, mode=ours.get("mode", "hybrid"), alpha=ours.get("alpha"), where={"year": {">=": 2020}})
    assert res.ids == [node_id(h) for h in hits] and res.similarities == [h.score for h in hits]


def test_sparse_and_hybrid_top_k(store):
    assert len(ids(store, q(QUERY, k=2, mode="sparse", sparse_top_k=5))) == 5
    assert len(ids(store, q(QUERY, k=2, mode="hybrid", hybrid_top_k=3))) == 3


def test_text_wins_over_the_vector_and_vector_alone(store):
    emb = store.embed_model
    text_only = store.query(q(QUERY, k=5))
    # a query embedding from another space beside the text: the text is what the store searches by
    both = store.query(VectorStoreQuery(query_str=QUERY, query_embedding=np.ones(384).tolist(), similarity_top_k=5))
    assert both.ids == text_only.ids and both.similarities == text_only.similarities
    vector_only = store.query(VectorStoreQuery(query_embedding=emb.get_query_embedding(QUERY), similarity_top_k=5))
    assert vector_only.ids == text_only.ids
    assert vector_only.similarities == pytest.approx(text_only.similarities, abs=1e-5)
    assert store.query(VectorStoreQuery(query_embedding=emb.get_query_embedding(QUERY), similarity_top_k=3,
                                        filters=f(("lang", "==", "en")))).ids[0] == "n1"


def test_mmr(store):
    plain = store.query(q(QUERY, k=4))
    mmr = store.query(q(QUERY, k=4, mode="mmr", mmr_threshold=0.5))
    assert len(mmr.ids) == 4 and len(set(mmr.ids)) == 4 and mmr.ids[0] == plain.ids[0]
    assert store.query(q(QUERY, k=4, mode="mmr", mmr_threshold=1.0)).ids == plain.ids  # 1: relevance alone
    assert len(store.query(q(QUERY, k=2, mode="mmr"), mmr_prefetch_k=3).ids) == 2


# ---- deleting, getting, clearing --------------------------------------------------------------------
def test_delete_ref_doc_delete_nodes_get_nodes_clear(empty_store):
    store = empty_store
    extra = [("n5", "memo", "Mortgage rates fell again this quarter.", {"lang": "en", "year": 2024, "team": "credit"}),
             ("n6", "sky", "Comets shed dust as they near the sun.", {"lang": "en", "year": 2018, "team": "sky"})]
    store.add(note_nodes(NOTES + extra))
    assert [n.node_id for n in store.get_nodes(["n3", "missing", "n1"])] == ["n3", "n1"]
    assert sorted(n.node_id for n in store.get_nodes(filters=f(("team", "==", "sky")))) == ["n4", "n6"]
    assert [n.node_id for n in store.get_nodes(["n1", "n4", "n5"], filters=f(("year", "<", 2024)))] == ["n4"]

    store.delete("memo")  # every node of the source document
    assert sorted(n.node_id for n in store.get_nodes()) == ["n3", "n4", "n6"]
    assert "n1" not in ids(store, q(QUERY, k=6)) and ids(store, q(doc_ids=["memo"])) == []
    store.delete("no-such-document")  # nothing to remove: no error

    store.delete_nodes(["n3", "missing"])
    assert sorted(n.node_id for n in store.get_nodes()) == ["n4", "n6"]
    store.delete_nodes(["n4", "n6"], filters=f(("year", "<", 2020)))  # both: those of the ids that match
    assert [n.node_id for n in store.get_nodes()] == ["n4"]
    store.add(note_nodes(NOTES[:2]))
    store.delete_nodes(filters=f(("lang", "==", "fr")))
    assert sorted(n.node_id for n in store.get_nodes()) == ["n1", "n4"]
    with pytest.raises(InputError, match="node_ids or filters"):
        store.delete_nodes()
    with pytest.raises(InputError, match="AND"):
        store.delete_nodes(filters=f(("lang", "==", "fr"), condition=FilterCondition.OR))

    store.add([TextNode(id_="n1", text="Loan decisions now take one business day.", metadata={"year": 2025})])  # replaces n1
    assert store.get_nodes(["n1"])[0].get_content() == "Loan decisions now take one business day."
    assert store.get_nodes(["n1"])[0].metadata == {"year": 2025}
    store.clear()
    assert store.get_nodes() == [] and ids(store, q(QUERY)) == []


def test_a_second_store_over_the_folder_sees_the_nodes(empty_store, real_encoder):
    empty_store.add(note_nodes())
    again = SemsearchVectorStore.from_index(empty_store.folder, encoder=real_encoder, create=False)
    try:
        assert ids(again, q(QUERY, k=1)) == ["n1"] and again.get_nodes(["n3"])[0].ref_doc_id == "recipes"
    finally:
        again.retriever.close()


# ---- embeddings ----------------------------------------------------------------------------------------
def test_semsearch_embedding_is_the_index_model(store, real_encoder):
    emb = store.embed_model
    assert isinstance(emb, SemsearchEmbedding) and isinstance(emb, BaseEmbedding) and emb.encoder is store.retriever.encoder
    assert SemsearchEmbedding(real_encoder).get_query_embedding(QUERY) == emb.get_query_embedding(QUERY)
    qv = emb.get_query_embedding(QUERY)
    assert np.allclose(qv, encode_queries(real_encoder, [QUERY])[0], atol=1e-6)
    texts = [n[2] for n in NOTES]
    batch = emb.get_text_embedding_batch(texts)
    assert np.allclose(batch, real_encoder.encode(texts, progress=False), atol=1e-5)
    assert np.allclose(asyncio.run(emb.aget_query_embedding(QUERY)), qv, atol=1e-6)
    assert np.allclose(asyncio.run(emb.aget_text_embedding_batch(texts)), batch, atol=1e-5)


def test_another_models_embeddings_are_refused(empty_store):
    store = empty_store
    node = note_nodes()[0]
    with pytest.raises(InputError, match="8 dimensions; the index's model gives 384"):
        store.add([node.model_copy(update={"embedding": [0.5] * 8})])
    rng = np.random.default_rng(0)
    with pytest.raises(InputError, match="from another model"):
        store.add([node.model_copy(update={"embedding": rng.standard_normal(384).tolist()})])
    with pytest.raises(InputError, match="from another model"):  # VectorStoreIndex with another embedding model
        VectorStoreIndex.from_documents([Document(text=node.text)], storage_context=StorageContext.from_defaults(vector_store=store),
                                        embed_model=MockEmbedding(embed_dim=384))
    assert store.get_nodes() == []  # nothing went in
    # the index's own model's embeddings are taken (and the index embeds the text itself)
    embedded = node.model_copy(update={"embedding": store.embed_model.get_text_embedding(node.get_content(metadata_mode="embed"))})
    assert store.add([embedded]) == ["n1"] and ids(store, q(QUERY, k=1)) == ["n1"]


# ---- the async side ----------------------------------------------------------------------------------
def off_the_loop(monkeypatch, name: str, call):
    """Run `call()` (a coroutine) while SemsearchVectorStore.<name> waits for the event loop to
    make progress: it finishes only if the sync method runs on a worker thread."""
    gate = threading.Event()
    sync = getattr(SemsearchVectorStore, name)

    def gated(self, *args, **kwargs):
        assert gate.wait(20), f"{name} ran on the event loop"
        return sync(self, *args, **kwargs)

    monkeypatch.setattr(SemsearchVectorStore, name, gated)

    async def main():
        async def beside():
            await asyncio.sleep(0.01)
            gate.set()

        out, _ = await asyncio.gather(call(), beside())
        return out

    try:
        return asyncio.run(main())
    finally:
        monkeypatch.setattr(SemsearchVectorStore, name, sync)


def test_async_methods_run_off_the_loop(empty_store, monkeypatch):
    store = empty_store
    assert off_the_loop(monkeypatch, "add", lambda: store.async_add(note_nodes())) == [n[0] for n in NOTES]
    res = off_the_loop(monkeypatch, "query", lambda: store.aquery(q(QUERY, k=2)))
    assert res.ids == store.query(q(QUERY, k=2)).ids and res.ids[0] == "n1"
    off_the_loop(monkeypatch, "delete", lambda: store.adelete("memo"))
    assert [n.node_id for n in off_the_loop(monkeypatch, "get_nodes", lambda: store.aget_nodes())] == ["n3", "n4"]
    off_the_loop(monkeypatch, "delete_nodes", lambda: store.adelete_nodes(["n3"]))
    off_the_loop(monkeypatch, "clear", lambda: store.aclear())
    assert store.get_nodes() == []

    async def concurrent():  # many queries at once, each as alone
        store.add(note_nodes())
        queries = [q(t, k=2, mode=m) for t in (QUERY, "lentils", "comet") for m in ("default", "hybrid", "text_search")]
        return queries, await asyncio.gather(*(store.aquery(x) for x in queries))

    queries, results = asyncio.run(concurrent())
    assert [r.ids for r in results] == [store.query(x).ids for x in queries]
