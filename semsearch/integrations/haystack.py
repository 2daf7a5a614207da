"""A semsearch index as a Haystack 2 retriever component and document store (`pip install 'semsearch[haystack]'`).

    from semsearch.integrations.haystack import SemsearchDocumentStore, SemsearchRetriever
    retriever = SemsearchRetriever(index="indexes/default", top_k=4)
    retriever.run(query="loan approval")["documents"]       # list[haystack.Document]
    await retriever.run_async(query="loan approval")      # the same, off the event loop (AsyncPipeline)

    store = SemsearchDocumentStore(index="indexes/notes")   # made empty if the folder has no index
    store.write_documents([Document(content="...", meta={"lang": "en"})], policy=DuplicatePolicy.OVERWRITE)
    store.filter_documents({"field": "meta.lang", "operator": "==", "value": "en"})
    SemsearchRetriever(document_store=store, top_k=4).run(query="loan approval")
"""
from __future__ import annotations

import asyncio
import json
import os
from typing import Any, Callable, Iterable

from semsearch.errors import InputError
from semsearch.integrations.common import (check_k, check_mode, check_where, hit_metadata, open_or_create, open_retriever,
                                           require, search,
                                           where_from_comparisons)
from semsearch.store.folder import writer_lock

require("haystack", "haystack")

from haystack import Document, component, default_from_dict, default_to_dict  # noqa: E402
from haystack.dataclasses import SparseEmbedding  # noqa: E402
from haystack.document_stores.errors import DuplicateDocumentError  # noqa: E402
from haystack.document_stores.types import DuplicatePolicy  # noqa: E402
from haystack.errors import FilterError  # noqa: E402
from haystack.utils.filters import document_matches_filter  # noqa: E402

# The stored-metadata key that holds what a Haystack Document has beyond content and meta
# (embedding, sparse_embedding, score; content itself where the chunks cannot give it back exactly).
RESERVED = "_haystack"
COMPARISONS = ("==", "!=", ">", ">=", "<", "<=", "in", "not in")
LOGIC = ("AND", "OR", "NOT")
BATCH = 500  # ids per docstore read


