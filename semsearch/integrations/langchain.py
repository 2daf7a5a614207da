"""A semsearch index as a LangChain retriever and vector store (`pip install 'semsearch[langchain]'`).

    from semsearch.integrations.langchain import SemsearchRetriever, SemsearchVectorStore
    retriever = SemsearchRetriever.from_index("indexes/default", k=4)
    docs = retriever.invoke("loan approval")        # list[langchain_core.documents.Document]

    store = SemsearchVectorStore.from_index("indexes/notes")   # made empty if the folder has no index
    store.add_documents([Document(page_content="...", metadata={"lang": "en"})], ids=["note-1"])
    store.similarity_search("loan approval", k=4, filter={"lang": "en"})

Searches and writes are blocking calls; the async methods run them on worker threads, never on
the event loop.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import uuid
import weakref
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from semsearch.errors import InputError
from semsearch.store.folder import writer_lock
from semsearch.integrations.common import (check_k, check_mode, check_where, hit_metadata, open_or_create, open_retriever,
                                           require, search,
                                           where_from_langchain)

require("langchain_core.retrievers", "langchain")

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from langchain_core.embeddings import Embeddings  # noqa: E402
from langchain_core.retrievers import BaseRetriever  # noqa: E402
from langchain_core.runnables.config import run_in_executor  # noqa: E402
from langchain_core.vectorstores import VectorStore  # noqa: E402
from pydantic import ConfigDict  # noqa: E402

SEARCH_KEYS = ("k", "mode", "where", "filter")  # what search_kwargs may hold


def resolve_search_args(k: Any = None, mode: str | None = None, where: Any = None, filter: Any = None,
                        search_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """{k, mode, where} given by a caller in any of LangChain's spellings, each checked (InputError
    otherwise); only those given. `filter` (LangChain's metadata filter) becomes `where`; arguments
    given directly win over the same ones in `search_kwargs`."""
    given: dict[str, Any] = {}
    if search_kwargs is not None:
        if not isinstance(search_kwargs, dict):
            raise InputError(f"search_kwargs must be a dict, got {type(search_kwargs).__name__}")
        unknown = sorted(set(search_kwargs) - set(SEARCH_KEYS))
        if unknown:
            raise InputError(f"search_kwargs {unknown} not supported; supported: {', '.join(SEARCH_KEYS)}")
        given.update(resolve_search_args(**search_kwargs))
    if where is not None and filter is not None:
        raise InputError("give `where` or `filter`, not both")
    if filter is not None:
        where = where_from_langchain(filter)
    if k is not None:
        given["k"] = check_k(k)
    if mode is not None:
        given["mode"] = check_mode(mode)
    if where is not None:
        given["where"] = check_where(where)
    return given


class SemsearchRetriever(BaseRetriever):
    """LangChain retriever over a semsearch `Retriever`: invoke / ainvoke / batch / abatch give
    Documents (page_content = the chunk's text; metadata = the user's columns plus source,
    location, offsets, score; id = the chunk id). `k`, `mode` and `where` (or `filter`, LangChain's
    metadata filter, or `search_kwargs={"k": .., "filter": ..}`) are set on the retriever and may
    be overridden per call: `retriever.invoke("query", k=3, filter={"lang": "en"})`."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    retriever: Any  # a semsearch.Retriever
    k: int = 4
    mode: str | None = None
    where: Any = None  # a dict, one condition string, or a list of them: see semsearch.filters

    def __init__(self, **data: Any) -> None:
        args = resolve_search_args(data.pop("k", None), data.pop("mode", None), data.pop("where", None),
                                   data.pop("filter", None), data.pop("search_kwargs", None))
        super().__init__(**data, **args)

    @classmethod
    def from_index(cls, index: str | os.PathLike | None = None, device: str = "auto", **kwargs: Any) -> "SemsearchRetriever":
        """A retriever over an index folder (default: $SEMSEARCH_INDEX or ./indexes/default)."""
        return cls(retriever=open_retriever(index, device), **kwargs)

    def _call_args(self, kwargs: dict[str, Any]) -> tuple[int, str | None, Any]:
        kwargs.pop("verbose", None)  # LangChain's own, passed along by invoke
        unknown = sorted(set(kwargs) - {*SEARCH_KEYS, "search_kwargs"})
        if unknown:
            raise InputError(f"unknown argument(s) {unknown}; a call takes k, mode, where, filter or search_kwargs")
        args = {"k": self.k, "mode": self.mode, "where": self.where, **resolve_search_args(**kwargs)}
        return args["k"], args["mode"], args["where"]

    def _search(self, query: str, k: int, mode: str | None, where: Any) -> list[Document]:
        hits = search(self.retriever, [query], k, mode, where)[0]
        return [Document(page_content=h.text, metadata=hit_metadata(h), id=str(h.id)) for h in hits]

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **kwargs: Any) -> list[Document]:
        return self._search(query, *self._call_args(kwargs))

    async def _aget_relevant_documents(self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun,
                                       **kwargs: Any) -> list[Document]:
        args = self._call_args(kwargs)  # bad arguments fail here, before a thread is taken
        return await run_in_executor(None, self._search, query, *args)


