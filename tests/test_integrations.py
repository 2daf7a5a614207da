"""Framework adapters against the real packages: LangChain, LlamaIndex, Haystack 2."""
from __future__ import annotations

import asyncio
import inspect

import pytest

from semsearch.documents import Document as ApiDocument, upsert_documents
from semsearch.errors import InputError
from semsearch.indexing import index_corpus
from semsearch.integrations.common import hit_metadata, where_from_comparisons
from semsearch.search import Retriever

from conftest import SAMPLE, FakeEncoder

HAS_WHERE = "where" in inspect.signature(Retriever.search_batch).parameters
QUERY = "how long does a personal loan decision take"


pytestmark = pytest.mark.xdist_group("test_integrations")  # one worker sets the module fixtures up (pytest -n)


@pytest.fixture(scope="module")
def sample_retriever(tmp_path_factory, real_encoder):
    folder = tmp_path_factory.mktemp("integ") / "idx"
    index_corpus(SAMPLE, folder, real_encoder, progress=False)
    upsert_documents(folder, [ApiDocument("memo-7", "Loan decisions now take two business days.", {"lang": "en", "year": 2024}),
                              ApiDocument("memo-8", "Les décisions de prêt prennent deux jours.", {"lang": "fr", "year": 2023})],
                     real_encoder)
    r = Retriever.load(folder, encoder=real_encoder)
    yield r
    r.close()


def test_langchain_retriever(sample_retriever):
    pytest.importorskip("langchain_core")
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever

    from semsearch.integrations.langchain import SemsearchRetriever

    lr = SemsearchRetriever(retriever=sample_retriever, k=3)
    assert isinstance(lr, BaseRetriever)
    docs = lr.invoke(QUERY)
    hits = sample_retriever.search(QUERY, k=3)
    assert all(isinstance(d, Document) for d in docs) and len(docs) == 3
    assert [d.page_content for d in docs] == [h.text for h in hits]
    assert [d.id for d in docs] == [str(h.id) for h in hits]
    csv = next(d for d in docs if d.metadata["source"].endswith("bank_faq.csv"))
    assert csv.metadata["category"] == "lending" and csv.metadata["row"] >= 1 and "row" in csv.metadata["location"]
    memo = next(d for d in docs if d.metadata.get("doc_id") == "memo-7")
    assert (memo.metadata["lang"], memo.metadata["year"], memo.metadata["path"]) == ("en", 2024, "api:memo-7")
    assert docs[0].metadata["score"] == pytest.approx(hits[0].score)
    assert [d.page_content for d in asyncio.run(lr.ainvoke(QUERY))] == [d.page_content for d in docs]
    batch = lr.batch([QUERY, "sourdough starter"])
    assert [b[0].page_content for b in batch] == [docs[0].page_content, sample_retriever.search("sourdough starter", 1)[0].text]
    assert len(lr.invoke(QUERY, k=1)) == 1


def test_llamaindex_retriever(sample_retriever):
    pytest.importorskip("llama_index.core")
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

    from semsearch.integrations.llamaindex import SemsearchRetriever

    li = SemsearchRetriever(sample_retriever, similarity_top_k=3)
    assert isinstance(li, BaseRetriever)
    nodes = li.retrieve(QUERY)
    hits = sample_retriever.search(QUERY, k=3)
    assert all(isinstance(n, NodeWithScore) and isinstance(n.node, TextNode) for n in nodes)
    assert [n.node.get_content() for n in nodes] == [h.text for h in hits]
    assert [n.score for n in nodes] == pytest.approx([h.score for h in hits])
    assert nodes[0].node.metadata["location"] == hits[0].location
    assert [n.node.node_id for n in asyncio.run(li.aretrieve(QueryBundle(QUERY)))] == [str(h.id) for h in hits]


