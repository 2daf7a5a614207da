"""Property-based fuzzing of what enters semsearch from outside: the HTTP API from its own OpenAPI
schema (schemathesis), `where` filters and corpus records (hypothesis). The only outcomes allowed
are an answer or a clear error: no 5xx, no exception but a SemsearchError, nothing already indexed
lost.

Bounded for CI (SEMSEARCH_FUZZ_SCALE multiplies every count: 20 gives the longer run outside CI).
Each test prints how many examples it ran. FakeEncoder, real FAISS, SQLite and uvicorn.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from semsearch import filters  # noqa: E402
from semsearch.corpus.readers import ReadOptions  # noqa: E402
from semsearch.errors import InputError, SemsearchError  # noqa: E402
from semsearch.indexing import index_corpus  # noqa: E402
from semsearch.search import Retriever  # noqa: E402
from semsearch.store import Manifest  # noqa: E402

from conftest import FakeEncoder, running  # noqa: E402

SCALE = float(os.environ.get("SEMSEARCH_FUZZ_SCALE", "1"))
SEED = int(os.environ.get("SEMSEARCH_FUZZ_SEED", "0"))


def examples(n: int) -> int:
    return max(1, int(n * SCALE))


def fuzz_settings(n: int):
    return settings(max_examples=examples(n), deadline=None, derandomize=SEED == 0, database=None,
                    suppress_health_check=list(HealthCheck))


# JSON as parsers give it, with what broke things before: huge integers, NaN and infinities,
# deep nesting, lone surrogates, long strings, odd keys.
scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(), st.integers(min_value=10 ** 300, max_value=10 ** 500), st.integers(max_value=-(2 ** 63)),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30), st.sampled_from(["", "1e999", "nan", "-inf", "2020", " 7 ", "true", "*", "a\ud800b", "x" * 5000]),
)
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=8), inner, max_size=5)),
                           max_leaves=30)


def deep(depth: int, leaf):
    for _ in range(depth):
        leaf = {"k": leaf}
    return leaf


plain = st.one_of(st.integers(1990, 2030), st.floats(-1e6, 1e6), st.sampled_from(["en", "de", "2005", "x", True]))
plausible = st.one_of(
    st.dictionaries(st.sampled_from(["year", "lang", "n", "nofield"]), st.one_of(plain, st.lists(plain, max_size=4)), min_size=1, max_size=3),
    st.dictionaries(st.sampled_from(["year", "n"]), st.dictionaries(st.sampled_from([">=", "<", "!=", "=", ">", "<="]), plain, min_size=1, max_size=2),
                    min_size=1, max_size=2),
    st.builds(lambda k, op, v: [f"{k}{op}{v}"], st.sampled_from(["year", "lang", "n"]), st.sampled_from(["=", "!=", ">=", "<"]), plain),
    st.builds(lambda g: {"$path": g}, st.sampled_from(["*.jsonl", "r.*", "*/c/*", "nothing*", "[a-"])),
)
where_values = st.one_of(
    plausible, plausible,
    json_values,
    st.dictionaries(st.sampled_from(["year", "lang", "$path", "n", "", 'a"b', "k" * 5000]), json_values, max_size=4),
    st.dictionaries(st.sampled_from(["year", "n"]), st.dictionaries(st.sampled_from(["=", "!=", ">=", "<", "~", ">"]), json_values, max_size=3), max_size=2),
    st.lists(st.one_of(st.text(max_size=20), st.from_regex(r"[a-z$]{0,4}(=|!=|>=|<=|<|>|:)[-0-9e.a-z*]{0,12}", fullmatch=True)), max_size=5),
    st.builds(deep, st.integers(0, 2000), scalars),
    st.builds(lambda n: {f"f{i}": i for i in range(n)}, st.integers(60, 20_000)),
)


@pytest.fixture(scope="module")
def jsonl_index(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz-inputs")
    (root / "c").mkdir()
    rows = [{"text": f"record {i} about loans", "year": 2000 + i, "lang": "en" if i % 2 else "de", "n": 10 ** (i * 40)} for i in range(12)]
    (root / "c" / "r.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    index_corpus(root / "c", root / "idx", FakeEncoder(), progress=False)
    return root / "idx"


def test_fuzz_where(jsonl_index):
    r = Retriever.load(jsonl_index, encoder=FakeEncoder())
    tally: Counter = Counter()

    @fuzz_settings(600)
    @given(where_values)
    def check(where):
        try:
            f = filters.parse(where)
            hits = r.search("record loans", k=5, where=where)
        except InputError as e:
            assert str(e) and len(str(e)) < 2000  # a message, never the whole value repeated back
            tally["input error"] += 1
            return
        tally["answered"] += 1
        if f is not None:
            allowed = set(f.ids(r.docs).tolist())
            assert all(h.id in allowed for h in hits)

    check()
    total = sum(tally.values())
    print(f"\nfuzz where: {total} examples: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.items())))
    assert tally["answered"] and tally["input error"]


records = st.dictionaries(st.sampled_from(["text", "title", "year", "meta", "tags", "n"]), json_values, min_size=1, max_size=5)


@pytest.fixture
def base_index(tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "a.txt").write_text("the bank approved the loan")
    index_corpus(tmp_path / "base", tmp_path / "idx", FakeEncoder(), progress=False)
    return tmp_path


def test_fuzz_corpus_records(base_index):
    """JSONL, JSON and CSV files of generated records: indexed, skipped, or a SemsearchError;
    after an error the index is as it was."""
    root = base_index
    idx = root / "idx"
    tally: Counter = Counter()
    n = [0]

    def written(kind: str, rows: list[dict], raw: bytes | None) -> str:
        n[0] += 1
        folder = root / f"corpus{n[0]}"
        folder.mkdir()
        if raw is not None:
            (folder / f"odd.{kind}").write_bytes(raw)
        elif kind == "jsonl":
            (folder / "r.jsonl").write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8", errors="surrogatepass")
        elif kind == "json":
            (folder / "r.json").write_text(json.dumps(rows), encoding="utf-8", errors="surrogatepass")
        else:
            keys = sorted({k for r in rows for k in r})
            lines = [",".join(keys)] + [",".join(json.dumps(r.get(k, "")).replace(",", ";") for k in keys) for r in rows]
            (folder / "r.csv").write_text("\n".join(lines), encoding="utf-8", errors="surrogatepass")
        return str(folder)

    encodings = st.sampled_from(["utf-8", "utf-16", "latin-1", "utf-8-sig"])

    @fuzz_settings(40)
    @given(st.sampled_from(["jsonl", "json", "csv"]), st.lists(records, min_size=1, max_size=4), st.booleans(), encodings,
           st.integers(0, 1500))
    def check(kind, rows, as_raw, encoding, depth):
        if depth > 30:
            rows = rows + [{"text": "deep one", "meta": deep(depth, 1)}]
        raw = None
        if as_raw:
            text = "\n".join(json.dumps(r) for r in rows) if kind != "csv" else "text,year\nhello,2020\n"
            raw = text.encode(encoding, "surrogatepass" if encoding.startswith("utf") else "replace")
        corpus = written(kind, rows, raw)
        before = Manifest.load(idx).generation
        try:
            index_corpus(Path(corpus), idx, FakeEncoder(), progress=False, read=ReadOptions(skip_errors=False))
            tally["indexed"] += 1
        except SemsearchError as e:
            assert str(e)
            assert Manifest.load(idx).generation == before
            tally["error"] += 1
        hits = Retriever.load(idx, encoder=FakeEncoder()).search("bank loan", k=3, mode="lexical")
        assert any(h.text == "the bank approved the loan" for h in hits)  # nothing already indexed lost

    check()
    print(f"\nfuzz corpus records: {sum(tally.values())} examples: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.items())))
    assert tally["indexed"]


# ---- the HTTP API, from its own OpenAPI schema --------------------------------------------------
schemathesis = pytest.importorskip("schemathesis")
pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    from semsearch.serve import Limits, Service, create_app

    root = tmp_path_factory.mktemp("fuzz-api")
    (root / "c").mkdir()
    (root / "c" / "bank.txt").write_text("The bank approved the loan after checking the credit score.")
    (root / "c" / "r.jsonl").write_text("\n".join(json.dumps({"text": f"note {i}", "year": 2000 + i}) for i in range(5)) + "\n")
    index_corpus(root / "c", root / "idx", FakeEncoder(), progress=False)
    app = create_app(Service(root / "idx", device="cpu", encoder=FakeEncoder()), Limits(max_k=100), docs=True)
    with running(app) as url:
        yield schemathesis.openapi.from_url(url + "/openapi.json"), root / "idx"


def test_fuzz_http_api(api):
    """Every operation of the served OpenAPI schema, with schemathesis' generated requests
    (valid and invalid): never a 5xx, every status and error body one the schema declares; the
    corpus' chunks survive every write and delete."""
    from schemathesis.checks import (content_type_conformance, not_a_server_error, response_schema_conformance,
                                     status_code_conformance)

    schema, idx = api
    calls: Counter = Counter()
    statuses: Counter = Counter()
    for op in schema.get_all_operations():
        op = op.ok()

        @settings(max_examples=examples(25), deadline=None, suppress_health_check=list(HealthCheck), database=None,
                  derandomize=SEED == 0)
        @given(case=op.as_strategy())
        def check(case):
            response = case.call(timeout=60)
            calls[op.label] += 1
            statuses[response.status_code // 100 * 100] += 1
            assert response.status_code < 500, f"{op.label}: {response.status_code} {response.text[:500]}"
            case.validate_response(response, checks=[not_a_server_error, status_code_conformance, content_type_conformance,
                                                      response_schema_conformance])

        check()
    print(f"\nfuzz http: {sum(calls.values())} requests ({dict(sorted(statuses.items()))}): "
          + ", ".join(f"{k} {v}" for k, v in sorted(calls.items())))
    assert {"POST /search", "GET /search", "POST /documents", "DELETE /documents/{doc_id}"} <= set(calls)
    r = Retriever.load(idx, encoder=FakeEncoder())
    assert any("bank approved" in h.text for h in r.search("bank approved the loan", k=20, mode="lexical"))