@component
class SemsearchRetriever:
    """Haystack retriever over a semsearch index, or over a SemsearchDocumentStore.

    Over an index (`index=` or `retriever=`), it gives chunks (content = the chunk's text, meta =
    the user's columns plus source, location, offsets); `filters` in Haystack's syntax (AND of
    comparisons on `meta.*` fields) become semsearch's `where`, and a dict without "operator" is
    taken as a `where` already. Over a store (`document_store=`), it gives the store's documents
    whole, as written, each with its best chunk's score; `filters` may then be any Haystack filter
    (see SemsearchDocumentStore.search)."""

    def __init__(self, index: str | None = None, top_k: int = 10, mode: str | None = None,
                 filters: dict[str, Any] | None = None, device: str = "auto", retriever=None,
                 document_store: "SemsearchDocumentStore | None" = None):
        if document_store is not None:
            if not isinstance(document_store, SemsearchDocumentStore):
                raise InputError(f"document_store must be a SemsearchDocumentStore, not {type(document_store).__name__}")
            if index is not None or retriever is not None:
                raise InputError("give `document_store`, or `index` / `retriever`, not both")
        self.index = None if index is None else os.fspath(index)
        self.top_k = check_k(top_k)
        self.mode = check_mode(mode)
        self.filters = filters
        self.device = device
        self.document_store = document_store
        self._retriever = retriever

    def warm_up(self) -> None:
        """Load the index and its model (Pipeline.run calls this before the first run)."""
        if self._retriever is None and self.document_store is None:
            self._retriever = open_retriever(self.index, self.device)

    def to_dict(self) -> dict[str, Any]:
        extra = {} if self.document_store is None else {"document_store": self.document_store.to_dict()}
        return default_to_dict(self, index=self.index, top_k=self.top_k, mode=self.mode, filters=self.filters,
                               device=self.device, **extra)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SemsearchRetriever":
        params = data.get("init_parameters", {})
        if isinstance(params.get("document_store"), dict):
            params["document_store"] = _store_from_dict(params["document_store"])
        return default_from_dict(cls, data)

    @component.output_types(documents=list[Document])
    def run(self, query: str, filters: dict[str, Any] | None = None, top_k: int | None = None,
            mode: str | None = None, where: Any = None) -> dict[str, list[Document]]:
        """The top_k best chunks (or, over a store, documents) for query. `filters` (Haystack's) or
        `where` (semsearch's; not both), `top_k` and `mode` given here win over the component's own."""
        args = self._args(filters, top_k, mode, where)
        self.warm_up()
        return self._run(query, *args)

    @component.output_types(documents=list[Document])
    async def run_async(self, query: str, filters: dict[str, Any] | None = None, top_k: int | None = None,
                        mode: str | None = None, where: Any = None) -> dict[str, list[Document]]:
        """run() for AsyncPipeline: the search (and, the first time, loading the index) runs on a
        worker thread, not on the event loop."""
        args = self._args(filters, top_k, mode, where)
        if self._retriever is None and self.document_store is None:
            await asyncio.to_thread(self.warm_up)
        return await asyncio.to_thread(self._run, query, *args)

    def _args(self, filters, top_k, mode, where) -> tuple[int, str | None, Any, dict[str, Any] | None]:
        """(k, mode, where, Haystack filters to apply exactly: only over a store)."""
        if filters is not None and where is not None:
            raise InputError("give `filters` or `where`, not both")
        exact = None
        if where is None:
            f = filters if filters is not None else self.filters
            if f and self.document_store is not None and ("operator" in f or "field" in f):
                exact = f  # the store pushes down what it can and checks the rest itself
            else:
                where = where_from_haystack(f) if f else None
        return (check_k(self.top_k if top_k is None else top_k), check_mode(mode if mode is not None else self.mode),
                None if where is None else check_where(where), exact)

    def _run(self, query: str, k: int, mode: str | None, where: Any, exact: dict[str, Any] | None) -> dict[str, list[Document]]:
        if self.document_store is not None:
            return {"documents": self.document_store.search(query, k, filters=exact, mode=mode, where=where)}
        hits = search(self._retriever, [query], k, mode, where)[0]
        return {"documents": [Document(id=str(h.id), content=h.text, meta=_chunk_meta(h), score=h.score) for h in hits]}


