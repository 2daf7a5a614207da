"""The shards path (engines/build.py) without a cluster: the in-process engine gives the index
the local streaming path gives, chunk for chunk, id for id, and updates either way."""
from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from semsearch.engines import make_engine
from semsearch.engines.build import EngineError, update_with_engine
from semsearch.engines.inprocess import InProcessEngine
from semsearch.errors import CorpusError, InputError
from semsearch.indexing import VectorSettings, index_corpus
from semsearch.search import Retriever
from semsearch.store import Manifest


def dump(folder: Path) -> tuple[list[tuple], np.ndarray, list[tuple]]:
    """(live chunk rows with their file path, vectors (n, d), live files) of an index, by id,
    across its segments."""
    from semsearch.store.folder import open_index
    from semsearch.store.segments import read_rows

    m = Manifest.load(folder)
    rows = sorted(read_rows(folder, m, "f.path, c.row, c.ord, c.start, c.end, c.line, c.text, c.metadata"))  # (partitions interleave)
    docs = open_index(folder)[2]
    ids, vecs = docs.get_vectors([r[0] for r in rows])
    assert ids.tolist() == [r[0] for r in rows]
    files = sorted((f.id, f.path, f.hash, f.size, f.documents) for f in docs.files().values())
    docs.close()
    return rows, vecs, files


def kept_tables(folder: Path) -> list[tuple[str, np.ndarray]]:
    """(text, token table kept beside its states) of every live chunk, by id."""
    from semsearch.store.kept import TOKEN_COLS, tokens_name
    from semsearch.store.segments import read_rows

    out = []
    for _, text, file, off, n in read_rows(folder, Manifest.load(folder), "c.text, c.state_file, c.state_off, c.state_len"):
        rows = np.fromfile(folder / "states" / tokens_name(file), np.int32).reshape(-1, TOKEN_COLS)
        out.append((text, rows[off : off + n]))
    return out


def faiss_ids(folder: Path) -> np.ndarray:
    """The live ids every segment's vector index holds (its faiss index, or for a flat segment
    its vector file), sorted."""
    from semsearch.store.integrity import vector_ids
    from semsearch.store.segments import Segment, Tombstones

    m = Manifest.load(folder)
    out = []
    for e in m.segments:
        seg = Segment(folder, e)
        ids = np.sort(vector_ids(seg.vectors))
        seg.docs.close()
        if e.get("deletes"):
            ids = ids[~np.isin(ids, Tombstones.load(folder / e["deletes"]).chunks)]
        out.append(ids)
    return np.sort(np.concatenate(out))


def assert_same_index(a: Path, b: Path, atol: float = 0.0) -> None:
    ra, va, fa = dump(a)
    rb, vb, fb = dump(b)
    assert ra == rb and fa == fb
    np.testing.assert_allclose(va, vb, rtol=0, atol=atol)
    np.testing.assert_array_equal(faiss_ids(a), faiss_ids(b))
    np.testing.assert_array_equal(faiss_ids(a), [r[0] for r in ra])
    ma, mb = Manifest.load(a), Manifest.load(b)
    assert ma.counts == mb.counts and ma.index["type"] == mb.index["type"]


def edit_corpus(root: Path) -> None:
    """Change one file, delete one, add one, and touch one without changing it."""
    (root / "banking" / "mortgage_rates.md").write_text("# Mortgage rates\nRates rose again this spring.\n")
    (root / "travel" / "packing_light.txt").unlink()
    (root / "new_note.txt").write_text("Lighthouses guide ships along rocky coasts at night.\n")
    p = root / "meteor_showers.txt"
    p.write_bytes(p.read_bytes())  # new mtime, same bytes


def test_inprocess_engine_equals_local_and_updates_either_way(sample_copy, tmp_path, fake_encoder):
    a, b = tmp_path / "local", tmp_path / "shards"
    index_corpus(sample_copy, a, fake_encoder)
    rep = index_corpus(sample_copy, b, fake_encoder, engine=InProcessEngine(fake_encoder, shard_rows=7))
    assert rep.engine["shards"] > 3 and rep.engine["files"] == 25
    # the workers wrote one segment a group of shards; the driver published them (merged as the policy asks)
    assert rep.engine["segments_written"] > 1 and 1 < len(Manifest.load(b).segments) < rep.engine["segments_written"]
    assert not list(b.glob(".staging-*"))  # the staging folder is gone after the run
    assert_same_index(a, b)

    edit_corpus(sample_copy)
    ra = index_corpus(sample_copy, a, fake_encoder)
    rb = index_corpus(sample_copy, b, fake_encoder, engine=InProcessEngine(fake_encoder))
    for k in ("added", "updated", "removed", "unchanged", "documents", "chunks"):
        assert getattr(ra, k) == getattr(rb, k), k
    assert (rb.added, rb.updated, rb.removed) == (1, 1, 1) and rb.engine["files"] == 3  # changed, new, touched
    assert_same_index(a, b)

    # the shard-built index updated by the local engine, and the local one by the shards path
    (sample_copy / "cooking" / "red_lentil_soup.txt").write_text("Lentil soup with lemon.\n")
    index_corpus(sample_copy, a, fake_encoder, engine=InProcessEngine(fake_encoder))
    index_corpus(sample_copy, b, fake_encoder)
    assert_same_index(a, b)


