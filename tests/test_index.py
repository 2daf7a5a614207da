"""Index folder: build, query, incremental updates, atomic writes, settings checks."""
from __future__ import annotations

import json
import os
import sqlite3

import numpy as np
import pytest
from click.testing import CliRunner

from semsearch.cli import main
from semsearch.corpus import ChunkSettings
from semsearch.errors import IndexFormatError, SettingsMismatch
from semsearch.indexing import index_corpus
from semsearch.search import Retriever
from semsearch.store import Manifest, open_index

from conftest import SAMPLE


def run(*args, input=None):
    r = CliRunner().invoke(main, [str(a) for a in args], input=input, catch_exceptions=False)
    return r


pytestmark = pytest.mark.xdist_group("test_index")  # one worker sets the module fixtures up (pytest -n)


@pytest.fixture(scope="module")
def sample_index(tmp_path_factory):
    folder = tmp_path_factory.mktemp("idx") / "default"
    r = run("index", SAMPLE, "--index", folder, "--no-progress", "--precision", "fp32")
    assert r.exit_code == 0, r.output
    return folder


def test_index_and_query_sample_corpus(sample_index):
    m = Manifest.load(sample_index)
    assert m.counts["files"] == len([p for p in SAMPLE.rglob("*") if p.is_file()])
    assert m.counts["chunks"] >= m.counts["documents"] > m.counts["files"]  # csv/jsonl rows are documents
    assert m.pooling == "mean" and m.dim == 384 and m.max_length == 256 and m.metric == "cosine"

    r = run("query", "loan approval", "--index", sample_index, "-k", "5", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    hits = out["hits"]
    assert out["query"] == "loan approval" and len(hits) == 5
    assert [h["rank"] for h in hits] == [1, 2, 3, 4, 5]
    assert all(-1 <= h["score"] <= 1 for h in hits)
    assert hits == sorted(hits, key=lambda h: -h["score"])
    # Lending documents should fill the top of the list.
    lending = ("bank", "loan", "lend", "credit", "mortgage", "underwriting", "faq", "news")
    assert sum(any(w in h["source"].lower() for w in lending) for h in hits) >= 4
    top = hits[0]
    src = open(top["path"], encoding="utf-8").read()
    if top["row"] is None:  # offsets point into the source file
        assert src[top["start"]:top["end"]] == top["text"]


def test_query_table_and_jsonl_from_stdin(sample_index):
    r = run("query", "loan approval", "--index", sample_index, "-k", "3")
    assert r.exit_code == 0
    lines = r.output.strip().splitlines()
    assert lines[0].split()[:3] == ["rank", "score", "source"] and len(lines) == 4
    r = run("query", "-", "--index", sample_index, "-k", "2", "--jsonl", input="loan approval\n\nmortgage rates\n")
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in r.output.strip().splitlines()]
    assert [x["query"] for x in rows] == ["loan approval", "mortgage rates"]
    assert all(len(x["hits"]) == 2 for x in rows)


def test_query_explain_table_and_json(sample_index):
    r = run("query", "how long does a loan decision take", "--index", sample_index, "-k", "2", "--explain")
    assert r.exit_code == 0, r.output
    assert "[[" in r.output and "bm25" in r.output and "fusion convex" in r.output  # markers: not a terminal
    assert "\x1b[" not in r.output
    r = run("query", "loan decision", "--index", sample_index, "-k", "2", "--explain", "--json")
    hits = json.loads(r.output)["hits"]
    assert len(hits) == 2 and all(h["explanation"] for h in hits)
    r = run("query", "loan decision", "--index", sample_index, "-k", "2", "--json")
    assert all(h["explanation"] is None for h in json.loads(r.output)["hits"])


def test_info(sample_index):
    r = run("info", "--index", sample_index)
    assert r.exit_code == 0
    assert "all-MiniLM-L6-v2" in r.output and "mean" in r.output and "cosine" in r.output
    r = run("info", "--index", sample_index, "--json")
    assert json.loads(r.output)["format_version"] == 6


def test_info_says_which_faiss_is_loaded(sample_index):
    import faiss

    r = run("info", "--index", sample_index)
    assert r.exit_code == 0, r.output
    line = next(line for line in r.output.splitlines() if line.startswith("faiss "))
    build = "GPU build" if hasattr(faiss, "StandardGpuResources") else "CPU build"
    assert f"{faiss.__version__}, {build} (" in line and "GPUs seen: " in line


