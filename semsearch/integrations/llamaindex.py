"""A semsearch index as a LlamaIndex retriever (`pip install 'semsearch[llamaindex]'`).

    from semsearch.integrations.llamaindex import SemsearchRetriever
    retriever = SemsearchRetriever.from_index("indexes/default", similarity_top_k=4)
    nodes = retriever.retrieve("loan approval")     # list[NodeWithScore], each a TextNode
    nodes = await retriever.aretrieve("loan approval")  # the same, off the event loop
"""
from __future__ import annotations

import asyncio
import os
from typing import Any

from semsearch.errors import InputError
from semsearch.integrations.common import (check_k, check_mode, check_where, hit_metadata, open_retriever, require, search,
                                           where_from_comparisons)

require("llama_index.core.retrievers", "llamaindex")

from llama_index.core.retrievers import BaseRetriever  # noqa: E402
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode  # noqa: E402
from llama_index.core.vector_stores.types import MetadataFilters  # noqa: E402


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


def where_from_filters(filters: MetadataFilters) -> dict[str, Any]:
    """semsearch's `where` from LlamaIndex MetadataFilters (AND of plain comparisons)."""
    if str(getattr(filters.condition, "value", filters.condition)).lower() != "and":
        raise InputError(f"only AND filters map to semsearch's where, not {filters.condition}")
    comparisons = []
    for f in filters.filters:
        if isinstance(f, MetadataFilters):
            raise InputError("nested MetadataFilters do not map to semsearch's where")
        comparisons.append((f.key, getattr(f.operator, "value", f.operator), f.value))
    return where_from_comparisons(comparisons)
