"""The hardening items seen from the command line, with the real bundled model on tiny corpora."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from semsearch.cli import main
from semsearch.formatting import table as _table
from semsearch.search import Hit

from conftest import REPO

OPTS = ["--no-progress", "--device", "cpu", "--precision", "fp32"]
FILES = {
    "bank.txt": "The bank approved the loan after checking the credit score.\nMortgage rates fell this spring.\n",
    "cook.md": "# Soup\nSimmer lentils with onion and cumin for twenty minutes.\n",
}


@pytest.fixture(autouse=True)
def _stay_in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SEMSEARCH_INDEX", str(tmp_path / "default-index-must-not-be-used"))


def cli(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def handled(r) -> str:
    """The one-line message of a handled failure."""
    assert r.exit_code != 0 and isinstance(r.exception, SystemExit), f"{r.exception!r}\n{r.output}"
    assert "Traceback" not in r.output
    return r.output


def make(root: Path, files: dict) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for k, v in files.items():
        (root / k).write_bytes(v if isinstance(v, bytes) else v.encode())
    return root


@pytest.fixture(scope="module")
def odd_index(tmp_path_factory) -> tuple[Path, Path]:
    """An index under a path with every character a file: URI must quote."""
    base = tmp_path_factory.mktemp("odd")
    corpus = make(base / "corpus", FILES)
    folder = base / "idx#1?x=2%41 ünï"
    r = cli("index", corpus, "--index", folder, *OPTS)
    assert r.exit_code == 0, r.output
    return corpus, folder


def test_query_and_update_under_an_index_path_with_special_characters(odd_index):
    corpus, folder = odd_index
    before = sorted(p.name for p in folder.parent.iterdir())
    r = cli("query", "loan approval", "--index", folder, "--json", "-k", "2")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["hits"][0]["path"].endswith("bank.txt")
    r = cli("index", corpus, "--index", folder, *OPTS)
    assert r.exit_code == 0 and "0 added" in r.output and "2 unchanged" in r.output, r.output
    assert sorted(p.name for p in folder.parent.iterdir()) == before  # no stray file beside the folder
    r = cli("info", "--index", folder, "--verify")
    assert r.exit_code == 0 and "is whole" in r.output


def test_index_over_a_damaged_index_says_so_and_offers_rebuild(tmp_path, odd_index):
    import shutil

    corpus, src = odd_index
    folder = tmp_path / "idx"
    shutil.copytree(src, folder)
    vec = next(folder.glob("vectors.*.faiss"))
    vec.write_bytes(vec.read_bytes()[: vec.stat().st_size // 2])
    for args in (("index", corpus, "--index", folder, *OPTS), ("query", "loan", "--index", folder), ("info", "--index", folder, "--verify")):
        out = handled(cli(*args))
        assert vec.name in out and "--rebuild" in out
    r = cli("index", corpus, "--index", folder, "--rebuild", *OPTS)
    assert r.exit_code == 0 and "2 added" in r.output


def test_an_empty_corpus_fails_before_the_model_loads(tmp_path):
    (tmp_path / "empty").mkdir()
    out = handled(cli("index", tmp_path / "empty", "--index", tmp_path / "i", "--model", tmp_path / "no-such-model"))
    assert "no indexable files" in out  # not the model's error: the corpus was checked first


def test_skip_errors_summary_lists_the_skipped_files(tmp_path):
    corpus = make(tmp_path / "c", {**FILES, "bad.parquet": b"PAR1 junk PAR1", "bad.json": "{not json"})
    out = handled(cli("index", corpus, "--index", tmp_path / "i", *OPTS))
    assert "bad." in out
    r = cli("index", corpus, "--index", tmp_path / "i", "--skip-errors", *OPTS)
    assert r.exit_code == 0, r.output
    assert "skipped " + str(corpus / "bad.json") in r.output and "skipped " + str(corpus / "bad.parquet") in r.output
    assert "2 added" in r.output and "2 file(s) skipped" in r.output


def test_json_and_jsonl_together_are_refused(odd_index):
    r = cli("query", "loan", "--index", odd_index[1], "--json", "--jsonl")
    assert r.exit_code == 2 and "--json and --jsonl" in r.output


def test_a_long_query_is_noticed(odd_index):
    exe = Path(sys.executable).parent / "semsearch"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    r = subprocess.run([exe, "query", "loan approval " * 200, "--index", odd_index[1], "-k", "1"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "bank.txt" in r.stdout
    assert "WARNING: the query is longer than the model's 256 tokens: only its first 254 tokens are searched" in r.stderr
    r = subprocess.run([exe, "query", "loan approval", "--index", odd_index[1], "-k", "1"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "longer than" not in r.stderr


def test_a_newline_in_a_file_name_keeps_the_table_one_line_a_row():
    hits = [Hit(rank=1, score=0.5, text="some\ntext", source="odd\nname.txt", path="/x/odd\nname.txt", start=0, end=9, line=1),
            Hit(rank=2, score=0.4, text="more", source="b.txt", path="/x/b.txt", start=0, end=4, line=1)]
    lines = _table(hits, 40).splitlines()
    assert len(lines) == 3 and "odd\\nname.txt:1" in lines[1]


def test_query_help_says_where_a_one_shot_query_runs():
    out = cli("query", "--help").output
    assert "auto picks a CUDA GPU" not in out and "one-shot query" in out


def test_skips_for_missing_shared_data_say_why_in_the_summary(tmp_path):
    env = dict(os.environ, SEMSEARCH_SHARED=str(tmp_path / "nowhere"), HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_eval.py", "-k", "scifact"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert "SKIPPED" in r.stdout and "SciFact not found at" in r.stdout and str(tmp_path / "nowhere") in r.stdout, r.stdout[-2000:]
