"""Encoder: text -> L2-normalised float32 vectors (n, D), with cls / mean / max / head pooling."""
from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch

from semsearch.encoder.hardware import resolve_device, resolve_precision
from semsearch.encoder.models import DEFAULT_MODEL, default_model_path, fingerprint_folder, is_bert_folder, resolve_model  # noqa: F401
from semsearch.encoder.tokens import table_of
from semsearch.encoder.pooling import POOLINGS, AttentionHead, check_pooling, pool
from semsearch.errors import InputError, ModelError
from semsearch.progress import bar as progress_bar

log = logging.getLogger(__name__)

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Tokens a batch where none is asked for. On a GPU the CPU's side of each batch (padding, copies,
# kernel launches) is what limits: SciFact documents in fp16 on an H200, 2 cores: 1,523 a second
# at 4,096 tokens, 1,640 at 16,384, 2,136 at 65,536 (16 cores: 5,037 / 8,083 / 7,799), and a build
# held to 2 cores 1.31x faster at 65,536 (docs/gpu.md). On the CPU 4,096 (larger batches gain
# nothing there and hold more memory).
CPU_BATCH_TOKENS, GPU_BATCH_TOKENS = 4096, 65_536


def default_batch_tokens(device: str) -> int:
    return GPU_BATCH_TOKENS if device.startswith("cuda") else CPU_BATCH_TOKENS


@dataclass
class Batch:
    index: list[int]  # positions of these texts in the caller's list
    states: torch.Tensor  # (B, T, D) token states
    mask: torch.Tensor  # (B, T) 1 real, 0 pad


