"""The int8 ONNX Runtime encoder (what `--precision auto` runs on x86 CPUs without AMX) against fp32."""
from __future__ import annotations

import json
import platform

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import SCIFACT
from semsearch.encoder import hardware
from semsearch.errors import InputError, ModelError

pytest.importorskip("onnxruntime")

# The int8 encoder's stated tolerance against fp32: every vector within cosine 0.98, on average
# within 0.99 (measured on SciFact: min 0.985, SciFact nDCG@10 within 0.3 of fp32, README).
MIN_COS, MEAN_COS = 0.98, 0.99


def _texts() -> list[str]:
    if SCIFACT.exists():
        docs = [json.loads(line) for _, line in zip(range(24), open(SCIFACT / "corpus.jsonl"))]
        queries = [json.loads(line)["text"] for _, line in zip(range(24), open(SCIFACT / "queries.jsonl"))]
        return [f"{d['title']} {d['text']}" for d in docs] + queries
    return ["loan approval", "What causes antibiotic resistance in bacteria?",
            "Mortgage rates rose for the third month as lenders priced in inflation. " * 12] * 4


@pytest.fixture(scope="module")
def avx2_auto_encoder():
    """Encoder(precision='auto') on an AVX2-only machine (simulated where the CPU has more)."""
    from semsearch.encoder import Encoder

    if "avx2" not in hardware._proc_cpu_flags():
        pytest.skip("auto picks int8 on x86 CPUs with AVX2 only")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SEMSEARCH_CPU_ISA", "avx2")
        return Encoder(device="cpu", precision="auto")


def test_cpu_isa_override(monkeypatch):
    monkeypatch.setenv("SEMSEARCH_CPU_ISA", "avx2")
    flags = hardware.cpu_flags()
    assert not any(f.startswith(("avx512", "amx")) for f in flags)
    assert not hardware.cpu_has_fast_bf16()
    want = "int8" if "avx2" in flags and platform.machine().lower() in ("x86_64", "amd64") else "fp32"
    assert hardware.resolve_precision("auto", "cpu") == want
    assert hardware.resolve_precision("auto", "cuda") == "fp16"
    # An existing index keeps its own arithmetic: int8 stays int8, a float index is never int8.
    assert hardware.precision_for_index("int8", "cpu") == "int8"
    assert hardware.precision_for_index("fp32", "cpu") == "fp32"
    assert hardware.precision_for_index("bf16", "cpu") == "fp32"  # no bf16 units in this simulation
    assert hardware.precision_for_index("int8", "cuda") == "fp16"
    monkeypatch.setattr(hardware, "onnxruntime_installed", lambda: False)
    assert hardware.resolve_precision("auto", "cpu") == "fp32"
    assert hardware.precision_for_index("int8", "cpu") == "fp32"
    monkeypatch.setenv("SEMSEARCH_CPU_ISA", "native")
    assert hardware.cpu_flags() == hardware._proc_cpu_flags()
    monkeypatch.setenv("SEMSEARCH_CPU_ISA", "sse2")
    with pytest.raises(InputError, match="SEMSEARCH_CPU_ISA='sse2'.*avx2"):
        hardware.cpu_flags()


def test_int8_is_for_cpus():
    with pytest.raises(InputError, match="'int8' is for CPUs"):
        hardware.resolve_precision("int8", "cuda")