def test_llamaindex_filters_become_where():
    pytest.importorskip("llama_index.core")
    from llama_index.core.vector_stores.types import FilterCondition, MetadataFilter, MetadataFilters

    from semsearch.integrations.llamaindex import where_from_filters

    f = MetadataFilters(filters=[MetadataFilter(key="lang", value="en"), MetadataFilter(key="year", operator=">=", value=2020)])
    assert where_from_filters(f) == {"lang": "en", "year": {">=": 2020}}
    f = MetadataFilters(filters=[MetadataFilter(key="year", operator=">=", value=2020), MetadataFilter(key="year", operator="<", value=2024),
                                 MetadataFilter(key="tag", operator="in", value=["a", "b"])])
    assert where_from_filters(f) == {"year": {">=": 2020, "<": 2024}, "tag": ["a", "b"]}
    with pytest.raises(InputError, match="AND"):
        where_from_filters(MetadataFilters(filters=[MetadataFilter(key="a", value=1)], condition=FilterCondition.OR))
    with pytest.raises(InputError, match="not supported"):
        where_from_filters(MetadataFilters(filters=[MetadataFilter(key="a", operator="text_match", value="x")]))


def test_haystack_component(sample_retriever, tmp_path):
    pytest.importorskip("haystack")
    from haystack import Document, Pipeline

    from semsearch.integrations.haystack import SemsearchRetriever

    hits = sample_retriever.search(QUERY, k=3)
    out = SemsearchRetriever(retriever=sample_retriever, top_k=3).run(query=QUERY)
    docs = out["documents"]
    assert all(isinstance(d, Document) for d in docs)
    assert [(d.content, d.id) for d in docs] == [(h.text, str(h.id)) for h in hits]
    assert [d.score for d in docs] == pytest.approx([h.score for h in hits])
    assert docs[0].meta["location"] == hits[0].location
    assert len(SemsearchRetriever(retriever=sample_retriever).run(query=QUERY, top_k=2)["documents"]) == 2

    # in a pipeline, from an index path, and through to_dict / from_dict
    p = Pipeline()
    p.add_component("retriever", SemsearchRetriever(index=str(sample_retriever.folder), top_k=2, device="cpu"))
    res = p.run({"retriever": {"query": QUERY}})["retriever"]["documents"]
    assert [d.content for d in res] == [h.text for h in hits[:2]]
    # Haystack >= 3 loads classes only from modules the caller trusts
    trust = {"allowed_modules": ["semsearch.integrations.haystack"]} if "allowed_modules" in inspect.signature(Pipeline.from_dict).parameters else {}
    again = Pipeline.from_dict(p.to_dict(), **trust)
    assert again.to_dict() == p.to_dict()
    assert [d.id for d in again.run({"retriever": {"query": QUERY}})["retriever"]["documents"]] == [d.id for d in res]


def test_haystack_filters_become_where():
    pytest.importorskip("haystack")
    from semsearch.integrations.haystack import where_from_haystack

    f = {"operator": "AND", "conditions": [{"field": "meta.lang", "operator": "==", "value": "en"},
                                           {"field": "meta.year", "operator": ">=", "value": 2020}]}
    assert where_from_haystack(f) == {"lang": "en", "year": {">=": 2020}}
    assert where_from_haystack({"field": "meta.lang", "operator": "!=", "value": "fr"}) == {"lang": {"!=": "fr"}}
    assert where_from_haystack({"field": "meta.lang", "operator": "not in", "value": ["fr", "de"]}) == {"lang": {"!=": ["fr", "de"]}}
    assert where_from_haystack({"lang": "en"}) == {"lang": "en"}
    with pytest.raises(InputError, match="OR"):
        where_from_haystack({"operator": "OR", "conditions": []})
    with pytest.raises(InputError, match="meta"):
        where_from_haystack({"field": "content", "operator": "==", "value": "x"})


def test_common_helpers(sample_retriever):
    with pytest.raises(InputError, match="cannot both hold"):
        where_from_comparisons([("a", "==", 1), ("a", "==", 2)])
    assert where_from_comparisons([("a", "==", 1), ("a", "!=", 3)]) == {"a": {"=": 1, "!=": 3}}
    with pytest.raises(InputError, match="takes a list"):
        where_from_comparisons([("a", "in", 1)])
    hit = next(h for h in sample_retriever.search("loan decisions two business days", k=5) if h.path == "api:memo-7")
    meta = hit_metadata(hit)
    assert meta["doc_id"] == "memo-7" and meta["lang"] == "en" and "row" not in meta and meta["line"] == 1


