"""A semsearch index as a Haystack 2 retriever component (`pip install 'semsearch[haystack]'`).

    from semsearch.integrations.haystack import SemsearchRetriever
    retriever = SemsearchRetriever(index="indexes/default", top_k=4)
    retriever.run(query="loan approval")["documents"]       # list[haystack.Document]
    await retriever.run_async(query="loan approval")      # the same, off the event loop (AsyncPipeline)
"""
from __future__ import annotations

import asyncio
import os
from typing import Any

from semsearch.errors import InputError
from semsearch.integrations.common import (check_k, check_mode, check_where, hit_metadata, open_retriever, require, search,
                                           where_from_comparisons)

require("haystack", "haystack")

from haystack import Document, component, default_from_dict, default_to_dict  # noqa: E402


@component
class SemsearchRetriever:
    """Haystack retriever over a semsearch index. `filters` in Haystack's syntax (AND of
    comparisons on `meta.*` fields) become semsearch's `where`; a dict without "operator" is
    taken as a `where` already."""

    def __init__(self, index: str | None = None, top_k: int = 10, mode: str | None = None,
                 filters: dict[str, Any] | None = None, device: str = "auto", retriever=None):
        self.index = None if index is None else os.fspath(index)
        self.top_k = check_k(top_k)
        self.mode = check_mode(mode)
        self.filters = filters
        self.device = device
        self._retriever = retriever

    def warm_up(self) -> None:
        """Load the index and its model (Pipeline.run calls this before the first run)."""
        if self._retriever is None:
            self._retriever = open_retriever(self.index, self.device)

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, index=self.index, top_k=self.top_k, mode=self.mode, filters=self.filters, device=self.device)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SemsearchRetriever":
        return default_from_dict(cls, data)

    @component.output_types(documents=list[Document])
    def run(self, query: str, filters: dict[str, Any] | None = None, top_k: int | None = None,
            mode: str | None = None, where: Any = None) -> dict[str, list[Document]]:
        """The top_k best chunks for query. `filters` (Haystack's) or `where` (semsearch's; not
        both), `top_k` and `mode` given here win over the component's own."""
        k, mode, where = self._args(filters, top_k, mode, where)
        self.warm_up()
        return self._run(query, k, mode, where)

    @component.output_types(documents=list[Document])
    async def run_async(self, query: str, filters: dict[str, Any] | None = None, top_k: int | None = None,
                        mode: str | None = None, where: Any = None) -> dict[str, list[Document]]:
        """run() for AsyncPipeline: the search (and, the first time, loading the index) runs on a
        worker thread, not on the event loop."""
        k, mode, where = self._args(filters, top_k, mode, where)
        if self._retriever is None:
            await asyncio.to_thread(self.warm_up)
        return await asyncio.to_thread(self._run, query, k, mode, where)

    def _args(self, filters, top_k, mode, where) -> tuple[int, str | None, Any]:
        if filters is not None and where is not None:
            raise InputError("give `filters` or `where`, not both")
        if where is None:
            f = filters if filters is not None else self.filters
            where = where_from_haystack(f) if f else None
        return (check_k(self.top_k if top_k is None else top_k), check_mode(mode if mode is not None else self.mode),
                None if where is None else check_where(where))

    def _run(self, query: str, k: int, mode: str | None, where: Any) -> dict[str, list[Document]]:
        hits = search(self._retriever, [query], k, mode, where)[0]
        return {"documents": [Document(id=str(h.id), content=h.text, meta=hit_metadata(h), score=h.score) for h in hits]}


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
