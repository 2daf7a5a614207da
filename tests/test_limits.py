"""Bounds where data enters (semsearch/limits.py): nesting depth, numbers and width of filters,
skipped files named. Each case once broke a search or a run: a huge integer in `where` was a 500,
deeply nested metadata accepted by POST /documents broke every later search that returned it, a
deeply nested JSONL field crashed `semsearch index` with a traceback, and 10,000 `where` fields
cost ~18 s of CPU and kept memory forever."""
from __future__ import annotations

import json

import pytest

from click.testing import CliRunner

from semsearch import filters
from semsearch.cli import main
from semsearch.documents import Document, upsert_documents
from semsearch.errors import InputError
from semsearch.indexing import index_corpus
from semsearch.limits import MAX_DEPTH, MAX_WHERE_CONDITIONS, MAX_WHERE_VALUES, too_deep
from semsearch.search import Retriever
from semsearch.store import Manifest

from conftest import FakeEncoder, running

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from semsearch.serve import Limits, Service, create_app  # noqa: E402


def nested(depth: int, leaf="x") -> dict:
    """A dict `depth` levels deep: nested(1) == {"k": "x"}."""
    v = leaf
    for _ in range(depth):
        v = {"k": v}
    return v


@pytest.fixture
def index(small_corpus, tmp_path):
    folder = tmp_path / "idx"
    index_corpus(small_corpus, folder, FakeEncoder(), progress=False)
    return folder


@pytest.fixture
def server(index):
    with running(create_app(Service(index, device="cpu", encoder=FakeEncoder()), Limits(max_k=50))) as url:
        yield url, index


def test_too_deep_counts_levels_and_names_the_place():
    assert too_deep(nested(MAX_DEPTH), MAX_DEPTH) is None
    assert too_deep(nested(MAX_DEPTH + 1), MAX_DEPTH) == ".".join(["k"] * MAX_DEPTH)
    assert too_deep([[[]]], 3) is None and too_deep([[[[]]]], 3) == "0.0.0"
    assert too_deep("a", 0) is None and too_deep({}, 0) == "(top level)"
    deep: list = []
    for _ in range(100_000):  # far past Python's recursion limit: the walk is iterative
        deep = [deep]
    assert too_deep(deep, MAX_DEPTH) is not None


# ---- 1. numbers in filters -----------------------------------------------------------------------
@pytest.mark.parametrize("where", [
    {"year": {">=": 10 ** 400}},          # OverflowError in float() before
    {"year": {"<": -(10 ** 400)}},
    {"year": 10 ** 400},                  # equality: float(value).is_integer() overflowed too
    {"year": [1, 10 ** 30]},
    {"year": {">=": float("nan")}},       # NaN / Infinity: accepted by Python's JSON, refused here
    {"year": {"<=": float("inf")}},
    {"year": float("-inf")},
    ["year>=1" + "0" * 400],              # the string form: a finite number is required
    ["year<nan"],
    {"year": {">=": [1, 2]}},             # a list where a number goes
    {"year": None},
    {"$path": 5},
    {"lang": "a\ud800b"},                # a lone surrogate: SQLite cannot bind it (found by the fuzzer)
    {"$path": "*\udfff"},
    ["lang=\ud800"],
])
def test_odd_numbers_in_where_are_input_errors(index, where):
    r = Retriever.load(index, encoder=FakeEncoder())
    with pytest.raises(InputError, match="filter"):
        r.search("loan", k=3, where=where)
    assert r.search("loan", k=3, where={"year": {">=": 2000}}) == []  # still answers


def test_huge_integer_in_where_over_http_is_a_422_and_the_server_goes_on(server):
    url, _ = server
    body = '{"query": "loan", "where": {"year": {">=": 1' + "0" * 400 + '}}}'
    r = httpx.post(url + "/search", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert "out of range" in r.json()["error"]["message"]
    r = httpx.post(url + "/search", content='{"query": "loan", "where": {"year": NaN}}', headers={"content-type": "application/json"})
    assert r.status_code == 422 and "finite" in r.json()["error"]["message"]
    assert httpx.post(url + "/search", json={"query": "loan", "k": 2}).status_code == 200


def test_stored_huge_integers_still_compare(tmp_path):
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "r.jsonl").write_text(
        json.dumps({"text": "a loan", "n": 10 ** 30}) + "\n" + '{"text": "a bank", "n": 1' + "0" * 400 + "}\n"
        + json.dumps({"text": "a soup", "n": 5}) + "\n")
    index_corpus(corpus, tmp_path / "idx", FakeEncoder(), progress=False)
    r = Retriever.load(tmp_path / "idx", encoder=FakeEncoder())
    assert sorted(h.text for h in r.search("a", k=5, mode="dense", where={"n": {">=": 1e20}})) == ["a bank", "a loan"]
    assert [h.text for h in r.search("a", k=5, mode="dense", where={"n": {"<": 10}})] == ["a soup"]


