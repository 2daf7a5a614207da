"""The Ray engine on a local cluster (num_cpus=2) with the real bundled model: the same index as
the local engine (chunks, ids, vectors within 1e-5), updates with either engine, and a run that
survives an actor killed mid-run. About 2 minutes on 2 shared cores (cluster start 15-25 s,
each run ~20-60 s: most of it is actors importing torch and loading the model)."""
from __future__ import annotations

import json
import os
import shutil

import pytest

ray = pytest.importorskip("ray", reason="the Ray engine needs pip install 'semsearch[ray]'")

from click.testing import CliRunner  # noqa: E402

from semsearch.cli import main  # noqa: E402
from semsearch.engines.ray_engine import RayEngine  # noqa: E402
from semsearch.indexing import index_corpus  # noqa: E402
from test_engines import assert_same_index, edit_corpus  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]  # one local Ray cluster at a time (pytest -n: one worker)


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster of 2 CPUs for this module (the engine reuses a connected Ray)."""
    import logging

    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_engine_equals_local_survives_a_killed_actor_and_updates_either_way(cluster, sample_copy, tmp_path, real_encoder):
    """Three Ray runs: a build in which one of two actors is SIGKILLed after its 2nd batch (Ray
    restarts it and re-runs its batches), then, after the corpus changes, a local-built index
    updated on Ray from the command line and the Ray-built one updated on Ray; a copy of the
    Ray-built index is updated locally. Every index equals the local engine's (the same chunks,
    ids, and vectors within 1e-5), and each run leaves no staging folder behind."""
    a, b, c = tmp_path / "local", tmp_path / "ray", tmp_path / "ray-then-local"
    index_corpus(sample_copy, a, real_encoder)
    engine = RayEngine(workers=2, batch_rows=8, kill_once_after=2)  # ~11 batches: one actor dies after its 2nd
    rep = index_corpus(sample_copy, b, real_encoder, engine=engine)
    assert rep.engine["engine"] == "ray" and rep.engine["workers"] == 2
    pid = rep.engine["killed_pid"]
    assert pid is not None and pid != os.getpid()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the actor's process is gone
    assert_same_index(a, b, atol=1e-5)  # every chunk, once, with its id and vector
    assert not list(b.glob(".staging-*"))
    shutil.copytree(b, c)

    edit_corpus(sample_copy)  # one file changed, one deleted, one added, one touched
    (sample_copy / "faq" / "bank_faq.csv").unlink()
    shutil.copy(sample_copy / "growing_tomatoes.txt", sample_copy / "tomatoes_again.txt")
    res = CliRunner().invoke(main, ["index", str(sample_copy), "--index", str(a), "--engine", "ray", "--workers", "1",
                                    "--device", "cpu", "--precision", "fp32", "--json"])  # local-built, updated on Ray
    assert res.exit_code == 0, res.output
    ra = json.loads(res.output[res.output.index("{"):])
    assert ra["engine"]["engine"] == "ray" and ra["engine"]["workers"] == 1
    assert ra["engine"]["files"] == 4  # the changed, the two new, and the touched file (same hash: not re-embedded)
    rb = index_corpus(sample_copy, b, real_encoder, engine=RayEngine(workers=1)).as_dict()  # Ray-built, updated on Ray
    rc = index_corpus(sample_copy, c, real_encoder).as_dict()  # Ray-built, updated locally
    for k in ("added", "updated", "removed", "chunks"):
        assert ra[k] == rb[k] == rc[k], (k, ra, rb, rc)
    assert (ra["added"], ra["updated"], ra["removed"]) == (2, 1, 2)
    for other in (b, c):
        assert_same_index(a, other, atol=1e-5)
        assert not list(other.glob(".staging-*"))


def test_ray_engine_writes_each_partition_in_a_task_of_its_own(cluster, sample_copy, tmp_path, real_encoder):
    """`index --shards 3 --engine ray`: Ray tasks write one segment a partition, each keeping its
    partition's documents of every staged file (the JSONL and CSV files' records fall in all
    three); the index holds what the local engine's unpartitioned build holds, chunk for chunk."""
    from test_engines import parts_hold_their_documents

    a, b = tmp_path / "local", tmp_path / "ray-parted"
    index_corpus(sample_copy, a, real_encoder)
    rep = index_corpus(sample_copy, b, real_encoder, engine=RayEngine(workers=2), shards=3)
    assert rep.engine["engine"] == "ray" and rep.engine["segments_written"] == 3
    m, by_part = parts_hold_their_documents(b, 3)
    assert sorted(by_part) == [0, 1, 2] and any(e.get("guests") for e in m.segments)
    assert_same_index(a, b, atol=1e-5)