def test_auto_on_avx2_is_int8_and_matches_fp32(avx2_auto_encoder, real_encoder):
    enc = avx2_auto_encoder
    assert enc.precision == "int8" and enc.onnx is not None  # auto's choice on this CPU
    texts = _texts()
    poolings = ["mean", "cls", "max"]
    gots, wants = enc.encode_many(texts, poolings), real_encoder.encode_many(texts, poolings)  # one pass each
    for pooling in poolings:
        got, want = gots[pooling], wants[pooling]
        cos = (got * want).sum(1)
        assert cos.min() >= MIN_COS and cos.mean() >= MEAN_COS, (pooling, cos.min(), cos.mean())
        assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    # Each text runs alone (dynamic quantisation scales activations per run): its vector does
    # not depend on what it is encoded with.
    together = enc.encode(texts)
    for i in (0, len(texts) // 2, len(texts) - 1):
        np.testing.assert_allclose(enc.encode([texts[i]])[0], together[i], atol=1e-6)


def test_int8_vectors_pooled_text_by_text_match_the_padded_batch(avx2_auto_encoder):
    """int8 with plain poolings pools each text's states as they come back (numpy, no padded
    batch): the same vectors as pooling the padded batches of iter_states with torch, several
    poolings from one pass; kept states are each text's own, bit for bit."""
    import torch

    from semsearch.encoder.pooling import pool

    enc, texts = avx2_auto_encoder, _texts()
    got = enc.encode_many(texts, ["mean", "cls", "max"], progress=False)
    want = {p: np.zeros_like(v) for p, v in got.items()}
    for b in enc.iter_states(texts, progress=False):
        for p in want:
            want[p][b.index] = torch.nn.functional.normalize(pool(p, b.states, b.mask), dim=-1).numpy()
    for p in want:
        assert not np.array_equal(want[p], np.zeros_like(want[p]))
        np.testing.assert_allclose(got[p], want[p], atol=2e-6, err_msg=p)
    # with the states kept (--keep-states): the same vectors, and each text's own states as fp16
    vecs, states = enc.encode_with_states(texts)
    np.testing.assert_allclose(vecs, got[enc.pooling], atol=2e-6)
    lens = [len(x) for x in enc.tokenize(texts)]
    for b in enc.iter_states(texts, progress=False):
        for r, i in enumerate(b.index):
            assert states[i].dtype == np.float16 and states[i].shape == (lens[i], enc.dim)
            assert np.array_equal(states[i], b.states[r, : lens[i]].to(torch.float16).numpy())


def test_int8_stream_gives_each_texts_own_states(avx2_auto_encoder):
    """OnnxStates.stream (many texts, the cores kept busy ahead of the caller) gives, in order,
    the very states each text gets run alone; a caller may stop early."""
    states = avx2_auto_encoder.onnx
    ids = [np.asarray(x, np.int64) for x in avx2_auto_encoder.tokenize(_texts())]
    alone = [states.each([x])[0] for x in ids]
    for ahead in (1, 3, 100):
        got = list(states.stream(ids, ahead))
        assert len(got) == len(ids) and all(np.array_equal(a, b) for a, b in zip(got, alone))
    it = states.stream(ids, 4)
    assert np.array_equal(next(it), alone[0])
    it.close()  # the rest cancelled, nothing left running that matters


def test_int8_encode_from_many_threads_at_once(avx2_auto_encoder):
    """Several threads encoding many texts with one int8 encoder at once (their texts streamed
    through one pool of workers) each get the vectors a lone call gives."""
    from concurrent.futures import ThreadPoolExecutor

    texts = _texts()
    want = avx2_auto_encoder.encode(texts)
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda i: avx2_auto_encoder.encode(texts[i:] + texts[:i]), range(4)))
    for i, g in enumerate(got):
        assert np.array_equal(g, np.roll(want, -i, axis=0))


def test_int8_model_cached_by_fingerprint(avx2_auto_encoder):
    from semsearch.encoder import Encoder

    path = avx2_auto_encoder.onnx.path
    assert path.exists() and avx2_auto_encoder.fingerprint in path.name
    before = path.stat().st_mtime_ns
    again = Encoder(device="cpu", precision="int8")
    assert again.onnx.path == path and path.stat().st_mtime_ns == before  # loaded, not exported again


def test_int8_model_keeps_residual_and_layernorm_apart(avx2_auto_encoder):
    """Recipe int8-v3: ONNX Runtime's fused residual + LayerNorm kernel was 4-7x slower than Add then
    LayerNormalization (docs/precision.md); attention stays fused (one QAttention a layer)."""
    import onnx

    ops = [n.op_type for n in onnx.load(str(avx2_auto_encoder.onnx.path)).graph.node]
    assert "SkipLayerNormalization" not in ops
    assert ops.count("QAttention") == avx2_auto_encoder.model.cfg.num_hidden_layers
    assert ops.count("LayerNormalization") == 2 * avx2_auto_encoder.model.cfg.num_hidden_layers + 1


