"""The Python API (semsearch.index / evaluate / train): its docstring examples run as written,
with the real model, from a folder holding the bundled data; and it agrees with the CLI."""
from __future__ import annotations

import doctest
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

import semsearch
from semsearch import api
from semsearch.cli import main
from semsearch.errors import InputError

from conftest import REPO


@pytest.fixture
def in_workdir(tmp_path):
    """A working folder with the repository's data/ in it (the examples' relative paths)."""
    (tmp_path / "data").symlink_to(REPO / "data")
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(old)


def test_docstring_examples_run(in_workdir):
    res = doctest.testmod(api, extraglobs={"semsearch": semsearch, "Path": Path}, optionflags=doctest.ELLIPSIS, report=True)
    assert res.attempted >= 7 and res.failed == 0, res
    assert (in_workdir / "indexes" / "doc-example" / "manifest.json").exists()
    assert (in_workdir / "heads" / "doc-example" / "head.json").exists()


def test_top_level_names():
    for name in ("index", "evaluate", "train", "Retriever", "Encoder", "Hit"):
        assert callable(getattr(semsearch, name)), name


def test_api_and_cli_give_the_same_evaluation(in_workdir):
    rep = semsearch.evaluate("data/tiny-beir", pooling=["mean"], k=[10], modes=["dense", "lexical"], progress=False)
    run = CliRunner().invoke(main, ["eval", "data/tiny-beir", "--k", "10", "--mode", "dense,lexical", "--json", "--no-progress"])
    assert run.exit_code == 0, run.output
    cli = json.loads(run.output)
    assert [r for r in cli["results"]] == rep["results"]


def test_errors_are_typed(in_workdir):
    with pytest.raises(InputError, match="does not exist"):
        semsearch.index("no-such-folder", "indexes/x")
    with pytest.raises(InputError, match="give a BEIR dataset"):
        semsearch.evaluate()
    with pytest.raises(InputError, match="not both"):
        semsearch.train("heads/x", beir="data/tiny-beir", pairs="p.tsv")