class SemsearchEmbeddings(Embeddings):
    """A semsearch encoder as LangChain `Embeddings` (L2-normalised vectors; queries through the
    encoder's trained query layers where it has them)."""

    def __init__(self, encoder) -> None:
        self.encoder = encoder

    @classmethod
    def load(cls, model: str | None = None, device: str = "auto", precision: str = "auto") -> "SemsearchEmbeddings":
        """The bundled model (or `model`) as Embeddings."""
        from semsearch.encoder import Encoder

        return cls(Encoder(model, device=device, precision=precision))

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        return np.asarray(self.encoder.encode(list(texts), progress=False), np.float32).tolist()

    def embed_query(self, text: str) -> list[float]:
        from semsearch.search import encode_queries

        return np.asarray(encode_queries(self.encoder, [text])[0], np.float32).tolist()

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        return await run_in_executor(None, self.embed_documents, texts)

    async def aembed_query(self, text: str) -> list[float]:
        return await run_in_executor(None, self.embed_query, text)


class SemsearchVectorStore(VectorStore):
    """A LangChain vector store over a semsearch index folder.

    Documents are upserted by id (`add_documents` / `add_texts`, ids from the `ids` argument, else
    each Document's `id`, else new UUIDs), chunked and embedded with the index's own model, and
    come back whole (`page_content` as added, from its first to its last token; `metadata` as
    added; `id`). A document longer than the model's window is stored as several chunks and found
    by its best one. `filter` takes LangChain's metadata filters ({"lang": "en"},
    {"year": {"$gte": 2020}}, {"$and": [...]}) or semsearch's `where`. Searches are dense by
    default (`mode="hybrid"` or `"lexical"` per store or per call); `similarity_search_with_score`
    gives the cosine similarity (higher is closer). Chunks the index holds from files (`semsearch
    index CORPUS`) are found too, as Documents whose id is the chunk id and whose metadata also
    names their source. Each write is one new index generation under the index's writer lock:
    searches go on meanwhile, against the previous one."""

    def __init__(self, retriever, mode: str = "dense") -> None:
        self._retriever = retriever
        self.mode = check_mode(mode)
        self._embeddings = SemsearchEmbeddings(retriever.encoder)

    # ---- making one ----------------------------------------------------------------------------
    @classmethod
    def from_index(cls, index: str | os.PathLike | None = None, device: str = "auto", encoder=None,
                   mode: str = "dense", create: bool = True) -> "SemsearchVectorStore":
        """A store over an index folder (default: $SEMSEARCH_INDEX or ./indexes/default); a folder
        without an index becomes an empty one (the bundled model, or `encoder`) unless `create` is False."""
        return cls(open_or_create(index, device, encoder, create), mode=mode)

    @classmethod
    def from_texts(cls, texts: list[str], embedding: Embeddings | None = None, metadatas: list[dict] | None = None, *,
                   ids: list[str] | None = None, index: str | os.PathLike | None = None, device: str = "auto",
                   mode: str = "dense", **kwargs: Any) -> "SemsearchVectorStore":
        """A store holding `texts`: in the index folder `index` (made if needed, added to if it
        holds one), or, without `index`, in a new temporary folder that is removed when the store
        is garbage-collected. `embedding` may be None or a SemsearchEmbeddings (its encoder builds
        a new index): the index always embeds with its own model."""
        encoder = _encoder_of(embedding)
        ephemeral = None
        if index is None:
            ephemeral = index = Path(tempfile.mkdtemp(prefix="semsearch-")) / "index"
        try:
            store = cls.from_index(index, device=device, encoder=encoder, mode=mode)
        except BaseException:
            if ephemeral is not None:
                shutil.rmtree(ephemeral.parent, ignore_errors=True)
            raise
        if ephemeral is not None:
            weakref.finalize(store, shutil.rmtree, str(ephemeral.parent), True)
        if texts:
            store.add_texts(texts, metadatas, ids=ids, **kwargs)
        return store

    @property
    def embeddings(self) -> SemsearchEmbeddings:
        return self._embeddings

    @property
    def retriever(self):
        """The semsearch Retriever this store searches."""
        return self._retriever

    @property
    def folder(self) -> Path:
        return self._retriever.folder

    # ---- writing ---------------------------------------------------------------------------------
    def add_documents(self, documents: list[Document], **kwargs: Any) -> list[str]:
        """Add or replace documents by id; gives back their ids."""
        from semsearch.documents import Document as ApiDocument, upsert_documents

        ids = kwargs.pop("ids", None)
        if kwargs:
            raise InputError(f"unknown argument(s) {sorted(kwargs)} to add_documents")
        documents = list(documents)
        if ids is not None and len(ids) != len(documents):
            raise InputError(f"{len(ids)} ids for {len(documents)} documents")
        ids = [(ids[i] if ids is not None and ids[i] is not None else d.id) or uuid.uuid4().hex
               for i, d in enumerate(documents)]
        if not documents:
            return []
        docs = [ApiDocument(i, d.page_content, dict(d.metadata or {})) for i, d in zip(ids, documents)]
        with writer_lock(self.folder):
            upsert_documents(self.folder, docs, self._retriever.encoder)
            self._retriever.refresh()
        return ids

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        """Remove documents by id (ids the index does not hold are passed over)."""
        from semsearch.documents import delete_documents

        if kwargs:
            raise InputError(f"unknown argument(s) {sorted(kwargs)} to delete")
        if ids is None:
            raise InputError("delete takes the ids of the documents to remove")
        if not ids:
            return True
        with writer_lock(self.folder):
            delete_documents(self.folder, list(ids), missing_ok=True)
            self._retriever.refresh()
        return True

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The documents with these ids, in that order; ids the index does not hold are left out."""
        from semsearch.documents import stored_documents

        r = self._current()
        found = stored_documents(r.docs, [i for i in ids if isinstance(i, str)])
        return [Document(page_content=d.text, metadata=d.metadata, id=d.id) for d in found.values()]

    # ---- searching -------------------------------------------------------------------------------
    def similarity_search(self, query: str, k: int = 4, filter: Any = None, **kwargs: Any) -> list[Document]:
        return [d for d, _ in self.similarity_search_with_score(query, k, filter, **kwargs)]

    def similarity_search_with_score(self, query: str, k: int = 4, filter: Any = None,
                                     **kwargs: Any) -> list[tuple[Document, float]]:
        """(Document, score) best first: the cosine similarity in mode dense (the default), the
        fused score in hybrid, BM25 in lexical. Also takes `where` and `mode`."""
        k, mode, where = self._args(k, filter, kwargs)
        return self._documents(lambda n: search(self._retriever, [query], n, mode, where)[0], k)

    def similarity_search_by_vector(self, embedding: list[float], k: int = 4, filter: Any = None,
                                    **kwargs: Any) -> list[Document]:
        return [d for d, _ in self.similarity_search_with_score_by_vector(embedding, k, filter, **kwargs)]

    def similarity_search_with_score_by_vector(self, embedding: list[float], k: int = 4, filter: Any = None,
                                               **kwargs: Any) -> list[tuple[Document, float]]:
        """Dense search for a query vector (the index's dimension; normalised here)."""
        k, _, where = self._args(k, filter, kwargs, modes=False)
        qv = self._query_vector(embedding)
        r = self._current()
        return self._documents(lambda n: r.search_vectors(qv, n, where)[0], k)

    def max_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
                                      filter: Any = None, **kwargs: Any) -> list[Document]:
        qv = np.asarray(self._embeddings.embed_query(query), np.float32)
        return self.max_marginal_relevance_search_by_vector(qv.tolist(), k, fetch_k, lambda_mult, filter, **kwargs)

    def max_marginal_relevance_search_by_vector(self, embedding: list[float], k: int = 4, fetch_k: int = 20,
                                                lambda_mult: float = 0.5, filter: Any = None, **kwargs: Any) -> list[Document]:
        """`k` documents among the `fetch_k` closest, each chosen for closeness to the query less
        likeness to those already chosen (maximal marginal relevance, on the stored vectors)."""
        from langchain_core.vectorstores.utils import maximal_marginal_relevance

        k, _, where = self._args(k, filter, kwargs, modes=False)
        fetch_k = max(check_k(fetch_k), k)
        qv = self._query_vector(embedding)
        r = self._current()
        found = self._documents(lambda n: r.search_vectors(qv, n, where)[0], fetch_k, keep_hits=True)
        if not found:
            return []
        ids, vecs = r.docs.get_vectors([h.id for _, h in found])
        at = {int(i): j for j, i in enumerate(ids)}
        found = [(d, h) for d, h in found if h.id in at]
        chosen = maximal_marginal_relevance(qv[0], vecs[[at[h.id] for _, h in found]], lambda_mult, k)
        return [found[i][0] for i in chosen]

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        """Relevance in [0, 1] for similarity_search_with_relevance_scores and score_threshold:
        the cosine similarity (dense) or fused score (hybrid), clipped to [0, 1]."""
        return lambda score: min(1.0, max(0.0, float(score)))

    # ---- the async side: each call on a worker thread ------------------------------------------
    async def aadd_documents(self, documents: list[Document], **kwargs: Any) -> list[str]:
        return await run_in_executor(None, self.add_documents, documents, **kwargs)

    async def aadd_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None, *,
                         ids: list[str] | None = None, **kwargs: Any) -> list[str]:
        return await run_in_executor(None, self.add_texts, list(texts), metadatas, ids=ids, **kwargs)

    async def adelete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        return await run_in_executor(None, self.delete, ids, **kwargs)

    async def aget_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        return await run_in_executor(None, self.get_by_ids, ids)

    async def asimilarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return await run_in_executor(None, self.similarity_search, query, k, **kwargs)

    async def asimilarity_search_with_score(self, query: str, k: int = 4, **kwargs: Any) -> list[tuple[Document, float]]:
        return await run_in_executor(None, self.similarity_search_with_score, query, k, **kwargs)

    async def asimilarity_search_by_vector(self, embedding: list[float], k: int = 4, **kwargs: Any) -> list[Document]:
        return await run_in_executor(None, self.similarity_search_by_vector, embedding, k, **kwargs)

    async def amax_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
                                             **kwargs: Any) -> list[Document]:
        return await run_in_executor(None, self.max_marginal_relevance_search, query, k, fetch_k, lambda_mult, **kwargs)

    # ---- helpers ---------------------------------------------------------------------------------
    def _current(self):
        """The Retriever, on the index's newest generation (search() checks on its own; the
        vector and docstore paths do not)."""
        r = self._retriever
        if r.auto_refresh:
            r.refresh()
        return r

    def _args(self, k: Any, filter: Any, kwargs: dict[str, Any], modes: bool = True) -> tuple[int, str, Any]:
        allowed = {"where", "mode"} if modes else {"where"}
        unknown = sorted(set(kwargs) - allowed)
        if unknown:
            raise InputError(f"unknown argument(s) {sorted(unknown)}; a search takes k, filter, {', '.join(sorted(allowed))}")
        args = resolve_search_args(k, kwargs.get("mode"), kwargs.get("where"), filter)
        return args["k"], args.get("mode", self.mode), args.get("where")

    def _query_vector(self, embedding: Sequence[float]) -> np.ndarray:
        qv = np.asarray(embedding, np.float32).reshape(1, -1)
        dim = self._retriever.manifest.dim
        if qv.shape[1] != dim:
            raise InputError(f"the query vector has {qv.shape[1]} dimensions; the index's have {dim}")
        norm = float(np.linalg.norm(qv))
        if not np.isfinite(norm) or norm == 0:
            raise InputError("the query vector must be finite and not all zeros")
        return qv / norm

    def _documents(self, run: Callable[[int], list], k: int, keep_hits: bool = False) -> list[tuple[Document, Any]]:
        """The best hit of each of the k best documents: `run(n)` gives the n best chunks; more are
        asked for while chunks of one document crowd others out of the first k."""
        from semsearch.documents import doc_id_of, stored_documents

        n = k
        while True:
            hits = run(n)
            best: dict[Any, Any] = {}
            for h in hits:
                best.setdefault(h.path if doc_id_of(h.path) is not None else h.id, h)
            if len(best) >= k or len(hits) < n or n >= len(self._retriever):
                break
            n = min(n * 4, len(self._retriever))
        top = list(best.values())[:k]
        whole = stored_documents(self._retriever.docs, [doc_id_of(h.path) for h in top if doc_id_of(h.path) is not None])
        out = []
        for h in top:
            i = doc_id_of(h.path)
            if i is None:  # a chunk of a file
                meta = {key: v for key, v in hit_metadata(h).items() if key != "score"}
                doc = Document(page_content=h.text, metadata=meta, id=str(h.id))
            elif i in whole:
                doc = Document(page_content=whole[i].text, metadata=whole[i].metadata, id=i)
            else:  # removed by a write since the search: what the search saw
                doc = Document(page_content=h.text, metadata=h.metadata, id=i)
            out.append((doc, h if keep_hits else h.score))
        return out


def _encoder_of(embedding: Any):
    """The semsearch encoder behind `embedding` (None for None); InputError for another model's."""
    if embedding is None:
        return None
    if isinstance(embedding, SemsearchEmbeddings):
        return embedding.encoder
    raise InputError(f"SemsearchVectorStore embeds with its index's own model; pass embedding=None or a SemsearchEmbeddings, "
                     f"not {type(embedding).__name__}")
