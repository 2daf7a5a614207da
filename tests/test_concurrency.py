"""Every public search entry point from many threads and from asyncio at once, writes interleaved:
no error, no deadlock (a time limit fails the test), and the hits a serial run gives.

Each surface runs in a child process (tests/concurrency_run.py) with a time limit: a thread stuck
inside SQLite while holding the interpreter's lock would also stop a watchdog in this process.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

RUNNER = Path(__file__).with_name("concurrency_run.py")
LIMIT = 900  # seconds: a deadlock, not slowness (a run takes 1-4.5 minutes on 2 busy cores)


pytestmark = pytest.mark.xdist_group("test_concurrency")  # one worker sets the module fixtures up (pytest -n)


@pytest.fixture(scope="module")
def index(tmp_path_factory, real_encoder):
    """The sample corpus plus records with numeric and language metadata, with the real model."""
    import shutil

    from semsearch.indexing import index_corpus
    from conftest import SAMPLE

    root = tmp_path_factory.mktemp("conc")
    corpus = root / "corpus"
    shutil.copytree(SAMPLE, corpus)
    topics = ["loan approval takes one business day", "lentil soup simmers with cumin",
              "sleep helps muscles recover after exercise", "printing presses spread books in Europe",
              "tomatoes need sun and steady watering"]
    with open(corpus / "papers.jsonl", "w") as f:
        for i in range(40):
            f.write(json.dumps({"text": f"Paper {i}: {topics[i % 5]}.", "year": 2000 + i % 25,
                                "lang": "de" if i % 7 == 0 else "en"}) + "\n")
    folder = root / "index"
    index_corpus(corpus, folder, real_encoder, progress=False)
    return folder


def run(index: Path, *surfaces: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    try:
        p = subprocess.run([sys.executable, str(RUNNER), str(index), *surfaces], capture_output=True, text=True,
                           timeout=LIMIT, env=env, cwd=REPO)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{surfaces}: no answer in {LIMIT} s (deadlock?)\n{(e.stderr or b'')[-3000:]!r}")
    assert p.returncode == 0, p.stderr[-4000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["n_problems"] == 0, "\n".join(out["problems"])
    assert out["calls"] > 0 and out["writes"] > 0, out  # the run did search while the writer wrote
    for s in {"http", "mcp"} & set(surfaces):  # their answers name a generation: each checked against its state
        assert out["labelled_by"].get(s, 0) > 0, out
    return out


def test_retriever_threads_and_asyncio_with_writes(index):
    run(index, "retriever", "asyncio", "explain", "oneshot")


@pytest.fixture(scope="module")
def kept_index(tmp_path_factory, real_encoder, index):
    """The same corpus kept with its token states and token tables (--keep-states): explaining
    reads them from the mapped states files, and the writer's documents add more."""
    from semsearch.indexing import index_corpus

    folder = tmp_path_factory.mktemp("conc_kept") / "index"
    index_corpus(index.parent / "corpus", folder, real_encoder, progress=False, keep_states=True)
    assert any(folder.joinpath("states").glob("*.tok"))
    return folder


def test_explain_from_kept_states_threads_and_asyncio_with_writes(kept_index):
    run(kept_index, "explain")


def test_http_endpoints_and_mcp_tools_with_writes(index):
    """8 threads and an asyncio loop on the HTTP endpoints, and as many calling the MCP server's
    search tool over four sessions, both servers in one process over one index, while a writer
    upserts through HTTP (POST /documents) and deletes through MCP's write tool (--allow-writes):
    one process start and one reference pass for the two (they took ~14 and ~18 s apart)."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    pytest.importorskip("mcp.server.mcpserver")
    out = run(index, "http", "mcp")
    assert set(out["surfaces"]) == {"http", "mcp"}, out


def test_adapters_sync_and_async_with_writes(index):
    """The LangChain, LlamaIndex and Haystack adapters at once in one process (8 threads and an
    asyncio loop each, over one index) while the writer writes: one process start and one
    reference pass for the three, where a run each spent ~7 s of a loaded CPU apiece on starting."""
    import importlib.util

    have = [f for f, mod in (("langchain", "langchain_core"), ("llamaindex", "llama_index.core"), ("haystack", "haystack"))
            if importlib.util.find_spec(mod.split(".")[0]) is not None and importlib.util.find_spec(mod) is not None]
    if not have:
        pytest.skip("none of langchain-core, llama-index-core, haystack-ai is installed")
    out = run(index, *have)
    assert set(out["surfaces"]) == set(have), out