class SemsearchDocumentStore:
    """A Haystack DocumentStore over a semsearch index folder.

    What is stored. Each Document is upserted by its id as one semsearch document: `content` is
    chunked and embedded with the index's own model (the Document's own `embedding` is not used
    for search), `meta` is stored as the document's metadata (plain JSON: str, int, float, bool,
    None, lists and objects with string keys; anything JSON would change, such as a tuple, a
    datetime object or a non-string key, is refused with InputError). `embedding`,
    `sparse_embedding` and `score` are kept beside the metadata, under the key "_haystack", and
    come back as written; so does `content` where the chunks would not give it back exactly
    (blanks around it, or an index chunked without overlap). A Document without `content`, or
    with a `blob`, is refused (InputError): semsearch stores text. The store's documents are
    those written through it (and by semsearch's document API); chunks of files indexed from a
    corpus are found by `search` but are not documents of the store.

    Writes. `write_documents` with DuplicatePolicy.NONE acts as FAIL (as Haystack's in-memory
    store does): DuplicateDocumentError, and nothing written, if any id is held already or given
    twice; SKIP keeps the held (and the first of ids given twice); OVERWRITE replaces (the last
    of ids given twice wins). Each call is one new index generation under the index's writer
    lock; searches go on meanwhile, against the previous one. `delete_documents` passes over ids
    the store does not hold. `update_by_filter` rewrites (and so re-embeds) what it changes.

    Filters. `filter_documents` (and `search`, `count_documents_by_filter`, `delete_by_filter`,
    ...) give exactly what Haystack's `document_matches_filter` gives for the full filter (AND,
    OR, NOT, nested; every comparison operator; ISO dates): each candidate document is checked
    with it in Python. What is pushed down to semsearch's `where` (a pre-filter run on the index's
    metadata columns) only narrows the candidates: the `==` and `in` comparisons on top-level
    `meta.<field>` fields joined to the whole filter by AND, with values that are strings (not ISO
    dates), numbers or booleans. Other operators (`!=` and `not in` match missing fields and
    values of other types; ranges compare dates and raise FilterError on strings), fields on
    `content`, `id` or nested meta, and anything under OR or NOT, are evaluated in Python only.
    A malformed filter raises FilterError before any document is read."""

    def __init__(self, index: str | os.PathLike | None = None, device: str = "auto", create: bool = True,
                 strict_datetime_comparison: bool = False, encoder=None, retriever=None):
        """`index`: the folder (default: $SEMSEARCH_INDEX or ./indexes/default); a folder without
        an index becomes an empty one (the bundled model, or `encoder`) unless `create` is False.
        `retriever`: an open semsearch Retriever to use instead (its folder is the index)."""
        self.device = device
        self.create = create
        self.strict_datetime_comparison = bool(strict_datetime_comparison)
        if retriever is not None:
            self.index = os.fspath(retriever.folder)
            self._retriever = retriever
            return
        self.index = None if index is None else os.fspath(index)
        self._retriever = open_or_create(index, device, encoder, create)

    @property
    def retriever(self):
        """The semsearch Retriever over the store's index."""
        return self._retriever

    @property
    def folder(self):
        return self._retriever.folder

    def close(self) -> None:
        self._retriever.close()

    # ---- serialisation ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, index=self.index, device=self.device, create=self.create,
                               strict_datetime_comparison=self.strict_datetime_comparison)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SemsearchDocumentStore":
        return default_from_dict(cls, data)

    # ---- the DocumentStore protocol ----------------------------------------------------------------
    def count_documents(self) -> int:
        return len(self._all_ids(self._current().docs))

    def filter_documents(self, filters: dict[str, Any] | None = None) -> list[Document]:
        """The documents that match `filters` (Haystack's syntax; None or {}: all), in the order
        they were first written."""
        return self._filtered(filters)

    def write_documents(self, documents: list[Document], policy: DuplicatePolicy = DuplicatePolicy.NONE) -> int:
        """Write Documents; gives back how many were written (see the class doc for the policies)."""
        from semsearch.documents import upsert_documents

        if isinstance(documents, (str, bytes, dict)) or not isinstance(documents, Iterable):
            raise InputError(f"write_documents takes a list of Documents, not {type(documents).__name__}")
        documents = list(documents)
        bad = next((d for d in documents if not isinstance(d, Document)), None)
        if bad is not None:
            raise InputError(f"write_documents takes a list of Documents; got a {type(bad).__name__}")
        policy = DuplicatePolicy(policy) if isinstance(policy, str) else policy
        if not isinstance(policy, DuplicatePolicy):
            raise InputError(f"policy must be a DuplicatePolicy, not {policy!r}")
        if policy == DuplicatePolicy.NONE:
            policy = DuplicatePolicy.FAIL
        given = len(documents)
        chosen: dict[str, Document] = {}
        for d in documents:
            if d.id in chosen and policy == DuplicatePolicy.FAIL:
                raise DuplicateDocumentError(f"ID '{d.id}' is given twice")
            if d.id not in chosen or policy == DuplicatePolicy.OVERWRITE:
                chosen[d.id] = d
        if not chosen:
            return 0
        stored = [self._to_stored(d) for d in chosen.values()]  # refused before anything is written
        with writer_lock(self.folder):
            r = self._current()
            held = self._held(r.docs, list(chosen))
            if held and policy == DuplicatePolicy.FAIL:
                raise DuplicateDocumentError(f"ID '{next(i for i in chosen if i in held)}' already exists")
            if policy == DuplicatePolicy.SKIP:
                stored = [s for s in stored if s.id not in held]
            if stored:
                upsert_documents(self.folder, stored, r.encoder)
                r.refresh()
        return given if policy == DuplicatePolicy.OVERWRITE else len(stored)

    def delete_documents(self, document_ids: list[str]) -> None:
        """Remove the documents with these ids (ids the store does not hold are passed over)."""
        from semsearch.documents import check_id

        if isinstance(document_ids, (str, bytes)) or not isinstance(document_ids, Iterable):
            raise InputError(f"delete_documents takes a list of ids, not {type(document_ids).__name__}")
        ids = list(document_ids)
        bad = next((i for i in ids if not isinstance(i, str)), None)
        if bad is not None:
            raise InputError(f"document ids are strings, not {type(bad).__name__}")

        def storable(i: str) -> bool:  # an id semsearch refuses cannot be held: nothing to delete
            try:
                check_id(i)
                return True
            except InputError:
                return False

        self._delete([i for i in ids if storable(i)])

    # ---- beyond the protocol: what Haystack's in-memory store also has -----------------------------
    def delete_all_documents(self) -> None:
        """Remove every document of the store (chunks of files indexed from a corpus stay)."""
        with writer_lock(self.folder):
            self._delete_held(self._all_ids(self._current().docs))

    def delete_by_filter(self, filters: dict[str, Any]) -> int:
        """Remove the documents that match `filters`; gives back how many."""
        _check_filters(filters)
        with writer_lock(self.folder):  # the match and the delete see one generation
            ids = [d.id for d in self._filtered(filters)]
            self._delete_held(ids)
        return len(ids)

    def update_by_filter(self, filters: dict[str, Any], meta: dict[str, Any]) -> int:
        """Merge `meta` into the meta of the documents that match `filters` (they are rewritten,
        and so re-embedded); gives back how many."""
        from semsearch.documents import upsert_documents

        _check_filters(filters)
        if not isinstance(meta, dict):
            raise InputError(f"meta must be a dict, not {type(meta).__name__}")
        with writer_lock(self.folder):
            r = self._current()
            found = self._filtered(filters)
            stored = [self._to_stored(_replace(d, meta={**d.meta, **meta})) for d in found]
            if stored:
                upsert_documents(self.folder, stored, r.encoder)
                r.refresh()
        return len(found)

    def count_documents_by_filter(self, filters: dict[str, Any]) -> int:
        return len(self._filtered(filters))

    def count_unique_metadata_by_filter(self, filters: dict[str, Any], metadata_fields: list[str]) -> dict[str, int]:
        """{field: the number of distinct non-None values it has} over the matching documents."""
        docs = self._filtered(filters)
        out: dict[str, int] = {}
        for name in metadata_fields:
            key = _meta_key(name)
            out[key] = len({_hashable(d.meta[key]) for d in docs if d.meta.get(key) is not None})
        return out

    def get_metadata_fields_info(self) -> dict[str, dict[str, str]]:
        """{field: {"type": keyword | int | float | boolean}} of the stored documents' meta."""
        types: dict[str, str] = {}
        for d in self._filtered(None):
            for key, value in d.meta.items():
                if value is not None:
                    types[key] = ("boolean" if isinstance(value, bool) else "int" if isinstance(value, int)
                                  else "float" if isinstance(value, float) else "keyword")
        return {k: {"type": v} for k, v in types.items()}

    def get_metadata_field_min_max(self, metadata_field: str) -> dict[str, Any]:
        """{"min": .., "max": ..} of a meta field's numbers or strings (None, None when it has none,
        or holds both)."""
        key = _meta_key(metadata_field)
        values = [d.meta[key] for d in self._filtered(None) if isinstance(d.meta.get(key), (int, float, str))]
        try:
            return {"min": min(values), "max": max(values)} if values else {"min": None, "max": None}
        except TypeError:
            return {"min": None, "max": None}

    def get_metadata_field_unique_values(self, metadata_field: str, search_term: str | None = None, from_: int = 0,
                                         size: int = 10, filters: dict[str, Any] | None = None) -> tuple[list[Any], int]:
        """(a page of a meta field's distinct values, how many there are): values of other types
        stay apart (1, 1.0, "1", True), sorted by their text; `search_term` keeps those whose text
        holds it (case-insensitive)."""
        key = _meta_key(metadata_field)
        unique: dict[tuple[str, Any], Any] = {}
        for d in self._filtered(filters):
            value = d.meta.get(key)
            if value is not None:
                unique.setdefault((type(value).__name__, _hashable(value)), value)
        if search_term:
            term = search_term.lower()
            unique = {k: v for k, v in unique.items() if term in str(v).lower()}
        order = sorted(unique, key=lambda k: (str(unique[k]), k[0]))
        return [unique[k] for k in order[from_ : from_ + size]], len(order)

    # ---- searching --------------------------------------------------------------------------------
    def search(self, query: str, top_k: int = 10, filters: dict[str, Any] | None = None, mode: str | None = None,
               where: Any = None) -> list[Document]:
        """The top_k documents that best match query, best first, each with its best chunk's score
        (cosine in mode dense, fused in hybrid, BM25 in lexical; mode None: the index's default).
        `filters` (Haystack's) are applied exactly, as in filter_documents: the part that maps is
        pushed down, the rest checked per document, and more chunks are asked for until top_k
        documents pass or the index has no more. `where` (semsearch's) is a pre-filter on top."""
        from semsearch.documents import Document as ApiDocument, doc_id_of, stored_documents

        k, mode = check_k(top_k), check_mode(mode)
        if filters:
            _check_filters(filters)
        pre = where if where is not None else _pushdown(filters) if filters else None
        r = self._retriever
        n = k
        while True:
            hits = search(r, [query], n, mode, pre)[0]
            best: dict[Any, Any] = {}
            for h in hits:
                best.setdefault(doc_id_of(h.path) or ("chunk", h.id), h)
            whole = stored_documents(r.docs, [key for key in best if isinstance(key, str)])
            out: list[Document] = []
            for key, h in best.items():
                if not isinstance(key, str):  # a chunk of a file
                    doc = Document(id=str(h.id), content=h.text, meta=_chunk_meta(h), score=h.score)
                else:  # whole[key] missing: removed by a write since the search; what the search saw
                    doc = _to_haystack(whole.get(key) or ApiDocument(key, h.text, h.metadata), h.score)
                if not filters or self._matches(filters, doc):
                    out.append(doc)
                    if len(out) == k:
                        return out
            if len(hits) < n or n >= len(r):
                return out
            n = min(n * 4, len(r))

    # ---- the async side: each call on a worker thread ----------------------------------------------
    async def count_documents_async(self) -> int:
        return await asyncio.to_thread(self.count_documents)

    async def filter_documents_async(self, filters: dict[str, Any] | None = None) -> list[Document]:
        return await asyncio.to_thread(self.filter_documents, filters)

    async def write_documents_async(self, documents: list[Document], policy: DuplicatePolicy = DuplicatePolicy.NONE) -> int:
        return await asyncio.to_thread(self.write_documents, documents, policy)

    async def delete_documents_async(self, document_ids: list[str]) -> None:
        await asyncio.to_thread(self.delete_documents, document_ids)

    async def delete_all_documents_async(self) -> None:
        await asyncio.to_thread(self.delete_all_documents)

    async def delete_by_filter_async(self, filters: dict[str, Any]) -> int:
        return await asyncio.to_thread(self.delete_by_filter, filters)

    async def update_by_filter_async(self, filters: dict[str, Any], meta: dict[str, Any]) -> int:
        return await asyncio.to_thread(self.update_by_filter, filters, meta)

    async def count_documents_by_filter_async(self, filters: dict[str, Any]) -> int:
        return await asyncio.to_thread(self.count_documents_by_filter, filters)

    async def count_unique_metadata_by_filter_async(self, filters: dict[str, Any], metadata_fields: list[str]) -> dict[str, int]:
        return await asyncio.to_thread(self.count_unique_metadata_by_filter, filters, metadata_fields)

    async def get_metadata_fields_info_async(self) -> dict[str, dict[str, str]]:
        return await asyncio.to_thread(self.get_metadata_fields_info)

    async def get_metadata_field_min_max_async(self, metadata_field: str) -> dict[str, Any]:
        return await asyncio.to_thread(self.get_metadata_field_min_max, metadata_field)

    async def get_metadata_field_unique_values_async(self, metadata_field: str, search_term: str | None = None, from_: int = 0,
                                                     size: int = 10, filters: dict[str, Any] | None = None) -> tuple[list[Any], int]:
        return await asyncio.to_thread(self.get_metadata_field_unique_values, metadata_field, search_term, from_, size, filters)

    async def search_async(self, query: str, top_k: int = 10, filters: dict[str, Any] | None = None, mode: str | None = None,
                           where: Any = None) -> list[Document]:
        return await asyncio.to_thread(self.search, query, top_k, filters, mode, where)

    # ---- helpers ----------------------------------------------------------------------------------
    def _current(self):
        """The Retriever, on the index's newest generation (search() checks on its own; the
        docstore reads here do not)."""
        r = self._retriever
        if r.auto_refresh:
            r.refresh()
        return r

    def _matches(self, filters: dict[str, Any], doc: Document) -> bool:
        return document_matches_filter(filters, doc, strict_datetime_comparison=self.strict_datetime_comparison)

    def _filtered(self, filters: dict[str, Any] | None) -> list[Document]:
        """The documents matching `filters` exactly (see the class doc), in write order."""
        from semsearch import filters as where_filters
        from semsearch.documents import stored_documents

        if filters:
            _check_filters(filters)
        docs = self._current().docs
        flt = None
        if filters and (pre := _pushdown(filters)) is not None:
            try:
                flt = where_filters.parse(pre)
            except InputError:  # past a bound of `where` (values, lengths): checked in Python only
                flt = None
        ids = self._all_ids(docs, flt.select(docs) if flt is not None else None)
        out: list[Document] = []
        for at in range(0, len(ids), BATCH):
            for d in stored_documents(docs, ids[at : at + BATCH]).values():
                doc = _to_haystack(d)
                if not filters or self._matches(filters, doc):
                    out.append(doc)
        return out

    @staticmethod
    def _all_ids(docs, selection=None) -> list[str]:
        """The ids of the documents in `docs` (one generation), in write order (that of their
        first chunks); only those whose chunks `selection` (a where's) lets through if given."""
        from semsearch.documents import PREFIX, doc_id_of

        rows = docs.select("f.path", "substr(f.path, 1, ?) = ? AND c.ord = 0", (len(PREFIX), PREFIX))
        if selection is None:
            return [doc_id_of(path) for _, path in rows]
        mask = selection.mask  # the chunks of a document share its metadata: its first one decides
        return [doc_id_of(path) for i, path in rows if i < len(mask) and mask[i]]

    @staticmethod
    def _held(docs, ids: list[str]) -> set[str]:
        """Those of `ids` that `docs` (one generation) holds."""
        from semsearch.documents import doc_id_of, doc_path

        held: set[str] = set()
        for at in range(0, len(ids), BATCH):
            paths = [doc_path(i) for i in ids[at : at + BATCH]]
            rows = docs.select("f.path", f"f.path IN ({','.join('?' * len(paths))}) AND c.ord = 0", tuple(paths))
            held.update(doc_id_of(path) for _, path in rows)
        return held

    def _delete(self, ids: list[str]) -> None:
        if ids:
            with writer_lock(self.folder):
                self._delete_held(ids)

    def _delete_held(self, ids: list[str]) -> None:
        """Remove those of ids the index holds, in one generation (the caller holds the writer lock)."""
        from semsearch.documents import delete_documents

        r = self._current()
        held = self._held(r.docs, list(dict.fromkeys(ids)))
        if held:
            delete_documents(self.folder, [i for i in dict.fromkeys(ids) if i in held])
            r.refresh()

    def _to_stored(self, d: Document):
        """The semsearch document that keeps `d` (InputError for what it cannot keep)."""
        from semsearch.documents import Document as ApiDocument, check_id

        check_id(d.id)
        if d.content is None:
            raise InputError(f"document {d.id!r} has no content: SemsearchDocumentStore stores and embeds text")
        if d.blob is not None:
            raise InputError(f"document {d.id!r} has a blob: SemsearchDocumentStore stores text, not binary data "
                             "(keep the blob's text as content, and the blob elsewhere)")
        meta = dict(d.meta or {})
        if RESERVED in meta:
            raise InputError(f"document {d.id!r}: the meta key {RESERVED!r} is the store's own")
        _check_json(meta, f"the meta of document {d.id!r}")
        extra: dict[str, Any] = {}
        if d.embedding is not None:
            try:
                extra["embedding"] = [float(x) for x in d.embedding]
            except (TypeError, ValueError) as e:
                raise InputError(f"the embedding of document {d.id!r} must be a list of numbers ({e})") from e
        if d.sparse_embedding is not None:
            extra["sparse_embedding"] = d.sparse_embedding.to_dict()
        if d.score is not None:
            extra["score"] = d.score
        if isinstance(d.content, str) and self._stored_text(d.content) != d.content:
            extra["content"] = d.content
        _check_json(extra, f"the embedding, sparse embedding or score of document {d.id!r}")
        return ApiDocument(d.id, d.content, {**meta, RESERVED: extra} if extra else meta)

    def _stored_text(self, text: str) -> str:
        """The text the docstore will give back for `text`: its chunks joined as
        semsearch.documents.stored_documents joins them."""
        from semsearch.corpus.chunking import ChunkSettings, chunk_text

        r = self._retriever
        out, done = "", None
        for c in chunk_text(text, r.encoder.token_offsets, ChunkSettings.of_index(r.manifest.chunking)):
            if done is None or c.start >= done:
                out += c.text if done is None or c.start == done else " " + c.text
            else:
                out += c.text[done - c.start:]
            done = max(done or 0, c.end)
        return out


