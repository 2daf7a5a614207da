"""A semsearch index as a LangChain retriever (`pip install 'semsearch[langchain]'`).

    from semsearch.integrations.langchain import SemsearchRetriever
    retriever = SemsearchRetriever.from_index("indexes/default", k=4)
    docs = retriever.invoke("loan approval")        # list[langchain_core.documents.Document]
"""
from __future__ import annotations

import os
from typing import Any

from semsearch.integrations.common import hit_metadata, open_retriever, require, search

require("langchain_core.retrievers", "langchain")

from langchain_core.callbacks import CallbackManagerForRetrieverRun  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from langchain_core.retrievers import BaseRetriever  # noqa: E402
from pydantic import ConfigDict  # noqa: E402


class SemsearchRetriever(BaseRetriever):
    """LangChain retriever over a semsearch `Retriever`: invoke / ainvoke / batch give Documents
    (page_content = the chunk's text; metadata = the user's columns plus source, location,
    offsets, score; id = the chunk id). `k`, `mode` and `where` may also be passed per call:
    `retriever.invoke("query", k=3, where={"lang": "en"})`."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    retriever: Any  # a semsearch.Retriever
    k: int = 4
    mode: str | None = None
    where: dict[str, Any] | None = None

    @classmethod
    def from_index(cls, index: str | os.PathLike | None = None, device: str = "auto", **kwargs: Any) -> "SemsearchRetriever":
        """A retriever over an index folder (default: $SEMSEARCH_INDEX or ./indexes/default)."""
        return cls(retriever=open_retriever(index, device), **kwargs)

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                k: int | None = None, mode: str | None = None, where: dict[str, Any] | None = None) -> list[Document]:
        hits = search(self.retriever, [query], k or self.k, mode or self.mode, where if where is not None else self.where)[0]
        return [Document(page_content=h.text, metadata=hit_metadata(h), id=str(h.id)) for h in hits]
