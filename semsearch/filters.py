"""Metadata filters: `where` conditions -> the chunks they let through.

Conditions (all must hold):
- `key=value`, `key!=value`: a metadata field equals (or not) the value; "2020" matches the
  string "2020" and the number 2020; `!=` also matches chunks without the field.
- `key>=n`, `key>n`, `key<=n`, `key<n`: numeric comparison (numbers, and strings that are numbers).
- `path:GLOB`: the chunk's source file matches GLOB (SQLite GLOB: `*` also crosses `/`); a
  relative pattern matches the end of the absolute path, so `path:*.md` and `path:docs/*.md` work.

In Python, `where` is a list of such strings, one string, or a dict: `{"lang": "en"}`,
`{"lang": ["en", "de"]}` (any of), `{"year": {">=": 2020, "<": 2024}}`, `{"$path": "docs/*.md"}`.
The filter runs before the ranking (pre-filtering), in memory: each metadata field a filter names
is read once per index generation (an equality map and sorted numbers), so a condition costs what
it selects, not a scan of every chunk. The chunks it lets through are handed to FAISS as an ID
bitmap and to BM25 as a row mask, or scored exactly when they are few. Nothing runs inside SQLite
but plain SELECTs, so filtered searches are safe from any number of threads.
"""
from __future__ import annotations

import re
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from semsearch.errors import InputError
from semsearch.limits import MAX_DEPTH, MAX_WHERE_CONDITIONS, MAX_WHERE_TEXT, MAX_WHERE_VALUES, check_depth, check_encodable

OPS = ("=", "!=", ">=", "<=", ">", "<")
_COND = re.compile(r"^\s*([^=!<>]+?)\s*(!=|>=|<=|=|>|<)\s*(.*?)\s*$", re.S)


@dataclass(frozen=True)
class Condition:
    """One condition: kind 'eq' / 'ne' (values: the stored forms that count as equal), 'num'
    (op and a number), or 'path' (two SQLite GLOB patterns)."""

    kind: str
    key: str
    op: str
    values: tuple


@dataclass
class Filter:
    """A compiled `where`: conditions that must all hold."""

    conditions: list[Condition] = field(default_factory=list)
    text: list[str] = field(default_factory=list)  # the conditions as given, for messages

    def select(self, docs) -> "Selection":
        """The chunks of docstore `docs` (one generation) that pass."""
        return _Columns.of(docs).select(self)

    def ids(self, docs) -> np.ndarray:
        """The allowed chunk ids, sorted (int64)."""
        return self.select(docs).ids

    def __str__(self) -> str:
        return " AND ".join(self.text)


class Selection:
    """The chunks a filter lets through, as a boolean mask over chunk ids (index = id), with the
    forms each consumer wants made once: sorted ids, a faiss ID-selector bitmap, a mask over the
    rows of the lexical index."""

    def __init__(self, mask: np.ndarray):
        mask.flags.writeable = False
        self.mask = mask
        self.count = int(np.count_nonzero(mask))
        self._ids: np.ndarray | None = None
        self._bitmap: np.ndarray | None = None

    def __len__(self) -> int:
        return self.count

    @property
    def ids(self) -> np.ndarray:
        if self._ids is None:
            self._ids = np.flatnonzero(self.mask).astype(np.int64)
        return self._ids

    @property
    def bitmap(self) -> np.ndarray:
        """The mask as faiss.IDSelectorBitmap wants it: bit i of byte i // 8 is id i."""
        if self._bitmap is None:
            self._bitmap = np.packbits(self.mask, bitorder="little")
        return self._bitmap

    def rows(self, row_ids: np.ndarray) -> np.ndarray:
        """A boolean mask over rows holding the given (sorted) chunk ids."""
        inside = row_ids < len(self.mask)
        if inside.all():
            return self.mask[row_ids]
        out = np.zeros(len(row_ids), bool)
        out[inside] = self.mask[row_ids[inside]]
        return out