def _to_haystack(d, score: float | None = None) -> Document:
    """The Haystack Document a stored semsearch document keeps (score: a search's, else the stored one)."""
    meta = dict(d.metadata)
    extra = meta.pop(RESERVED) if isinstance(meta.get(RESERVED), dict) else {}
    sparse = extra.get("sparse_embedding")
    return Document(id=d.id, content=extra.get("content", d.text), meta=meta, embedding=extra.get("embedding"),
                    sparse_embedding=SparseEmbedding.from_dict(sparse) if sparse else None,
                    score=score if score is not None else extra.get("score"))


def _replace(d: Document, **changes: Any) -> Document:
    import dataclasses

    return dataclasses.replace(d, **changes)


def _chunk_meta(hit) -> dict[str, Any]:
    """A hit's metadata for a chunk Document: the store's own key left out."""
    meta = hit_metadata(hit)
    if isinstance(meta.get(RESERVED), dict):
        del meta[RESERVED]
    return meta


def _check_json(value: Any, what: str) -> None:
    """InputError unless `value` comes back from JSON as it is (what the docstore keeps)."""
    try:
        back = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise InputError(f"{what} is not plain JSON ({e}); the store keeps meta as JSON") from e
    if back != value:
        raise InputError(f"{what} holds values JSON would change (a tuple, a non-string key, ...); "
                         "the store keeps meta as JSON: give lists and string keys")


