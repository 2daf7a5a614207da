"""SemsearchDocumentStore against Haystack's own standard document-store suites
(`haystack.testing.document_store` and its async twin), and in a Haystack Pipeline with a
DocumentWriter and SemsearchRetriever; each test on a real index (the real model, FAISS, SQLite)
in its own folder. The model is loaded once (conftest's real_encoder); an empty index costs
milliseconds."""
from __future__ import annotations

import inspect

import pytest

pytest.importorskip("haystack")

from haystack import Document, Pipeline  # noqa: E402
from haystack.components.writers import DocumentWriter  # noqa: E402
from haystack.dataclasses import ByteStream, SparseEmbedding  # noqa: E402
from haystack.document_stores.errors import DuplicateDocumentError  # noqa: E402
from haystack.document_stores.types import DuplicatePolicy  # noqa: E402
from haystack.errors import FilterError  # noqa: E402
from haystack.testing.document_store import (CountDocumentsByFilterTest, CountUniqueMetadataByFilterTest,  # noqa: E402
                                             DocumentStoreBaseExtendedTests, GetMetadataFieldMinMaxTest,
                                             GetMetadataFieldsInfoTest, GetMetadataFieldUniqueValuesTest,
                                             create_filterable_docs)
from haystack.utils.filters import document_matches_filter  # noqa: E402

from semsearch.errors import InputError  # noqa: E402
from semsearch.integrations.haystack import (RESERVED, SemsearchDocumentStore, SemsearchRetriever,  # noqa: E402
                                             _pushdown)

ASYNC_SUITES = ()
try:  # the async suites need pytest-asyncio (the project's test extra has it, through langchain-tests)
    import pytest_asyncio  # noqa: F401
    from haystack.testing.document_store_async import (CountDocumentsAsyncTest, CountDocumentsByFilterAsyncTest,
                                                       CountUniqueMetadataByFilterAsyncTest, DeleteAllAsyncTest,
                                                       DeleteByFilterAsyncTest, DeleteDocumentsAsyncTest,
                                                       FilterDocumentsAsyncTest, GetMetadataFieldMinMaxAsyncTest,
                                                       GetMetadataFieldsInfoAsyncTest, GetMetadataFieldUniqueValuesAsyncTest,
                                                       UpdateByFilterAsyncTest, WriteDocumentsAsyncTest)

    ASYNC_SUITES = (CountDocumentsAsyncTest, CountDocumentsByFilterAsyncTest, CountUniqueMetadataByFilterAsyncTest,
                    DeleteAllAsyncTest, DeleteByFilterAsyncTest, DeleteDocumentsAsyncTest, FilterDocumentsAsyncTest,
                    GetMetadataFieldMinMaxAsyncTest, GetMetadataFieldsInfoAsyncTest, GetMetadataFieldUniqueValuesAsyncTest,
                    UpdateByFilterAsyncTest, WriteDocumentsAsyncTest)
except ImportError:
    pass

NO_RECREATE = ("semsearch has no recreate_index: delete_all_documents removes the store's documents and keeps the "
               "index (its model, settings and any chunks of files indexed from a corpus)")
TRUST = {"allowed_modules": ["semsearch.integrations.haystack", "haystack"]} \
    if "allowed_modules" in inspect.signature(Pipeline.from_dict).parameters else {}


@pytest.fixture
def document_store(tmp_path, real_encoder):
    store = SemsearchDocumentStore(index=tmp_path / "idx", encoder=real_encoder, device="cpu")
    try:
        yield store
    finally:
        store.close()