@pytest.mark.skipif(not HAS_WHERE, reason="Retriever.search_batch has no `where` yet (issue #9)")
def test_filters_reach_the_retriever(sample_retriever):
    pytest.importorskip("langchain_core")
    pytest.importorskip("haystack")
    pytest.importorskip("llama_index.core")
    from llama_index.core.vector_stores.types import MetadataFilter, MetadataFilters

    from semsearch.integrations.haystack import SemsearchRetriever as H
    from semsearch.integrations.langchain import SemsearchRetriever as L
    from semsearch.integrations.llamaindex import SemsearchRetriever as LI

    lc = L(retriever=sample_retriever, k=5).invoke("loan decision", where={"lang": "fr"})
    assert [d.metadata["doc_id"] for d in lc] == ["memo-8"]
    li = LI(sample_retriever, similarity_top_k=5, filters=MetadataFilters(filters=[MetadataFilter(key="lang", value="fr")]))
    assert [n.node.metadata["doc_id"] for n in li.retrieve("loan decision")] == ["memo-8"]
    hs = H(retriever=sample_retriever, top_k=5).run(query="loan decision", filters={"field": "meta.lang", "operator": "==", "value": "fr"})
    assert [d.meta["doc_id"] for d in hs["documents"]] == ["memo-8"]
    newer = H(retriever=sample_retriever, top_k=5).run(query="loan decision", filters={
        "operator": "AND", "conditions": [{"field": "meta.year", "operator": ">=", "value": 2024}]})
    assert [d.meta["doc_id"] for d in newer["documents"]] == ["memo-7"]
    li = LI(sample_retriever, similarity_top_k=5, filters=MetadataFilters(filters=[MetadataFilter(key="year", operator="<", value=2024)]))
    assert [n.node.metadata["doc_id"] for n in li.retrieve("loan decision")] == ["memo-8"]


@pytest.mark.skipif(HAS_WHERE, reason="Retriever takes where")
def test_filters_refused_clearly_before_where_exists(tmp_path, small_corpus):
    pytest.importorskip("langchain_core")
    from semsearch.integrations.langchain import SemsearchRetriever

    enc = FakeEncoder()
    index_corpus(small_corpus, tmp_path / "idx", enc, progress=False)
    lr = SemsearchRetriever(retriever=Retriever.load(tmp_path / "idx", encoder=enc), where={"lang": "en"})
    with pytest.raises(InputError, match="not supported"):
        lr.invoke("soup")


def test_readme_rag_examples_run(sample_retriever, tmp_path, monkeypatch):
    """Each framework's RAG example in the README runs as written, with a stand-in chat model."""
    import re

    pytest.importorskip("langchain_core")
    pytest.importorskip("llama_index.core")
    pytest.importorskip("haystack")
    from haystack import component
    from haystack.dataclasses import ChatMessage
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from llama_index.core.llms import MockLLM

    from conftest import REPO

    # Haystack reads a component's input types from real annotations, which this module's
    # `from __future__ import annotations` would turn into strings: define it apart.
    ns = {"component": component, "ChatMessage": ChatMessage}
    exec("@component\nclass EchoChat:\n"
         "    @component.output_types(replies=list[ChatMessage])\n"
         "    def run(self, messages: list[ChatMessage]):\n"
         "        return {'replies': [ChatMessage.from_assistant(messages[0].text)]}\n", ns)
    EchoChat = ns["EchoChat"]

    llms = {"langchain": FakeListChatModel(responses=["an answer"]), "llamaindex": MockLLM(max_tokens=8), "haystack": EchoChat()}
    blocks = re.findall(r"```python\n(# pip install 'semsearch\[(\w+)\]'.*?)```", (REPO / "README.md").read_text(), re.S)
    assert sorted(extra for _, extra in blocks) == ["haystack", "langchain", "llamaindex"]
    (tmp_path / "indexes").mkdir()
    (tmp_path / "indexes" / "default").symlink_to(sample_retriever.folder.resolve())
    monkeypatch.chdir(tmp_path)
    printed: list[str] = []
    for code, extra in blocks:
        printed.clear()
        exec(code, {"llm": llms[extra], "print": lambda *a: printed.append(" ".join(map(str, a)))})
        assert printed, extra
    assert "Loan decisions now take two business days." in printed[-1]  # haystack: the prompt held the memo