def _meta_key(name: str) -> str:
    return name[len("meta."):] if name.startswith("meta.") else name


def _hashable(value: Any) -> Any:
    """A value's hashable form for counting distinct values (types kept apart: 1, 1.0, True)."""
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True)
    return (type(value).__name__, value)


def _check_filters(filters: Any) -> None:
    """FilterError for a malformed Haystack filter (what document_matches_filter would raise on
    meeting it), before any document is read."""
    if filters is None or filters == {}:
        return
    stack = [filters]
    while stack:
        f = stack.pop()
        if not isinstance(f, dict):
            raise FilterError(f"a filter or condition must be a dict, not {type(f).__name__}")
        if "field" in f:
            for key in ("operator", "value"):
                if key not in f:
                    raise FilterError(f"'{key}' key missing in {f}")
            op = f["operator"]
            if op not in COMPARISONS:
                raise FilterError(f"Unknown comparison operator '{op}'. Valid operators are: {sorted(COMPARISONS)}")
            if op in ("in", "not in") and not isinstance(f["value"], list):
                raise FilterError(f"Filter value must be a `list` when using operator '{op}', received {type(f['value'])}")
            if op in (">", ">=", "<", "<=") and isinstance(f["value"], list):
                raise FilterError(f"Filter value can't be of type {type(f['value'])} using operators '>', '>=', '<', '<='")
            continue
        for key in ("operator", "conditions"):
            if key not in f:
                raise FilterError(f"'{key}' key missing in {f}")
        if f["operator"] not in LOGIC:
            raise FilterError(f"Unknown logical operator '{f['operator']}'. Valid operators are: {sorted(LOGIC)}")
        if not isinstance(f["conditions"], list):
            raise FilterError(f"'conditions' must be a list, not {type(f['conditions']).__name__}")
        stack.extend(f["conditions"])