class TestSemsearchDocumentStoreStandard(DocumentStoreBaseExtendedTests, CountDocumentsByFilterTest,
                                        CountUniqueMetadataByFilterTest, GetMetadataFieldsInfoTest,
                                        GetMetadataFieldMinMaxTest, GetMetadataFieldUniqueValuesTest):
    """Haystack's base and extended suites, and every optional sync suite the store implements."""

    @pytest.fixture
    def document_store(self, document_store):
        return document_store

    def test_write_documents(self, document_store):
        """DuplicatePolicy.NONE (the default) acts as FAIL, as in Haystack's in-memory store."""
        doc = Document(content="test doc", meta={"lang": "en"})
        assert document_store.write_documents([doc]) == 1
        self.assert_documents_are_equal(document_store.filter_documents(), [doc])
        with pytest.raises(DuplicateDocumentError):
            document_store.write_documents([doc])
        assert document_store.count_documents() == 1

    @pytest.mark.skip(reason=NO_RECREATE)
    def test_delete_all_documents_without_recreate_index(self, document_store):
        pass

    @pytest.mark.skip(reason=NO_RECREATE)
    def test_delete_all_documents_with_recreate_index(self, document_store):
        pass


if ASYNC_SUITES:
    class TestSemsearchDocumentStoreAsync(*ASYNC_SUITES):
        """Haystack's async suites: each *_async method runs the sync one on a worker thread."""

        @pytest.fixture
        def document_store(self, document_store):
            return document_store

        @pytest.mark.asyncio
        async def test_write_documents_async(self, document_store):
            doc = Document(content="test doc")
            assert await document_store.write_documents_async([doc]) == 1
            with pytest.raises(DuplicateDocumentError):
                await document_store.write_documents_async([doc])
            self.assert_documents_are_equal(await document_store.filter_documents_async(), [doc])

        @pytest.mark.skip(reason=NO_RECREATE)
        async def test_delete_all_documents_without_recreate_index_async(self, document_store):
            pass

        @pytest.mark.skip(reason=NO_RECREATE)
        async def test_delete_all_documents_with_recreate_index_async(self, document_store):
            pass


# ---- beyond the standard suites -------------------------------------------------------------------
NOTES = [
    Document(content="The bank approved the loan after checking the credit score.", meta={"topic": "finance", "year": 2021}),
    Document(content="Mortgage rates fell for the third month in a row.", meta={"topic": "finance", "year": 2023}),
    Document(content="Simmer lentils with onion and cumin for twenty minutes.", meta={"topic": "cooking", "year": 2022}),
    Document(content="Meteor showers happen when Earth crosses a comet's debris trail.", meta={"topic": "space", "year": 2020}),
]


def test_pipeline_writer_and_retriever(document_store):
    """A DocumentWriter writes into the store through a Pipeline; a retriever over the store finds
    the written documents whole; both survive Pipeline.to_dict / from_dict."""
    writing = Pipeline()
    writing.add_component("writer", DocumentWriter(document_store=document_store, policy=DuplicatePolicy.OVERWRITE))
    assert writing.run({"writer": {"documents": NOTES}})["writer"]["documents_written"] == len(NOTES)
    assert document_store.count_documents() == len(NOTES)

    searching = Pipeline()
    searching.add_component("retriever", SemsearchRetriever(document_store=document_store, top_k=2))
    found = searching.run({"retriever": {"query": "how do home loan interest rates change"}})["retriever"]["documents"]
    assert [d.id for d in found] == [NOTES[1].id, NOTES[0].id]
    assert found[0].content == NOTES[1].content and found[0].meta == NOTES[1].meta
    assert found[0].score >= found[1].score

    # a filter with OR, which semsearch's where has no form for, applied exactly
    either = {"operator": "OR", "conditions": [{"field": "meta.topic", "operator": "==", "value": "space"},
                                               {"field": "meta.year", "operator": "<", "value": 2023}]}
    got = searching.run({"retriever": {"query": "mortgage rates", "filters": either, "top_k": 10}})["retriever"]["documents"]
    assert sorted(d.id for d in got) == sorted(d.id for d in NOTES if document_matches_filter(either, d))

    again = Pipeline.from_dict(searching.to_dict(), **TRUST)
    assert again.to_dict() == searching.to_dict()
    assert again.to_dict()["components"]["retriever"]["init_parameters"]["document_store"]["type"] == \
        "semsearch.integrations.haystack.SemsearchDocumentStore"
    redo = again.run({"retriever": {"query": "how do home loan interest rates change"}})["retriever"]["documents"]
    assert [d.id for d in redo] == [d.id for d in found]
    writer_again = Pipeline.from_dict(writing.to_dict(), **TRUST)
    new = Document(content="Comets leave trails of dust behind them.", meta={"topic": "space", "year": 2024})
    assert writer_again.run({"writer": {"documents": [new]}})["writer"]["documents_written"] == 1
    assert document_store.count_documents() == len(NOTES) + 1  # the same folder, seen by the first store