def test_python_api(sample_index):
    import semsearch

    r = semsearch.Retriever.load(sample_index)
    hits = r.search("how do banks decide on a loan application", k=3)
    assert len(hits) == 3 and isinstance(hits[0], semsearch.Hit)
    assert hits[0].score >= hits[1].score >= hits[2].score
    assert hits[0].text and hits[0].source and hits[0].end > hits[0].start
    batch = r.search_batch(["mortgage rates", "sourdough starter"], k=1)
    assert "mortgage" in batch[0][0].text.lower() and "sourdough" in batch[1][0].source
    # k larger than the index: every chunk, no FAISS -1 padding
    assert len(r.search("anything", k=10_000)) == len(r)


def test_query_refuses_other_pooling_or_model(sample_index):
    with pytest.raises(SettingsMismatch, match="pooling 'mean', not 'max'"):
        Retriever.load(sample_index, pooling="max")
    r = run("query", "x", "--index", sample_index, "--pooling", "cls")
    assert r.exit_code != 0 and "pooling 'mean'" in r.output


def test_incremental_reindex(small_corpus, tmp_path, fake_encoder):
    folder = tmp_path / "idx"
    rep = index_corpus(small_corpus, folder, fake_encoder)
    assert (rep.added, rep.updated, rep.removed, rep.unchanged) == (3, 0, 0, 0)
    calls = fake_encoder.calls

    rep = index_corpus(small_corpus, folder, fake_encoder)
    assert (rep.added, rep.updated, rep.removed, rep.unchanged) == (0, 0, 0, 3)
    assert fake_encoder.calls == calls  # nothing re-embedded

    (small_corpus / "cook.md").write_text("# Bread\nKnead the dough and let it rise overnight.\n")
    (small_corpus / "space.txt").unlink()
    (small_corpus / "new.txt").write_text("Gardening: tomatoes need sun and steady watering.\n")
    os.utime(small_corpus / "bank.txt")  # touched, same content: not re-embedded
    rep = index_corpus(small_corpus, folder, fake_encoder)
    assert (rep.added, rep.updated, rep.removed, rep.unchanged) == (1, 1, 1, 1)
    assert fake_encoder.calls == calls + 2

    r = Retriever.load(folder, encoder=fake_encoder)
    assert len(r) == 3
    sources = {h.source.split("/")[-1] for h in r.search("anything at all", k=10)}
    assert sources == {"bank.txt", "cook.md", "new.txt"}
    assert "dough" in r.search("knead dough rise", k=1)[0].text
    m = Manifest.load(folder)
    assert m.last_run["updated"] == 1 and m.counts["files"] == 3
    # Files of older generations are cleaned up: exactly the manifest's data files stay (the
    # first run's segment with tombstones for the updated and removed files, and the new segment).
    assert {p.name for p in folder.iterdir() if p.name[0] != "."} == m.data_files() | {"manifest.json"}
    assert len(m.segments) == 2 and m.segments[0]["deletes"] and m.segments[0]["live"] == 1


class Boom(RuntimeError):
    pass


def test_interrupted_index_leaves_previous_usable(small_corpus, tmp_path, fake_encoder):
    folder = tmp_path / "idx"
    index_corpus(small_corpus, folder, fake_encoder)
    before = Retriever.load(folder, encoder=fake_encoder).search("credit score loan", k=3)
    manifest_before = (folder / "manifest.json").read_text()

    class Exploding(type(fake_encoder)):
        def encode(self, texts, progress=None):
            raise Boom("power cut")

    (small_corpus / "more.txt").write_text("Another document about loans and interest.\n")
    with pytest.raises(Boom):
        index_corpus(small_corpus, folder, Exploding())
    assert (folder / "manifest.json").read_text() == manifest_before
    after = Retriever.load(folder, encoder=fake_encoder).search("credit score loan", k=3)
    assert [(h.id, h.score) for h in after] == [(h.id, h.score) for h in before]
    # A stray half-written generation (as a killed process would leave) is cleaned by the next run.
    (folder / "docs.99.sqlite").write_bytes(b"half")
    rep = index_corpus(small_corpus, folder, fake_encoder)
    assert rep.added == 1 and not (folder / "docs.99.sqlite").exists()


def test_settings_mismatch_refused_and_rebuild(small_corpus, tmp_path, fake_encoder):
    from conftest import FakeEncoder

    folder = tmp_path / "idx"
    index_corpus(small_corpus, folder, fake_encoder)
    other = FakeEncoder(pooling="max")
    with pytest.raises(SettingsMismatch, match="pooling 'max' vs the index's 'mean'"):
        index_corpus(small_corpus, folder, other)
    with pytest.raises(SettingsMismatch, match="chunking"):
        index_corpus(small_corpus, folder, fake_encoder, ChunkSettings(10, 2))
    rep = index_corpus(small_corpus, folder, other, rebuild=True)
    assert rep.added == 3 and Manifest.load(folder).pooling == "max"