def test_an_engine_writes_each_partition_side_by_side_and_the_commit_splits_nothing(sample_copy, tmp_path, fake_encoder,
                                                                                     monkeypatch):
    """`index --shards 3` through an engine: its segment writers write one segment a partition
    (a task each: in parallel on Ray), so the commit merges and splits nothing; the index equals
    the local engine's partitioned and unpartitioned builds chunk for chunk, and stays partitioned
    through an update by either engine."""
    from semsearch.store import merge as merge_

    a, b, c = tmp_path / "local", tmp_path / "engine", tmp_path / "local-parted"
    index_corpus(sample_copy, a, fake_encoder)
    index_corpus(sample_copy, c, fake_encoder, shards=3)
    merges = []
    real_merge = merge_.merge
    monkeypatch.setattr(merge_, "merge", lambda *x, **k: merges.append(x[2]) or real_merge(*x, **k))
    rep = index_corpus(sample_copy, b, fake_encoder, engine=InProcessEngine(fake_encoder), shards=3)
    m = Manifest.load(b)
    assert rep.engine["segments_written"] == 3 and merges == []
    assert m.shards == 3 and sorted(e["part"] for e in m.segments) == [0, 1, 2]
    parts_hold_their_documents(b, 3)
    assert any(e.get("guests") for e in m.segments)  # (the sample's JSONL and CSV records: in every partition)
    assert_same_index(a, b)
    assert_same_index(c, b)
    edit_corpus(sample_copy)
    for folder in (a, b):
        index_corpus(sample_copy, folder, fake_encoder)
    index_corpus(sample_copy, c, fake_encoder, engine=InProcessEngine(fake_encoder))
    assert_same_index(a, b)
    assert_same_index(a, c)
    for folder in (b, c):
        parts_hold_their_documents(folder, 3)


def _segments_by_part(folder):
    from semsearch.store.manifest import Manifest

    m = Manifest.load(folder)
    out: dict = {}
    for e in m.segments:
        out.setdefault(e.get("part"), []).append(e)
    return m, out


def parts_hold_their_documents(folder, n):
    """Every live chunk of every segment is of the segment's partition (its document's: hash of
    its file's path, or of path and row for a record), and every file a segment holds either has
    a chunk there or is at home there (hash(path) mod n); the segment counts its home files."""
    import sqlite3

    from semsearch.store.partition import entry_parts, part_of

    m, by_part = _segments_by_part(folder)
    assert m.shards == n and None not in by_part and set(by_part) <= set(range(n))
    for e in m.segments:
        parts, _ = entry_parts(folder, e, n)
        assert all(len(s.chunks) == 0 for p, s in parts.items() if p != e["part"]), (e["id"], set(parts))
        db = sqlite3.connect(f"file:{folder / e['docs']}?mode=ro", uri=True)
        paths = dict(db.execute("SELECT id, path FROM files"))
        db.close()
        held = set(parts[e["part"]].files.tolist()) if e["part"] in parts else set()
        assert held == set(paths) - set(_dead_files(folder, e)), e["id"]
        assert e["files"] == sum(part_of(paths[f], n) == e["part"] for f in held), e["id"]
    return m, by_part


def _dead_files(folder, e):
    from semsearch.store.segments import Tombstones

    return Tombstones.load(folder / e["deletes"]).files.tolist() if e.get("deletes") else []