@pytest.mark.asyncio
async def test_async_writer_and_retriever(document_store):
    writer = DocumentWriter(document_store=document_store)
    assert (await writer.run_async(documents=NOTES))["documents_written"] == len(NOTES)
    found = (await SemsearchRetriever(document_store=document_store, top_k=1).run_async(query="lentil soup recipe"))["documents"]
    assert [d.id for d in found] == [NOTES[2].id]


def test_fields_round_trip(document_store):
    """Everything a text Document carries comes back as written: embedding, sparse embedding,
    score, meta of every JSON type (ISO dates as strings, lists, None, nested), and content that
    the chunks alone would not give back (blanks around it; several chunks)."""
    long_text = " ".join(f"Sentence {i} about the quarterly report and its many figures." for i in range(120))
    docs = [
        Document(id="a", content="  padded text\n\n", meta={"date": "2024-05-01T10:00:00", "tags": ["x", "y"], "none": None,
                                                           "nested": {"a": {"b": [1, 2.5, True]}}, "big": 2 ** 62},
                 embedding=[0.1, -0.2, 0.3], sparse_embedding=SparseEmbedding(indices=[1, 7], values=[0.5, 0.25]), score=0.75),
        Document(id="b", content=long_text, meta={"n": 1.0}),
        Document(id="c", content="plain text", meta={}),
    ]
    assert document_store.write_documents(docs) == 3
    assert document_store.filter_documents() == docs
    assert len([h for h in document_store.retriever.search("quarterly report figures", k=50) if h.path == "api:b"]) > 1
    # content is kept beside the metadata only where the chunks would change it
    stored = {d.id: d.metadata for d in _stored(document_store, ["a", "b", "c"])}
    assert stored["a"][RESERVED]["content"] == docs[0].content
    assert RESERVED not in stored["c"] and "content" not in stored["b"].get(RESERVED, {})
    # a store over the same folder, made from to_dict, sees them as written
    other = SemsearchDocumentStore.from_dict(document_store.to_dict())
    try:
        assert other.filter_documents({"field": "id", "operator": "in", "value": ["a", "c"]}) == [docs[0], docs[2]]
    finally:
        other.close()


def _stored(store, ids):
    from semsearch.documents import stored_documents

    return list(stored_documents(store.retriever.docs, ids).values())


def test_refuses_what_it_cannot_keep(document_store):
    """What the store cannot keep is refused (nothing of the call written), never dropped."""
    from datetime import datetime

    ok = Document(id="ok", content="fine")
    bad = [
        (Document(id="x", content=None), "no content"),
        (Document(id="x", content="text", blob=ByteStream(b"%PDF")), "blob"),
        (Document(id="x", content="text", meta={"when": datetime(2024, 1, 1)}), "not plain JSON"),
        (Document(id="x", content="text", meta={"pair": (1, 2)}), "JSON would change"),
        (Document(id="x", content="text", meta={RESERVED: 1}), "store's own"),
        (Document(id="x", content="text", meta={"n": float("nan")}), "not plain JSON"),
        (Document(id="x", content="   "), "no text"),
        (Document(id="a\nb", content="text"), "control characters"),
    ]
    for doc, message in bad:
        with pytest.raises(InputError, match=message):
            document_store.write_documents([ok, doc])
    assert document_store.count_documents() == 0
    with pytest.raises(ValueError):
        document_store.write_documents([ok, "not a document"])
    with pytest.raises(InputError, match="list of ids"):
        document_store.delete_documents("ok")