class _KeyColumn:
    """One metadata field over all chunks: an inverted map (stored value -> ids) for equality, and
    the numeric values sorted (with their ids) for ranges. Built once per generation and field."""

    def __init__(self, ids: np.ndarray, values: list[Any]):
        groups: dict[Any, list[int]] = {}
        for i, v in zip(ids.tolist(), values):
            groups.setdefault(v, []).append(i)
        self.eq = {v: np.array(g, np.int64) for v, g in groups.items()}
        nums = np.array([np.nan if (n := _num(v)) is None else n for v in values], np.float64)
        ok = ~np.isnan(nums)
        order = np.argsort(nums[ok], kind="stable")
        self.num_sorted = nums[ok][order]
        self.num_ids = ids[ok][order]

    def equal(self, values: tuple) -> list[np.ndarray]:
        seen: set[int] = set()
        out = []
        for v in values:
            a = self.eq.get(v)
            if a is not None and id(a) not in seen:  # 2020 and 2020.0 find the same group
                seen.add(id(a))
                out.append(a)
        return out

    def compare(self, op: str, n: float) -> np.ndarray:
        s = self.num_sorted
        if op == ">=":
            return self.num_ids[np.searchsorted(s, n, "left"):]
        if op == ">":
            return self.num_ids[np.searchsorted(s, n, "right"):]
        if op == "<=":
            return self.num_ids[: np.searchsorted(s, n, "right")]
        return self.num_ids[: np.searchsorted(s, n, "left")]


_NO_VALUES = _KeyColumn(np.zeros(0, np.int64), [])


class _SegmentColumns:
    """One immutable segment's chunks in the forms filters need: each chunk's file (sorted, for
    path conditions) and each metadata field a filter has named. Built once per segment and kept
    with it across generations (a write adds a segment: earlier ones are not read again)."""

    def __init__(self, segment):
        self.segment = weakref.proxy(segment)
        self.ids = segment.ids
        file_ids = segment.file_ids
        self.by_file = np.argsort(file_ids, kind="stable")
        self.files_sorted = file_ids[self.by_file]
        self._keys: OrderedDict[str, _KeyColumn] = OrderedDict()
        self._known: frozenset[str] | None = None
        self._lock = threading.Lock()

    KEYS = 256  # fields kept built per segment (least recently used dropped): memory stays bounded

    @classmethod
    def of(cls, segment) -> "_SegmentColumns":
        return segment.memo("filter-columns", lambda: cls(segment))

    def key(self, key: str) -> _KeyColumn:
        with self._lock:  # one build per field, however many threads ask at once
            col = self._keys.get(key)
            if col is not None:
                self._keys.move_to_end(key)
                return col
            if self._known is None:  # the segment's field names, read once
                self._known = self.segment.docs.metadata_keys()
            if key not in self._known:  # a field no chunk has: nothing to read, nothing to keep
                return _NO_VALUES
            col = self._keys[key] = _KeyColumn(*self.segment.docs.metadata_values(_path(key)))
            while len(self._keys) > self.KEYS:
                self._keys.popitem(last=False)
        return col


class _Columns:
    """A generation's chunks in the forms filters need, kept in memory with that generation: the
    live ids as a mask over ids, and each segment's columns (see _SegmentColumns).

    Why by hand: filters used to run as SQL with a Python function inside SQLite, scanning every
    chunk's JSON on every search (and registering that function on a connection shared by threads
    deadlocked). Here a field is read once per segment, by SQLite's own json_extract, and then a
    condition costs what it selects: a dict lookup for equality, a binary search for a range."""

    CACHE = 16  # recent filters' selections, per generation

    def __init__(self, docs):
        # A weak reference: the docstore keeps this in its memo, and a cycle would keep an old
        # generation's files open until the cycle collector ran.
        self.docs = weakref.proxy(docs)
        self.segs = [(_SegmentColumns.of(p.segment), p.dead) for p in docs.parts]
        self.size = max([int(c.ids[-1]) + 1 for c, _ in self.segs if len(c.ids)] + [0])
        self.live = np.zeros(self.size, bool)
        for c, dead in self.segs:
            self.live[c.ids] = True
            if len(dead.chunks):
                self.live[dead.chunks[dead.chunks < self.size]] = False
        self.live.flags.writeable = False
        self._lock = threading.Lock()
        self._recent: OrderedDict[tuple, Selection] = OrderedDict()

    @classmethod
    def of(cls, docs) -> "_Columns":
        return docs.memo("filter-columns", lambda: cls(docs))

    def select(self, f: Filter) -> Selection:
        sig = tuple(f.conditions)
        with self._lock:
            hit = self._recent.get(sig)
            if hit is not None:
                self._recent.move_to_end(sig)
                return hit
        mask: np.ndarray | None = None
        for c in f.conditions:
            m = self._condition(c)
            mask = m if mask is None else np.logical_and(mask, m, out=mask)
        mask = np.logical_and(mask, self.live, out=mask) if mask is not None else self.live.copy()  # deleted chunks never pass
        sel = Selection(mask)
        with self._lock:
            self._recent[sig] = sel
            while len(self._recent) > self.CACHE:
                self._recent.popitem(last=False)
        return sel

    def _condition(self, c: Condition) -> np.ndarray:
        """A fresh boolean mask over chunk ids: the chunks that pass c (deleted ones may be set)."""
        if c.kind == "path":
            m = np.zeros(self.size, bool)
            for col, _ in self.segs:
                files = col.segment.docs.files_matching(list(c.values))
                lo = np.searchsorted(col.files_sorted, files, "left")
                hi = np.searchsorted(col.files_sorted, files, "right")
                for a, b in zip(lo.tolist(), hi.tolist()):
                    m[col.ids[col.by_file[a:b]]] = True
            return m
        cols = [col.key(c.key) for col, _ in self.segs]
        if c.kind == "num":
            m = np.zeros(self.size, bool)
            for col in cols:
                m[col.compare(c.op, c.values[0])] = True
            return m
        if c.kind == "eq":
            m = np.zeros(self.size, bool)
            for col in cols:
                for a in col.equal(c.values):
                    m[a] = True
            return m
        m = self.live.copy()  # ne: every chunk but the equal ones (also those without the field)
        for col in cols:
            for a in col.equal(c.values):
                m[a] = False
        return m