def test_int8_attention_runs_without_the_padding_mask_and_gives_the_same_states(avx2_auto_encoder):
    """Recipe int8-v4: texts run one at a time, unpadded, so the attention nodes get no mask (8.5%
    faster, docs/precision.md). The same model with the all-ones mask wired back in gives the very
    same states, bit for bit."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    model = onnx.load(str(avx2_auto_encoder.onnx.path))
    att = [n for n in model.graph.node if n.op_type == "QAttention"]
    assert att and all(len(n.input) <= 5 or not n.input[5] for n in att)
    masked = onnx.ModelProto()
    masked.CopyFrom(model)
    masked.graph.node.extend([
        helper.make_node("Cast", ["attention_mask"], ["mask_i32"], to=TensorProto.INT32),
        helper.make_node("ReduceSum", ["mask_i32", "mask_axes"], ["mask_index_t"], keepdims=0)])
    masked.graph.initializer.append(helper.make_tensor("mask_axes", TensorProto.INT64, [1], [1]))
    for n in masked.graph.node:
        if n.op_type == "QAttention":
            ins = list(n.input) + [""] * max(0, 6 - len(n.input))
            ins[5] = "mask_index_t"
            del n.input[:]
            n.input.extend(ins)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sessions = [ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"],
                                     disabled_optimizers=["SkipLayerNormFusion"]) for m in (model, masked)]
    for ids in avx2_auto_encoder.tokenize(_texts()[:8] + _texts()[-4:]):
        x = np.asarray(ids, np.int64)[None]
        a, b = (s.run(None, {"input_ids": x, "attention_mask": np.ones_like(x)})[0] for s in sessions)
        assert np.array_equal(a, b)
    half = np.ones_like(x)
    half[:, x.shape[1] // 2:] = 0  # the wired-in mask does mask: padding changes the masked model's states
    assert not np.array_equal(sessions[1].run(None, {"input_ids": x, "attention_mask": half})[0][:, :2], a[:, :2])


def test_processes_that_start_together_export_the_int8_model_once(tmp_path, monkeypatch):
    """The export is under a file lock (flock: it holds between threads' own open() calls as
    between processes): of four callers at once with an empty cache one builds, the others wait
    and find its file. A stand-in build that takes 0.3 s, so that all four meet at the lock."""
    import threading
    import time

    from semsearch.encoder import onnx_backend

    built = []

    def slow_build(folder, out):
        built.append(threading.get_ident())
        time.sleep(0.3)
        out.write_bytes(b"model")
        return out

    monkeypatch.setattr(onnx_backend, "build", slow_build)
    path = tmp_path / "onnx" / "x.onnx"
    go = threading.Barrier(4)

    def caller():
        go.wait()
        onnx_backend._export_once(tmp_path, path)

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(built) == 1 and path.read_bytes() == b"model"


def test_broken_cached_model_is_named(tmp_path, monkeypatch, real_encoder):
    from semsearch.encoder.onnx_backend import OnnxStates, model_path

    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path))
    bad = model_path("0123456789abcdef")
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not an onnx model")
    with pytest.raises(ModelError, match="0123456789abcdef.*delete it"):
        OnnxStates.load(real_encoder.folder, "0123456789abcdef")


def test_numpy_query_encoder_uses_one_blas_thread():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from semsearch.encoder.numpy_encoder import one_blas_thread

    with one_blas_thread():
        blas = threadpoolctl.ThreadpoolController().select(user_api="blas").info()
        assert all(b["num_threads"] == 1 for b in blas)


@pytest.mark.skipif(not SCIFACT.exists(), reason="SciFact not found beside the repo")
def test_eval_max_length_and_int8_through_cli(monkeypatch):
    from semsearch.cli import main

    monkeypatch.setenv("SEMSEARCH_CPU_ISA", "avx2")
    r = CliRunner().invoke(main, ["eval", str(SCIFACT), "--max-queries", "20", "--max-docs", "120", "--max-length", "128",
                                  "--precision", "int8", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["settings"]["max_length"] == 128 and rep["settings"]["precision"] == "int8"
    assert rep["results"][0]["ndcg@10"] > 40


def test_an_int8_index_is_queried_in_int8(tmp_path):
    from semsearch.cli import main
    from semsearch.search import Retriever

    from conftest import SAMPLE

    idx = tmp_path / "idx"
    r = CliRunner().invoke(main, ["index", str(SAMPLE), "--index", str(idx), "--precision", "int8", "--no-progress"])
    assert r.exit_code == 0, r.output
    ret = Retriever.load(idx, device="cpu")
    assert ret.manifest.precision == "int8" and ret.encoder.precision == "int8" and ret.encoder.onnx is not None
    hits = ret.search("loan approval", k=3, mode="dense")
    assert len(hits) == 3
    # the top hit's score is the int8 query against the int8 document vector, as stored
    v = ret.encoder.encode_queries(["loan approval"])[0]
    stored = ret.docs.get_vectors([hits[0].id])[1][0]
    assert abs(float(v @ stored) - hits[0].score) < 1e-4
    # The one-shot CLI path (torch-free) gives the same int8 query vector, so the same scores.
    fast = Retriever.load(idx, device="cpu", fast_start=True)
    assert type(fast.encoder).__name__ == "NumpyEncoder" and fast.encoder.precision == "int8"
    np.testing.assert_allclose(fast.encoder.encode(["loan approval"])[0], v, atol=1e-6)
    assert [h.id for h in fast.search("loan approval", k=3, mode="dense")] == [h.id for h in hits]


def test_an_index_keeps_its_arithmetic_under_auto(tmp_path):
    """New chunks and queries on an existing index are encoded as its vectors were: an fp32 index
    stays fp32 on a CPU where a fresh auto index would be int8, and an int8 one stays int8."""
    from semsearch.cli import main
    from semsearch.indexing import encoder_for_index
    from semsearch.search import Retriever
    from semsearch.store.manifest import Manifest

    from conftest import SAMPLE

    idx = tmp_path / "idx"
    r = CliRunner().invoke(main, ["index", str(SAMPLE), "--index", str(idx), "--precision", "fp32", "--no-progress"])
    assert r.exit_code == 0, r.output
    m = Manifest.load(idx)
    assert m.precision == "fp32"
    assert encoder_for_index(m, device="cpu").precision in ("fp32", "bf16")  # bf16 only where the CPU has it
    assert Retriever.load(idx, device="cpu").encoder.precision in ("fp32", "bf16")
    m.precision = "int8"  # as if it had been built in int8
    assert encoder_for_index(m, device="cpu").precision == "int8"