def test_duplicates_in_one_call(document_store):
    first, second = Document(id="d", content="first text"), Document(id="d", content="second text")
    with pytest.raises(DuplicateDocumentError):
        document_store.write_documents([first, second], policy=DuplicatePolicy.FAIL)
    assert document_store.count_documents() == 0
    assert document_store.write_documents([first, second], policy=DuplicatePolicy.SKIP) == 1
    assert document_store.filter_documents() == [first]
    assert document_store.write_documents([first, second], policy=DuplicatePolicy.OVERWRITE) == 2
    assert document_store.filter_documents() == [second]
    # FAIL writes nothing when one of several is held already
    with pytest.raises(DuplicateDocumentError, match="'d'"):
        document_store.write_documents([Document(id="e", content="new text"), first], policy=DuplicatePolicy.FAIL)
    assert document_store.count_documents() == 1
    assert document_store.write_documents([], policy=DuplicatePolicy.FAIL) == 0


TRICKY = [
    Document(id="s2020", content="year as text", meta={"year": "2020", "kind": "a"}),
    Document(id="n2020", content="year as number", meta={"year": 2020, "kind": "b"}),
    Document(id="f2020", content="year as float", meta={"year": 2020.0, "kind": ["a", "b"]}),
    Document(id="t", content="a flag true", meta={"year": True, "kind": "a"}),
    Document(id="one", content="the number one", meta={"year": 1, "kind": None}),
    Document(id="iso", content="a date", meta={"when": "2024-05-01T10:00:00", "kind": "a"}),
    Document(id="iso2", content="the same date spelt otherwise", meta={"when": "2024-05-01 10:00:00+00:00", "kind": "b"}),
    Document(id="none", content="no fields at all"),
    Document(id="nest", content="nested meta", meta={"a": {"b": 3}, "a.b": 4, "kind": "c"}),
]


@pytest.mark.parametrize("flt", [
    {"field": "meta.year", "operator": "==", "value": 2020},
    {"field": "meta.year", "operator": "==", "value": "2020"},
    {"field": "meta.year", "operator": "==", "value": 1},
    {"field": "meta.year", "operator": "==", "value": True},
    {"field": "meta.year", "operator": "in", "value": [2020.0, "x"]},
    {"field": "meta.year", "operator": "!=", "value": 2020},
    {"field": "meta.year", "operator": "not in", "value": ["2020", 1]},
    {"field": "meta.kind", "operator": "==", "value": None},
    {"field": "meta.when", "operator": "==", "value": "2024-05-01T10:00:00+00:00"},
    {"field": "meta.when", "operator": ">=", "value": "2024-05-01T09:00:00"},
    {"field": "meta.a.b", "operator": "==", "value": 3},
    {"field": "content", "operator": "==", "value": "a date"},
    {"field": "id", "operator": "in", "value": ["t", "none"]},
    {"operator": "AND", "conditions": [{"field": "meta.kind", "operator": "==", "value": "a"},
                                       {"operator": "NOT", "conditions": [{"field": "meta.year", "operator": "==", "value": 1}]}]},
    {"operator": "AND", "conditions": [{"field": "meta.kind", "operator": "in", "value": ["a", "b"]},
                                       {"operator": "OR", "conditions": [{"field": "meta.year", "operator": "==", "value": 2020},
                                                                         {"field": "meta.when", "operator": "!=", "value": None}]}]},
])
def test_filters_are_exact(tricky_store, flt):
    """filter_documents gives exactly what Haystack's document_matches_filter gives, also where
    semsearch's `where` is looser ("2020" == 2020, true == 1) and where it has no form (dates,
    nested fields, OR, NOT)."""
    want = [d for d in TRICKY if document_matches_filter(flt, d)]
    assert tricky_store.filter_documents(flt) == want
    assert tricky_store.count_documents_by_filter(flt) == len(want)
    found = tricky_store.search("text", top_k=len(TRICKY), filters=flt)
    assert sorted(d.id for d in found) == sorted(d.id for d in want)


@pytest.fixture(scope="module")
def tricky_store(tmp_path_factory, real_encoder):
    store = SemsearchDocumentStore(index=tmp_path_factory.mktemp("hs-tricky") / "idx", encoder=real_encoder, device="cpu")
    store.write_documents(TRICKY)
    yield store
    store.close()


