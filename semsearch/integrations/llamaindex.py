"""A semsearch index as a LlamaIndex retriever and vector store (`pip install 'semsearch[llamaindex]'`).

    from semsearch.integrations.llamaindex import SemsearchRetriever, SemsearchVectorStore
    retriever = SemsearchRetriever.from_index("indexes/default", similarity_top_k=4)
    nodes = retriever.retrieve("loan approval")     # list[NodeWithScore], each a TextNode
    nodes = await retriever.aretrieve("loan approval")  # the same, off the event loop

    store = SemsearchVectorStore.from_index("indexes/notes")   # made empty if the folder has no index
    index = VectorStoreIndex.from_vector_store(store, embed_model=store.embed_model)
    index.as_query_engine(llm=...).query("loan approval")

Searches and writes are blocking calls; the async methods run them on worker threads, never on
the event loop.
"""
from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from semsearch.errors import InputError
from semsearch.integrations.common import (check_k, check_mode, check_where, hit_metadata, open_or_create, open_retriever,
                                           require, search,
                                           where_from_comparisons)
from semsearch.store.folder import writer_lock

require("llama_index.core.retrievers", "llamaindex")

from llama_index.core.base.embeddings.base import BaseEmbedding  # noqa: E402
from llama_index.core.bridge.pydantic import PrivateAttr  # noqa: E402
from llama_index.core.retrievers import BaseRetriever  # noqa: E402
from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore, QueryBundle, TextNode  # noqa: E402
from llama_index.core.vector_stores.types import (BasePydanticVectorStore, MetadataFilters, VectorStoreQuery,  # noqa: E402
                                                  VectorStoreQueryMode, VectorStoreQueryResult)
from llama_index.core.vector_stores.utils import metadata_dict_to_node, node_to_metadata_dict  # noqa: E402


class SemsearchRetriever(BaseRetriever):
    """LlamaIndex retriever over a semsearch `Retriever`. `filters` (LlamaIndex MetadataFilters,
    AND of ==, !=, >, >=, <, <=, in, nin) or semsearch's own `where` (a dict, or a list of
    conditions like ["year>=2010", "lang=en"]) narrow the search."""

    def __init__(self, retriever, similarity_top_k: int = 4, mode: str | None = None,
                 filters: MetadataFilters | None = None, where: Any = None, **kwargs: Any) -> None:
        if filters is not None and where is not None:
            raise InputError("give `filters` or `where`, not both")
        self._semsearch = retriever
        self.similarity_top_k = check_k(similarity_top_k)
        self.mode = check_mode(mode)
        self.where = check_where(where_from_filters(filters) if filters is not None else where)
        super().__init__(**kwargs)

    @classmethod
    def from_index(cls, index: str | os.PathLike | None = None, device: str = "auto", **kwargs: Any) -> "SemsearchRetriever":
        """A retriever over an index folder (default: $SEMSEARCH_INDEX or ./indexes/default)."""
        return cls(open_retriever(index, device), **kwargs)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        hits = search(self._semsearch, [query_bundle.query_str], self.similarity_top_k, self.mode, self.where)[0]
        return [NodeWithScore(node=TextNode(text=h.text, id_=str(h.id), metadata=hit_metadata(h)), score=h.score) for h in hits]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        """_retrieve on a worker thread: aretrieve never blocks the event loop."""
        return await asyncio.to_thread(self._retrieve, query_bundle)


def comparisons_from_filters(filters: MetadataFilters) -> list[tuple[str, str, Any]]:
    """(field, operator, value) comparisons from LlamaIndex MetadataFilters joined by AND (nested
    AND filters are flattened); InputError for OR and NOT, which semsearch's `where` cannot express."""
    condition = str(getattr(filters.condition, "value", filters.condition) or "and").lower()
    if condition != "and":
        raise InputError(f"only AND filters map to semsearch's where, not {condition.upper()} "
                         "(semsearch's where is an AND of comparisons)")
    out: list[tuple[str, str, Any]] = []
    for f in filters.filters:
        if isinstance(f, MetadataFilters):
            out += comparisons_from_filters(f)
        else:
            out.append((f.key, getattr(f.operator, "value", f.operator), f.value))
    return out


