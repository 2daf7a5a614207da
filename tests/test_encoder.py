"""The native encoder against sentence-transformers, and the pooling functions."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from semsearch.encoder.pooling import AttentionHead, cls_pool, max_pool, mean_pool, pool
from semsearch.encoder.transformer import onednn_fused_linear_available
from semsearch.errors import InputError, ModelError

TEXTS = [
    "loan approval",
    "Mortgage rates rose sharply this quarter as inflation data surprised the markets.",
    "a",
    # Well over 256 tokens: both sides must truncate at the model's 256, not the tokenizer.json's 128.
    "The committee reviewed the application, the credit history and the collateral. " * 40,
    "Überprüfung der Kreditwürdigkeit — naïve café résumé, 東京, emoji 🙂.",
]


pytestmark = pytest.mark.xdist_group("test_encoder")  # one worker sets the module fixtures up (pytest -n)


@pytest.fixture(scope="module")
def st_reference():
    from sentence_transformers import SentenceTransformer

    try:  # the modules' home since sentence-transformers 6; `models` before
        from sentence_transformers.sentence_transformer import modules as models
    except ImportError:
        from sentence_transformers import models

    from semsearch.encoder.encoder import default_model_path

    path = str(default_model_path())
    out = {}
    for mode in ("cls", "mean", "max"):
        tr = models.Transformer(path, max_seq_length=256)
        st = SentenceTransformer(
            modules=[tr, models.Pooling(384, pooling_mode=mode), models.Normalize()],
            device="cpu",
        )
        out[mode] = st.encode(TEXTS, convert_to_numpy=True, batch_size=2)
    return out


@pytest.mark.parametrize("mode", ["cls", "mean", "max"])
def test_native_equals_sentence_transformers(mode, st_reference):
    from semsearch.encoder import Encoder

    enc = Encoder(pooling=mode, precision="fp32", device="cpu", batch_tokens=300)  # several batches
    ours = enc.encode(TEXTS)
    diff = np.abs(ours - st_reference[mode]).max()
    assert diff <= 1e-5, f"{mode}: max abs difference {diff}"
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_truncates_at_model_length(real_encoder):
    ids = real_encoder.tokenize([TEXTS[3]])[0]
    assert real_encoder.max_length == 256
    assert len(ids) == 256 and ids[0] == 101 and ids[-1] == 102


def test_encode_many_matches_single_pooling(real_encoder):
    from semsearch.encoder import Encoder

    many = real_encoder.encode_many(TEXTS, ["cls", "mean", "max"])
    for mode in ("cls", "max"):
        single = Encoder(pooling=mode, precision="fp32", device="cpu").encode(TEXTS)
        assert np.abs(many[mode] - single).max() < 1e-6


def test_bf16_close_to_fp32(real_encoder):
    from semsearch.encoder import Encoder

    fast = Encoder(precision="bf16", device="cpu").encode(TEXTS)
    ref = real_encoder.encode(TEXTS)
    assert (fast * ref).sum(1).min() > 0.999


@pytest.mark.skipif(not onednn_fused_linear_available(), reason="this torch has no oneDNN fused linear")
def test_fused_cpu_path_equals_plain_bf16(real_encoder):
    """The prepacked, fused oneDNN linear path gives the plain bf16 path's vectors, with padding
    in the batch (texts of different lengths) and without (one text)."""
    from semsearch.encoder import Encoder

    enc = Encoder(precision="bf16", device="cpu")
    if not enc.fused_cpu:
        pytest.skip("the fused path's load-time check rejected it on this CPU (the plain path is used)")
    assert all(layer.packed is not None for layer in enc.model.layers)
    fused = enc.encode(TEXTS)
    fused_one = enc.encode(TEXTS[1])
    enc.model.unpack_cpu()
    plain = enc.encode(TEXTS)
    assert (fused * plain).sum(1).min() > 0.9999
    assert float(fused_one[0] @ plain[1]) > 0.9999
    assert (fused * real_encoder.encode(TEXTS)).sum(1).min() > 0.999  # and bf16-close to fp32


def test_packs_dropped_when_the_model_is_moved_or_cast():
    from semsearch.encoder import Encoder

    enc = Encoder(precision="bf16", device="cpu")
    enc.model.float()  # fp32 weights: the bf16 packs must not be used
    assert all(layer.packed is None for layer in enc.model.layers)
    v = enc.encode(TEXTS[:2])
    assert np.isfinite(v).all() and abs(float(np.linalg.norm(v[0])) - 1) < 1e-5


def test_pooling_ignores_padding_and_leaves_input_untouched():
    torch.manual_seed(0)
    states = torch.randn(2, 5, 4)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    before = states.clone()
    m = mean_pool(states, mask)
    assert torch.allclose(m[0], states[0, :3].mean(0))
    mx = max_pool(states, mask)
    assert torch.allclose(mx[0], states[0, :3].max(0).values)
    assert torch.equal(cls_pool(states, mask), states[:, 0])
    assert torch.equal(states, before)
    # Padding values must not matter at all.
    states2 = states.clone()
    states2[0, 3:] = 1e6
    assert torch.allclose(mean_pool(states2, mask)[0], m[0])
    assert torch.allclose(max_pool(states2, mask)[0], mx[0])


def test_attention_head_starts_as_mean_pooling():
    torch.manual_seed(0)
    states = torch.randn(3, 7, 16)
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] + [0] * 6])
    for head in (AttentionHead(16), AttentionHead(16, 16)):
        assert torch.allclose(head(states, mask), mean_pool(states, mask), atol=1e-6)


def test_unknown_pooling_lists_valid_ones():
    with pytest.raises(InputError, match="cls, mean, max"):
        pool("sum", torch.zeros(1, 1, 1), torch.ones(1, 1))


def test_missing_model_folder():
    from semsearch.encoder import Encoder

    with pytest.raises(ModelError, match="nope"):
        Encoder("./nope")


def test_non_bert_folder_uses_sentence_transformers(tmp_path):
    """A folder that is not native-loadable (here: weights only as pytorch .bin) goes through ST."""
    import shutil

    from semsearch.encoder import Encoder
    from semsearch.encoder.encoder import default_model_path

    src = default_model_path()
    dst = tmp_path / "model"
    shutil.copytree(src, dst)
    (dst / "tokenizer.json").unlink()  # native backend needs tokenizer.json; ST rebuilds it from vocab.txt
    enc = Encoder(dst, precision="fp32", device="cpu")
    assert enc.backend == "sentence-transformers"
    ref = Encoder(precision="fp32", device="cpu").encode(TEXTS[:3])
    assert np.abs(enc.encode(TEXTS[:3]) - ref).max() < 1e-5
    assert enc.token_offsets("loan approval")[0] == (0, 4)


def test_small_cpu_inputs_run_on_one_torch_thread(real_encoder, monkeypatch):
    """A query's forward uses one torch thread (fast beside busy processes); batches keep all."""
    import torch

    seen = []
    orig = real_encoder.iter_states

    def spy(texts, progress=None):
        for b in orig(texts, progress):
            seen.append(torch.get_num_threads())
            yield b

    monkeypatch.setattr(real_encoder, "iter_states", spy)
    before = torch.get_num_threads()
    real_encoder.encode(["loan approval"])
    assert seen == [1] and torch.get_num_threads() == before
    seen.clear()
    real_encoder.encode(["a longer passage about mortgage rates and loan approval. " * 10] * 8)
    assert seen and set(seen) == {before} and torch.get_num_threads() == before