# ---- async paths, per-call arguments, concurrency ------------------------------------------------

class Gated(Retriever):
    """The real Retriever; each search first waits for `ticked` (set by a coroutine running beside
    it) and records whether it came and on which thread the search ran. A search run on the event
    loop's own thread would block that coroutine, so `ticked` could not come while it waited."""

    def __init__(self, r: Retriever):
        import threading

        super().__init__(r.folder, r.manifest, r.vectors, r.docs, r.encoder)
        self.ticked = threading.Event()
        self.saw: list[tuple[bool, int]] = []

    def search_batch(self, queries, k=10, mode=None, where=None, fusion="convex", alpha=None):
        import threading

        self.saw.append((self.ticked.wait(60), threading.get_ident()))  # 60 s: a safety net, not a measure
        return super().search_batch(queries, k, mode, where, fusion, alpha)

    def search_vectors(self, qv, k=10, where=None):
        import threading

        self.saw.append((self.ticked.wait(60), threading.get_ident()))
        return super().search_vectors(qv, k, where)


def off_the_loop(gated: Gated, make_call):
    """Run `make_call()` (a coroutine) beside a coroutine that sets gated.ticked after the call
    started; give back the call's result once asserting that the search ran on another thread
    than the loop's and that the loop went on meanwhile (the tick came before the search ended)."""
    import threading

    order: list[str] = []

    async def main():
        async def tick():
            await asyncio.sleep(0)  # the call has started and reached its first await
            order.append("tick")
            gated.ticked.set()

        async def call():
            out = await make_call()
            order.append("call done")
            return out

        return (await asyncio.gather(call(), tick()))[0], threading.get_ident()

    gated.ticked.clear()
    gated.saw.clear()
    out, loop_thread = asyncio.run(main())
    assert gated.saw and all(ok for ok, _ in gated.saw), "the search waited for the loop in vain: it ran on the loop"
    assert all(t != loop_thread for _, t in gated.saw)
    assert order == ["tick", "call done"]
    return out


def _ids(docs):
    return [d.id for d in docs]


