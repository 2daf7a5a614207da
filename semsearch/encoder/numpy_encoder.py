"""A torch-free fp32 forward pass of the native encoder, for queries (trained query layers included).

A query is a handful of tokens: the work is tiny, and importing torch (1.5–3 s) would dominate a
one-shot `semsearch query`. This mirrors transformer.py + pooling.py in numpy (same weights, same
maths; tests hold it to the torch encoder within 1e-5) so the query path loads only numpy, faiss,
tokenizers and safetensors.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Sequence

_FRESH_NUMPY = "numpy" not in sys.modules
import numpy as np  # noqa: E402

# OpenBLAS reads its thread count once, when numpy loads it.
_ONE_THREAD_AT_LOAD = _FRESH_NUMPY and os.environ.get("OPENBLAS_NUM_THREADS") == "1"

from semsearch.errors import InputError, ModelError

# erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7), since numpy has no erf of its own.
# Constants are Python floats: a numpy float64 scalar would promote float32 arrays to float64.
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_P, _A = 0.3275911, (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _erf(x: np.ndarray) -> np.ndarray:
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + _P * a)
    y = 1.0 - ((((_A[4] * t + _A[3]) * t + _A[2]) * t + _A[1]) * t + _A[0]) * t * np.exp(-a * a)
    return s * y


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x * _INV_SQRT2))


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


_NP_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32}


def map_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Zero-copy read-only views of a safetensors file's tensors.

    safetensors' own numpy loader reads and copies the whole file; a query touches a few rows of
    the 47 MB word-embedding table, so mapping the file lazily saves most of the load time.
    Format: 8-byte little-endian header size, a JSON header {name: {dtype, shape, data_offsets}}, data.
    """
    # A plain ndarray view of the map: results of arithmetic on np.memmap stay memmap instances,
    # whose per-operation bookkeeping made a query ~5x slower.
    buf = np.asarray(np.memmap(path, dtype=np.uint8, mode="r"))
    n = int(buf[:8].view("<u8")[0])
    header = json.loads(bytes(buf[8 : 8 + n]))
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] not in _NP_DTYPES:
            raise ModelError(f"{path}: tensor {name} has dtype {t['dtype']}, not supported by the numpy query encoder")
        a, b = t["data_offsets"]
        arr = buf[8 + n + a : 8 + n + b].view(_NP_DTYPES[t["dtype"]]).reshape(t["shape"])
        out[name] = arr if arr.dtype == np.float32 else arr.astype(np.float32)
    return out


def one_blas_thread():
    """A context in which numpy's BLAS runs on one thread.

    A query's matmuls are (T x 384) @ (384 x 1536) with T ~ 10: OpenBLAS's thread hand-offs cost
    more than the work, and on a loaded machine a second thread waits for a core. Measured on 2
    busy cores (AVX2): a 4-token forward took 0.2-1.2 s with OpenBLAS's 2 threads, 15-30 ms with 1.
    `semsearch query` sets OPENBLAS_NUM_THREADS=1 before numpy loads (no pool is even started);
    in a process where BLAS already has threads, threadpoolctl narrows it for the call.
    """
    if _ONE_THREAD_AT_LOAD:
        return contextlib.nullcontext()
    global _POOLS
    if _POOLS is None:
        try:
            from threadpoolctl import ThreadpoolController

            _POOLS = ThreadpoolController()
        except ImportError:
            _POOLS = False
    return _POOLS.limit(limits=1, user_api="blas") if _POOLS else contextlib.nullcontext()


_POOLS = None


def _base_layer(sd: dict[str, np.ndarray], i: int) -> tuple[np.ndarray, ...]:
    """Layer i of a BERT checkpoint, fused and pre-transposed so that x @ W is one BLAS call a projection."""
    p = f"encoder.layer.{i}."
    qkv_w = np.concatenate([sd[p + f"attention.self.{n}.weight"] for n in ("query", "key", "value")]).T.copy()
    qkv_b = np.concatenate([sd[p + f"attention.self.{n}.bias"] for n in ("query", "key", "value")])
    return (qkv_w, qkv_b,
            sd[p + "attention.output.dense.weight"].T, sd[p + "attention.output.dense.bias"],
            sd[p + "attention.output.LayerNorm.weight"], sd[p + "attention.output.LayerNorm.bias"],
            sd[p + "intermediate.dense.weight"].T, sd[p + "intermediate.dense.bias"],
            sd[p + "output.dense.weight"].T, sd[p + "output.dense.bias"],
            sd[p + "output.LayerNorm.weight"], sd[p + "output.LayerNorm.bias"])