# ---- 2. nesting: metadata written through HTTP and Python ------------------------------------------
def test_metadata_at_the_depth_limit_is_written_and_searchable_one_past_is_refused(server):
    url, index = server
    gen = Manifest.load(index).generation
    r = httpx.post(url + "/documents", json={"documents": [{"id": "deep", "text": "zebra crossing", "metadata": nested(MAX_DEPTH + 1)}]})
    assert r.status_code == 422, r.text
    assert "nested" in r.json()["error"]["message"] and "metadata" in r.json()["error"]["message"]
    assert Manifest.load(index).generation == gen  # nothing written
    r = httpx.post(url + "/documents", json={"documents": [{"id": "ok", "text": "zebra crossing", "metadata": nested(MAX_DEPTH)}]})
    assert r.status_code == 200, r.text
    r = httpx.post(url + "/search", json={"query": "zebra crossing", "k": 50})  # k past the chunk count: every hit
    assert r.status_code == 200, r.text
    assert any(h["metadata"] == nested(MAX_DEPTH) for h in r.json()["hits"])


def test_a_body_nested_past_the_limit_anywhere_is_refused_before_it_is_walked(server):
    url, _ = server
    for body in ({"query": "loan", "where": nested(200)}, {"documents": [{"id": "a", "text": "b", "metadata": nested(900)}]}):
        path = "/search" if "query" in body else "/documents"
        r = httpx.post(url + path, content=json.dumps(body), headers={"content-type": "application/json"})
        assert r.status_code in (400, 422), r.text
    assert httpx.get(url + "/search", params={"q": "loan"}).status_code == 200


def test_python_upsert_refuses_metadata_past_the_limit(index):
    gen = Manifest.load(index).generation
    with pytest.raises(InputError, match=f"more than {MAX_DEPTH} levels"):
        upsert_documents(index, [Document("d", "text", nested(MAX_DEPTH + 1))], FakeEncoder())
    assert Manifest.load(index).generation == gen
    upsert_documents(index, [Document("d", "text", nested(MAX_DEPTH))], FakeEncoder())
    hits = Retriever.load(index, encoder=FakeEncoder()).search("text", k=10)
    assert any(h.to_dict()["metadata"] == nested(MAX_DEPTH) for h in hits)


# ---- 3. nesting in corpus files ---------------------------------------------------------------------
@pytest.fixture
def fake_cli(monkeypatch):
    """`semsearch index` with the fake encoder."""
    import semsearch.indexing

    monkeypatch.setattr(semsearch.indexing, "encoder_for_index", lambda *a, **k: FakeEncoder())


@pytest.mark.parametrize("depth", [600, MAX_DEPTH + 1])
def test_a_deeply_nested_jsonl_field_is_a_named_error_or_skipped(tmp_path, depth, fake_cli, caplog):
    corpus = tmp_path / "c"
    corpus.mkdir()
    deep = json.dumps({"text": "nested record", "meta": nested(depth)})
    (corpus / "r.jsonl").write_text(json.dumps({"text": "first record"}) + "\n" + deep + "\n" + json.dumps({"text": "third record"}) + "\n")
    (corpus / "ok.txt").write_text("a plain file about loans")
    idx = tmp_path / "idx"
    index_corpus(corpus / "ok.txt", idx, FakeEncoder(), progress=False)
    before = Manifest.load(idx).generation
    res = CliRunner().invoke(main, ["index", str(corpus), "--index", str(idx)])
    assert res.exit_code != 0
    assert "Traceback" not in res.output and "r.jsonl:2" in res.output and "nested" in res.output, res.output
    assert Manifest.load(idx).generation == before  # the index is untouched
    res = CliRunner().invoke(main, ["index", str(corpus), "--index", str(idx), "--skip-errors"])
    assert res.exit_code == 0, res.output
    assert "r.jsonl:2: record nested more than" in caplog.text
    texts = {h.text for h in Retriever.load(idx, encoder=FakeEncoder()).search("record", k=10, mode="lexical")}
    assert texts == {"first record", "third record"}


