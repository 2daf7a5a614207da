"""Metadata filters: `where` conditions -> the SQL that selects the chunk ids they allow.

Conditions (all must hold):
- `key=value`, `key!=value`: a metadata field equals (or not) the value; "2020" matches the
  string "2020" and the number 2020; `!=` also matches chunks without the field.
- `key>=n`, `key>n`, `key<=n`, `key<n`: numeric comparison (numbers, and strings that are numbers).
- `path:GLOB`: the chunk's source file matches GLOB (SQLite GLOB: `*` also crosses `/`); a
  relative pattern matches the end of the absolute path, so `path:*.md` and `path:docs/*.md` work.

In Python, `where` is a list of such strings, one string, or a dict: `{"lang": "en"}`,
`{"lang": ["en", "de"]}` (any of), `{"year": {">=": 2020, "<": 2024}}`, `{"$path": "docs/*.md"}`.
The filter runs in SQLite before the vector search (pre-filtering): its ids are handed to FAISS
as an ID selector, or scored exactly from the stored vectors when they are few.
"""
from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from semsearch.errors import InputError

OPS = ("=", "!=", ">=", "<=", ">", "<")
_COND = re.compile(r"^\s*([^=!<>]+?)\s*(!=|>=|<=|=|>|<)\s*(.*?)\s*$", re.S)


@dataclass
class Filter:
    """A compiled `where`: SQL over `chunks c JOIN files f` and its parameters."""

    clauses: list[str] = field(default_factory=list)
    params: list[Any] = field(default_factory=list)
    text: list[str] = field(default_factory=list)  # the conditions as given, for messages

    def sql(self) -> tuple[str, list[Any]]:
        """('SELECT c.id FROM ... WHERE ...', params) selecting the allowed chunk ids."""
        where = " AND ".join(self.clauses) or "1"
        return f"SELECT c.id FROM chunks c JOIN files f ON f.id = c.file_id WHERE {where}", list(self.params)

    def ids(self, db: sqlite3.Connection) -> np.ndarray:
        """The allowed chunk ids, sorted (int64)."""
        register(db)
        sql, params = self.sql()
        try:
            rows = db.execute(sql + " ORDER BY c.id", params).fetchall()
        except sqlite3.DatabaseError as e:
            if "malformed" in str(e) or "not a database" in str(e):
                from semsearch.errors import IndexFormatError

                raise IndexFormatError(f"the docstore is damaged ({e}); rebuild the index with --rebuild") from e
            raise InputError(f"cannot apply filter {' AND '.join(self.text)}: {e}") from e
        return np.array([r[0] for r in rows], np.int64)

    def __str__(self) -> str:
        return " AND ".join(self.text)


def _num(x: Any) -> float | None:
    """x as a number: numbers, and strings that read as one; else None."""
    if isinstance(x, bool) or x is None:
        return None
    if isinstance(x, (int, float)):
        return float(x)
    try:
        return float(str(x).strip())
    except ValueError:
        return None


def register(db: sqlite3.Connection) -> None:
    db.create_function("semsearch_num", 1, _num, deterministic=True)


def _path(key: str) -> str:
    if not key or '"' in key or "\\" in key:
        raise InputError(f"bad metadata field name {key!r} in a filter (it must be non-empty, without quotes or backslashes)")
    return f'$."{key}"'


def _literal(value: Any) -> list[Any]:
    """The SQL values a metadata field may hold to equal `value` as given."""
    if isinstance(value, bool):
        return [int(value)]
    if isinstance(value, (int, float)):  # also its text form: CSV metadata holds strings
        return [value, str(int(value)) if float(value).is_integer() else str(value)]
    s = str(value)
    out: list[Any] = [s]
    n = _num(s)
    if n is not None:
        out += [n, int(n)] if n.is_integer() else [n]
    if s.lower() in ("true", "false"):
        out.append(1 if s.lower() == "true" else 0)
    return out


def _condition(f: Filter, key: str, op: str, value: Any, shown: str) -> None:
    if key == "$path":
        if op != "=":
            raise InputError(f"filter {shown!r}: a path takes a glob (path:GLOB), not {op}")
        pattern = str(value)
        if not pattern:
            raise InputError("filter 'path:': give a glob, e.g. path:*.md")
        f.clauses.append("(f.path GLOB ? OR f.path GLOB ?)")
        f.params += [pattern, "*/" + pattern.lstrip("/")]
    elif op in ("=", "!="):
        values = [v for x in (value if isinstance(value, (list, tuple)) else [value]) for v in _literal(x)]
        if not values:
            raise InputError(f"filter {shown!r}: no values")
        marks = ",".join("?" * len(values))
        expr = f"json_extract(c.metadata, ?) IN ({marks})"
        f.clauses.append(f"({expr})" if op == "=" else f"(c.metadata IS NULL OR json_extract(c.metadata, ?) IS NULL OR NOT ({expr}))")
        f.params += ([_path(key)] if op == "!=" else []) + [_path(key)] + values
    else:
        n = _num(value)
        if n is None:
            raise InputError(f"filter {shown!r}: {op} needs a number, got {value!r}")
        f.clauses.append(f"semsearch_num(json_extract(c.metadata, ?)) {op} ?")
        f.params += [_path(key), n]
    f.text.append(shown)


def parse(where: Any) -> Filter | None:
    """A Filter from a `where` (see the module doc); None when there is nothing to filter."""
    if where is None or where == [] or where == {} or where == ():
        return None
    f = Filter()
    if isinstance(where, str):
        where = [where]
    if isinstance(where, dict):
        for key, value in where.items():
            key = str(key)
            if isinstance(value, dict):
                if not value:
                    raise InputError(f"filter on {key!r}: empty condition")
                for op, v in value.items():
                    if op not in OPS:
                        raise InputError(f"filter on {key!r}: unknown operator {op!r}; valid operators are: {', '.join(OPS)}")
                    _condition(f, key, op, v, f"{key}{op}{v}")
            else:
                _condition(f, key, "=", value, f"path:{value}" if key == "$path" else f"{key}={value}")
        return f
    if not isinstance(where, (list, tuple)):
        raise InputError(f"where must be a dict, a string or a list of strings, not {type(where).__name__}")
    for cond in where:
        if not isinstance(cond, str):
            raise InputError(f"filter conditions are strings like key=value, key>=n, path:GLOB; got {cond!r}")
        if cond.strip().startswith("path:"):
            _condition(f, "$path", "=", cond.strip()[5:], cond)
            continue
        m = _COND.match(cond)
        if not m or not m.group(1).strip():
            raise InputError(f"bad filter {cond!r}: expected key=value, key!=value, key>=n, key>n, key<=n, key<n or path:GLOB")
        _condition(f, m.group(1).strip(), m.group(2), m.group(3), cond)
    return f