def test_shards_path_builds_ivf_and_keeps_states(sample_copy, tmp_path, real_encoder):
    a, b = tmp_path / "local", tmp_path / "shards"
    vs = VectorSettings(index_type="ivf")
    index_corpus(sample_copy, a, real_encoder, keep_states=True, vectors=vs)
    index_corpus(sample_copy, b, real_encoder, keep_states=True, vectors=vs, engine=InProcessEngine(real_encoder))
    assert_same_index(a, b, atol=1e-5)
    assert Manifest.load(b).index["type"] == "ivf" and Manifest.load(b).states
    # both keep each chunk's token table beside its states: the tokenizer's own
    tables = [kept_tables(f) for f in (a, b)]
    assert len(tables[0]) > 10 and [t for t, _ in tables[0]] == [t for t, _ in tables[1]]
    # of what was encoded: a chunk's titles (the sample's Markdown files have them), then its text
    from semsearch.corpus.titles import chunk_context, embedding_text

    rows = sorted(Retriever.load(a).docs.select("c.text, f.path, c.metadata"))
    assert [t for _, t, _, _ in rows] == [t for t, _ in tables[0]]
    want = real_encoder.token_table([embedding_text(chunk_context(p, json.loads(m) if m else {}), t) for _, t, p, m in rows])
    for (_, ra), (_, rb), w in zip(tables[0], tables[1], want):
        assert np.array_equal(ra, w) and np.array_equal(rb, w)
    # kept states re-pool to the same vectors in both
    from semsearch.indexing import encoder_for_index

    for f in (a, b):
        enc = encoder_for_index(Manifest.load(f), pooling="max", device="cpu", precision="fp32")
        index_corpus(sample_copy, f, enc)
    assert_same_index(a, b, atol=1e-5)


def test_staged_duplicates_kept_once_and_lost_chunks_refused(sample_copy, tmp_path, fake_encoder):
    class Duplicating(InProcessEngine):
        def run(self, jobs, spec, staging):
            figures = super().run(jobs, spec, staging)
            first = sorted((staging / "shards").glob("*.parquet"))[0]
            shutil.copy(first, first.with_name("retry-" + first.name))  # a write that happened twice
            return figures

    class Losing(InProcessEngine):
        def run(self, jobs, spec, staging):
            import pyarrow.compute as pc
            import pyarrow.parquet as pq

            figures = super().run(jobs, spec, staging)
            first = sorted((staging / "shards").glob("*.parquet"))[0]
            t = pq.read_table(first)
            pq.write_table(t.filter(pc.invert(pc.and_(pc.equal(t["doc"], 0), pc.equal(t["ord"], 0)))), first)
            return figures

    a, b = tmp_path / "local", tmp_path / "dup"
    index_corpus(sample_copy, a, fake_encoder)
    index_corpus(sample_copy, b, fake_encoder, engine=Duplicating(fake_encoder, shard_rows=7))
    assert_same_index(a, b)
    with pytest.raises(EngineError, match="chunk"):
        index_corpus(sample_copy, tmp_path / "lost", fake_encoder, rebuild=True, engine=Losing(fake_encoder, shard_rows=7))
    assert not (tmp_path / "lost" / "manifest.json").exists()


def test_bad_file_through_engine_names_it_and_keeps_index(tmp_path, fake_encoder, small_corpus):
    folder = tmp_path / "idx"
    index_corpus(small_corpus, folder, fake_encoder, engine=InProcessEngine(fake_encoder))
    before = dump(folder)
    (small_corpus / "bad.jsonl").write_text('{"text": "fine"}\n{not json\n')
    with pytest.raises(CorpusError, match="bad.jsonl"):
        index_corpus(small_corpus, folder, fake_encoder, engine=InProcessEngine(fake_encoder))
    assert dump(folder)[0] == before[0]
    (small_corpus / "bad.jsonl").unlink()
    (small_corpus / "latin1.txt").write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    rep = index_corpus(small_corpus, folder, fake_encoder, engine=InProcessEngine(fake_encoder))
    assert sum(rep.skipped.values()) == 1 and rep.added == 0


def test_make_engine_checks_its_options():
    assert make_engine("local") is None
    with pytest.raises(InputError, match="--engine ray"):
        make_engine("local", workers=2)
    with pytest.raises(InputError, match="valid engines"):
        make_engine("spark")


def test_ray_engine_without_ray_names_the_extra(monkeypatch, sample_copy, tmp_path, fake_encoder):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    engine = make_engine("ray", workers=1)  # constructing it needs no Ray
    with pytest.raises(InputError, match=r"semsearch\[ray\]"):
        index_corpus(sample_copy, tmp_path / "idx", fake_encoder, engine=engine)
    assert not (tmp_path / "idx" / "manifest.json").exists()


def test_core_does_not_import_ray(sample_copy, tmp_path):
    import subprocess
    import sys

    code = ("import sys; from semsearch.indexing import index_corpus; from semsearch.cli import main; "
            "import semsearch.engines.build, semsearch.engines.inprocess; print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
