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
