"""Bad inputs driven through the CLI: a clear message, a non-zero exit, and an existing index left intact.

Uses the real bundled model on tiny corpora. Every command gets --index inside tmp_path, and the
working directory and $SEMSEARCH_INDEX point into tmp_path too, so nothing is written into the repo.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from semsearch.cli import main
from semsearch.store import FORMAT_VERSION

INDEX_OPTS = ["--no-progress", "--device", "cpu", "--precision", "fp32"]
QUERIES = ["loan approval and credit score", "cooking lentil soup", "meteor shower comet", "password reset"]

BANK = "The bank approved the loan after checking the credit score.\nMortgage rates fell this spring.\n"
COOK = "# Soup\nSimmer lentils with onion and cumin for twenty minutes.\n"
SPACE = "Meteor showers happen when Earth crosses a comet's debris trail.\n"
FAQ = "id,question\n1,How do I reset my online banking password?\n2,What is the daily ATM withdrawal limit?\n"
BAD_CSV = (
    "id,text\n"
    "1,How do I change the PIN of my debit card?\n"
    "2,Where can I see my monthly statement?\n"
    "3,this line,has,too many fields\n"  # line 4 of the file
    "4,Can I freeze a lost card from the app?\n"
)
BAD_JSONL = (
    '{"text": "Tomatoes need six hours of sun a day.", "topic": "garden"}\n'
    '{"text": "Water them deeply twice a week", "topic": \n'  # line 2: malformed
    '{"text": "Pinch off the suckers to get bigger fruit.", "topic": "garden"}\n'
)


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _stay_in_tmp(tmp_path, monkeypatch):
    """No command may fall back to ./indexes/default in the repo."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SEMSEARCH_INDEX", str(tmp_path / "default-index-must-not-be-used"))


def cli(*args, input: str | None = None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def ok(result) -> str:
    assert result.exit_code == 0, f"exit {result.exit_code}: {result.output}\n{result.exception!r}"
    return result.output


def fails(result, code: int | None = None) -> str:
    """The message of a handled failure (a click error, not a traceback)."""
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), f"unhandled exception: {result.exception!r}\n{result.output}"
    if code is not None:
        assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    assert "Error:" in result.output
    return result.output


def index(corpus, idx, *extra):
    return cli("index", corpus, "--index", idx, *INDEX_OPTS, *extra)


def hits(idx) -> list[list[tuple]]:
    """Every hit (k=20, more than the tiny indexes hold) for QUERIES, as comparable tuples."""
    out = ok(cli("query", "-", "--index", idx, "--device", "cpu", "--json", "-k", "20", input="\n".join(QUERIES) + "\n"))
    res = json.loads(out)
    assert [r["query"] for r in res] == QUERIES
    return [
        [(h["path"], h["row"], h["line"], h["start"], h["end"], h["text"], round(h["score"], 4)) for h in r["hits"]]
        for r in res
    ]


