"""A long-lived reader beside a writer: a Retriever or a server's Service loaded while a writer
publishes opens the newer generation at its next search, and a server labels each answer with the
generation its hits came from (FakeEncoder, real FAISS and SQLite files)."""
from __future__ import annotations

from pathlib import Path

import semsearch.search
from semsearch.documents import Document, delete_documents, upsert_documents
from semsearch.indexing import index_corpus
from semsearch.search import Retriever
from semsearch.service import Service

from conftest import FakeEncoder


def _index(tmp_path, small_corpus):
    folder = tmp_path / "idx"
    enc = FakeEncoder()
    index_corpus(small_corpus, folder, enc, progress=False)
    upsert_documents(folder, [Document("kelp", "kelp forests grow fast in cold water", {})], enc)
    return folder, enc


def _texts(hits):
    return [h.text for h in hits]


def test_a_generation_published_while_a_retriever_loads_is_searched(tmp_path, small_corpus, monkeypatch):
    """The document is deleted while load() builds its encoder (after the manifest was read):
    the Retriever's first search must not answer from the generation it loaded."""
    folder, enc = _index(tmp_path, small_corpus)

    def slow_encoder(*args, **kwargs):  # a writer publishes while the (real: ~4 s) encoder loads
        delete_documents(folder, ["kelp"])
        return enc

    monkeypatch.setattr(semsearch.search, "_query_encoder", slow_encoder)
    r = Retriever.load(folder)
    assert r.manifest.generation == 2  # what load() read: the kelp document is in it
    for _ in range(3):
        assert "kelp forests grow fast in cold water" not in _texts(r.search("kelp forests", k=5, mode="lexical"))
    assert r.manifest.generation == 3


def test_a_service_loaded_during_a_write_serves_the_newer_generation(tmp_path, small_corpus, monkeypatch):
    folder, enc = _index(tmp_path, small_corpus)
    real_load = Retriever.load.__func__

    def load_then_write(cls, *args, **kwargs):
        r = real_load(cls, *args, **kwargs)
        delete_documents(folder, ["kelp"])  # published after the load read its manifest
        return r

    monkeypatch.setattr(Retriever, "load", classmethod(load_then_write))
    svc = Service(folder, encoder=enc)
    monkeypatch.undo()
    gen, results = svc.search(["kelp forests"], 5, "lexical", None)
    assert gen == 3 and "kelp forests grow fast in cold water" not in _texts(results[0])


def test_a_service_labels_answers_with_the_generation_searched(tmp_path, small_corpus):
    """A generation published between the Service's check and the Retriever's own refresh: the
    hits come from the newer one, and so must the label."""
    folder, enc = _index(tmp_path, small_corpus)
    svc = Service(folder, encoder=enc)
    gen, results = svc.search(["kelp forests"], 5, "lexical", None)
    assert gen == 2 and "kelp forests grow fast in cold water" in _texts(results[0])
    checked = svc.retriever

    def retriever_then_write():
        r = checked()
        delete_documents(folder, ["kelp"])
        return r

    svc.retriever = retriever_then_write
    gen, results = svc.search(["kelp forests"], 5, "lexical", None)
    assert "kelp forests grow fast in cold water" not in _texts(results[0])
    assert gen == 3
    upsert_documents(folder, [Document("kelp", "kelp forests grow fast in cold water", {})], enc)
    svc.retriever = checked
    for explain in (False, True):
        gen, results = svc.search(["kelp forests"], 5, "lexical", None, explain=explain)
        assert gen == 4 and "kelp forests grow fast in cold water" in _texts(results[0])


def test_search_at_names_the_generation_of_its_hits(tmp_path, small_corpus):
    folder, enc = _index(tmp_path, small_corpus)
    r = Retriever.load(folder, encoder=enc)
    assert r.search_at(["kelp"], 3, mode="lexical")[0] == 2
    delete_documents(folder, ["kelp"])
    gen, hits = r.search_at(["kelp"], 3, mode="lexical")
    assert gen == 3 and hits == [[]]
    assert Path(r.search("meteor comet", k=1, mode="lexical")[0].path).name == "space.txt"
