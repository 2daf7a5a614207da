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