def _tower_layer(w: dict[str, np.ndarray], i: int) -> tuple[np.ndarray, ...]:
    """Layer i of a QueryTower's state dict (transformer.Layer's names: qkv already fused), in _base_layer's order."""
    p = f"layers.{i}."
    return (w[p + "qkv.weight"].T, w[p + "qkv.bias"], w[p + "attn_out.weight"].T, w[p + "attn_out.bias"], w[p + "ln1.weight"],
            w[p + "ln1.bias"], w[p + "ff_in.weight"].T, w[p + "ff_in.bias"], w[p + "ff_out.weight"].T, w[p + "ff_out.bias"],
            w[p + "ln2.weight"], w[p + "ln2.bias"])


class NumpyEncoder:
    """Same interface as Encoder.encode / encode_queries for the native BERT backend, on the CPU.

    int8=True: documents' token states (encode) come from the cached int8 ONNX model instead
    (onnx_backend.py, which must exist), so that an int8 index gets the very query vectors the
    torch encoder gives it, still without importing torch.

    A head folder of trained query layers (kind 'query-layers'): encode_queries runs the base
    model's bottom layers, then the fine-tuned top layers from head.safetensors, then the
    documents' pooling, as Encoder.encode_queries does. That path is fp32 whatever the index's
    precision, int8 included: the torch encoder runs its query layers on the fp32 model too
    (query_layers.tower_states), and they were trained against fp32 bottom layers."""

    backend = "native"
    device = "cpu"

    def __init__(self, folder: Path, name: str, fingerprint: str, pooling: str, max_length: int, head_folder: str | None = None,
                 int8: bool = False):
        from tokenizers import Tokenizer

        folder = Path(folder)
        if not (folder / "config.json").exists():
            raise ModelError(f"{folder}: not a model folder (no config.json)")
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        self.name, self.fingerprint, self.pooling, self.max_length = name, fingerprint, pooling, max_length
        self.h = cfg["num_attention_heads"]
        self.eps = cfg.get("layer_norm_eps", 1e-12)
        self.tanh_gelu = cfg.get("hidden_act", "gelu") != "gelu"
        self.dim = int(cfg["hidden_size"])
        self.L = int(cfg["num_hidden_layers"])
        self.precision = "int8" if int8 else "fp32"
        self.query_tower = None
        if head_folder is not None and pooling != "head":
            from semsearch.encoder.heads import QUERY_LAYERS, head_kind

            if head_kind(head_folder) == QUERY_LAYERS:
                self.query_tower = _NumpyTower(head_folder, self.L, self.dim)
        self.onnx, self.w, self.layers = None, {}, []
        if int8:
            from semsearch.encoder.onnx_backend import OnnxStates, model_path

            self.onnx = OnnxStates(model_path(fingerprint))  # its session loads on first use
        if not int8 or self.query_tower is not None:
            self._load_weights(folder)
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=max_length)
        self.head = _NumpyHead(head_folder) if pooling == "head" else None
        if pooling == "head" and head_folder is None:
            raise InputError("pooling 'head' needs a head folder")
        self.out_dim = self.head.out_dim if self.head else self.dim

    def _load_weights(self, folder: Path) -> None:
        """Map the fp32 weights: fused, pre-transposed, so that x @ W is one BLAS call a projection."""
        sd = self.w = {k.removeprefix("bert."): v for k, v in map_safetensors(folder / "model.safetensors").items()}
        # With trained query layers and int8 documents, only the layers below the tower are run here.
        n = self.query_tower.first if self.onnx is not None else self.L
        self.layers = [_base_layer(sd, i) for i in range(n)]

    def _embed(self, ids: list[int]) -> np.ndarray:
        sd = self.w
        x = sd["embeddings.word_embeddings.weight"][ids] + sd["embeddings.position_embeddings.weight"][: len(ids)] + sd["embeddings.token_type_embeddings.weight"][0]
        return _layer_norm(x, sd["embeddings.LayerNorm.weight"], sd["embeddings.LayerNorm.bias"], self.eps)

    def _run(self, x: np.ndarray, layers) -> np.ndarray:
        """x (T, D) through post-norm encoder layers (no mask: one unpadded sequence)."""
        T, D = x.shape
        h, d = self.h, D // self.h
        for qkv_w, qkv_b, o_w, o_b, ln1_w, ln1_b, i_w, i_b, f_w, f_b, ln2_w, ln2_b in layers:
            q, k, v = (x @ qkv_w + qkv_b).reshape(T, 3, h, d).transpose(1, 2, 0, 3)  # 3 × (h, T, d)
            att = q @ k.transpose(0, 2, 1) * (1.0 / math.sqrt(d))  # (h, T, T)
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            a = (att @ v).transpose(1, 0, 2).reshape(T, D)
            x = _layer_norm(x + a @ o_w + o_b, ln1_w, ln1_b, self.eps)
            f = x @ i_w + i_b
            f = 0.5 * f * (1 + np.tanh(math.sqrt(2 / math.pi) * (f + 0.044715 * f**3))) if self.tanh_gelu else _gelu(f)
            x = _layer_norm(x + f @ f_w + f_b, ln2_w, ln2_b, self.eps)
        return x

    def _forward(self, ids: list[int]) -> np.ndarray:
        """Token states (T, D) of one unpadded sequence (no mask needed)."""
        if self.onnx is not None:
            return self.onnx.each([np.asarray(ids, np.int64)])[0]
        return self._run(self._embed(ids), self.layers)

    def _query_forward(self, ids: list[int]) -> np.ndarray:
        """Token states (T, D) of a query: the base model's bottom layers, then the trained ones (fp32)."""
        t = self.query_tower
        return self._run(self._run(self._embed(ids), self.layers[: t.first]), t.layers)

    def _pool(self, states: np.ndarray) -> np.ndarray:
        return self.head(states) if self.pooling == "head" else pool_text(self.pooling, states)

    def encode(self, texts: Sequence[str] | str, progress: bool | None = None) -> np.ndarray:
        """(n, D) L2-normalised float32 vectors, one sequence at a time (no padding at all)."""
        return self._encode(texts, self._forward)

    def encode_queries(self, texts: Sequence[str] | str, progress: bool | None = None) -> np.ndarray:
        """(n, D) normalised vectors of queries: through the trained query layers where this
        encoder has them (the documents' pooling after them), else as encode() does."""
        return self._encode(texts, self._forward if self.query_tower is None else self._query_forward)

    def _encode(self, texts: Sequence[str] | str, forward) -> np.ndarray:
        if isinstance(texts, str):
            texts = [texts]
        out = np.zeros((len(texts), self.out_dim), np.float32)
        with one_blas_thread():
            for i, enc in enumerate(self.tokenizer.encode_batch(list(texts))):
                v = self._pool(forward(enc.ids))
                assert v.dtype == np.float32, v.dtype  # no silent float64 promotion
                out[i] = unit(v)
        return out


