"""The Ray engine on a local cluster (num_cpus=2) with the real bundled model: the same index as
the local engine (chunks, ids, vectors within 1e-5), updates with either engine, and a run that
survives an actor killed mid-run. About 4 minutes on 2 shared cores (cluster start 15-25 s,
each run ~40-100 s: most of it is actors importing torch and loading the model)."""
from __future__ import annotations

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


def test_ray_engine_equals_local_and_updates_either_way(cluster, sample_copy, tmp_path, real_encoder):
    a, b = tmp_path / "local", tmp_path / "ray"
    index_corpus(sample_copy, a, real_encoder)
    res = CliRunner().invoke(main, ["index", str(sample_copy), "--index", str(b), "--engine", "ray", "--workers", "2",
                                    "--device", "cpu", "--precision", "fp32", "--json"])
    assert res.exit_code == 0, res.output
    assert '"engine": "ray"' in res.output and '"workers": 2' in res.output
    assert_same_index(a, b, atol=1e-5)
    assert not list(b.glob(".staging-*"))

    edit_corpus(sample_copy)
    ra = index_corpus(sample_copy, a, real_encoder, engine=RayEngine(workers=1))  # local-built, updated on Ray
    rb = index_corpus(sample_copy, b, real_encoder)  # Ray-built, updated locally
    assert (ra.added, ra.updated, ra.removed, ra.chunks) == (rb.added, rb.updated, rb.removed, rb.chunks) == (1, 1, 1, 2)
    assert ra.engine["files"] == 3  # the changed, the new, and the touched file (same hash: not re-embedded)
    assert_same_index(a, b, atol=1e-5)


def test_actor_killed_mid_run_is_retried_and_every_chunk_lands_once(cluster, sample_copy, tmp_path, real_encoder):
    a, b = tmp_path / "local", tmp_path / "ray"
    index_corpus(sample_copy, a, real_encoder)
    engine = RayEngine(workers=2, batch_rows=8, kill_once_after=2)  # ~11 batches: one actor dies after its 2nd
    rep = index_corpus(sample_copy, b, real_encoder, engine=engine)
    pid = rep.engine["killed_pid"]
    assert pid is not None and pid != os.getpid()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the actor's process is gone
    assert_same_index(a, b, atol=1e-5)  # every chunk, once, with its id and vector

    # the Ray-built index, updated on Ray
    (sample_copy / "faq" / "bank_faq.csv").unlink()
    shutil.copy(sample_copy / "growing_tomatoes.txt", sample_copy / "tomatoes_again.txt")
    index_corpus(sample_copy, a, real_encoder)
    index_corpus(sample_copy, b, real_encoder, engine=RayEngine(workers=1))
    assert_same_index(a, b, atol=1e-5)