def test_pushdown_only_narrows():
    """What goes to semsearch's `where`: == and in on top-level meta fields under AND, with values
    its equality covers; nothing from OR / NOT, ranges, !=, dates, None or nested fields."""
    f = {"operator": "AND", "conditions": [
        {"field": "meta.kind", "operator": "==", "value": "a"},
        {"field": "meta.year", "operator": "in", "value": [2020, "2021"]},
        {"field": "meta.when", "operator": "==", "value": "2024-05-01"},
        {"field": "meta.n", "operator": ">", "value": 3},
        {"field": "meta.m", "operator": "!=", "value": "x"},
        {"field": "meta.a.b", "operator": "==", "value": 3},
        {"field": "meta.z", "operator": "==", "value": None},
        {"operator": "OR", "conditions": [{"field": "meta.o", "operator": "==", "value": "p"}]},
    ]}
    assert _pushdown(f) == {"kind": ["a"], "year": [2020, "2021"]}
    assert _pushdown({"operator": "NOT", "conditions": [{"field": "meta.kind", "operator": "==", "value": "a"}]}) is None


def test_malformed_filters_fail_on_an_empty_store(document_store):
    for bad in ({"conditions": []}, {"operator": "AND"}, {"operator": "XOR", "conditions": []},
                {"field": "meta.a", "operator": "~", "value": 1}, {"field": "meta.a", "operator": "in", "value": "ab"},
                {"operator": "AND", "conditions": [{"field": "meta.a", "value": 1}]}):
        with pytest.raises(FilterError):
            document_store.filter_documents(bad)


def test_search_fills_top_k_past_filtered_chunks(document_store):
    """A filter checked in Python (NOT) still gives top_k documents when the best chunks fail it;
    a long document counts once."""
    docs = [Document(id=f"loan-{i}", content=f"Loan application number {i} was approved by the bank.", meta={"i": i})
            for i in range(12)]
    docs.append(Document(id="long", content=" ".join(["The bank approves loans after credit checks."] * 80), meta={"i": 99}))
    document_store.write_documents(docs)
    keep = {"operator": "NOT", "conditions": [{"field": "meta.i", "operator": "<", "value": 9}]}
    found = document_store.search("bank loan approval", top_k=4, filters=keep, mode="dense")
    assert sorted(d.id for d in found) == ["loan-10", "loan-11", "loan-9", "long"]
    assert all(d.score is not None for d in found)
    assert len({d.id for d in document_store.search("bank loan approval", top_k=13)}) == 13


def test_index_retriever_hides_the_store_key(document_store):
    """The plain retriever over the same index gives chunks, without the store's own meta key."""
    document_store.write_documents([Document(id="e", content="Embedded note on loans.", meta={"lang": "en"},
                                             embedding=[0.5, 0.5])])
    out = SemsearchRetriever(retriever=document_store.retriever, top_k=1).run(query="loans")["documents"]
    assert out[0].meta["doc_id"] == "e" and out[0].meta["lang"] == "en" and RESERVED not in out[0].meta


def test_update_keeps_other_fields(document_store):
    doc = Document(id="u", content="to be updated", meta={"a": 1}, embedding=[1.0, 2.0], score=0.5)
    document_store.write_documents([doc])
    assert document_store.update_by_filter({"field": "meta.a", "operator": "==", "value": 1}, {"b": "x"}) == 1
    (got,) = document_store.filter_documents()
    assert got.meta == {"a": 1, "b": "x"} and got.embedding == [1.0, 2.0] and got.score == 0.5 and got.content == doc.content


def test_retriever_arguments(document_store):
    with pytest.raises(InputError, match="not both"):
        SemsearchRetriever(document_store=document_store, index="somewhere")
    with pytest.raises(InputError, match="SemsearchDocumentStore"):
        SemsearchRetriever(document_store=object())
    document_store.write_documents(create_filterable_docs()[:6])
    r = SemsearchRetriever(document_store=document_store, top_k=3, filters={"field": "meta.chapter", "operator": "==", "value": "intro"})
    assert [d.meta["chapter"] for d in r.run(query="foo document")["documents"]] == ["intro"]
    # a per-call `where` (semsearch's) replaces the component's filters
    got = r.run(query="foo document", where={"chapter": "abstract"})["documents"]
    assert [d.meta["chapter"] for d in got] == ["abstract"]