def test_chunks_keep_offsets_and_lines(tmp_path, fake_encoder):
    root = tmp_path / "c"
    root.mkdir()
    text = "\n".join(f"line {i} has some words in it" for i in range(1, 41))
    (root / "long.txt").write_text(text)
    folder = tmp_path / "idx"
    index_corpus(root, folder, fake_encoder, ChunkSettings(window=30, overlap=5))
    _, _, docs = open_index(folder)
    rows = sorted(r[1:] for r in docs.select("c.ord, c.start, c.end, c.line, c.text"))
    assert len(rows) > 5
    for ord_, start, end, line, chunk in rows:
        assert text[start:end] == chunk
        assert text.count("\n", 0, start) + 1 == line
    # consecutive chunks overlap by 5 tokens
    assert rows[1][1] < rows[0][2]


def test_other_format_version_refused(small_corpus, tmp_path, fake_encoder):
    folder = tmp_path / "idx"
    index_corpus(small_corpus, folder, fake_encoder)
    raw = json.loads((folder / "manifest.json").read_text())
    raw["format_version"] = 999
    (folder / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(IndexFormatError, match="version 999.*--rebuild"):
        Retriever.load(folder, encoder=fake_encoder)


def test_no_pickle_in_index(sample_index):
    m = Manifest.load(sample_index)
    assert len(m.segments) == 1  # one run, one segment
    db = sqlite3.connect(sample_index / m.files["docs"])
    (n,) = db.execute("SELECT COUNT(*) FROM chunks").fetchone()
    assert n == m.counts["chunks"]
    assert db.execute("SELECT COUNT(*) FROM chunks WHERE vector IS NOT NULL").fetchone()[0] == 0  # vectors in the .vec only
    from semsearch.store.vecfile import VectorFile

    vf = VectorFile(sample_index / m.segments[0]["vecs"])
    assert vf.matrix.shape == (n, 384) and np.allclose(np.linalg.norm(vf.matrix, axis=1), 1, atol=1e-5)
    assert not any(p.suffix in (".pkl", ".pickle") for p in sample_index.iterdir())


def _word_files(root, n: int, seed: int):
    """n small text files of 12 words drawn from 300 (a corpus for the approximate index types)."""
    root.mkdir()
    words = [f"w{i}" for i in range(300)]
    rng = np.random.default_rng(seed)
    for f in range(n):
        (root / f"f{f}.txt").write_text(" ".join(rng.choice(words, 12)))
    return root


@pytest.mark.parametrize("kind", ["ivf", "ivf-fastscan", "ivf-sq8", "hnsw"])
def test_approximate_index_types_update_delete_and_tune(kind, tmp_path, fake_encoder):
    """Every index type keeps working through incremental updates and deletes, and records its
    tuned knob and measured recall in the manifest."""
    from semsearch.indexing import VectorSettings

    root = _word_files(tmp_path / "c", 60, seed=0)
    folder = tmp_path / "idx"
    vs = VectorSettings(index_type=kind, target_recall=0.9)
    index_corpus(root, folder, fake_encoder, vectors=vs)
    m = Manifest.load(folder)
    assert m.index["type"] == kind and m.index["recall"]["recall"] >= 0.9
    knob = {"ivf": "nprobe", "ivf-fastscan": "nprobe", "ivf-sq8": "nprobe", "hnsw": "efSearch"}[kind]
    assert m.index["params"][knob] == m.index["recall"]["value"]

    (root / "f0.txt").unlink()
    (root / "f1.txt").write_text("brand new words zebra quokka")
    rep = index_corpus(root, folder, fake_encoder, vectors=VectorSettings(target_recall=0.9))  # auto keeps the forced type
    assert (rep.removed, rep.updated) == (1, 1)
    r = Retriever.load(folder, encoder=fake_encoder)
    assert r.manifest.index["type"] == kind and len(r) == 59
    assert "f0.txt" not in {h.source.split("/")[-1] for h in r.search("anything", k=100)}
    assert r.search("zebra quokka", k=1)[0].source.endswith("f1.txt")


def test_tune_raises_k_factor_where_the_probed_lists_hold_the_neighbours():
    """Fast scan finds a true neighbour when its list is probed and its 4-bit codes rank it among
    the k_factor * k candidates re-ranked. With every list probed and recall still short, the
    tuner raises k_factor instead of stopping at the last nprobe (at 10M chunks recall stayed at
    0.937 from nprobe 128 to 1,024 with k_factor 100)."""
    from semsearch.store.vectors import K_FACTOR_STEPS, VectorIndex, _probed_share, exact_knn, refine_depth, tune

    rng = np.random.default_rng(0)
    n, d = 10_000, 64
    x = rng.normal(size=(n, d)).astype(np.float32)  # no clusters: the codes rank coarsely
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ids = np.arange(1, n + 1, dtype=np.int64)
    vi = VectorIndex.build(d, "ivf-fastscan", iter([(ids, x)]), n, {"nlist": 16})
    pick = np.sort(rng.choice(n, 200, replace=False))
    exact = exact_knn(x[pick], iter([(ids, x)]), 10, ids[pick])
    assert _probed_share(vi, x[pick], exact, 16) == pytest.approx(1.0)  # every list probed
    assert _probed_share(vi, x[pick], exact, 1) < 0.5
    got = tune(vi, x[pick], exact, 10, 0.995, ids[pick])
    assert got["recall"] >= 0.995 and got["value"] == 16 and got["k_factor"] > K_FACTOR_STEPS[0]
    assert vi.params["k_factor"] == got["k_factor"] and vi.params["nprobe"] == 16
    low = tune(vi, x[pick], exact, 10, 0.3, ids[pick])  # an easy target: the first k_factor, a small nprobe
    assert low["k_factor"] == K_FACTOR_STEPS[0] and low["value"] < 16 and low["recall"] >= 0.3
    # a deep search re-ranks k_factor candidates for the first 10 results and one for each after them
    assert refine_depth(100, 100, 10**7) == 1090 and refine_depth(10, 300, 10**7) == 3000 and refine_depth(5, 100, 50) == 50


def test_tune_probes_past_the_last_step_up_to_every_list(monkeypatch):
    """Vectors without clusters scatter a query's neighbours over the lists: where the largest
    nprobe step (1,024; 4 here) holds too few of them and the index has more lists, the tuner
    goes on doubling up to every list instead of stopping below the target (a 417k-chunk build
    of the real model's vectors of synthetic text: 0.775 at nprobe 1,024 of 2,583 lists)."""
    import semsearch.store.vectors as vectors
    from semsearch.store.vectors import VectorIndex, exact_knn, nprobe_steps, tune

    assert nprobe_steps(2583)[-4:] == [512, 1024, 2048, 2583] and nprobe_steps(1024)[-1] == 1024
    assert nprobe_steps(12)[-1] == 12 and nprobe_steps(1) == [1] and nprobe_steps(16)[-1] == 16
    rng = np.random.default_rng(5)
    n, d = 8_000, 32
    x = rng.normal(size=(n, d)).astype(np.float32)  # no clusters
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ids = np.arange(1, n + 1, dtype=np.int64)
    pick = np.sort(rng.choice(n, 200, replace=False))
    exact = exact_knn(x[pick], iter([(ids, x)]), 10, ids[pick])
    monkeypatch.setitem(vectors.KNOB_STEPS, "nprobe", [1, 2, 4])
    assert nprobe_steps(32) == [1, 2, 4, 8, 16, 32]
    for kind in ("ivf", "ivf-fastscan"):
        vi = VectorIndex.build(d, kind, iter([(ids, x)]), n, {"nlist": 32})
        got = tune(vi, x[pick], exact, 10, 0.95, ids[pick])
        assert got["lower"] >= 0.95 and got["value"] > 4, (kind, got)
        assert vi.params["nprobe"] == got["value"]


def test_tune_stops_raising_k_factor_where_recall_no_longer_grows(monkeypatch):
    """Each k_factor step re-ranks more rows from the vector file (10,000 a query at 1,000): where
    a raise finds next to nothing more (recall up by less than PLATEAU), the tuner stops raising
    at that nprobe instead of trying every step (a 417k-chunk build: 146 s of trials, still short)."""
    import semsearch.store.vectors as vectors
    from semsearch.store.vectors import K_FACTOR_STEPS, PLATEAU, VectorIndex, exact_knn, tune

    rng = np.random.default_rng(6)
    n, d = 4_000, 32
    x = rng.normal(size=(n, d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ids = np.arange(1, n + 1, dtype=np.int64)
    vi = VectorIndex.build(d, "ivf-fastscan", iter([(ids, x)]), n, {"nlist": 8})
    pick = np.sort(rng.choice(n, 100, replace=False))
    exact = exact_knn(x[pick], iter([(ids, x)]), 10, ids[pick])
    real, tried = vectors._trial, []
    gains = iter([0.70, 0.80, 0.80 + PLATEAU / 2, 0.99, 0.99])  # a plateau after the second raise

    def trial(vi, queries, exact_ids, k, target, self_ids, value, k_factor=None):
        got = real(vi, queries, exact_ids, k, target, self_ids, value, k_factor)  # the real search
        tried.append((value, k_factor))
        r = next(gains) if value == 8 else 0.0
        return {**got, "recall": r, "lower": r - 0.01}

    monkeypatch.setattr(vectors, "_trial", trial)
    monkeypatch.setattr(vectors, "_probed_share", lambda vi, q, e, nprobe, lists=None: 1.0 if nprobe == 8 else 0.5)
    got = tune(vi, x[pick], exact, 10, 0.95, ids[pick])
    assert tried == [(8, f) for f in K_FACTOR_STEPS[:3]], tried  # not the 4th step, which would have met it
    assert got["recall"] == pytest.approx(0.80 + PLATEAU / 2) and vi.params["nprobe"] == 8
    # the other IVF types: past the usual nprobe steps (4 here), on only while recall grows
    monkeypatch.setitem(vectors.KNOB_STEPS, "nprobe", [1, 2, 4])
    sq8 = VectorIndex.build(d, "ivf-sq8", iter([(ids, x)]), n, {"nlist": 32})
    tried.clear()
    gains = iter([0.5, 0.6, 0.7, 0.7 + PLATEAU / 2, 0.99, 0.99])

    def scripted(vi, queries, exact_ids, k, target, self_ids, value, k_factor=None):
        tried.append((value, k_factor))
        r = next(gains)
        return {"knob": "nprobe", "value": value, "recall": r, "lower": r - 0.01}

    monkeypatch.setattr(vectors, "_trial", scripted)
    got = tune(sq8, x[pick], exact, 10, 0.95, ids[pick])
    assert tried == [(1, None), (2, None), (4, None), (8, None)] and got["value"] == 8 and sq8.params["nprobe"] == 8


def test_tune_keeps_the_cheapest_fast_scan_setting_whose_recall_meets_the_target_with_confidence():
    """Of every (nprobe, k_factor) on the tuner's steps, it keeps the one that costs least (codes
    scanned, rows re-ranked) among those whose recall's lower 95% bound over the queries meets
    the target. At 10M chunks the walk it replaced stopped at nprobe 4 with k_factor 300 (3,000
    rows re-ranked; 0.956 on its queries, 0.948 on others) where nprobe 8 with 100 was cheaper."""
    import itertools

    from semsearch.store.vectors import K_FACTOR_STEPS, KNOB_STEPS, VectorIndex, _fast_scan_cost, _trial, exact_knn, tune

    rng = np.random.default_rng(3)
    n, d, topics = 20_000, 96, 100
    centres = rng.normal(size=(topics, d)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    x = centres[rng.integers(0, topics, n)] + 2.5 * rng.normal(size=(n, d)).astype(np.float32) / np.sqrt(d)
    x /= np.linalg.norm(x, axis=1, keepdims=True)  # loose clusters: the codes rank coarsely, both knobs matter
    ids = np.arange(1, n + 1, dtype=np.int64)
    vi = VectorIndex.build(d, "ivf-fastscan", iter([(ids, x)]), n, {"nlist": 128})
    pick = np.sort(rng.choice(n, 200, replace=False))
    q, self_ids = x[pick], ids[pick]
    exact = exact_knn(q, iter([(ids, x)]), 10, self_ids)
    steps = [(p, f) for p, f in itertools.product([s for s in KNOB_STEPS["nprobe"] if s <= 128], K_FACTOR_STEPS)]
    trials = {}
    for target in (0.9, 0.95, 0.98):
        got = tune(vi, q, exact, 10, target, self_ids)
        cost = _fast_scan_cost(vi, got["value"], got["k_factor"], 10)
        assert got["lower"] >= target and got["recall"] >= got["lower"]
        assert vi.params["nprobe"] == got["value"] and vi.params["k_factor"] == got["k_factor"]
        for p, f in steps:
            if _fast_scan_cost(vi, p, f, 10) < cost and (p, f) not in trials:
                trials[p, f] = _trial(vi, q, exact, 10, target, self_ids, p, f)
        cheaper = [t for (p, f), t in trials.items() if _fast_scan_cost(vi, p, f, 10) < cost]
        assert cheaper and all(t["lower"] < target for t in cheaper), (got, [t for t in cheaper if t["lower"] >= target])
    # a setting whose mean recall is the target but whose bound is below it does not pass
    (p, f), t = max(((pf, t) for pf, t in trials.items() if t["lower"] < t["recall"]), key=lambda x: x[1]["recall"])
    got = tune(vi, q, exact, 10, t["recall"], self_ids)
    assert got["lower"] >= t["recall"] and (got["value"], got["k_factor"]) != (p, f)
    assert json.loads(json.dumps(got)) == got  # plain numbers: it goes into the manifest


def test_tune_command_retunes_in_place_and_readers_follow(tmp_path, fake_encoder):
    """`semsearch tune` publishes new knobs as a new generation without writing a data file, and
    a Retriever that was open searches with them after its refresh."""
    from semsearch.indexing import VectorSettings

    root = _word_files(tmp_path / "c", 80, seed=1)
    folder = tmp_path / "idx"
    index_corpus(root, folder, fake_encoder, vectors=VectorSettings(index_type="ivf-fastscan", target_recall=0.5))
    before = Manifest.load(folder)
    files = {p.name: p.stat().st_mtime_ns for p in folder.iterdir() if p.name != "manifest.json" and not p.name.startswith(".")}
    r = Retriever.load(folder, encoder=fake_encoder)
    first = r.search("w1 w2 w3", k=5, mode="dense")
    assert before.segments[0]["index"]["params"]["nprobe"] == 1  # recall 0.5 asks for one list of 2
    res = CliRunner().invoke(main, ["tune", "--index", str(folder), "--target-recall", "0.9", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    after = Manifest.load(folder)
    assert after.generation > before.generation and len(out["segments"]) == 1
    seg = after.segments[0]["index"]
    # (the fake encoder's vectors tie often at rank 10, so recall stays below 1 at any setting)
    assert seg["recall"]["target"] == 0.9 and seg["recall"]["recall"] >= 0.9 and seg["params"]["nprobe"] == 2
    assert seg["params"]["nprobe"] == seg["recall"]["value"] and after.index["recall"]["target"] == 0.9
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir() if p.name in files} == files  # no data file rewritten
    assert r.refresh() and r._gen.vectors.parts[0].segment.vectors.params["nprobe"] == seg["params"]["nprobe"]
    # every list probed now: each rank's score is at least what one list gave
    assert all(a.score >= b.score - 1e-6 for a, b in zip(r.search("w1 w2 w3", k=5, mode="dense"), first))
    res = CliRunner().invoke(main, ["tune", "--index", str(folder)])
    assert res.exit_code == 0 and "recall@10 " in res.output and "-> " in res.output, res.output
    res = CliRunner().invoke(main, ["info", "--index", str(folder)])
    low = Manifest.load(folder).index["recall"]["lower"]
    assert res.exit_code == 0 and f"recall@10 (at least {low:.3f}, one-sided 95%)" in res.output, res.output


def test_auto_type_follows_size_and_memory_budget():
    from semsearch.store.vectors import choose_type

    assert choose_type("auto", 1000, 384) == "flat"
    assert choose_type("auto", 2_000_000, 384) == "ivf-fastscan"
    # fast scan keeps 4-bit codes in memory (its full vectors are mapped from a file): it fits 500 bytes
    assert choose_type("auto", 2_000_000, 384, max_bytes_per_vector=500) == "ivf-fastscan"
    assert choose_type("auto", 1000, 384, max_bytes_per_vector=500) == "ivf-fastscan"
    with pytest.raises(Exception, match="no index type fits"):
        choose_type("auto", 1000, 384, max_bytes_per_vector=20)
    with pytest.raises(Exception, match="valid types are"):
        choose_type("lsh", 10, 384)


def test_numpy_query_encoder_equals_torch_encoder(real_encoder, sample_index):
    from semsearch.encoder.numpy_encoder import NumpyEncoder

    texts = ["loan approval", "What happens after I apply for a home loan?", "word " * 300]
    r = Retriever.load(sample_index, fast_start=True)
    assert isinstance(r.encoder, NumpyEncoder)  # the one-shot query path needs no torch
    assert np.abs(r.encoder.encode(texts) - real_encoder.encode(texts)).max() < 1e-5
    for pooling in ("cls", "max"):
        ne = NumpyEncoder(real_encoder.folder, "x", "y", pooling, 256)
        from semsearch.encoder import Encoder

        assert np.abs(ne.encode(texts) - Encoder(pooling=pooling, precision="fp32", device="cpu").encode(texts)).max() < 1e-5


def test_query_process_does_not_import_torch_nor_faiss_on_a_small_index(sample_index):
    import subprocess
    import sys

    code = ("import sys; from semsearch.cli import main; "
            f"sys.argv=['semsearch','query','loan approval','--index',{str(sample_index)!r},'--json','-k','2']; "
            "import contextlib, io\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
            "assert 'faiss' not in sys.modules, 'faiss was imported'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr
    light = json.loads(out.stdout)["hits"]
    assert light[0]["rank"] == 1
    # the same hits as a reader searching the FAISS index with the same query encoder
    one_shot = Retriever.load(sample_index, fast_start=True)
    r = Retriever.load(sample_index, encoder=one_shot.encoder)
    try:
        full = r.search("loan approval", 2)
    finally:
        r.close()
        one_shot.close()
    assert [h["id"] for h in light] == [h.id for h in full]
    assert np.allclose([h["score"] for h in light], [h.score for h in full], atol=1e-5)


def test_a_run_that_changes_nothing_publishes_nothing(tmp_path, fake_encoder):
    import shutil

    from semsearch.indexing import index_corpus

    corpus = tmp_path / "c"
    shutil.copytree(SAMPLE, corpus)
    folder = tmp_path / "idx"
    index_corpus(corpus, folder, fake_encoder, progress=False)
    before = Manifest.load(folder)
    files = sorted(p.name for p in folder.iterdir())
    rep = index_corpus(corpus, folder, fake_encoder, progress=False)
    assert (rep.added, rep.updated, rep.removed, rep.chunks) == (0, 0, 0, 0) and rep.unchanged == before.counts["files"]
    assert Manifest.load(folder).generation == before.generation and sorted(p.name for p in folder.iterdir()) == files
    assert rep.totals == before.counts
    (corpus / "meteor_showers.txt").write_text("Meteors streak across the night sky in August.\n")
    rep = index_corpus(corpus, folder, fake_encoder, progress=False)
    assert rep.updated == 1 and Manifest.load(folder).generation == before.generation + 1
    (corpus / "meteor_showers.txt").unlink()
    rep = index_corpus(corpus, folder, fake_encoder, progress=False)
    assert rep.removed == 1 and Manifest.load(folder).generation == before.generation + 2


@pytest.mark.parametrize("batch", [3, 64, 1000])
def test_exact_knn_equals_a_full_sort_and_leaves_each_query_out(batch):
    """The recall tuning's ground truth (faiss's exact kernel a batch, top k+1 merged) equals
    sorting every score, with each query's own id left out; batches smaller than k too."""
    from semsearch.store.vectors import exact_knn

    rng = np.random.default_rng(7)
    x = rng.standard_normal((700, 24)).astype(np.float32)
    ids = rng.permutation(np.arange(5000, 5700)).astype(np.int64)
    pick = rng.choice(700, 40, replace=False)
    q, self_ids = x[pick], ids[pick]
    got = exact_knn(q, ((ids[a:a + batch], x[a:a + batch]) for a in range(0, 700, batch)), 10, self_ids)
    scores = q @ x.T
    scores[np.arange(40), pick] = -np.inf
    want = ids[np.argsort(-scores, axis=1, kind="stable")[:, :10]]
    assert got.shape == (40, 10)
    assert (got == want).mean() > 0.99  # (a tie between two scores may order them either way)
    assert not (got == self_ids[:, None]).any()
    plain = exact_knn(q, iter([(ids, x)]), 5)  # no one left out: each query finds itself first
    assert (plain[:, 0] == self_ids).all()


def test_an_index_trained_ahead_and_partly_filled_is_completed_by_the_merge(tmp_path):
    """merge.fits takes an index trained ahead that holds the merged file's vectors up to an id
    (a long run's published segments, added beside it, stopped part way through one when the
    stream ended) and fill(after=) adds the rest: the lists equal those of the same quantizer
    filled at once. Where the count up to that id differs (a chunk deleted since), it is refused."""
    import faiss

    from semsearch.store import merge as merge_
    from semsearch.store import vecfile
    from semsearch.store.vectors import VectorIndex

    rng = np.random.default_rng(3)
    centres = rng.standard_normal((20, 32)).astype(np.float32)
    x = centres[rng.integers(0, 20, 3000)] + 0.1 * rng.standard_normal((3000, 32)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ids = np.arange(10, 6010, 2, dtype=np.int64)
    vecfile.write(tmp_path / "v.vec", ids, x)
    vf = vecfile.VectorFile(tmp_path / "v.vec")
    base = VectorIndex.trained(32, "ivf-fastscan", 3000, vf, {"nlist": merge_.default_nlist(3000)}, train_sample=1000)
    whole = VectorIndex(faiss.clone_index(base._cpu), base.kind, dict(base.params)).fill(vf)  # the same quantizer, at once
    part = base
    part.add(ids[:1234], x[:1234], refine=False)
    part.through = int(ids[1233])
    assert merge_.fits(part, "ivf-fastscan", 3000, vf.ids)
    deleted = np.delete(vf.ids, 100)  # the merged file of a group in which a prefix chunk was deleted
    assert not merge_.fits(part, "ivf-fastscan", 2999, deleted)
    part.fill(vf, after=part.through)
    assert part.ntotal == 3000
    assert [sorted(a.tolist()) for a in part.lists()] == [sorted(b.tolist()) for b in whole.lists()]
    q = x[::97]
    np.testing.assert_array_equal(part.search(q, 10)[1], whole.search(q, 10)[1])


def test_tune_while_threads_and_asyncio_search(tmp_path, fake_encoder):
    """semsearch.api.tune publishes its generation while 6 threads and 6 asyncio tasks search the
    index through one Retriever: no search fails or comes back empty, a second tune at the same
    time is refused (the index's one writer) or runs after, and the readers end on the new knobs."""
    import asyncio
    import threading

    from semsearch.api import tune as tune_index
    from semsearch.errors import IndexLocked
    from semsearch.indexing import VectorSettings

    root = _word_files(tmp_path / "c", 80, seed=2)
    folder = tmp_path / "idx"
    index_corpus(root, folder, fake_encoder, vectors=VectorSettings(index_type="ivf-fastscan", target_recall=0.5))
    r = Retriever.load(folder, encoder=fake_encoder)
    stop, errors, counts = threading.Event(), [], {"searches": 0}

    def search_loop() -> None:
        while not stop.is_set():
            try:
                assert r.search("w1 w2 w3", k=5, mode="dense")
                counts["searches"] += 1
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)

    async def search_tasks() -> None:
        async def one() -> None:
            while not stop.is_set():
                try:
                    assert await asyncio.to_thread(r.search, "w4 w5", 5, "hybrid")
                    counts["searches"] += 1
                except Exception as e:  # noqa: BLE001
                    errors.append(e)
        await asyncio.gather(*(one() for _ in range(6)))

    outcomes = []

    def tune_once() -> None:
        try:
            outcomes.append(tune_index(folder, 0.9)["segments"][0]["after"]["params"]["nprobe"])
        except IndexLocked:
            outcomes.append("locked")

    threads = [threading.Thread(target=search_loop) for _ in range(6)]
    threads.append(threading.Thread(target=lambda: asyncio.run(search_tasks())))
    for t in threads:
        t.start()
    tuners = [threading.Thread(target=tune_once) for _ in range(2)]
    for t in tuners:
        t.start()
    for t in tuners:
        t.join()
    r.refresh()
    import time

    time.sleep(0.3)  # searches on the new generation too
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert counts["searches"] > 0 and 2 in outcomes and set(outcomes) <= {2, "locked"}
    assert Manifest.load(folder).segments[0]["index"]["params"]["nprobe"] == 2
    assert r._gen.vectors.parts[0].segment.vectors.params["nprobe"] == 2


def test_large_quantizers_train_in_two_levels_and_find_the_neighbours(monkeypatch):
    """From TWO_LEVEL_LISTS lists the quantizer is trained in two levels (store/quantizer.py):
    nlist normalised centroids, which faiss's train() keeps (it trains the codes only), lists as
    good as faiss's k-means gives, and every vector added where faiss's own assignment puts it."""
    import faiss

    import semsearch.store.vectors as V
    from semsearch.store.quantizer import two_level
    from semsearch.store.vectors import VectorIndex, exact_knn, recall_at, _search_excluding

    rng = np.random.default_rng(3)
    n, d, nlist = 12_000, 32, 64
    centres = rng.normal(size=(150, d)).astype(np.float32)
    x = centres[rng.integers(0, 150, n)] + 0.35 * rng.normal(size=(n, d)).astype(np.float32)
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    ids = np.arange(1, n + 1, dtype=np.int64)
    pick = np.sort(rng.choice(n, 300, replace=False))
    exact = exact_knn(x[pick], iter([(ids, x)]), 10, ids[pick])
    got = {}
    for name, threshold in (("faiss", 10**9), ("two levels", 16)):
        monkeypatch.setattr(V, "TWO_LEVEL_LISTS", threshold)
        vi = VectorIndex.create(d, "ivf-fastscan", {"nlist": nlist})
        vi.train(x[:6000])
        quantizer = faiss.extract_index_ivf(vi.index).quantizer
        cents = quantizer.reconstruct_n(0, quantizer.ntotal)
        assert quantizer.ntotal == nlist
        if name == "two levels":  # the centroids two_level() gives, kept by faiss, unit length
            assert np.allclose(cents, two_level(x[:6000], nlist), atol=1e-6)
            assert np.allclose(np.linalg.norm(cents, axis=1), 1.0, atol=1e-4)
        vi.add(ids, x)
        inv = faiss.extract_index_ivf(vi.index).invlists
        held = {int(i): c for c in range(nlist) for i in faiss.rev_swig_ptr(inv.get_ids(c), inv.list_size(c))}
        _, nearest = quantizer.search(x, 1)
        assert len(held) == n and all(held[int(i)] == c for i, c in zip(ids, nearest[:, 0]))  # faiss's own assignment
        vi.params["k_factor"] = 100
        vi.set_knob(2)
        got[name] = recall_at(_search_excluding(vi, x[pick], 10, ids[pick]), exact)
    assert got["two levels"] >= got["faiss"] - 0.02 and got["two levels"] > 0.5, got
    # a coarse cluster whose share of the lists rounds to none gets none (faiss's k-means refuses 0)
    skewed = np.concatenate([x[:3000], x[:20] + 0.01])
    assert len(two_level(skewed, 64)) == 64
