"""FAISS on a GPU where faiss-gpu sees one, the CPU otherwise.

The fallback tests run everywhere; the GPU tests are skipped where faiss has no GPU (faiss-cpu,
or no device), and compare GPU results with the same index searched on the CPU.
"""
from __future__ import annotations

import numpy as np
import pytest

from semsearch.errors import InputError
from semsearch.store.vectors import VectorIndex, faiss_gpus, recall_at, resolve_index_device

needs_gpu = pytest.mark.skipif(faiss_gpus() == 0, reason="faiss has no GPU here (faiss-cpu, or no CUDA device)")


def _data(n=3000, d=64, nq=50, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(20, d))
    x = centres[rng.integers(0, 20, n)] + 0.5 * rng.normal(size=(n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = x[rng.choice(n, nq, replace=False)] + 0.1 * rng.normal(size=(nq, d))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    ids = np.arange(100, 100 + n, dtype=np.int64)  # not 0..n-1: ids must survive the GPU round trip
    return ids, x.astype(np.float32), q.astype(np.float32)


def test_unknown_device_is_refused():
    with pytest.raises(InputError, match="valid devices are"):
        resolve_index_device("tpu")


def test_cpu_request_stays_on_cpu():
    assert resolve_index_device("cpu") == "cpu"


@pytest.mark.skipif(faiss_gpus() > 0, reason="this machine has a GPU faiss can use")
def test_falls_back_to_cpu_without_faiss_gpu():
    """'auto' and even 'cuda' build and search on the CPU when faiss cannot use a GPU."""
    assert resolve_index_device("auto") == "cpu"
    assert resolve_index_device("cuda") == "cpu"
    ids, x, q = _data(n=500)
    vi = VectorIndex.build(64, "flat", [(ids, x)], len(ids), device=resolve_index_device("cuda"))
    assert vi.device == "cpu"
    _, got = vi.search(q, 5)
    assert set(got.ravel()) <= set(ids)


def test_types_without_gpu_form_stay_on_cpu():
    vi = VectorIndex.create(64, "hnsw", device="cuda")
    assert vi.device == "cpu"  # faiss has no GPU HNSW: searched on the CPU whatever was asked


@needs_gpu
def test_gpu_is_chosen_when_present():
    assert resolve_index_device("auto") == "cuda"


@needs_gpu
@pytest.mark.parametrize("kind", ["flat", "ivf", "ivf-sq8"])
def test_gpu_build_and_search_match_cpu(kind, tmp_path):
    ids, x, q = _data()
    params = {"nlist": 32, "nprobe": 8} if kind != "flat" else {}
    cpu = VectorIndex.build(64, kind, [(ids, x)], len(ids), dict(params), device="cpu")
    gpu = VectorIndex.build(64, kind, [(ids, x)], len(ids), dict(params), device="cuda")
    assert gpu.device == "cuda" and gpu.ntotal == cpu.ntotal == len(ids)
    s_cpu, i_cpu = cpu.search(q, 10)
    s_gpu, i_gpu = gpu.search(q, 10)
    if kind == "flat":
        np.testing.assert_allclose(s_gpu, s_cpu, atol=1e-4)
        assert recall_at(i_gpu, i_cpu) >= 0.99  # ties may swap
    else:  # k-means on the GPU gives other centroids: compare each with exact search
        exact = VectorIndex.build(64, "flat", [(ids, x)], len(ids)).search(q, 10)[1]
        assert recall_at(i_gpu, exact) >= recall_at(i_cpu, exact) - 0.05
    # Saved from the GPU, loaded on the CPU: the same hits.
    gpu.save(tmp_path / "v.faiss")
    back = VectorIndex.load(tmp_path / "v.faiss", kind, gpu.params, device="cpu")
    _, i_back = back.search(q, 10)
    assert recall_at(i_back, i_gpu) >= 0.99


@needs_gpu
def test_gpu_mirror_follows_adds_and_removes():
    ids, x, q = _data(n=1000)
    vi = VectorIndex.build(64, "flat", [(ids[:800], x[:800])], 800, device="cuda")
    vi.search(q, 5)  # makes the mirror
    vi.add(ids[800:], x[800:])
    assert vi.ntotal == 1000
    _, got = vi.search(x[900:901], 1)
    assert got[0, 0] == ids[900]
    vi.remove(ids[900:901])
    _, got = vi.search(x[900:901], 5)
    assert ids[900] not in got[0] and vi.ntotal == 999


# ---- The CPU/GPU bookkeeping, on every machine ------------------------------------------------
# faiss's GPU copy functions are replaced by CPU clones, so that the mirror logic (adds on the
# mirror, copy back before saving or editing, mirror dropped on delete, knob set on both, fallback
# when the copy fails) runs in CI. The real GPU is exercised by the tests above, where there is one.


@pytest.fixture
def stand_in_gpu(monkeypatch):
    import faiss

    from semsearch.store import vectors

    copies = []

    def to_gpu(index):
        copies.append(index)
        return faiss.clone_index(index)

    monkeypatch.setattr(vectors, "faiss_gpus", lambda: 1)
    monkeypatch.setattr(vectors, "_to_gpu", to_gpu)
    monkeypatch.setattr(faiss, "index_gpu_to_cpu", faiss.clone_index, raising=False)
    monkeypatch.setattr(faiss, "GpuParameterSpace", faiss.ParameterSpace, raising=False)
    return copies


@pytest.mark.parametrize("kind", ["flat", "ivf", "ivf-sq8"])
def test_mirror_bookkeeping(kind, stand_in_gpu, tmp_path):
    ids, x, q = _data(n=1200)
    params = {"nlist": 16, "nprobe": 4} if kind != "flat" else {}
    cpu = VectorIndex.build(64, kind, [(ids[:1000], x[:1000])], 1000, dict(params), device="cpu")
    gpu = VectorIndex.build(64, kind, [(ids[:1000], x[:1000])], 1000, dict(params), device="cuda")
    assert gpu.device == "cuda" and gpu.built_on == "cuda" and gpu._cpu_stale  # added on the mirror
    assert gpu.ntotal == 1000 and gpu._cpu.ntotal == 0  # the CPU copy is behind until needed
    np.testing.assert_array_equal(gpu.search(q, 10)[1], cpu.search(q, 10)[1])
    gpu.add(ids[1000:], x[1000:])
    assert gpu.ntotal == 1200
    gpu.remove(ids[:100])  # a delete is done on the CPU copy, taken from the mirror first
    assert not gpu._cpu_stale and gpu._gpu is None and gpu.ntotal == 1100
    got = gpu.search(x[:100], 5)[1]  # the mirror is made again from the edited copy
    assert gpu._gpu is not None and not set(got.ravel()) & set(ids[:100])
    if kind != "flat":
        gpu.set_knob(8)
        import faiss

        assert faiss.extract_index_ivf(gpu._gpu).nprobe == 8 and faiss.extract_index_ivf(gpu._cpu).nprobe == 8
    gpu.add(ids[:100], x[:100])
    gpu.save(tmp_path / "v.faiss")  # saving takes the mirror's adds back first
    back = VectorIndex.load(tmp_path / "v.faiss", kind, gpu.params)
    assert back.ntotal == 1200
    assert recall_at(back.search(q, 10)[1], gpu.search(q, 10)[1]) >= 0.99
    _, big = gpu.search(q[:2], 3000)  # beyond faiss's GPU k limit: searched on the CPU copy
    np.testing.assert_array_equal(big, gpu.index.search(q[:2], 1200)[1])


def test_failed_gpu_copy_falls_back_to_cpu(stand_in_gpu, monkeypatch, caplog):
    from semsearch.store import vectors

    def no_memory(index):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(vectors, "_to_gpu", no_memory)
    ids, x, q = _data(n=500)
    vi = VectorIndex.build(64, "flat", [(ids, x)], len(ids), device="cuda")
    assert vi.device == "cpu" and vi.built_on == "cpu" and vi.ntotal == 500
    assert "searching it on the CPU" in caplog.text
    assert set(vi.search(q, 5)[1].ravel()) <= set(ids)
