"""Bounds on what enters semsearch: how deep a JSON value may nest, how wide a filter may be.

Each bound sits well below what every later step can handle, and is applied where data enters
(HTTP bodies, the Python API, the corpus readers), so nothing past the gate meets a value it
cannot process: Python's recursion limit (1,000 frames, fewer in a worker thread's stack) is what
deep nesting used to hit in `copy.deepcopy`, `repr` and `json.dumps`, well after a write had been
accepted. The checks here are iterative, so they cannot hit it themselves.
"""
from __future__ import annotations

from typing import Any

from semsearch.errors import InputError

MAX_DEPTH = 32  # levels of nesting in a metadata object or a `where` (the object itself is level 1)
MAX_WHERE_CONDITIONS = 64  # conditions in one `where` (each operator of a field counts once)
MAX_WHERE_VALUES = 1024  # values in one "any of" list
MAX_WHERE_TEXT = 4096  # characters in one field name, value or glob


def too_deep(value: Any, limit: int = MAX_DEPTH) -> str | None:
    """The path (like `a.b.0.c`) of the first place in `value` (dicts and lists, as JSON gives
    them) nested deeper than `limit` levels, or None. A scalar is level 0, `{}` and `[]` level 1."""
    stack: list[tuple[Any, int, str]] = [(value, 0, "")]
    while stack:
        v, depth, where = stack.pop()
        if isinstance(v, dict):
            items = v.items()
        elif isinstance(v, (list, tuple)):
            items = enumerate(v)
        else:
            continue
        if depth + 1 > limit:
            return where or "(top level)"
        for k, x in items:
            if isinstance(x, (dict, list, tuple)):
                stack.append((x, depth + 1, f"{where}.{k}" if where else str(k)))
    return None


def check_depth(value: Any, what: str, limit: int = MAX_DEPTH) -> None:
    """Raise InputError naming `what` and the place when `value` nests deeper than `limit`."""
    at = too_deep(value, limit)
    if at is not None:
        shown = at if len(at) <= 80 else at[:77] + "..."
        raise InputError(f"{what} is nested more than {limit} levels deep (at {shown}); the most is {limit}")


def unencodable(value: Any, loc: str = "") -> tuple[str, str, int] | None:
    """(field, text, position) of the first string in a parsed JSON value (keys included) that is
    not valid Unicode (a lone surrogate such as "\\ud800", valid JSON but not encodable as UTF-8)."""
    stack = [(loc, value)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                return where or "body", v, e.start
        elif isinstance(v, dict):
            for k, x in reversed(list(v.items())):
                sub = f"{where}.{k}" if where else str(k)
                try:
                    str(k).encode("utf-8")
                except UnicodeEncodeError as e:
                    return f"{where} (a key)" if where else "body (a key)", str(k), e.start
                stack.append((sub, x))
        elif isinstance(v, (list, tuple)):
            stack.extend((f"{where}.{i}" if where else str(i), x) for i, x in reversed(list(enumerate(v))))
    return None


def check_encodable(value: Any, what: str) -> None:
    """Raise InputError naming `what` and the place when a string in `value` is not valid Unicode."""
    bad = unencodable(value)
    if bad is not None:
        where, text, at = bad
        raise InputError(f"{what}: {where[:80]} is not valid Unicode text ({ascii(text[at])} at character {at + 1} is a lone surrogate, "
                         "which UTF-8 cannot encode)")