def snapshot(idx: Path) -> dict[str, str]:
    """sha256 of every file of an index folder but the lock: equal snapshots = the index is untouched."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(idx).iterdir()) if p.name != ".lock"}


def counts(idx) -> dict:
    return json.loads(ok(cli("info", "--index", idx, "--json")))["counts"]


def make_corpus(root: Path, files: dict[str, str | bytes]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return root


class Built:
    corpus: Path
    index: Path
    hits: list
    snapshot: dict
    counts: dict


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Built:
    """One index of a tiny corpus, built once through the CLI; tests work on copies of it."""
    base = tmp_path_factory.mktemp("built")
    b = Built()
    b.corpus = make_corpus(base / "corpus", {"bank.txt": BANK, "cook.md": COOK, "space.txt": SPACE, "faq.csv": FAQ})
    b.index = base / "index"
    out = ok(index(b.corpus, b.index))
    assert "4 added" in out and "index holds 4 files, 5 chunks" in out
    b.hits = hits(b.index)
    # sanity: the queries find what they should, so comparing hits is meaningful
    assert b.hits[0][0][0].endswith("bank.txt")
    assert b.hits[1][0][0].endswith("cook.md")
    assert b.hits[2][0][0].endswith("space.txt")
    assert b.hits[3][0][0].endswith("faq.csv") and b.hits[3][0][1] == 1
    assert all(len(h) == 5 for h in b.hits)
    b.snapshot = snapshot(b.index)
    b.counts = counts(b.index)
    return b


@pytest.fixture
def idx(tmp_path, built) -> Path:
    """A private copy of the built index, which a test may try (and fail) to damage."""
    dst = tmp_path / "idx"
    shutil.copytree(built.index, dst)
    assert snapshot(dst) == built.snapshot
    return dst


def assert_intact(idx: Path, built: Built, snap: dict | None = None) -> None:
    assert snapshot(idx) == (snap if snap is not None else built.snapshot)  # manifest and data files unchanged
    assert hits(idx) == built.hits  # and it answers exactly as before


# ---------------------------------------------------------------------------------------------
# index: bad corpus paths and contents
# ---------------------------------------------------------------------------------------------


def test_missing_corpus_path(tmp_path, idx, built):
    missing = tmp_path / "no-such-corpus"
    msg = fails(index(missing, idx), 1)
    assert f"corpus path {str(missing)!r} does not exist" in msg
    assert_intact(idx, built)
    fresh = tmp_path / "fresh"
    fails(index(missing, fresh), 1)
    assert not fresh.exists()  # nothing created for a run that could not start


def test_empty_folder(tmp_path, idx, built):
    empty = tmp_path / "empty"
    empty.mkdir()
    msg = fails(index(empty, idx), 1)
    assert f"no indexable files in {str(empty)!r}" in msg
    assert "supported: .txt .md .rst .csv .tsv .jsonl .json .parquet" in msg
    assert_intact(idx, built)
    fresh = tmp_path / "fresh"
    fails(index(empty, fresh), 1)
    assert not fresh.exists()


def test_folder_with_only_unsupported_binary_and_hidden_files(tmp_path, idx, built):
    junk = make_corpus(tmp_path / "junk", {
        "photo.jpg": b"\xff\xd8\xff\xe0\0\x10JFIF",
        "slides.key": b"PK\x03\x04 keynote",
        "blob.txt": b"text with a \0 NUL byte",
        ".secret.md": "hidden",
        ".git/config.txt": "hidden folder",
    })
    msg = fails(index(junk, idx), 1)
    assert f"no indexable files in {str(junk)!r}" in msg
    for reason in ("1 unsupported type (.jpg)", "1 unsupported type (.key)", "1 binary", "2 hidden"):
        assert reason in msg
    assert "supported: .txt" in msg
    assert_intact(idx, built)


def test_non_utf8_file_is_skipped_with_a_warning_and_the_rest_indexed(tmp_path, caplog):
    corpus = make_corpus(tmp_path / "corpus", {
        "bank.txt": BANK,
        "cook.md": COOK,
        "latin1.txt": "Caf\xe9 cr\xe8me br\xfbl\xe9e recipe".encode("latin-1"),
    })
    fresh = tmp_path / "fresh"
    with caplog.at_level(logging.WARNING):
        out = ok(index(corpus, fresh))
    bad = corpus.resolve() / "latin1.txt"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(bad) in w and "not UTF-8" in w for w in warnings), warnings
    assert "skipped 1 file(s): not UTF-8" in out
    assert "2 added" in out and "1 file(s) skipped" in out and "index holds 2 files" in out
    assert counts(fresh) == {"files": 2, "documents": 2, "chunks": 2}
    found = hits(fresh)
    paths = {h[0] for per_query in found for h in per_query}
    assert paths == {str(corpus.resolve() / "bank.txt"), str(corpus.resolve() / "cook.md")}
    assert found[0][0][0].endswith("bank.txt")


@pytest.fixture
def own(tmp_path):
    """A fresh corpus and its own index (for tests that change the corpus)."""
    corpus = make_corpus(tmp_path / "own", {"bank.txt": BANK, "cook.md": COOK, "space.txt": SPACE, "faq.csv": FAQ})
    folder = tmp_path / "own-index"
    ok(index(corpus, folder))
    return corpus, folder


def test_malformed_csv_line_names_file_and_line_then_skip_errors_goes_on(own):
    corpus, folder = own
    before_snap, before_hits, before_counts = snapshot(folder), hits(folder), counts(folder)
    bad = corpus / "bad.csv"
    bad.write_text(BAD_CSV)

    msg = fails(index(corpus, folder), 1)
    assert str(bad.resolve()) in msg
    assert re.search(r"\bline 4\b", msg), msg
    assert "--skip-errors" in msg
    assert snapshot(folder) == before_snap
    assert hits(folder) == before_hits
    assert counts(folder) == before_counts

    out = ok(index(corpus, folder, "--skip-errors"))
    assert "1 added" in out and "4 unchanged" in out
    assert counts(folder)["files"] == before_counts["files"] + 1
    res = json.loads(ok(cli("query", "lost debit card PIN", "--index", folder, "--device", "cpu", "--json", "-k", "20")))
    from_bad = [h for h in res["hits"] if h["path"] == str(bad.resolve())]
    assert sorted(h["text"] for h in from_bad) == [
        "Can I freeze a lost card from the app?",
        "How do I change the PIN of my debit card?",
        "Where can I see my monthly statement?",
    ]
    assert not any("too many fields" in h["text"] or "this line" in h["text"] for h in res["hits"])


def test_malformed_jsonl_line_names_file_and_line_then_skip_errors_goes_on(own):
    corpus, folder = own
    before_snap, before_hits = snapshot(folder), hits(folder)
    bad = corpus / "garden.jsonl"
    bad.write_text(BAD_JSONL)

    msg = fails(index(corpus, folder), 1)
    assert f"{bad.resolve()}:2:" in msg
    assert "malformed JSON line" in msg and "--skip-errors" in msg
    assert snapshot(folder) == before_snap
    assert hits(folder) == before_hits

    ok(index(corpus, folder, "--skip-errors"))
    res = json.loads(ok(cli("query", "growing tomatoes", "--index", folder, "--device", "cpu", "--json", "-k", "20")))
    from_bad = sorted((h["row"], h["text"], h["metadata"]["topic"]) for h in res["hits"] if h["path"] == str(bad.resolve()))
    assert from_bad == [
        (1, "Tomatoes need six hours of sun a day.", "garden"),
        (3, "Pinch off the suckers to get bigger fruit.", "garden"),
    ]
    assert res["hits"][0]["path"] == str(bad.resolve())


def test_failed_index_run_leaves_the_previous_index_fully_usable(own):
    corpus, folder = own
    before_snap, before_hits, before_counts = snapshot(folder), hits(folder), counts(folder)
    manifest_before = (folder / "manifest.json").read_bytes()
    # A run that would update one file, remove one, add one, and then meets a malformed CSV.
    (corpus / "bank.txt").write_text("The branch closed early because of the storm.\n")
    (corpus / "space.txt").unlink()
    (corpus / "new.md").write_text("Knitting a scarf takes patience and good wool.\n")
    (corpus / "zz_bad.csv").write_text(BAD_CSV)

    msg = fails(index(corpus, folder), 1)
    assert "zz_bad.csv" in msg and re.search(r"\bline 4\b", msg)
    assert (folder / "manifest.json").read_bytes() == manifest_before
    assert snapshot(folder) == before_snap  # no half-written generation left behind either
    assert hits(folder) == before_hits  # the old bank text, the removed space.txt: all as before
    assert counts(folder) == before_counts

    # The next good run starts from the intact previous generation.
    (corpus / "zz_bad.csv").unlink()
    out = ok(index(corpus, folder))
    assert "1 added, 1 updated, 1 removed, 2 unchanged" in out
    res = json.loads(ok(cli("query", "storm closed the branch", "--index", folder, "--device", "cpu", "--json")))
    assert res["hits"][0]["text"] == "The branch closed early because of the storm."
    assert not any(h["path"].endswith("space.txt") for h in res["hits"])


# ---------------------------------------------------------------------------------------------
# query: empty queries
# ---------------------------------------------------------------------------------------------


def test_empty_query(idx, built):
    for args, stdin, message in [
        (["query", ""], None, "the query is empty"),
        (["query", "   "], None, "the query is empty"),
        (["query", "-"], "", "no queries on stdin"),
        (["query", "-"], "\n   \n\t\n", "no queries on stdin"),
    ]:
        msg = fails(cli(*args, "--index", idx, "--device", "cpu", input=stdin), 1)
        assert f"Error: {message}" in msg, (args, stdin, msg)
    assert_intact(idx, built)


# ---------------------------------------------------------------------------------------------
# bad options
# ---------------------------------------------------------------------------------------------


def test_unknown_pooling_lists_valid_values(tmp_path, idx, built):
    msg = fails(index(built.corpus, idx, "--pooling", "foo"), 2)
    assert "--pooling" in msg and "'foo'" in msg
    assert "cls, mean, max" in msg
    msg = fails(cli("query", "loan", "--index", idx, "--device", "cpu", "--pooling", "foo"), 2)
    assert "--pooling" in msg and "'foo'" in msg
    for name in ("cls", "mean", "max"):
        assert f"'{name}'" in msg
    assert_intact(idx, built)
    fresh = tmp_path / "fresh"
    fails(index(built.corpus, fresh, "--pooling", "foo"), 2)
    assert not fresh.exists()


@pytest.mark.parametrize("opts, message", [
    (["--chunk-tokens", "0"], "--chunk-tokens must be positive, got 0"),
    (["--chunk-tokens", "1000"], "--chunk-tokens 1000 exceeds the model's 254 content tokens"),
    (["--chunk-tokens", "64", "--overlap", "64"], "--overlap must be in [0, 64), got 64"),
])
def test_bad_chunk_settings_name_the_option(tmp_path, built, opts, message):
    fresh = tmp_path / "fresh"
    msg = fails(index(built.corpus, fresh, *opts), 1)
    assert message in msg
    assert not fresh.exists()


def test_missing_model_folder(tmp_path, idx, built):
    msg = fails(index(built.corpus, idx, "--model", "./nope"), 1)
    assert "model folder './nope' does not exist" in msg
    msg = fails(cli("query", "loan", "--index", idx, "--device", "cpu", "--model", "./nope"), 1)
    assert "model folder './nope' does not exist" in msg
    assert_intact(idx, built)
    fresh = tmp_path / "fresh"
    fails(index(built.corpus, fresh, "--model", "./nope"), 1)
    assert not fresh.exists()


# ---------------------------------------------------------------------------------------------
# missing or foreign index folders
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["query", "loan", "--device", "cpu"], ["info"]])
def test_index_folder_missing(tmp_path, command):
    missing = tmp_path / "no-index-here"
    msg = fails(cli(*command, "--index", missing), 1)
    assert f"no index at {str(missing)!r}" in msg
    assert f"semsearch index CORPUS --index {missing}" in msg
    assert not missing.exists()


def test_folder_that_is_not_an_index(tmp_path):
    folder = tmp_path / "just-a-folder"
    folder.mkdir()
    msg = fails(cli("query", "loan", "--index", folder, "--device", "cpu"), 1)
    assert f"{folder} is not a semsearch index (no manifest.json)" in msg
    assert list(folder.iterdir()) == []


def test_index_of_another_format_version(idx, built):
    mpath = idx / "manifest.json"
    raw = json.loads(mpath.read_text())
    assert raw["format_version"] == FORMAT_VERSION
    raw["format_version"] = 999
    mpath.write_text(json.dumps(raw, indent=2))
    snap = snapshot(idx)

    expected = (
        f"{idx} was written by index format version 999; this semsearch reads versions 1, 2, 3, 4, 5, 6, 7, 8, 9, 10. "
        f"Rebuild it with `semsearch index CORPUS --index {idx} --rebuild`."
    )
    for args in (["query", "loan", "--index", idx, "--device", "cpu"], ["info", "--index", idx]):
        msg = fails(cli(*args), 1)
        assert expected in msg
    # An update (without --rebuild) refuses too, and touches nothing.
    msg = fails(index(built.corpus, idx), 1)
    assert expected in msg
    assert snapshot(idx) == snap

    # Following the advice works and gives back the same search results.
    ok(index(built.corpus, idx, "--rebuild"))
    assert json.loads(mpath.read_text())["format_version"] == FORMAT_VERSION
    assert hits(idx) == built.hits
    assert counts(idx) == built.counts