def test_langchain_per_call_arguments(sample_retriever):
    pytest.importorskip("langchain_core")
    from semsearch.integrations.langchain import SemsearchRetriever

    lr = SemsearchRetriever(retriever=sample_retriever, k=4)
    fr = [d.metadata["doc_id"] for d in lr.invoke("loan decision", where={"lang": "fr"})]
    assert fr == ["memo-8"]
    # the same through ainvoke / abatch, and in LangChain's spellings: filter=, search_kwargs=
    assert [d.metadata["doc_id"] for d in asyncio.run(lr.ainvoke("loan decision", where={"lang": "fr"}))] == fr
    assert [d.metadata["doc_id"] for d in asyncio.run(lr.ainvoke("loan decision", filter={"lang": {"$eq": "fr"}}))] == fr
    assert [d.metadata["doc_id"] for d in lr.invoke("loan decision", search_kwargs={"k": 3, "filter": {"lang": "fr"}})] == fr
    assert len(asyncio.run(lr.ainvoke(QUERY, k=2))) == 2
    assert len(lr.invoke(QUERY, search_kwargs={"k": 1})) == 1
    assert len(lr.invoke(QUERY, k=2, search_kwargs={"k": 1})) == 2  # given directly wins
    newer = asyncio.run(lr.ainvoke("loan decision", k=5, filter={"$and": [{"year": {"$gte": 2024}}, {"lang": {"$in": ["en", "fr"]}}]}))
    assert [d.metadata["doc_id"] for d in newer] == ["memo-7"]
    both = asyncio.run(lr.abatch(["loan decision", "loan decision"], k=1, where=["year>=2023", "lang=fr"]))
    assert [[d.metadata["doc_id"] for d in b] for b in both] == [["memo-8"], ["memo-8"]]
    lexical = asyncio.run(lr.ainvoke(QUERY, k=2, mode="lexical"))
    assert _ids(lexical) == [str(h.id) for h in sample_retriever.search(QUERY, 2, mode="lexical")]
    assert all(d.metadata["score"] >= 0 for d in lexical)

    # constructor and call refuse the same things alike; the list form of where is taken by both
    for bad in ({"k": 0}, {"k": -1}, {"mode": "fuzzy"}, {"where": {"year": {"~": 1}}}, {"filter": {"$or": []}}):
        with pytest.raises(InputError) as at_init:
            SemsearchRetriever(retriever=sample_retriever, **bad)
        with pytest.raises(InputError) as at_call:
            lr.invoke(QUERY, **bad)
        with pytest.raises(InputError) as at_acall:
            asyncio.run(lr.ainvoke(QUERY, **bad))
        assert str(at_init.value) == str(at_call.value) == str(at_acall.value)
    listed = SemsearchRetriever(retriever=sample_retriever, k=5, where=["year>=2010", "lang=en"])
    assert [d.metadata["doc_id"] for d in listed.invoke("loan decision")] == ["memo-7"]
    assert [d.metadata["doc_id"] for d in SemsearchRetriever(retriever=sample_retriever, search_kwargs={"k": 5, "filter": {"lang": "fr"}})
            .invoke("loan decision")] == ["memo-8"]
    with pytest.raises(InputError, match="not both"):
        lr.invoke(QUERY, where={"lang": "en"}, filter={"lang": "en"})
    with pytest.raises(InputError, match="unknown argument"):
        lr.invoke(QUERY, top_k=3)
    with pytest.raises(InputError, match="search_kwargs"):
        lr.invoke(QUERY, search_kwargs={"score_threshold": 0.5})


def test_langchain_ainvoke_runs_off_the_loop(sample_retriever):
    pytest.importorskip("langchain_core")
    from semsearch.integrations.langchain import SemsearchRetriever

    lr = SemsearchRetriever(retriever=Gated(sample_retriever), k=3)
    docs = off_the_loop(lr.retriever, lambda: lr.ainvoke(QUERY, k=2, where={"lang": "en"}))
    assert [d.metadata["doc_id"] for d in docs][:1] == ["memo-7"] and len(docs) == 1


@pytest.mark.skipif(not HAS_WHERE, reason="Retriever.search_batch has no `where` yet (issue #9)")
def test_langchain_concurrent_ainvoke_matches_serial(sample_retriever):
    """8 ainvoke calls at once, each with its own k and where, give what the same calls give one by one."""
    pytest.importorskip("langchain_core")
    from semsearch.integrations.langchain import SemsearchRetriever

    lr = SemsearchRetriever(retriever=sample_retriever, k=4)
    calls = [("loan decision", 1, {"lang": "fr"}), (QUERY, 3, None), ("loan decision", 5, {"year": {">=": 2024}}),
             ("bank news", 2, {"topic": "banking"}), ("savings account", 4, {"category": {"!=": "lending"}}),
             ("loan decision", 5, ["year>=2020", "lang=en"]), ("sourdough starter", 2, None),
             ("loan decision", 3, {"year": {"<": 2024}})]
    serial = [lr.invoke(q, k=k, where=w) for q, k, w in calls]

    async def together():
        return await asyncio.gather(*(lr.ainvoke(q, k=k, where=w) for q, k, w in calls))

    for _ in range(3):
        concurrent = asyncio.run(together())
        assert [[(d.id, d.page_content) for d in docs] for docs in concurrent] == \
               [[(d.id, d.page_content) for d in docs] for docs in serial]
    assert [len(s) for s in serial] == [1, 3, 1, 2, 4, 1, 2, 1]
    assert [d.metadata["doc_id"] for d in serial[2]] == ["memo-7"]
    assert all(d.metadata["topic"] == "banking" for d in serial[3])


