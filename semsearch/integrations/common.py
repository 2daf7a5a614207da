"""What the adapters (and the HTTP server) share: search arguments, hit metadata, filters."""
from __future__ import annotations

import inspect
import os
from typing import Any, Iterable

from semsearch.errors import InputError

# Framework comparison operators -> those of semsearch's `where` ({field: {op: value}});
# "in" / "not in" take a list (any of / none of).
WHERE_OPERATORS = {"==": "=", "=": "=", "!=": "!=", ">": ">", ">=": ">=", "<": "<", "<=": "<=",
                   "in": "=", "nin": "!=", "not in": "!="}


def require(module: str, extra: str):
    """Import a framework module, or ImportError naming the extra that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"this adapter needs {module.split('.')[0]} ({e.name} is missing): "
                          f"pip install 'semsearch[{extra}]'") from e


def open_retriever(index: str | os.PathLike | None, device: str = "auto"):
    from semsearch.search import Retriever

    return Retriever.load(index, device=device)


def search_kwargs(retriever, mode: str | None = None, where: dict[str, Any] | None = None) -> dict[str, Any]:
    """mode / where as keyword arguments of retriever.search_batch, only where they are given;
    InputError where given to a Retriever that does not take them."""
    params = inspect.signature(type(retriever).search_batch).parameters
    out: dict[str, Any] = {}
    for name, value in (("mode", mode), ("where", where)):
        if value is not None:
            if name not in params:
                raise InputError(f"`{name}` is not supported by this semsearch version's Retriever")
            out[name] = value
    return out


def search(retriever, queries: list[str], k: int, mode: str | None = None, where: dict[str, Any] | None = None):
    return retriever.search_batch(queries, k, **search_kwargs(retriever, mode, where))


def hit_metadata(hit) -> dict[str, Any]:
    """A hit's metadata for a framework document: the user's columns, then where it came from
    (semsearch's keys win over user columns of the same name)."""
    from semsearch.documents import doc_id_of

    own = {"source": hit.source, "path": hit.path, "location": hit.location, "start": hit.start, "end": hit.end,
           "line": hit.line, "row": hit.row, "chunk": hit.chunk, "chunk_id": hit.id, "score": hit.score,
           "doc_id": doc_id_of(hit.path)}
    return {**hit.metadata, **{k: v for k, v in own.items() if v is not None}}


def where_from_comparisons(comparisons: Iterable[tuple[str, str, Any]]) -> dict[str, Any]:
    """A `where` dict from (field, operator, value) comparisons joined by AND:
    {"lang": "en", "year": {">=": 2020, "<": 2024}, "tag": ["a", "b"]}."""
    where: dict[str, dict[str, Any]] = {}
    for field, op, value in comparisons:
        if op not in WHERE_OPERATORS:
            raise InputError(f"filter operator {op!r} on {field!r} is not supported; supported: {', '.join(WHERE_OPERATORS)}")
        if op in ("in", "nin", "not in") and not isinstance(value, (list, tuple)):
            raise InputError(f"filter operator {op!r} on {field!r} takes a list, got {value!r}")
        ours = WHERE_OPERATORS[op]
        conds = where.setdefault(field, {})
        if ours in conds and conds[ours] != value:
            raise InputError(f"two filters on {field!r} {op} {conds[ours]!r} and {value!r} cannot both hold")
        conds[ours] = list(value) if isinstance(value, tuple) else value
    return {k: (c["="] if list(c) == ["="] else c) for k, c in where.items()}