def _pushable(value: Any) -> bool:
    """Whether semsearch's equality on `value` lets through every value Haystack's `==` matches:
    numbers, booleans and strings (2 == 2.0 == True and "2" are all let through, Python then
    decides), but not ISO dates (Haystack matches other spellings of the same time) nor None."""
    if isinstance(value, bool):
        return True
    if isinstance(value, int):
        return -(1 << 63) <= value < (1 << 63)
    if isinstance(value, float):
        return value == value and value not in (float("inf"), float("-inf"))
    if isinstance(value, str):
        return not (len(value) >= 10 and value[:4].isdigit() and value[4] == "-")
    return False


def _pushdown(filters: dict[str, Any]) -> dict[str, Any] | None:
    """The `where` that lets through every document `filters` matches (and usually few more):
    its `==` / `in` comparisons on top-level meta fields that are joined to the whole by AND.
    None when there is none."""
    where: dict[str, list[Any]] = {}
    stack = [filters]
    while stack:
        f = stack.pop()
        if "field" not in f:
            if f.get("operator") == "AND":
                stack.extend(f.get("conditions", []))
            continue
        field, op, value = str(f["field"]), f["operator"], f["value"]
        key = field[len("meta."):] if field.startswith("meta.") else ""
        if not key or "." in key or '"' in key or "\\" in key:
            continue
        values = [value] if op == "==" else value if op == "in" else None
        if not values or not all(_pushable(v) for v in values):
            continue
        where.setdefault(key, list(values))  # one condition a field is enough to narrow
    return where or None