def test_haystack_run_async(sample_retriever):
    pytest.importorskip("haystack")
    from semsearch.integrations.haystack import SemsearchRetriever

    comp = SemsearchRetriever(retriever=Gated(sample_retriever), top_k=3)
    comp._retriever.ticked.set()  # the gate waits for a tick: a sync call has no loop to give one
    sync = comp.run(query=QUERY, top_k=2)["documents"]
    out = off_the_loop(comp._retriever, lambda: comp.run_async(query=QUERY, top_k=2))["documents"]
    assert [(d.id, d.content, d.score) for d in out] == [(d.id, d.content, d.score) for d in sync]
    fr = off_the_loop(comp._retriever, lambda: comp.run_async(
        query="loan decision", filters={"field": "meta.lang", "operator": "==", "value": "fr"}))["documents"]
    assert [d.meta["doc_id"] for d in fr] == ["memo-8"]
    comp._retriever.ticked.set()
    assert [d.meta["doc_id"] for d in comp.run(query="loan decision", top_k=5, where=["year>=2024"])["documents"]] == ["memo-7"]
    with pytest.raises(InputError, match="not both"):
        asyncio.run(comp.run_async(query=QUERY, filters={"lang": "en"}, where={"lang": "en"}))
    with pytest.raises(InputError, match="positive"):
        asyncio.run(comp.run_async(query=QUERY, top_k=0))


def test_haystack_async_pipeline(sample_retriever):
    pytest.importorskip("haystack")
    import haystack

    from semsearch.integrations.haystack import SemsearchRetriever

    # Haystack 2 runs async components in AsyncPipeline; Haystack 3 in Pipeline.run_async
    p = getattr(haystack, "AsyncPipeline", haystack.Pipeline)()
    p.add_component("retriever", SemsearchRetriever(retriever=sample_retriever, top_k=2))
    out = asyncio.run(p.run_async({"retriever": {"query": QUERY}}))["retriever"]["documents"]
    assert [d.id for d in out] == [str(h.id) for h in sample_retriever.search(QUERY, 2)]


def test_llamaindex_aretrieve_runs_off_the_loop(sample_retriever):
    pytest.importorskip("llama_index.core")
    from llama_index.core.schema import QueryBundle

    from semsearch.integrations.llamaindex import SemsearchRetriever

    li = SemsearchRetriever(Gated(sample_retriever), similarity_top_k=3, where=["year>=2020"])
    nodes = off_the_loop(li._semsearch, lambda: li.aretrieve(QueryBundle("loan decision")))
    assert sorted(n.node.metadata["doc_id"] for n in nodes) == ["memo-7", "memo-8"]
    with pytest.raises(InputError):
        SemsearchRetriever(sample_retriever, similarity_top_k=0)


# ---- the LangChain vector store -----------------------------------------------------------------

NOTES = [("n1", "Loan decisions now take two business days.", {"lang": "en", "year": 2024, "team": "credit"}),
         ("n2", "Les décisions de prêt prennent deux jours.", {"lang": "fr", "year": 2023, "team": "credit"}),
         ("n3", "Simmer red lentils with cumin for twenty minutes.", {"lang": "en", "year": 2019, "team": "kitchen"}),
         ("n4", "Meteor showers come when Earth crosses a comet's trail.", {"lang": "en", "year": 2021, "team": "sky"})]


@pytest.fixture
def note_store(tmp_path, real_encoder):
    pytest.importorskip("langchain_core")
    from langchain_core.documents import Document

    from semsearch.integrations.langchain import SemsearchVectorStore

    store = SemsearchVectorStore.from_index(tmp_path / "notes", encoder=real_encoder)
    assert store.add_documents([Document(page_content=t, metadata=m) for _, t, m in NOTES], ids=[i for i, _, _ in NOTES]) == \
        [i for i, _, _ in NOTES]
    yield store
    store.retriever.close()


