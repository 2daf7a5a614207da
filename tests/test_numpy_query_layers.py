"""Trained query layers in the torch-free query encoder: the same query vectors as the torch
encoder, for fp32 and int8 indexes, and a one-shot search that never imports torch."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from semsearch.encoder.heads import load_head
from semsearch.encoder.numpy_encoder import NumpyEncoder
from semsearch.encoder.query_layers import QueryTower
from semsearch.training.query_tower import save_tower

from conftest import REPO
from test_train import write_beir

QUERIES = ["loan approval", "what is the boiling point of water at altitude?", "x", "comet " * 300]


def _tower_head(real_encoder, folder, n=2, seed=0):
    """A query-layers head whose layers differ from the base model's (as training leaves them)."""
    tower = QueryTower.from_base(real_encoder.model, n)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in tower.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    save_tower(tower, folder, {"base_model_fingerprint": real_encoder.fingerprint, "doc_pooling": "mean"}, None)
    return folder


def _numpy(real_encoder, head, pooling="mean", int8=False):
    return NumpyEncoder(real_encoder.folder, real_encoder.name, real_encoder.fingerprint, pooling, real_encoder.max_length,
                        str(head), int8=int8)


@pytest.mark.parametrize("n", [1, 2])
def test_numpy_query_layers_match_the_torch_encoder(real_encoder, tmp_path, n):
    from semsearch.encoder import Encoder

    head = _tower_head(real_encoder, tmp_path / "h", n)
    torch_enc = Encoder(precision="fp32", device="cpu", head=load_head(head, real_encoder.fingerprint))
    ne = _numpy(real_encoder, head)
    assert ne.query_tower is not None and ne.query_tower.first == 6 - n and ne.out_dim == 384
    want = torch_enc.encode_queries(QUERIES)
    got = ne.encode_queries(QUERIES)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-4
    # the tower does change the queries, and documents never go through it
    assert np.abs(got - real_encoder.encode(QUERIES)).max() > 1e-3
    assert np.abs(ne.encode(QUERIES) - real_encoder.encode(QUERIES)).max() <= 1e-4
    # a single string, as encode takes it
    assert np.abs(ne.encode_queries(QUERIES[0])[0] - want[0]).max() <= 1e-4


def test_query_layers_of_another_shape_are_refused(real_encoder, tmp_path):
    from semsearch.errors import ModelError

    head = _tower_head(real_encoder, tmp_path / "h", 2)
    cfg = json.loads((head / "head.json").read_text())
    cfg["first_layer"] = 3
    (head / "head.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="do not fit this model"):
        _numpy(real_encoder, head)


def test_int8_queries_through_query_layers_are_fp32_on_both_encoders(real_encoder, tmp_path):
    """The torch encoder runs query layers on its fp32 model even for an int8 index; the numpy
    one does the same (its int8 ONNX model serves the document side only)."""
    from semsearch.encoder import Encoder

    head = _tower_head(real_encoder, tmp_path / "h", 2)
    torch_int8 = Encoder(precision="int8", device="cpu", head=load_head(head, real_encoder.fingerprint))
    assert torch_int8.precision == "int8" and torch_int8.onnx is not None
    ne = _numpy(real_encoder, head, int8=True)
    assert ne.precision == "int8" and len(ne.layers) == 4  # only the base layers under the tower
    want = torch_int8.encode_queries(QUERIES)
    assert np.abs(ne.encode_queries(QUERIES) - want).max() <= 1e-4
    assert np.abs(ne.encode_queries(QUERIES) - _numpy(real_encoder, head).encode_queries(QUERIES)).max() <= 1e-6
    # documents stay int8, as the index's vectors are
    np.testing.assert_allclose(ne.encode(QUERIES[:2]), torch_int8.encode(QUERIES[:2]), atol=1e-5)


def _index_with_tower(real_encoder, tmp_path, precision):
    from semsearch.corpus import ReadOptions
    from semsearch.indexing import encoder_for_index, index_corpus, load_base

    ds = write_beir(tmp_path / "ds")
    idx = tmp_path / "idx"
    read = ReadOptions(text_column="title,text")
    enc = encoder_for_index(None, precision=precision, device="cpu")
    index_corpus(ds / "corpus.jsonl", idx, enc, read=read, progress=False)
    head = _tower_head(real_encoder, tmp_path / "h", 2)
    base = load_base(idx, False)
    enc = encoder_for_index(base, head=head, device="cpu", precision=precision)
    index_corpus(ds / "corpus.jsonl", idx, enc, read=read, progress=False)
    return idx, enc


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_one_shot_search_with_query_layers_is_torch_free_and_agrees(real_encoder, tmp_path, precision):
    from semsearch.search import Retriever

    idx, enc = _index_with_tower(real_encoder, tmp_path, precision)
    fast = Retriever.load(idx, device="cpu", fast_start=True)
    # (the index's torch encoder, in its own precision: auto would pick bf16 on CPUs that have it)
    slow = Retriever.load(idx, device="cpu", encoder=enc)
    assert fast.manifest.head["kind"] == "query-layers" and fast.manifest.precision == precision
    assert isinstance(fast.encoder, NumpyEncoder) and fast.encoder.query_tower is not None
    assert slow.encoder.query_tower is not None
    q = ["what about comet?", "garden tips"]
    assert np.abs(fast.encoder.encode_queries(q) - slow.encoder.encode_queries(q)).max() <= 1e-4
    for mode in ("dense", "hybrid"):
        a, b = fast.search(q[0], k=5, mode=mode), slow.search(q[0], k=5, mode=mode)
        assert [h.id for h in a] == [h.id for h in b] and "comet" in a[0].text
        assert max(abs(x.score - y.score) for x, y in zip(a, b)) <= 1e-4
    # a fresh process answers from the numpy path and never loads torch
    code = ("import sys, json; from semsearch.search import Retriever; "
            f"r = Retriever.load({str(idx)!r}, device='cpu', fast_start=True); "
            "h = r.search('what about comet?', k=3, mode='dense'); "
            "print(json.dumps({'torch': 'torch' in sys.modules, 'tower': r.encoder.query_tower is not None, 'top': h[0].id}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"torch": False, "tower": True, "top": slow.search("what about comet?", k=3, mode="dense")[0].id}