class Encoder:
    """Turns text into L2-normalised vectors.

    The native backend runs the BERT-family encoder of SEEDS.md; other architectures go through
    sentence-transformers behind the same interface. `pooling` is 'cls', 'mean', 'max' or 'head'
    (with `head` an AttentionHead). `head` may instead be trained query layers (a PendingTower from
    encoder.heads.load_head): documents keep `pooling`, and encode_queries() runs queries through
    the fine-tuned top layers (encoder/query_layers.py).
    """

    def __init__(
        self,
        model: str | os.PathLike | None = None,
        pooling: str = "mean",
        device: str = "auto",
        precision: str = "auto",
        max_length: int | None = None,
        batch_tokens: int | None = None,
        head: AttentionHead | None = None,
    ):
        self.pooling = pooling if pooling == "head" else check_pooling(pooling)
        if pooling == "head" and head is None:
            raise InputError("pooling 'head' needs a trained head (--head DIR)")
        pending = head if getattr(head, "kind", None) == "query-layers" else None
        self.head = None if pending is not None else head
        self.query_tower = None  # fine-tuned top layers for queries (set below from a PendingTower)
        # int8 runs on ONNX Runtime on the CPU: asked for with device auto, it takes the CPU.
        self.device = "cpu" if precision == "int8" and device == "auto" else resolve_device(device)
        self.precision = resolve_precision(precision, self.device)
        self.batch_tokens_asked = batch_tokens  # (None: the device's default, also on a Ray worker's device)
        self.batch_tokens = batch_tokens if batch_tokens is not None else default_batch_tokens(self.device)
        self.name, where = resolve_model(model)
        self.backend = "native"
        self.fused_cpu = False  # oneDNN fused linear in use (native bf16 on the CPU)
        self.onnx = None  # the int8 ONNX Runtime model, for precision int8 (see onnx_backend.py)
        self._auto_precision = precision == "auto"
        self.folder = where if isinstance(where, Path) else None
        self._chunk_tokenizer = None
        if isinstance(where, Path) and is_bert_folder(where):
            self._load_native(where, max_length)
        else:
            self._load_st(where, max_length)
        if self.head is not None:
            self.head.to(self.device)
        if pending is not None:
            if self.backend != "native":
                raise InputError(f"{pending.folder}: trained query layers need a BERT-family model on the native encoder")
            self.query_tower = pending.build(self.model.cfg).to(self.device)

    # ---- loading -------------------------------------------------------------------------
    def _load_native(self, folder: Path, max_length: int | None) -> None:
        from tokenizers import Tokenizer

        from semsearch.encoder.transformer import BertEncoder

        tok_file = folder / "tokenizer.json"
        if not tok_file.exists():
            raise ModelError(f"{folder}: no tokenizer.json")
        self.model = BertEncoder.from_folder(folder).to(self.device)
        self.dim = self.model.cfg.hidden_size
        self.max_length = max_length or _model_max_length(folder, self.model.cfg.max_position_embeddings)
        if self.max_length > self.model.cfg.max_position_embeddings:
            raise InputError(f"max length {self.max_length} exceeds the model's {self.model.cfg.max_position_embeddings} positions")
        self.tokenizer = Tokenizer.from_file(str(tok_file))
        # The bundled tokenizer.json pads and truncates at 128: undo both, truncate at the model's length.
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=self.max_length)
        self.fingerprint = fingerprint_folder(folder)
        if self.precision == "int8":
            self._load_onnx(folder)
        if self.precision not in ("fp32", "int8"):
            # Weights in bf16/fp16 outright rather than autocast: no per-call weight casts, and on
            # CPUs with AMX the matmuls run on its bf16 tiles (measured: 72.6 vs 53 docs/s autocast).
            self.model.to(_DTYPES[self.precision])
        # bf16 on the CPU: oneDNN's prepacked, fused linear where this torch has it (+25-30% a query).
        self.fused_cpu = self.model.pack_for_cpu()

    def _load_onnx(self, folder: Path) -> None:
        from semsearch.encoder.onnx_backend import OnnxStates

        try:
            self.onnx = OnnxStates.load(folder, self.fingerprint)
        except Exception as e:  # noqa: BLE001 - export/quantise failures come in many types
            if not self._auto_precision:
                raise
            log.warning("the int8 encoder is not available (%s); using fp32", e)
            self.precision = "fp32"

    def _load_st(self, where: Path | str, max_length: int | None) -> None:
        if self.precision == "int8":
            if not self._auto_precision:
                raise InputError("precision 'int8' is for BERT-family models on the native encoder; use fp32 for this model")
            self.precision = "fp32"
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise ModelError("models that are not BERT-family need sentence-transformers: pip install sentence-transformers") from e
        try:
            st = SentenceTransformer(str(where), device=self.device)
        except Exception as e:  # noqa: BLE001 - ST raises many kinds; report them as one
            raise ModelError(f"could not load model {str(where)!r}: {e}") from e
        self.backend = "sentence-transformers"
        self.st = st
        if max_length:
            st.max_seq_length = max_length
        self.max_length = st.max_seq_length
        dim_of = getattr(st, "get_embedding_dimension", None) or st.get_sentence_embedding_dimension
        self.dim = dim_of()
        self.tokenizer = None
        self.fingerprint = fingerprint_folder(Path(where)) if isinstance(where, Path) else f"hub:{where}"

    # ---- token states --------------------------------------------------------------------
    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids for each text, framed with [CLS] … [SEP] and truncated at max_length."""
        if self.tokenizer is None:
            raise ModelError("token ids are only available with the native backend")
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    def token_table(self, texts: Sequence[str]) -> list[np.ndarray | None]:
        """Each text's tokens as its states are encoded (framed, truncated at max_length): (T, 3)
        int32 rows of token id, character start and end (-1, -1 for special tokens). Kept beside
        the token states (--keep-states), so an explanation need not tokenise again. None for
        each text where the encoder has no tokenizer of its own (sentence-transformers backend)."""
        if self.tokenizer is None:
            return [None] * len(texts)
        return table_of(self.tokenizer, texts)

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        """(start, end) character offsets of each content token of text, without truncation."""
        if self.tokenizer is None:
            enc = self.st.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
            return [tuple(o) for o in enc["offset_mapping"]]
        if self._chunk_tokenizer is None:
            self._chunk_tokenizer = self.chunk_offsets()
        return self._chunk_tokenizer(text)

    def chunk_offsets(self) -> "ChunkOffsets | None":
        """token_offsets as a picklable callable, for a build's reader process (the tokenizer
        alone: no model); None on the sentence-transformers backend."""
        return None if self.tokenizer is None else ChunkOffsets(self.tokenizer.to_str())

    def iter_states(self, texts: Sequence[str], progress: bool | None = None) -> Iterator[Batch]:
        """Token states for texts, in length-sorted batches of about batch_tokens tokens."""
        if self.backend != "native":
            yield from self._iter_states_st(texts, progress)
            return
        ids = self.tokenize(texts)
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        bar = progress_bar(len(ids), "embedding", "text", progress)
        start = 0
        stream = self._onnx_stream(ids, order) if self.onnx is not None else None
        with torch.inference_mode():
            while start < len(order):
                # Pad T up to a multiple of self._pad: for bf16 a handful of distinct shapes instead of
                # one per batch, so oneDNN reuses its compiled kernels (per-shape cost ~40% there).
                T = len(ids[order[start]])
                if len(order) > 16:  # a few texts (a query): padding would cost more than it saves
                    T = min(-(-T // self._pad) * self._pad, self.max_length)
                B = max(1, self.batch_tokens // max(T, 1))
                if self.onnx is not None:  # texts run alone, spread over the cores: give every core several
                    B = max(B, 4 * self.onnx.threads)
                B = min(len(order) - start, B)
                idx = order[start : start + B]
                start += B
                arr = np.zeros((len(idx), T), dtype=np.int64)
                lens = np.zeros(len(idx), dtype=np.int64)
                for r, i in enumerate(idx):
                    arr[r, : len(ids[i])] = ids[i]
                    lens[r] = len(ids[i])
                batch = torch.from_numpy(arr)
                mask = (torch.arange(T)[None, :] < torch.from_numpy(lens)[:, None]).long()  # (B, T)
                if stream is not None:
                    yield Batch(idx, torch.from_numpy(self._onnx_states(itertools.islice(stream, len(idx)), arr.shape)), mask)
                else:
                    batch, mask = batch.to(self.device), mask.to(self.device)
                    yield Batch(idx, self.model(batch, mask), mask)
                bar.update(len(idx))
        bar.close()

    def _iter_states_st(self, texts: Sequence[str], progress: bool | None) -> Iterator[Batch]:
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        bs = max(1, self.batch_tokens // self.max_length)
        bar = progress_bar(len(texts), "embedding", "text", progress)
        with torch.inference_mode():
            for s in range(0, len(order), bs):
                idx = order[s : s + bs]
                feats = self.st.tokenize([texts[i] for i in idx])
                feats = {k: v.to(self.device) if hasattr(v, "to") else v for k, v in feats.items()}
                out = self.st[0](feats)
                yield Batch(idx, out["token_embeddings"], out["attention_mask"])
                bar.update(len(idx))
        bar.close()

    # ---- vectors -------------------------------------------------------------------------
    def pool(self, pooling: str, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Unnormalised (B, D) vectors from token states with a pooling name or 'head'."""
        if pooling == "head":
            return self.head(states.float(), mask)
        return pool(pooling, states.float(), mask)

    def encode_many(
        self, texts: Sequence[str], poolings: Sequence[str], progress: bool | None = None, queries: bool = False
    ) -> dict[str, np.ndarray]:
        """{pooling: (n, D) normalised float32} from one encoder pass over texts. With trained
        query layers, 'head' is the base pooling for documents and the query layers' vectors
        for queries (queries=True)."""
        texts = list(texts)
        for p in poolings:
            if p != "head":
                check_pooling(p)
        tower = self.query_tower is not None and "head" in poolings
        passes = [p for p in poolings if not (tower and p == "head")]
        out = {p: np.zeros((len(texts), self._dim_of(p)), np.float32) for p in poolings}
        wanted = passes + (["head"] if tower and not queries else [])
        plain = {p: self.pooling if p == "head" and tower else p for p in wanted}
        if self.onnx is not None and wanted and all(p in POOLINGS for p in plain.values()):
            self._onnx_vectors(texts, plain, out, progress)
        elif wanted:
            with _few_threads(self, texts):
                for b in self.iter_states(texts, progress):
                    for p, pooling in plain.items():
                        v = torch.nn.functional.normalize(self.pool(pooling, b.states, b.mask), dim=-1)
                        out[p][b.index] = v.float().cpu().numpy()
        if tower and queries:
            out["head"] = self.encode_queries(texts)
        return out

    def _onnx_vectors(self, texts: list[str], plain: dict[str, str], out: dict[str, np.ndarray], progress: bool | None,
                      states: list[np.ndarray] | None = None) -> None:
        """int8 with plain poolings: each text's states are pooled in numpy as they come back from
        its core (OnnxStates.stream), longest texts first, instead of being padded into a batch
        for torch's pooling. Zero-filling and copying a padded (B, T, D) batch, then pooling it,
        cost ~0.5 ms a SciFact document, 5% of its int8 forward on 2 cores (encode ran at 80.2
        documents/s against 86.0 for the bare stream). The vectors are the batch path's to ~1e-7
        (the same states, summed in another order). With `states`, each text's states are also
        kept there, as fp16 (encode_with_states)."""
        from semsearch.encoder.numpy_encoder import pool_text, unit

        ids = self.tokenize(texts)
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        bar = progress_bar(len(ids), "embedding", "text", progress)
        shown = 0
        for n, (i, st) in enumerate(zip(order, self._onnx_stream(ids, order)), 1):
            for name, pooling in plain.items():
                out[name][i] = unit(pool_text(pooling, st))
            if states is not None:
                states[i] = st.astype(np.float16)
            if n - shown >= 32 or n == len(order):
                bar.update(n - shown)
                shown = n
        bar.close()

    def _onnx_stream(self, ids: list[list[int]], order: list[int]) -> Iterator[np.ndarray]:
        """int8 token states of each text, in `order`: every text runs alone, and the cores take
        the next ones without waiting for the caller to pool (OnnxStates.stream), a few batches ahead."""
        return self.onnx.stream([np.asarray(ids[i], np.int64) for i in order], 8 * self.onnx.threads)

    def encode_queries(self, texts: Sequence[str] | str, progress: bool | None = None) -> np.ndarray:
        """(n, D) normalised vectors of queries: through the trained query layers where this
        encoder has them (the documents' pooling after them), else as encode() does."""
        if isinstance(texts, str):
            texts = [texts]
        if self.query_tower is None:
            return self.encode(texts, progress)
        from semsearch.encoder.query_layers import pad_ids, tower_states

        texts = list(texts)
        ids = self.tokenize(texts)
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        out = np.zeros((len(texts), self.dim), np.float32)
        bs = max(1, self.batch_tokens // max(1, max(map(len, ids), default=1)))
        with torch.inference_mode(), _few_threads(self, texts):
            for s in range(0, len(order), bs):
                idx = order[s : s + bs]
                arr, mask = pad_ids([ids[i] for i in idx])
                arr, mask = arr.to(self.device), mask.to(self.device)
                st = tower_states(self.model, self.query_tower, arr, mask)
                out[idx] = torch.nn.functional.normalize(pool(self.pooling, st, mask), dim=-1).float().cpu().numpy()
        return out

    def _dim_of(self, pooling: str) -> int:
        return self.head.out_dim if pooling == "head" and self.head is not None else self.dim

    def encode_with_states(self, texts: Sequence[str], progress: bool | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
        """(vectors (n, D') with this encoder's pooling, each text's real-token states (T_i, D) fp16)."""
        texts = list(texts)
        vecs = np.zeros((len(texts), self.out_dim), np.float32)
        states: list[np.ndarray] = [np.zeros((0, self.dim), np.float16)] * len(texts)
        if self.onnx is not None and self.pooling in POOLINGS:  # int8: text by text, never padded (see _onnx_vectors)
            self._onnx_vectors(texts, {"v": self.pooling}, {"v": vecs}, progress, states)
            return vecs, states
        for b in self.iter_states(texts, progress):
            v = torch.nn.functional.normalize(self.pool(self.pooling, b.states, b.mask), dim=-1)
            vecs[b.index] = v.float().cpu().numpy()
            lens = b.mask.sum(1).tolist()
            st = b.states.to(torch.float16).cpu().numpy()
            for r, i in enumerate(b.index):
                states[i] = st[r, : lens[r]]
        return vecs, states

    def encode(self, texts: Sequence[str] | str, progress: bool | None = None) -> np.ndarray:
        """(n, D) L2-normalised float32 vectors with this encoder's pooling."""
        if isinstance(texts, str):
            texts = [texts]
        return self.encode_many(texts, [self.pooling], progress)[self.pooling]

    def _onnx_states(self, states, shape: tuple[int, int]) -> np.ndarray:
        """int8 token states (B, T, D) from each text's own (T_i, D), each text run alone at its
        own length (OnnxStates). Dynamic quantisation sets the activations' scale per run: run
        together, a text's vector moved with its batch mates (cosine 0.994 alone vs in a batch of
        48); alone it is always the same, and there is no padding to compute."""
        out = np.zeros(shape + (self.dim,), np.float32)
        for r, st in enumerate(states):
            out[r, : len(st)] = st
        return out

    @property
    def _pad(self) -> int:
        """Batch lengths are rounded up to a multiple of this. 32 for bf16/fp16, whose oneDNN /
        GPU kernels are made per shape; 8 for fp32 and int8, which have no per-shape cost: fp32
        queries (~22 tokens) ran at 122 per s padded to 32 against 168 padded to 8 (149 for
        sentence-transformers, same run, 2 AVX2 cores)."""
        return 32 if self.precision in ("bf16", "fp16") else 8

    @property
    def out_dim(self) -> int:
        return self._dim_of(self.pooling)


SMALL_CHARS = 2048  # about 512 tokens: a handful of queries, not a batch of documents


@contextlib.contextmanager
def _few_threads(enc, texts):
    """Run a small CPU forward on one torch thread. A query's matmuls are too small to gain from a
    second thread, and where other processes load the CPU, torch's OpenMP team waits on the busy
    core: measured on 2 cores with two busy processes beside it, Retriever.search p50 137 ms with
    2 threads against 46 ms with 1 (scripts/bench/bench_threads.py). Large batches keep every thread."""
    if enc.device != "cpu" or enc.onnx is not None or sum(map(len, texts)) > SMALL_CHARS:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _model_max_length(folder: Path, positions: int) -> int:
    sb = folder / "sentence_bert_config.json"
    if sb.exists():
        v = json.loads(sb.read_text(encoding="utf-8")).get("max_seq_length")
        if v:
            return int(v)
    return min(512, positions)


class ChunkOffsets:
    """The chunker's tokenizer: (start, end) character offsets of a text's content tokens, without
    truncation. Pickles as its tokenizer's JSON (a reader process rebuilds it without torch)."""

    def __init__(self, tokenizer_json: str):
        self.json = tokenizer_json
        self._tok = None

    def __getstate__(self) -> dict:
        return {"json": self.json}

    def __setstate__(self, state: dict) -> None:
        self.json, self._tok = state["json"], None

    def __call__(self, text: str) -> list[tuple[int, int]]:
        if self._tok is None:
            from tokenizers import Tokenizer

            self._tok = Tokenizer.from_str(self.json)
            self._tok.no_truncation()
        return self._tok.encode(text, add_special_tokens=False).offsets