def _num(x: Any) -> float | None:
    """x as a number: numbers, and strings that read as one; else None. An integer past the float
    range is +-inf (its order kept: a stored 10**400 is still above every finite bound)."""
    if isinstance(x, bool) or x is None:
        return None
    if isinstance(x, int):
        try:
            return float(x)
        except OverflowError:
            return float("inf") if x > 0 else float("-inf")
    if isinstance(x, float):
        return x
    if not isinstance(x, str) or len(x) > 400:  # no number is written with more; a long str() is a cost
        return None
    try:
        return float(x.strip())
    except ValueError:
        return None


def _bound(value: Any, shown: str, op: str) -> float:
    """The number a range condition compares with: finite, within the float range."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            n = float(value)
        except OverflowError:
            raise InputError(f"filter {shown!r}: the number is out of range (beyond +-1.8e308)") from None
    else:
        n = _num(value)
        if n is None:
            raise InputError(f"filter {shown!r}: {op} needs a number, got {_short(value)}")
    if n != n or n in (float("inf"), float("-inf")):
        raise InputError(f"filter {shown!r}: numbers in filters must be finite, got {_short(value)}")
    return n


def _short(value: Any) -> str:
    text = repr(value) if isinstance(value, (str, int, float, bool)) or value is None else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def _path(key: str) -> str:
    if len(key) > MAX_WHERE_TEXT:
        raise InputError(f"a metadata field name in a filter is {len(key)} characters long; the most is {MAX_WHERE_TEXT}")
    if not key or '"' in key or "\\" in key:
        raise InputError(f"bad metadata field name {key!r} in a filter (it must be non-empty, without quotes or backslashes)")
    return f'$."{key}"'


def _literal(value: Any, shown: str) -> list[Any]:
    """The SQL values a metadata field may hold to equal `value` as given."""
    if isinstance(value, bool):
        return [int(value)]
    if isinstance(value, int):  # also its text form: CSV metadata holds strings
        if not -(1 << 63) <= value < (1 << 63):  # what SQLite (and JSON metadata) holds as an integer
            raise InputError(f"filter {shown!r}: the integer is out of range (a 64-bit integer is the most)")
        return [value, str(value)]
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise InputError(f"filter {shown!r}: numbers in filters must be finite, got {value!r}")
        return [value, str(int(value)) if value.is_integer() else str(value)]
    if not isinstance(value, str):
        raise InputError(f"filter {shown!r}: a value must be a string, a number or a boolean, not {type(value).__name__}")
    if len(value) > MAX_WHERE_TEXT:
        raise InputError(f"filter on a value of {len(value)} characters; the most is {MAX_WHERE_TEXT}")
    s = value
    out: list[Any] = [s]
    n = _num(s)
    if n is not None and n == n and n not in (float("inf"), float("-inf")):
        out += [n, int(n)] if n.is_integer() else [n]
    if s.lower() in ("true", "false"):
        out.append(1 if s.lower() == "true" else 0)
    return out


def _condition(f: Filter, key: str, op: str, value: Any, shown: str) -> None:
    if key == "$path":
        if op != "=":
            raise InputError(f"filter {shown!r}: a path takes a glob (path:GLOB), not {op}")
        if not isinstance(value, str):
            raise InputError(f"filter {shown!r}: a path takes a glob string, not {type(value).__name__}")
        pattern = value
        if len(pattern) > MAX_WHERE_TEXT:
            raise InputError(f"filter on a glob of {len(pattern)} characters; the most is {MAX_WHERE_TEXT}")
        if not pattern:
            raise InputError("filter 'path:': give a glob, e.g. path:*.md")
        f.conditions.append(Condition("path", "$path", "=", (pattern, "*/" + pattern.lstrip("/"))))
    elif op in ("=", "!="):
        given = value if isinstance(value, (list, tuple)) else [value]
        if len(given) > MAX_WHERE_VALUES:
            raise InputError(f"filter on {key!r}: {len(given)} values in one list; the most is {MAX_WHERE_VALUES}")
        values = [v for x in given for v in _literal(x, shown)]
        if not values:
            raise InputError(f"filter {shown!r}: no values")
        _path(key)  # checks the name
        f.conditions.append(Condition("eq" if op == "=" else "ne", key, op, tuple(values)))
    else:
        n = _bound(value, shown, op)
        _path(key)
        f.conditions.append(Condition("num", key, op, (n,)))
    f.text.append(shown)
    if len(f.conditions) > MAX_WHERE_CONDITIONS:
        raise InputError(f"more than {MAX_WHERE_CONDITIONS} conditions in one filter; the most is {MAX_WHERE_CONDITIONS}")


def _shown(key: str, op: str, value: Any) -> str:
    """A condition as the user would write it, cut short: a message never repeats a huge value."""
    text = f"{key}{op}{value}" if isinstance(value, (str, int, float, bool)) or value is None else f"{key}{op}{type(value).__name__}"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 1000:
        text = f"{key}{op}<an integer of {value.bit_length()} bits>"
    return text if len(text) <= 120 else text[:117] + "..."


def parse(where: Any) -> Filter | None:
    """A Filter from a `where` (see the module doc); None when there is nothing to filter."""
    if where is None or where == [] or where == {} or where == ():
        return None
    f = Filter()
    if isinstance(where, str):
        where = [where]
    if isinstance(where, (dict, list, tuple)):
        # where: {field: {op: [values]}} is three levels; anything deeper is refused before any
        # step (repr, str) could recurse into it
        if len(where) > MAX_WHERE_CONDITIONS:  # counted first: a count costs nothing, a walk grows with the value
            raise InputError(f"{len(where)} fields or conditions in one filter; the most is {MAX_WHERE_CONDITIONS}")
        check_depth(where, "the filter (where)", min(MAX_DEPTH, 4))
        check_encodable(where, "the filter (where)")  # SQLite cannot bind a lone surrogate
    if isinstance(where, dict):
        for key, value in where.items():
            if not isinstance(key, str):
                raise InputError(f"filter field names are strings, not {type(key).__name__}")
            if isinstance(value, dict):
                if not value:
                    raise InputError(f"filter on {key[:80]!r}: empty condition")
                for op, v in value.items():
                    if op not in OPS:
                        raise InputError(f"filter on {key[:80]!r}: unknown operator {str(op)[:20]!r}; valid operators are: {', '.join(OPS)}")
                    _condition(f, key, op, v, _shown(key, op, v))
            else:
                _condition(f, key, "=", value, f"path:{_shown('', '', value)}" if key == "$path" else _shown(key, "=", value))
        return f
    if not isinstance(where, (list, tuple)):
        raise InputError(f"where must be a dict, a string or a list of strings, not {type(where).__name__}")
    for cond in where:
        if not isinstance(cond, str):
            raise InputError(f"filter conditions are strings like key=value, key>=n, path:GLOB; got {_short(cond)}")
        if len(cond) > 2 * MAX_WHERE_TEXT:
            raise InputError(f"a filter condition of {len(cond)} characters; the most is {2 * MAX_WHERE_TEXT}")
        shown = cond if len(cond) <= 120 else cond[:117] + "..."
        if cond.strip().startswith("path:"):
            _condition(f, "$path", "=", cond.strip()[5:], shown)
            continue
        m = _COND.match(cond)
        if not m or not m.group(1).strip():
            raise InputError(f"bad filter {shown!r}: expected key=value, key!=value, key>=n, key>n, key<=n, key<n or path:GLOB")
        _condition(f, m.group(1).strip(), m.group(2), m.group(3), shown)
    return f