def _store_from_dict(data: dict[str, Any]) -> SemsearchDocumentStore:
    kind = data.get("type", "")
    if kind.rsplit(".", 1)[-1] != SemsearchDocumentStore.__name__:
        raise InputError(f"SemsearchRetriever searches a SemsearchDocumentStore, not {kind!r}")
    return SemsearchDocumentStore.from_dict(data)


def where_from_haystack(filters: dict[str, Any]) -> dict[str, Any]:
    """semsearch's `where` from Haystack 2 filters (a comparison, or AND of comparisons)."""
    if "operator" not in filters:
        return dict(filters)  # already a where dict
    comparisons: list[tuple[str, str, Any]] = []

    def walk(f: dict[str, Any]) -> None:
        op = f.get("operator")
        if op == "AND":
            for c in f.get("conditions", []):
                walk(c)
        elif op in ("OR", "NOT"):
            raise InputError(f"Haystack filters with {op} do not map to semsearch's where (AND of comparisons only)")
        else:
            field = str(f.get("field", ""))
            if not field.startswith("meta."):
                raise InputError(f"filter field {field!r}: only meta.* fields map to semsearch's where")
            comparisons.append((field[len("meta."):], op, f.get("value")))

    walk(filters)
    return where_from_comparisons(comparisons)
