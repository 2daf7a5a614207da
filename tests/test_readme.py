"""The README's examples run as written, in order, on the bundled data (a copy of data/ in a fresh
working folder, the real bundled model): the command-line block, the evaluation lines on
data/tiny-beir, the Python blocks (each filter example finds something), and the serve block's
curl lines against a real server on loopback. The RAG framework examples run in
tests/test_integrations.py."""
from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from semsearch.cli import main

from conftest import REPO, running

README = (REPO / "README.md").read_text()


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end > 0 else None]


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def commands(block: str) -> list[str]:
    """The block's command lines, continuations joined, comments dropped."""
    out: list[str] = []
    for line in block.replace("\\\n", " ").splitlines():
        line = line.strip()
        if line:
            out.append(line)
    return out


def without_comment(line: str) -> str:
    parts = shlex.shlex(line, posix=True, punctuation_chars="|")
    parts.whitespace_split, parts.commenters = True, "#"
    return " ".join(shlex.quote(t) if t != "|" else "|" for t in parts)


def run_cli(line: str):
    """A `semsearch ...` line (optionally fed by `printf '...' |`) through the CLI in this process."""
    line = without_comment(line)
    stdin = None
    if line.startswith("printf "):
        feed, line = line.split(" | ", 1)
        stdin = shlex.split(feed)[1].encode().decode("unicode_escape")
    args = shlex.split(line)
    assert args[0] == "semsearch", line
    return CliRunner().invoke(main, args[1:], input=stdin, catch_exceptions=False)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("readme")
    shutil.copytree(REPO / "data" / "sample", root / "data" / "sample")
    shutil.copytree(REPO / "data" / "tiny-beir", root / "data" / "tiny-beir")
    return root


def test_the_command_line_block_runs_as_written(workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    monkeypatch.delenv("SEMSEARCH_INDEX", raising=False)
    lines = commands(blocks(section("Command line"), "bash")[0])
    assert len(lines) >= 10
    for line in lines:
        r = run_cli(line)
        assert r.exit_code == 0, (line, r.output[-2000:])
        if "query" in line.split()[:2] and "--json" not in line:
            assert "no results" not in r.output.lower() and r.output.strip(), (line, r.output)
    filtered = run_cli("semsearch query loan --where topic=banking --where 'path:*.jsonl' --json")
    hits = json.loads(filtered.output)
    hits = hits if isinstance(hits, list) else hits.get("hits", hits)
    assert hits and all(h["metadata"].get("topic") == "banking" for h in hits)


def test_the_evaluation_lines_on_the_bundled_dataset_run(workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    lines = [l for l in commands(blocks(section("Command line"), "bash")[1]) if "data/tiny-beir" in l]
    assert len(lines) == 3
    for line in lines:
        r = run_cli(line)
        assert r.exit_code == 0 and "ndcg@10" in r.output, (line, r.output[-2000:])


def test_the_python_blocks_run_in_order_and_their_filters_find_something(workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    first, second = blocks(section("Python"), "python")
    space: dict = {}
    exec(compile(first, "README.md (Python 1)", "exec"), space)
    assert (workdir / "indexes" / "md-only" / "manifest.json").exists()
    exec(compile(second, "README.md (Python 2)", "exec"), space)
    searches = [l.split("  #")[0].strip() for l in second.splitlines() if l.startswith("r.search(") and "where=" in l]
    assert len(searches) == 2
    for expr in searches:
        assert eval(expr, space), f"README example finds nothing: {expr}"
    assert space["vecs"].shape == (2, 384)


def test_the_serve_blocks_curl_lines_answer_with_hits(workdir, monkeypatch):
    pytest.importorskip("fastapi")
    if shutil.which("curl") is None:
        pytest.skip("no curl")
    from semsearch.serve import create_app
    from semsearch.service import Service

    monkeypatch.chdir(workdir)
    if not (workdir / "indexes" / "default" / "manifest.json").exists():
        assert run_cli("semsearch index data/sample/").exit_code == 0
    curls = [l for l in commands(blocks(section("Serve over HTTP"), "bash")[0]) if l.startswith("curl")]
    assert len(curls) == 3
    with running(create_app(Service(workdir / "indexes" / "default", device="cpu"))) as url:
        for line in curls:
            cmd = without_comment(line).replace("localhost:8000", url.removeprefix("http://"))
            out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, (line, out.stderr)
            got = json.loads(out.stdout)
            assert got.get("hits") or got.get("data"), (line, out.stdout[:500])
