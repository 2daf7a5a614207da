"""The native encoder as an int8 ONNX Runtime model: `auto`'s choice on x86 CPUs without AMX
(AVX2, AVX-512; docs/precision.md).

There fp32 is already near the matmul peak (and AVX-512-BF16 without AMX is no faster), so speed
has to come from cheaper arithmetic: ONNX Runtime multiplies u8 activations by s8 weights (dynamic,
per-channel quantisation of every linear layer) and fuses bias + GELU (residual + LayerNorm stay
apart: see UNFUSED). The model is exported once from the native torch encoder, optimised,
quantised, and cached per weights fingerprint:

    $SEMSEARCH_CACHE (default $XDG_CACHE_HOME/semsearch, else ~/.cache/semsearch)/onnx/<key>.onnx

Nothing is downloaded. Needs onnxruntime and onnx (dependencies of semsearch).
"""
from __future__ import annotations

import collections
import itertools
import logging
import os
import tempfile
import warnings
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from semsearch.errors import ModelError

log = logging.getLogger(__name__)

FORMAT = "int8-v4"  # bump when the export or the quantisation recipe changes (v3: residual + LayerNorm unfused;
# v4: attention without the padding mask)
# ONNX Runtime's fused residual + LayerNorm kernel (SkipLayerNormalization) took 4-7x the time of a plain Add then
# LayerNormalization on an AVX-512 CPU (ONNX Runtime 1.32, one thread: 58 vs 14 us at 22 tokens, 604 vs 84 us at
# 256; 25% of a query's kernel time): the model keeps them apart, and the session does not fuse them back.
UNFUSED = ["SkipLayerNormFusion"]
# Inputs of at most this many tokens (a query; texts run one at a time) run on one thread: thread hand-offs cost more
# than they save on so little work, and on a loaded machine a second thread may wait for a core.
SMALL_TOKENS = 64


def cache_dir() -> Path:
    """Where exported models are kept: $SEMSEARCH_CACHE, else the user's cache folder."""
    root = os.environ.get("SEMSEARCH_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "semsearch")
    return Path(root) / "onnx"


def _import_ort():
    try:
        import onnxruntime
    except ImportError as e:
        raise ModelError("precision 'int8' needs ONNX Runtime: pip install onnxruntime onnx") from e
    return onnxruntime


def model_path(fingerprint: str) -> Path:
    """The cached int8 model of the weights with this fingerprint (for this ONNX Runtime)."""
    ort = _import_ort()
    ver = ".".join(ort.__version__.split(".")[:2])
    return cache_dir() / f"{fingerprint}-{FORMAT}-ort{ver}.onnx"


def build(folder: Path, out: Path) -> Path:
    """Export the native encoder of a model folder, fuse, quantise to int8, write to out (atomically)."""
    import torch

    _import_ort()
    try:
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic
        from onnxruntime.transformers.optimizer import optimize_model
    except ImportError as e:
        raise ModelError("precision 'int8' needs onnx and ONNX Runtime: pip install onnxruntime onnx") from e
    from semsearch.encoder.transformer import BertEncoder

    model = BertEncoder.from_folder(folder).float()
    cfg = model.cfg
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        raw, fused = Path(tmp) / "raw.onnx", Path(tmp) / "fused.onnx"
        ids = torch.randint(1000, 2000, (2, 16))
        with warnings.catch_warnings(), torch.inference_mode():
            warnings.simplefilter("ignore")
            torch.onnx.export(_export_module(model), (ids, torch.ones_like(ids)), str(raw),
                              input_names=["input_ids", "attention_mask"], output_names=["states"],
                              dynamic_axes={n: {0: "B", 1: "T"} for n in ("input_ids", "attention_mask", "states")},
                              opset_version=17, dynamo=False)
        from onnxruntime.transformers.fusion_options import FusionOptions

        fusions = FusionOptions("bert")
        fusions.enable_skip_layer_norm = fusions.enable_bias_skip_layer_norm = False  # see UNFUSED
        opt = optimize_model(str(raw), model_type="bert", num_heads=cfg.num_attention_heads,
                             hidden_size=cfg.hidden_size, opt_level=0, optimization_options=fusions)
        fused_attention = sum(n.op_type == "Attention" for n in opt.model.graph.node)
        if fused_attention != cfg.num_hidden_layers:  # still correct, only slower
            log.warning("ONNX Runtime fused %d of %d attention blocks; the int8 model will be slower", fused_attention, cfg.num_hidden_layers)
        opt.save_model_to_file(str(fused))
        # reduce_range: 7-bit weights, so that AVX2's u8 x s8 pairwise add (vpmaddubsw) cannot
        # saturate its 16-bit sums; per-channel scales keep each output row's own range.
        tmp_out = Path(tmp) / "int8.onnx"
        logging.getLogger().disabled, was = True, logging.getLogger().disabled  # its advice goes to the root logger
        try:
            quantize_dynamic(str(fused), str(tmp_out), weight_type=QuantType.QInt8, per_channel=True, reduce_range=True,
                             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT, "MatMulConstBOnly": True})
        finally:
            logging.getLogger().disabled = was
        quantized = onnx.load(str(tmp_out))
        _drop_attention_mask(quantized)
        onnx.save(quantized, str(tmp_out))
        os.replace(tmp_out, out)
    return out