def unit(v: np.ndarray) -> np.ndarray:
    """v scaled to length 1, as torch's normalize (eps 1e-12) scales it."""
    return v / max(float(np.linalg.norm(v)), 1e-12)


def pool_text(pooling: str, states: np.ndarray) -> np.ndarray:
    """One unpadded text's (T, D) token states -> its (D,) vector with a plain pooling (cls, mean,
    max), as pooling.py pools a padded batch."""
    if pooling == "cls":
        return states[0]
    if pooling == "mean":
        return states.mean(0)
    if pooling == "max":
        return states.max(0)
    raise InputError(f"unknown pooling {pooling!r}")


class _NumpyTower:
    """Trained query layers (query_layers.QueryTower) read from a head folder without torch:
    head.safetensors mapped as the model's weights are (map_safetensors), not read and copied by
    safetensors' own numpy loader (26 ms against 2 ms for two MiniLM layers)."""

    def __init__(self, folder: str | Path, n_layers: int, dim: int):
        from semsearch.encoder.heads import read_head_config

        cfg = read_head_config(folder)
        self.first, self.n = int(cfg["first_layer"]), int(cfg["layers"])
        if self.first + self.n != n_layers or cfg.get("dim") != dim:
            raise ModelError(f"{folder}: query layers {self.first}..{self.first + self.n - 1} of width {cfg.get('dim')} do not fit "
                             f"this model ({n_layers} layers of width {dim})")
        try:
            w = map_safetensors(Path(folder) / "head.safetensors")
            self.layers = [_tower_layer(w, i) for i in range(self.n)]
        except (OSError, KeyError, ValueError) as e:
            raise ModelError(f"{folder}: cannot load its query layers ({e})") from e


class _NumpyHead:
    """AttentionHead's forward in numpy (see pooling.py)."""

    def __init__(self, folder: str):
        from safetensors.numpy import load_file

        w = load_file(str(Path(folder) / "head.safetensors"))
        self.score_w = w["score.weight"].astype(np.float32)[0]  # (D,)
        self.score_b = float(w["score.bias"][0])
        self.proj = w["proj.weight"].astype(np.float32).T.copy() if "proj.weight" in w else None
        self.out_dim = self.proj.shape[1] if self.proj is not None else self.score_w.shape[0]

    def __call__(self, states: np.ndarray) -> np.ndarray:
        s = states @ self.score_w + self.score_b  # (T,)
        w = np.exp(s - s.max())
        v = (w / w.sum()) @ states  # (D,)
        return v @ self.proj if self.proj is not None else v