def test_vector_store_search_and_filters(note_store):
    from langchain_core.vectorstores import VectorStore

    assert isinstance(note_store, VectorStore)
    scored = note_store.similarity_search_with_score("How long does a loan decision take?", k=4)
    assert [d.id for d, _ in scored][0] == "n1" and len(scored) == 4
    scores = [s for _, s in scored]
    assert scores == sorted(scores, reverse=True) and all(-1 <= s <= 1 for s in scores)
    assert scored[0][0].metadata == NOTES[0][2] and scored[0][0].page_content == NOTES[0][1]
    exact = note_store.similarity_search_with_score(NOTES[2][1], k=1)[0]
    assert exact[0].id == "n3" and exact[1] == pytest.approx(1.0, abs=1e-4)

    def ids(**kw):
        return [d.id for d in note_store.similarity_search("loan decision", k=4, **kw)]

    assert ids(filter={"lang": "fr"}) == ["n2"]
    assert sorted(ids(filter={"year": {"$gte": 2021}})) == ["n1", "n2", "n4"]
    assert ids(filter={"$and": [{"team": {"$in": ["credit", "sky"]}}, {"lang": {"$ne": "fr"}}, {"year": {"$lt": 2024}}]}) == ["n4"]
    assert sorted(ids(filter=["year>=2020", "lang=en"])) == ["n1", "n4"]
    assert sorted(ids(where={"team": "kitchen"})) == ["n3"]
    assert ids(filter={"lang": "de"}) == []
    assert ids(mode="hybrid")[0] == ids(mode="lexical")[0] == "n1"
    with pytest.raises(InputError, match=r"\$or"):
        ids(filter={"$or": [{"lang": "fr"}, {"lang": "en"}]})
    with pytest.raises(InputError, match="unknown argument"):
        ids(fetch_k=10)

    # by vector: the store's own embeddings give the dense search's results
    qv = note_store.embeddings.embed_query("loan decision")
    assert [d.id for d in note_store.similarity_search_by_vector(qv, k=3)] == ids()[:3]
    assert [d.id for d in note_store.similarity_search_by_vector(qv, k=3, filter={"lang": "en"})] == ids(filter={"lang": "en"})[:3]
    with pytest.raises(InputError, match="dimensions"):
        note_store.similarity_search_by_vector([1.0, 0.0], k=1)
    relevance = note_store.similarity_search_with_relevance_scores("loan decision", k=4)
    assert all(0 <= r <= 1 for _, r in relevance)


def test_vector_store_as_retriever(note_store):
    r = note_store.as_retriever(search_kwargs={"k": 2, "filter": {"team": "credit"}})
    assert sorted(d.id for d in r.invoke("loan decision")) == ["n1", "n2"]
    assert [d.id for d in asyncio.run(r.ainvoke("loan decision"))] == [d.id for d in r.invoke("loan decision")]
    mmr = note_store.as_retriever(search_type="mmr", search_kwargs={"k": 3, "fetch_k": 4}).invoke("loan decision")
    assert len(mmr) == 3 and mmr[0].id == "n1" and len({d.id for d in mmr}) == 3
    high = note_store.as_retriever(search_type="similarity_score_threshold",
                                   search_kwargs={"k": 4, "score_threshold": 0.5}).invoke(NOTES[3][1])
    assert [d.id for d in high] == ["n4"]


def test_vector_store_long_documents_come_back_whole(note_store):
    from langchain_core.documents import Document

    words = " ".join(f"Clause {i}: the borrower repays the loan in equal monthly parts." for i in range(60))
    long = f"Terms of the loan agreement. {words} Signed in Lisbon."
    note_store.add_documents([Document(page_content=long, metadata={"kind": "contract"})], ids=["contract"])
    assert len(note_store.retriever.docs.get_chunks(range(1, 100))) > 5  # it was stored as several chunks
    got = note_store.get_by_ids(["contract", "missing", "n1"])
    assert [d.id for d in got] == ["contract", "n1"]
    assert got[0].page_content == long and got[0].metadata == {"kind": "contract"}
    hits = note_store.similarity_search("borrower repays the loan in monthly parts", k=3)
    assert [d.id for d in hits].count("contract") == 1 and len(hits) == 3  # one document, not its chunks
    assert next(d for d in hits if d.id == "contract").page_content == long
    note_store.delete(["contract", "never-there"])
    assert note_store.get_by_ids(["contract"]) == []
    assert "contract" not in [d.id for d in note_store.similarity_search("borrower repays the loan", k=5)]