def _export_once(folder: Path, path: Path) -> None:
    """build() unless another process is building the same file: the first to take the lock
    exports, the others wait for it and then find the file (processes started together on a fresh
    machine, a server's workers or a test run's, would otherwise each spend the export's ~10 s of
    CPU on the same bytes)."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released on close, also by a process that dies holding it
        if not path.exists():
            log.warning("exporting the encoder to an int8 ONNX model for this CPU at %s (once per model: seconds to a minute)", path)
            build(folder, path)


def _drop_attention_mask(model) -> int:
    """Take the padding mask out of every attention node (and the nodes that only computed it).

    The int8 model only ever runs one text at a time, unpadded (OnnxStates.each): its mask is all
    ones and masks nothing. ONNX Runtime's attention still applies it, per head: without it a
    SciFact document (234 tokens) runs 8.5% faster on one thread (45.4 against 41.85 documents/s),
    and every state comes out the same, bit for bit (tested). Gives back the nodes changed."""
    changed = 0
    for node in model.graph.node:
        at = {"QAttention": 5, "Attention": 3}.get(node.op_type)  # mask_index's place among the node's inputs
        if at is not None and len(node.input) > at and node.input[at]:
            node.input[at] = ""
            changed += 1
    # the nodes whose outputs nothing uses any more (the mask's ReduceSum, Cast, ...)
    outputs = {o.name for o in model.graph.output}
    while True:
        used = {i for n in model.graph.node for i in n.input} | outputs
        dead = [n for n in model.graph.node if not any(o in used for o in n.output)]
        if not dead:
            break
        for n in dead:
            model.graph.node.remove(n)
    used = {i for n in model.graph.node for i in n.input}
    for init in [t for t in model.graph.initializer if t.name not in used]:  # (ONNX Runtime warns of each)
        model.graph.initializer.remove(init)
    return changed


def _export_module(model):
    """The encoder's forward, written as Hugging Face's BERT writes it, for ONNX export.

    ONNX Runtime's BERT optimiser fuses attention only where the graph has the pattern of that
    code (separate Q, K, V projections, matmul / sqrt(d) + mask, softmax, matmul); our module's
    fused QKV and scaled_dot_product_attention export as dozens of unfused small ops. Fused, the
    quantiser turns each layer's attention into one QAttention (int8 Q/K/V projection, fused
    softmax): 13% more documents a second on one AVX2 thread. The padding mask is always applied
    (the torch module skips it when there is no padding; an exported graph must serve both)."""
    import math

    import torch

    def linear(w: torch.Tensor, b: torch.Tensor) -> torch.nn.Linear:
        lin = torch.nn.Linear(w.shape[1], w.shape[0])
        lin.weight.data, lin.bias.data = w.clone(), b.clone()
        return lin

    class ExportLayer(torch.nn.Module):
        def __init__(self, layer):
            super().__init__()
            D = layer.qkv.in_features
            self.layer, self.h, self.d = layer, layer.h, D // layer.h
            W, b = layer.qkv.weight.data, layer.qkv.bias.data
            self.q, self.k, self.v = (linear(W[i * D:(i + 1) * D], b[i * D:(i + 1) * D]) for i in range(3))

        def heads(self, x):  # (B, T, D) -> (B, h, T, d)
            return x.view(x.shape[0], x.shape[1], self.h, self.d).permute(0, 2, 1, 3)

        def forward(self, x, bias):
            L = self.layer
            scores = torch.matmul(self.heads(self.q(x)), self.heads(self.k(x)).transpose(-1, -2)) / math.sqrt(self.d)
            a = torch.matmul(torch.softmax(scores + bias, dim=-1), self.heads(self.v(x))).permute(0, 2, 1, 3).contiguous()
            x = L.ln1(x + L.attn_out(a.view(a.shape[0], a.shape[1], self.h * self.d)))
            f = torch.nn.functional.gelu(L.ff_in(x), approximate="tanh" if L.tanh_gelu else "none")
            return L.ln2(x + L.ff_out(f))

    class Export(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m
            self.layers = torch.nn.ModuleList(ExportLayer(layer) for layer in m.layers)

        def forward(self, ids, mask):  # (B, T), (B, T) -> (B, T, D)
            x = self.m.embeddings(ids)
            bias = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min  # (B, 1, 1, T)
            for layer in self.layers:
                x = layer(x, bias)
            return x

    return Export(model).eval()


class OnnxStates:
    """(ids, mask) -> token states (B, T, D) float32 from the cached int8 model."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._sessions: dict[int, object] = {}
        self._executor = None  # threads for bulk jobs, made on first use (see each())
        self.threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

    @classmethod
    def load(cls, folder: Path, fingerprint: str) -> "OnnxStates":
        """The int8 model for these weights, exported and cached on first use (~20 s)."""
        path = model_path(fingerprint)
        if not path.exists():
            _export_once(folder, path)
        states = cls(path)
        states._session(1)  # load now: a broken cache file fails here, not mid-index
        return states

    def _session(self, threads: int):
        s = self._sessions.get(threads)
        if s is None:
            ort = _import_ort()
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            so.inter_op_num_threads = 1
            # Threads that spin while waiting for work steal the core a busy neighbour needs;
            # on a shared machine that made 2-thread queries 5x slower than 1-thread ones. Queries
            # (<= SMALL_TOKENS) now run on the 1-thread session, where spinning does not arise; the
            # all-cores session encodes one document at a time, whose many short parallel ops
            # wait on sleeping threads without it (measured: 25.1 vs 28.4 docs/s, 2 cores).
            so.add_session_config_entry("session.intra_op.allow_spinning", "1" if threads > 1 else "0")
            try:
                s = ort.InferenceSession(str(self.path), so, providers=["CPUExecutionProvider"], disabled_optimizers=UNFUSED)
            except Exception as e:  # noqa: BLE001 - ORT raises its own types; any of them means a bad file
                raise ModelError(f"{self.path}: cannot load the cached int8 model ({e}); delete it to export it again") from e
            self._sessions[threads] = s
        return s

    def each(self, texts: list[np.ndarray]) -> list[np.ndarray]:
        """Token states (n_i, D) of each text's ids (n_i,), every text run alone.

        With at least two texts per core, each core runs whole texts on a one-thread session (ONNX
        Runtime releases the GIL while it runs), instead of all cores sharing every matmul of one
        text: no hand-over between threads inside an op, and the cores never wait for each other.
        Measured on 200 SciFact documents, 2 AVX2 cores: 29-31 docs/s against 22-26 one text at a
        time on both cores. A text's vector does not depend on the path: a run's result is the same
        on one thread as on several (tested)."""
        if self.threads < 2 or len(texts) < 2 * self.threads:
            return [self._one(x, 1 if len(x) <= SMALL_TOKENS else self.threads) for x in texts]
        self._session(1)  # made here, before the pool's threads would race to make it
        return list(self._pool().map(lambda x: self._one(x, 1), texts))

    def stream(self, texts: Sequence[np.ndarray], ahead: int) -> Iterator[np.ndarray]:
        """each(texts) given back one text at a time, in order, while the cores go on: up to
        `ahead` texts run beyond the one given back. A caller that works on its results in
        batches (pooling) then never leaves a core idle at the end of each batch, nor both while
        it pools. On 2 cores that is worth little (260 SciFact documents, `Encoder.encode`, fresh
        processes: 83.7-83.9 against 81.1-84.0 documents/s a batch at a time); the idle tails
        grow with the cores. The states are the same as each()'s (each text alone on a one-thread
        session)."""
        if self.threads < 2 or len(texts) < 2 * self.threads:
            yield from self.each(list(texts))
            return
        self._session(1)
        pool = self._pool()
        rest = iter(texts)
        running = collections.deque(pool.submit(self._one, x, 1) for x in itertools.islice(rest, max(ahead, self.threads)))
        try:
            while running:
                got = running.popleft().result()
                x = next(rest, None)
                if x is not None:
                    running.append(pool.submit(self._one, x, 1))
                yield got
        finally:
            for f in running:  # a caller that stopped early: what has not started never will
                f.cancel()

    def _one(self, x: np.ndarray, threads: int) -> np.ndarray:
        ids = np.asarray(x, np.int64)[None]
        return self._session(threads).run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0][0]

    def _pool(self):
        if self._executor is None:
            from concurrent.futures import ThreadPoolExecutor

            self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="semsearch-int8")
        return self._executor