def where_from_filters(filters: MetadataFilters) -> dict[str, Any]:
    """semsearch's `where` from LlamaIndex MetadataFilters (AND of plain comparisons)."""
    return where_from_comparisons(comparisons_from_filters(filters))


class SemsearchEmbedding(BaseEmbedding):
    """A semsearch encoder as a LlamaIndex embedding model (L2-normalised vectors; queries through
    the encoder's trained query layers where it has them). Give it to `VectorStoreIndex(...,
    embed_model=...)` over a `SemsearchVectorStore`: the vectors LlamaIndex computes are then in
    the index's own space (`store.embed_model` is the one for a store)."""

    _encoder: Any = PrivateAttr()

    def __init__(self, encoder, embed_batch_size: int = 32, **kwargs: Any) -> None:
        super().__init__(model_name=f"semsearch:{getattr(encoder, 'name', type(encoder).__name__)}",
                         embed_batch_size=embed_batch_size, **kwargs)
        self._encoder = encoder

    @classmethod
    def class_name(cls) -> str:
        return "SemsearchEmbedding"

    @classmethod
    def load(cls, model: str | None = None, device: str = "auto", precision: str = "auto") -> "SemsearchEmbedding":
        """The bundled model (or `model`) as an embedding model."""
        from semsearch.encoder import Encoder

        return cls(Encoder(model, device=device, precision=precision))

    @property
    def encoder(self):
        return self._encoder

    def _get_query_embedding(self, query: str) -> list[float]:
        from semsearch.search import encode_queries

        return np.asarray(encode_queries(self._encoder, [query])[0], np.float32).tolist()

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._get_text_embeddings([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        return np.asarray(self._encoder.encode(list(texts), progress=False), np.float32).tolist()

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return await asyncio.to_thread(self._get_query_embedding, query)

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return await asyncio.to_thread(self._get_text_embedding, text)

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return await asyncio.to_thread(self._get_text_embeddings, texts)


# LlamaIndex query modes -> semsearch's search modes ("mmr": maximal marginal relevance, done here).
QUERY_MODES = {VectorStoreQueryMode.DEFAULT: "dense", VectorStoreQueryMode.HYBRID: "hybrid",
               VectorStoreQueryMode.TEXT_SEARCH: "lexical", VectorStoreQueryMode.SPARSE: "lexical",
               VectorStoreQueryMode.MMR: "mmr"}
NODE_ID_KEY = "_node_id"  # the node's id among its stored metadata: what VectorStoreQuery.node_ids filters on
SAME_MODEL = 0.9  # the least cosine between a node's embedding and the index model's one of the same text
QUERY_KWARGS = ("mmr_prefetch_k",)


class SemsearchVectorStore(BasePydanticVectorStore):
    """A LlamaIndex vector store over a semsearch index folder (`stores_text`: the index keeps each
    node's text, metadata and relationships; LlamaIndex's own docstore is not needed).

    Writing. Each node is one semsearch document whose id is the node id (`add` upserts: a node
    id added again replaces that node). Its text (`node.get_content(MetadataMode.NONE)`) is
    chunked and embedded with the index's own model; a node longer than the model's window is
    stored as several chunks and found by its best one. Its metadata is stored as LlamaIndex's
    stores store it (the node's own fields, plus `ref_doc_id` / `doc_id` / `document_id`,
    `_node_content` and `_node_type`, and `_node_id`), so `MetadataFilters` apply to the node's
    metadata and to `ref_doc_id`, and a query gives the node back as it was added.
    `delete(ref_doc_id)` removes every node of that source document; `delete_nodes`, `get_nodes`
    and `clear` concern the nodes the index holds as documents (not the chunks of files indexed
    with `semsearch index`). Each write is one new index generation under the index's writer lock.

    Embeddings. The index always embeds with its own model: embeddings that LlamaIndex computed
    for the nodes are not stored. They are checked instead: a node embedding of another dimension,
    or unlike the index model's embedding of the same text, is refused with an InputError (another
    model's vectors never enter the index silently). Give `VectorStoreIndex` the index's model,
    `embed_model=store.embed_model` (a `SemsearchEmbedding`).

    Querying. `query_str` and `query_embedding` may both come (VectorIndexRetriever sends both):
    where the query has text, the store searches by the text, embedded here with the index's own
    model (the vector is not used: the text is what hybrid and lexical search need, and it is
    always in the index's space); only a query without text is searched by its vector (dense or
    MMR), which must come from the index's model (`SemsearchEmbedding`). Modes: DEFAULT -> dense
    (cosine similarity), HYBRID -> semsearch's hybrid (convex fusion; `alpha` is the dense share,
    as in LlamaIndex: 1 all vector, 0 all BM25; `hybrid_top_k`, where given, is the number of
    results), TEXT_SEARCH and SPARSE -> lexical (BM25; `sparse_top_k`, where given, is the number
    of results), MMR -> maximal marginal relevance among the closest nodes (`mmr_threshold`,
    default 0.5; query kwarg `mmr_prefetch_k`, default max(4 k, 20)). Other modes are refused.
    `filters` (AND of ==, !=, >, >=, <, <=, in, nin; nested AND groups too) become semsearch's
    `where`; OR, NOT and other operators are refused with an InputError. `doc_ids` restricts to
    those ref_doc_ids, `node_ids` to those nodes (an empty list, as VectorIndexRetriever sends
    for stores that keep text, restricts nothing; at most 1024 ids, semsearch's limit). Each
    result is a node with its best chunk's score; chunks of files the index holds from `semsearch
    index` are found too, as TextNodes whose id is the chunk id.

    `is_embedding_query` stays True (LlamaIndex embeds each query, as for any store); set it to
    False to skip that embedding, which this store does not use when the query has text.
    """

    stores_text: bool = True
    is_embedding_query: bool = True
    flat_metadata: bool = False

    _retriever: Any = PrivateAttr()
    _embed_model: Any = PrivateAttr(default=None)

    def __init__(self, retriever, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._retriever = retriever

    @classmethod
    def class_name(cls) -> str:
        return "SemsearchVectorStore"

    @classmethod
    def from_index(cls, index: str | os.PathLike | None = None, device: str = "auto", encoder=None,
                   create: bool = True, **kwargs: Any) -> "SemsearchVectorStore":
        """A store over an index folder (default: $SEMSEARCH_INDEX or ./indexes/default); a folder
        without an index becomes an empty one (the bundled model, or `encoder`) unless `create` is False."""
        return cls(open_or_create(index, device, encoder, create), **kwargs)

    @property
    def client(self):
        """The semsearch Retriever this store searches."""
        return self._retriever

    @property
    def retriever(self):
        return self._retriever

    @property
    def folder(self) -> Path:
        return self._retriever.folder

    @property
    def embed_model(self) -> SemsearchEmbedding:
        """The index's own model as a LlamaIndex embedding model (for `VectorStoreIndex(embed_model=...)`)."""
        if self._embed_model is None:
            self._embed_model = SemsearchEmbedding(self._retriever.encoder)
        return self._embed_model

    # ---- writing ---------------------------------------------------------------------------------
    def add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        """Add or replace nodes by id; gives back their ids."""
        from semsearch.documents import Document, upsert_documents

        if kwargs:
            raise InputError(f"unknown argument(s) {sorted(kwargs)} to add")
        nodes = list(nodes)
        if not nodes:
            return []
        self._check_embeddings(nodes)
        docs = []
        for node in nodes:
            meta = node_to_metadata_dict(node, remove_text=True, flat_metadata=self.flat_metadata)
            meta[NODE_ID_KEY] = node.node_id
            docs.append(Document(node.node_id, node.get_content(metadata_mode=MetadataMode.NONE), meta))
        with writer_lock(self.folder):
            upsert_documents(self.folder, docs, self._retriever.encoder)
            self._retriever.refresh()
        return [node.node_id for node in nodes]

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Remove every node of the source document `ref_doc_id`."""
        if delete_kwargs:
            raise InputError(f"unknown argument(s) {sorted(delete_kwargs)} to delete")
        if not isinstance(ref_doc_id, str) or not ref_doc_id:
            raise InputError(f"delete takes a ref_doc_id (a non-empty string), got {ref_doc_id!r}")
        self._delete_where(lambda: self._ids_where({"ref_doc_id": ref_doc_id}))

    def delete_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None,
                     **delete_kwargs: Any) -> None:
        """Remove nodes by id, or those that match `filters`, or (both given) those of `node_ids`
        that match `filters`. Ids the index does not hold are passed over. Refused with neither
        (clear() removes every node)."""
        if delete_kwargs:
            raise InputError(f"unknown argument(s) {sorted(delete_kwargs)} to delete_nodes")
        if node_ids is None and filters is None:
            raise InputError("delete_nodes takes node_ids or filters (clear() removes every node)")
        self._delete_where(lambda: self._select(node_ids, filters))

    def clear(self) -> None:
        """Remove every node (every document added by id; chunks of indexed files stay)."""
        self._delete_where(self._all_ids)

    def get_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None) -> list[BaseNode]:
        """The stored nodes with these ids (in that order; ids the index does not hold are left
        out), or those that match `filters`, or both; every node with neither."""
        from semsearch.documents import stored_documents

        r = self._current()
        ids = self._all_ids() if node_ids is None and filters is None else self._select(node_ids, filters)
        return [_node(d.id, d.text, d.metadata) for d in stored_documents(r.docs, ids).values()]

    # ---- querying --------------------------------------------------------------------------------
    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        unknown = sorted(set(kwargs) - set(QUERY_KWARGS))
        if unknown:
            raise InputError(f"unknown argument(s) {unknown} to query; it takes {', '.join(QUERY_KWARGS)}")
        asked = str(getattr(query.mode, "value", query.mode))
        try:
            mode = QUERY_MODES.get(VectorStoreQueryMode(asked))
        except ValueError:
            mode = None
        if mode is None:
            raise InputError(f"query mode {asked!r} is not supported by SemsearchVectorStore; "
                             f"supported: {', '.join(m.value for m in QUERY_MODES)}")
        k = check_k(query.similarity_top_k)
        if mode == "hybrid" and query.hybrid_top_k is not None:
            k = check_k(query.hybrid_top_k)
        if mode == "lexical" and query.sparse_top_k is not None:
            k = check_k(query.sparse_top_k)
        where = self._where(query.filters, query.doc_ids, query.node_ids)
        text = query.query_str if isinstance(query.query_str, str) and query.query_str.strip() else None
        r = self._current()
        if mode in ("hybrid", "lexical"):
            if text is None:
                raise InputError(f"a {asked} query needs query_str (the text to search for)")
            alpha = None if mode == "lexical" else query.alpha
            found = self._best(lambda n: r.search_batch([text], n, mode=mode, where=where, alpha=alpha)[0], k)
        elif mode == "dense" and text is not None:  # the search's own path: what Retriever.search gives
            found = self._best(lambda n: r.search_batch([text], n, mode="dense", where=where)[0], k)
        else:  # by vector: a query without text, or MMR
            if text is not None:
                from semsearch.search import encode_queries

                qv = np.asarray(encode_queries(r.encoder, [text]), np.float32).reshape(1, -1)
            elif query.query_embedding is not None:
                qv = self._query_vector(query.query_embedding)
            else:
                raise InputError("the query has neither query_str nor query_embedding")
            if mode == "dense":
                found = self._best(lambda n: r.search_vectors(qv, n, where)[0], k)
            else:
                prefetch = kwargs.get("mmr_prefetch_k")
                prefetch = max(k, check_k(prefetch) if prefetch is not None else max(4 * k, 20))
                found = self._mmr(r, qv, self._best(lambda n: r.search_vectors(qv, n, where)[0], prefetch), k,
                                  query.mmr_threshold)
        return self._result(r, found)

    # ---- the async side: each call on a worker thread ------------------------------------------
    async def async_add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        return await asyncio.to_thread(self.add, nodes, **kwargs)

    async def adelete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        await asyncio.to_thread(self.delete, ref_doc_id, **delete_kwargs)

    async def adelete_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None,
                            **delete_kwargs: Any) -> None:
        await asyncio.to_thread(self.delete_nodes, node_ids, filters, **delete_kwargs)

    async def aget_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None) -> list[BaseNode]:
        return await asyncio.to_thread(self.get_nodes, node_ids, filters)

    async def aclear(self) -> None:
        await asyncio.to_thread(self.clear)

    async def aquery(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        return await asyncio.to_thread(self.query, query, **kwargs)

    # ---- helpers ---------------------------------------------------------------------------------
    def _current(self):
        """The Retriever, on the index's newest generation (search() checks on its own; the
        vector and docstore paths do not)."""
        r = self._retriever
        if r.auto_refresh:
            r.refresh()
        return r

    def _check_embeddings(self, nodes: list[BaseNode]) -> None:
        """InputError where a node brings an embedding that is not the index model's: of another
        dimension, or (for the first such node: one encoder pass) unlike the model's embedding of
        the same text as LlamaIndex embeds it."""
        given = [n for n in nodes if n.embedding is not None]
        if not given:
            return
        dim = self._retriever.manifest.dim
        hint = ("the index embeds nodes with its own model: give VectorStoreIndex embed_model=store.embed_model "
                "(a SemsearchEmbedding), or add nodes without embeddings")
        for n in given:
            if len(n.embedding) != dim:
                raise InputError(f"node {n.node_id!r} has an embedding of {len(n.embedding)} dimensions; the index's model "
                                 f"gives {dim}: {hint}")
        probe = given[0]
        v = np.asarray(probe.embedding, np.float64)
        ours = np.asarray(self._retriever.encoder.encode([probe.get_content(metadata_mode=MetadataMode.EMBED)],
                                                         progress=False)[0], np.float64)
        norm = float(np.linalg.norm(v) * np.linalg.norm(ours))
        if not np.isfinite(norm) or norm == 0 or float(v @ ours) / norm < SAME_MODEL:
            raise InputError(f"node {probe.node_id!r} has an embedding from another model than the index's "
                             f"({getattr(self._retriever.encoder, 'name', '?')}): {hint}")

    def _where(self, filters: MetadataFilters | None, doc_ids: list[str] | None, node_ids: list[str] | None) -> dict | None:
        comparisons = comparisons_from_filters(filters) if filters is not None else []
        if doc_ids:
            comparisons.append(("ref_doc_id", "in", list(doc_ids)))
        if node_ids:
            comparisons.append((NODE_ID_KEY, "in", list(node_ids)))
        return check_where(where_from_comparisons(comparisons)) if comparisons else None

    def _ids_where(self, where: Any) -> list[str]:
        """The ids of the documents the index holds whose chunks `where` lets through."""
        from semsearch import filters
        from semsearch.documents import doc_id_of

        r = self._current()
        flt = filters.parse(where)
        if flt is None:  # no condition: every document
            return self._all_ids()
        chunk_ids = flt.select(r.docs).ids.tolist()
        out: dict[str, None] = {}
        for at in range(0, len(chunk_ids), 500):
            for c in r.docs.get_chunks(chunk_ids[at : at + 500]).values():
                i = doc_id_of(c["path"])
                if i is not None:
                    out[i] = None
        return list(out)

    def _all_ids(self) -> list[str]:
        from semsearch.documents import doc_id_of

        return [i for i in (doc_id_of(p) for p in self._current().docs.files()) if i is not None]

    def _select(self, node_ids: list[str] | None, filters: MetadataFilters | None) -> list[str]:
        """node_ids (strings only, in order), narrowed to those that match `filters` where given."""
        ids = [i for i in dict.fromkeys(node_ids) if isinstance(i, str) and i] if node_ids is not None else None
        if filters is None:
            return ids or []
        matching = self._ids_where(self._where(filters, None, None) or {})
        if ids is None:
            return matching
        keep = set(matching)
        return [i for i in ids if i in keep]

    def _delete_where(self, ids_of: Callable[[], list[str]]) -> None:
        """Remove the documents ids_of() names, worked out under the writer lock (on the newest generation)."""
        from semsearch.documents import delete_documents

        with writer_lock(self.folder):
            ids = ids_of()
            if ids:
                delete_documents(self.folder, ids, missing_ok=True)
                self._retriever.refresh()

    def _query_vector(self, embedding: Sequence[float]) -> np.ndarray:
        qv = np.asarray(embedding, np.float32).reshape(1, -1)
        dim = self._retriever.manifest.dim
        if qv.shape[1] != dim:
            raise InputError(f"the query embedding has {qv.shape[1]} dimensions; the index's have {dim} "
                             "(embed queries with store.embed_model)")
        norm = float(np.linalg.norm(qv))
        if not np.isfinite(norm) or norm == 0:
            raise InputError("the query embedding must be finite and not all zeros")
        return qv / norm

    def _best(self, run: Callable[[int], list], k: int) -> list:
        """The best hit of each of the k best nodes: `run(n)` gives the n best chunks; more are
        asked for while chunks of one node crowd others out of the first k."""
        from semsearch.documents import doc_id_of

        n, size = k, len(self._retriever)
        while True:
            hits = run(n)
            best: dict[Any, Any] = {}
            for h in hits:
                best.setdefault(h.path if doc_id_of(h.path) is not None else h.id, h)
            if len(best) >= k or len(hits) < n or n >= size:
                return list(best.values())[:k]
            n = min(n * 4, size)

    def _mmr(self, r, qv: np.ndarray, found: list, k: int, threshold: float | None) -> list:
        """k of `found` (hits) by maximal marginal relevance on their stored vectors; each hit's
        score becomes its MMR score."""
        from llama_index.core.indices.query.embedding_utils import get_top_k_mmr_embeddings

        if not found:
            return []
        ids, vecs = r.docs.get_vectors([h.id for h in found])
        at = {int(i): j for j, i in enumerate(ids)}
        found = [h for h in found if h.id in at]
        scores, chosen = get_top_k_mmr_embeddings(qv[0].tolist(), [vecs[at[h.id]].tolist() for h in found],
                                                  similarity_top_k=k, embedding_ids=list(range(len(found))),
                                                  mmr_threshold=threshold)
        out = []
        for s, j in zip(scores, chosen):
            h = found[j]
            h.score = float(s)
            out.append(h)
        return out

    def _result(self, r, hits: list) -> VectorStoreQueryResult:
        from semsearch.documents import doc_id_of, stored_documents

        whole = stored_documents(r.docs, [i for i in (doc_id_of(h.path) for h in hits) if i is not None])
        nodes: list[BaseNode] = []
        for h in hits:
            i = doc_id_of(h.path)
            if i is None:  # a chunk of a file
                nodes.append(TextNode(id_=str(h.id), text=h.text,
                                      metadata={k: v for k, v in hit_metadata(h).items() if k != "score"}))
            elif i in whole:
                nodes.append(_node(i, whole[i].text, whole[i].metadata))
            else:  # removed by a write since the search: what the search saw
                nodes.append(_node(i, h.text, h.metadata))
        return VectorStoreQueryResult(nodes=nodes, similarities=[float(h.score) for h in hits], ids=[n.node_id for n in nodes])


def _node(doc_id: str, text: str, metadata: dict[str, Any]) -> BaseNode:
    """The node a stored document stands for: as it was added where this store added it, else a
    TextNode of the document's text and metadata."""
    if "_node_content" in metadata:
        try:
            return metadata_dict_to_node(metadata, text)
        except (ValueError, TypeError):
            pass  # not a node's JSON after all: a plain node below
    return TextNode(id_=doc_id, text=text, metadata=dict(metadata))


__all__ = ["SemsearchEmbedding", "SemsearchRetriever", "SemsearchVectorStore", "comparisons_from_filters",
           "where_from_filters"]
