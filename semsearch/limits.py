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


def blank(text: str) -> bool:
    """Whether a text holds nothing to search for: only whitespace, control and format characters
    ("\u0000\u0001", "\u200b"), or nothing. Such a query is refused as empty: encoded, it would
    still be a vector, and rank chunks by nothing the user asked."""
    import unicodedata

    return all(unicodedata.category(c)[0] in "CZ" for c in text)


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


# ---- request bodies, before any per-item work -----------------------------------------------------
def body_problem(data: Any, known: tuple[str, ...], bounds: tuple[tuple[str, int, str], ...],
                 max_values: int) -> tuple[str, str] | None:
    """What refuses a parsed JSON request body before it is validated item by item, as (kind,
    message), kind "input" or "limit"; None when nothing does. Each check costs a count or a walk
    that stops at `max_values`, whatever the body holds: its type; fields other than `known`;
    `bounds` ((field, most, "{n} things in one request; the most is {most}"), for lists and
    objects); then the number of values in the whole body (every string, number, list and
    object counts one), at most `max_values`."""
    if not isinstance(data, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(data), "a number")
        return "input", f"the request body must be a JSON object, not {kind}"
    unknown = [k for k in data if k not in known]
    if unknown and unencodable(unknown[:1000]) is None:  # (a key UTF-8 cannot carry: the validation names it)
        shown = ", ".join(repr(str(k)[:40]) for k in unknown[:5]) + (f" and {len(unknown) - 5:,} more" if len(unknown) > 5 else "")
        return "input", f"unknown field(s) {shown}; known: {', '.join(known)}"
    for field, most, message in bounds:
        value = data.get(field)
        if isinstance(value, (list, dict)) and len(value) > most:
            return "limit", message.format(n=f"{len(value):,}", most=f"{most:,}")
    n, stack = 0, [data]
    while stack:
        v = stack.pop()
        n += 1
        if n > max_values:
            return "limit", (f"the request body holds more than {max_values:,} JSON values (strings, numbers, lists, "
                             f"objects); the most is {max_values:,}: send fewer documents or smaller metadata")
        if isinstance(v, dict):
            stack.extend(v.values())
            n += len(v)  # the keys
        elif isinstance(v, list):
            stack.extend(v)
    return None


def json_body_problem(raw: bytes, known: tuple[str, ...], bounds: tuple[tuple[str, int, str], ...],
                      max_values: int) -> tuple[str, str] | None:
    """body_problem of raw JSON bytes, or ("json_invalid", why) where they do not parse: for a
    worker process that reads a large body before the server does (semsearch.serve)."""
    import json

    try:
        data = json.loads(raw)
    except ValueError as e:
        return "json_invalid", str(e).split(":")[0]
    return body_problem(data, known, bounds, max_values)


def precheck_main(args: str) -> None:
    """`python -c ...precheck_main(ARGS)`: json_body_problem of the body on standard input, with
    ARGS the JSON of [known, bounds, max_values]; prints the problem as JSON (null for none)."""
    import json
    import sys

    known, bounds, most = json.loads(args)
    problem = json_body_problem(sys.stdin.buffer.read(), tuple(known), tuple(tuple(b) for b in bounds), most)
    sys.stdout.write(json.dumps(problem))
