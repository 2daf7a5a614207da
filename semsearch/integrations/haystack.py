"""A semsearch index as a Haystack 2 retriever component (`pip install 'semsearch[haystack]'`).

    from semsearch.integrations.haystack import SemsearchRetriever
    retriever = SemsearchRetriever(index="indexes/default", top_k=4)
    retriever.run(query="loan approval")["documents"]       # list[haystack.Document]
"""
from __future__ import annotations

import os
from typing import Any

from semsearch.integrations.common import hit_metadata, open_retriever, require, search, where_from_comparisons

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
        self.top_k = top_k
        self.mode = mode
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
    def run(self, query: str, filters: dict[str, Any] | None = None, top_k: int | None = None) -> dict[str, list[Document]]:
        self.warm_up()
        f = filters if filters is not None else self.filters
        hits = search(self._retriever, [query], top_k or self.top_k, self.mode, where_from_haystack(f) if f else None)[0]
        return {"documents": [Document(id=str(h.id), content=h.text, meta=hit_metadata(h), score=h.score) for h in hits]}


def where_from_haystack(filters: dict[str, Any]) -> dict[str, Any]:
    """semsearch's `where` from Haystack 2 filters (a comparison, or AND of comparisons)."""
    from semsearch.errors import InputError

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