def test_a_lone_surrogate_in_a_jsonl_record_is_a_named_error_or_skipped(tmp_path, fake_cli, caplog):
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "r.jsonl").write_text('{"text": "first record"}\n{"text": "broken \\ud800 emoji"}\n{"text": "third record"}\n')
    res = CliRunner().invoke(main, ["index", str(corpus), "--index", str(tmp_path / "idx")])
    assert res.exit_code != 0 and "r.jsonl:2" in res.output and "lone surrogate" in res.output, res.output
    assert "Traceback" not in res.output
    res = CliRunner().invoke(main, ["index", str(corpus), "--index", str(tmp_path / "idx"), "--skip-errors"])
    assert res.exit_code == 0, res.output
    assert len(Retriever.load(tmp_path / "idx", encoder=FakeEncoder()).search("record", k=5, mode="lexical")) == 2


def test_python_upsert_refuses_a_lone_surrogate(index):
    with pytest.raises(InputError, match="lone surrogate"):
        upsert_documents(index, [Document("d", "text \ud800", {})], FakeEncoder())
    with pytest.raises(InputError, match="lone surrogate"):
        upsert_documents(index, [Document("d", "text", {"k": "\udc00"})], FakeEncoder())


def test_a_jsonl_field_at_the_limit_is_indexed(tmp_path):
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "r.jsonl").write_text(json.dumps({"text": "nested record", "meta": nested(MAX_DEPTH - 1)}) + "\n")
    index_corpus(corpus, tmp_path / "idx", FakeEncoder(), progress=False)
    [hit] = Retriever.load(tmp_path / "idx", encoder=FakeEncoder()).search("record", k=3)
    assert hit.to_dict()["metadata"]["meta"] == nested(MAX_DEPTH - 1)


# ---- 4. filter width --------------------------------------------------------------------------------
def test_too_many_where_fields_is_a_4xx_and_reads_nothing(server, monkeypatch):
    url, index = server
    from semsearch.store.docstore import DocStore

    scans = []
    orig = DocStore.metadata_values
    monkeypatch.setattr(DocStore, "metadata_values", lambda self, key: scans.append(key) or orig(self, key))
    wide = {f"field{i}": "x" for i in range(10_000)}
    r = httpx.post(url + "/search", json={"query": "loan", "where": wide})
    assert r.status_code == 422 and f"the most is {MAX_WHERE_CONDITIONS}" in r.json()["error"]["message"]
    r = httpx.post(url + "/search", json={"query": "loan", "where": {"lang": [str(i) for i in range(MAX_WHERE_VALUES + 1)]}})
    assert r.status_code == 422 and f"the most is {MAX_WHERE_VALUES}" in r.json()["error"]["message"]
    # at the limit: fields no chunk has cost no scan of the docstore, and nothing is kept for them
    at_limit = {f"nofield{i}": "x" for i in range(MAX_WHERE_CONDITIONS)}
    r = httpx.post(url + "/search", json={"query": "loan", "where": at_limit})
    assert r.status_code == 200 and r.json()["hits"] == []
    assert scans == []


def test_the_per_segment_field_cache_is_bounded(tmp_path):
    corpus = tmp_path / "c"
    corpus.mkdir()
    n = filters._SegmentColumns.KEYS + 40
    (corpus / "r.jsonl").write_text("\n".join(json.dumps({"text": f"record {i}", f"f{i}": i}) for i in range(n)) + "\n")
    index_corpus(corpus, tmp_path / "idx", FakeEncoder(), progress=False)
    r = Retriever.load(tmp_path / "idx", encoder=FakeEncoder())
    for i in range(n):
        assert [h.text for h in r.search("record", k=3, mode="lexical", where={f"f{i}": i})] == [f"record {i}"]
    cols = [filters._SegmentColumns.of(p.segment) for p in r.docs.parts]
    assert cols and all(len(c._keys) <= filters._SegmentColumns.KEYS for c in cols)


# ---- 6. every skipped file named --------------------------------------------------------------------
def test_binary_and_special_files_are_named_with_their_reason(tmp_path, fake_cli):
    import os

    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "ok.txt").write_text("loans and banks")
    (corpus / "blob.txt").write_bytes(b"\x00\x01binary" * 100)
    (corpus / "utf16.csv").write_text("text,year\nhello,2020\n", encoding="utf-16")
    os.mkfifo(corpus / "pipe.txt")
    res = CliRunner().invoke(main, ["index", str(corpus), "--index", str(tmp_path / "idx"), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout[res.stdout.index("{"):])
    named = "\n".join(report["skipped_files"])
    for name, why in (("blob.txt", "binary"), ("utf16.csv", "binary"), ("pipe.txt", "not a regular file")):
        assert f"{name}: {why}" in named, named
    res = CliRunner().invoke(main, ["index", str(corpus), "--index", str(tmp_path / "idx2")])
    assert "blob.txt: binary" in res.output and "pipe.txt: not a regular file" in res.output