def test_vector_store_async_off_the_loop_and_concurrent_writes(note_store):
    from langchain_core.documents import Document

    from semsearch.integrations.langchain import SemsearchVectorStore

    gated = SemsearchVectorStore(Gated(note_store.retriever))
    docs = off_the_loop(gated.retriever, lambda: gated.asimilarity_search("loan decision", k=2, filter={"lang": "en"}))
    assert [d.id for d in docs][0] == "n1"
    by_vec = off_the_loop(gated.retriever, lambda: gated.asimilarity_search_by_vector(
        gated.embeddings.embed_query("lentil soup"), k=1))
    assert [d.id for d in by_vec] == ["n3"]
    gated.retriever.ticked.set()

    # 8 writers at once from the event loop: each write waits its turn for the index
    async def add_all():
        return await asyncio.gather(*(note_store.aadd_documents([Document(page_content=f"Note {i} about topic {i}.",
                                                                          metadata={"batch": i})], ids=[f"c{i}"])
                                      for i in range(8)))

    assert asyncio.run(add_all()) == [[f"c{i}"] for i in range(8)]
    assert sorted(d.id for d in note_store.get_by_ids([f"c{i}" for i in range(8)])) == [f"c{i}" for i in range(8)]
    assert [d.id for d in asyncio.run(note_store.asimilarity_search("Note 5 about topic 5.", k=1))] == ["c5"]
    asyncio.run(note_store.adelete([f"c{i}" for i in range(8)]))
    assert asyncio.run(note_store.aget_by_ids(["c1", "n1"]))[0].id == "n1"


def test_vector_store_from_texts(real_encoder, tmp_path):
    pytest.importorskip("langchain_core")
    import gc

    from langchain_core.documents import Document
    from langchain_core.embeddings import DeterministicFakeEmbedding

    from semsearch.integrations.langchain import SemsearchEmbeddings, SemsearchVectorStore

    emb = SemsearchEmbeddings(real_encoder)
    store = SemsearchVectorStore.from_texts(["red lentil soup", "meteor showers"], emb, metadatas=[{"a": 1}, {"a": 2}], ids=["s", "m"])
    folder = store.folder
    assert folder.exists() and [d.id for d in store.similarity_search("comet debris", k=1)] == ["m"]
    store.retriever.close()
    del store
    gc.collect()
    assert not folder.exists()  # a store without a folder of its own keeps none

    kept = SemsearchVectorStore.from_documents([Document(page_content="sourdough starter", metadata={"b": 1}, id="bread")], emb,
                                               index=tmp_path / "kept")
    assert kept.get_by_ids(["bread"])[0].metadata == {"b": 1}
    again = SemsearchVectorStore.from_index(tmp_path / "kept", encoder=real_encoder)  # the folder holds it
    assert [d.id for d in again.similarity_search("bread", k=1)] == ["bread"]
    assert len(emb.embed_documents(["a", "b"])) == 2 and len(emb.embed_query("a")) == again.retriever.manifest.dim
    with pytest.raises(InputError, match="own model"):
        SemsearchVectorStore.from_texts(["x"], DeterministicFakeEmbedding(size=6))


def test_vector_store_over_a_corpus_index(sample_retriever):
    pytest.importorskip("langchain_core")
    from semsearch.integrations.langchain import SemsearchVectorStore

    store = SemsearchVectorStore(sample_retriever, mode="hybrid")
    docs = store.similarity_search(QUERY, k=3)
    hits = sample_retriever.search(QUERY, k=3, mode="hybrid")
    assert [d.id for d in docs] == [h.path[len("api:"):] if h.path.startswith("api:") else str(h.id) for h in hits]
    csv = next(d for d in docs if d.metadata.get("source", "").endswith("bank_faq.csv"))
    assert csv.metadata["category"] == "lending" and "location" in csv.metadata and "score" not in csv.metadata