def test_the_chunkers_tokenizer_pickles_for_a_reader_process(real_encoder):
    """What a build's reader process chunks with (Encoder.chunk_offsets, pickled as the
    tokenizer's JSON) gives the encoder's own token offsets, past the model's length too."""
    import pickle

    texts = ["Loan approval takes three days.", "naïve café — ünïcode, emoji 🙂 and\nnew lines",
             " ".join(f"word{i}" for i in range(600))]
    far = pickle.loads(pickle.dumps(real_encoder.chunk_offsets()))
    for t in texts:
        assert far(t) == real_encoder.token_offsets(t)
    assert len(far(texts[2])) > real_encoder.max_length


def test_batch_tokens_default_to_the_device_and_travel_only_when_asked(real_encoder):
    """Tokens a batch: 4,096 on the CPU, 65,536 on a GPU (where the CPU's side of each batch
    limits: docs/gpu.md); a Ray worker's encoder takes its own device's default unless a size
    was asked for, which it then keeps."""
    from semsearch.corpus import ReadOptions
    from semsearch.corpus.chunking import ChunkSettings
    from semsearch.encoder import Encoder
    from semsearch.encoder.encoder import default_batch_tokens
    from semsearch.engines.spec import spec_for

    assert default_batch_tokens("cpu") == 4096 and default_batch_tokens("cuda") == 65536
    assert default_batch_tokens("cuda:1") == 65536
    assert real_encoder.batch_tokens == 4096 and real_encoder.batch_tokens_asked is None
    chunking = ChunkSettings(window=254)
    assert spec_for(real_encoder, chunking, ReadOptions(), False).batch_tokens is None
    asked = Encoder(device="cpu", precision="fp32", batch_tokens=300)
    assert asked.batch_tokens == 300 and spec_for(asked, chunking, ReadOptions(), False).batch_tokens == 300
