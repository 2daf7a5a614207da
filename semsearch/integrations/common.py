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


# LangChain's filter operators (as Chroma, PGVector and the in-memory store spell them) -> ours.
LANGCHAIN_OPERATORS = {"$eq": "==", "$ne": "!=", "$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<=",
                       "$in": "in", "$nin": "nin"}


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


def open_or_create(index: str | os.PathLike | None, device: str = "auto", encoder=None, create: bool = True):
    """A Retriever over an index folder (default: $SEMSEARCH_INDEX or ./indexes/default), for the
    stores: a folder without an index becomes an empty one (the bundled model, or `encoder`)
    unless `create` is False."""
    from semsearch.search import Retriever
    from semsearch.store.folder import index_path, writer_lock

    folder = index_path(index)
    if create and not (folder / "manifest.json").exists():
        from semsearch.documents import create_index
        from semsearch.indexing import encoder_for_index

        encoder = encoder if encoder is not None else encoder_for_index(None, device=device)
        with writer_lock(folder):
            create_index(folder, encoder)
    return Retriever.load(folder, device=device, encoder=encoder)


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


def check_k(k: Any) -> int:
    """k if it is a positive integer (the number of results), else InputError."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InputError(f"k must be a positive integer, got {k!r}")
    return k


def check_mode(mode: str | None) -> str | None:
    """mode if it is None or a search mode semsearch knows, else InputError."""
    if mode is not None:
        from semsearch.fusion import check_mode as check

        check(mode)
    return mode


def check_where(where: Any) -> Any:
    """where (a dict, one condition string or a list of them) if semsearch can apply it, else InputError."""
    from semsearch import filters

    filters.parse(where)
    return where


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


def where_from_langchain(filter: Any) -> Any:
    """semsearch's `where` from a LangChain metadata filter: {"lang": "en"}, {"year": {"$gte": 2020}},
    {"tag": {"$in": ["a", "b"]}}, {"$and": [{...}, {...}]} (AND only: $or and $not have no `where`
    form). semsearch's own forms pass through: a list of conditions ["year>=2020", "lang=en"], one
    condition string, or a dict whose operators are semsearch's ({"year": {">=": 2020}})."""
    if filter is None or isinstance(filter, (str, list, tuple)):
        return filter
    if not isinstance(filter, dict):
        raise InputError(f"a filter must be a dict (or semsearch's list of conditions), not {type(filter).__name__}")
    comparisons: list[tuple[str, str, Any]] = []

    def walk(f: dict[str, Any]) -> None:
        for key, value in f.items():
            key = str(key)
            if key == "$and":
                if not isinstance(value, (list, tuple)) or not all(isinstance(c, dict) for c in value):
                    raise InputError(f"$and takes a list of filters, got {value!r}")
                for c in value:
                    walk(c)
            elif key.startswith("$") and key != "$path":
                raise InputError(f"filter operator {key!r} does not map to semsearch's where (AND of comparisons only)"
                                 if key in ("$or", "$not", "$nor") else f"unknown filter operator {key!r}")
            elif isinstance(value, dict):
                if not value:
                    raise InputError(f"filter on {key!r}: empty condition")
                for op, v in value.items():
                    if op not in LANGCHAIN_OPERATORS and op not in WHERE_OPERATORS:
                        raise InputError(f"filter operator {op!r} on {key!r} is not supported; supported: "
                                         f"{', '.join(LANGCHAIN_OPERATORS)}")
                    comparisons.append((key, LANGCHAIN_OPERATORS.get(op, op), v))
            elif isinstance(value, (list, tuple)):
                comparisons.append((key, "in", value))  # any of
            else:
                comparisons.append((key, "==", value))

    walk(filter)
    return where_from_comparisons(comparisons)
