"""The BERT-family encoder of SEEDS.md in plain torch: (ids, mask) -> (B, T, D) token states.

Written by hand rather than taken from `transformers` because the model is small and fixed
(post-norm BERT), and owning it lets us control precision, attention kernel and import cost.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from semsearch.errors import ModelError

BERT_MODEL_TYPES = {"bert"}


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int  # D
    num_hidden_layers: int  # L
    num_attention_heads: int  # h
    intermediate_size: int  # D_ff
    max_position_embeddings: int
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"

    @classmethod
    def from_file(cls, path: Path) -> "BertConfig":
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        if raw.get("model_type", "bert") not in BERT_MODEL_TYPES:
            raise ModelError(f"{path}: model_type {raw.get('model_type')!r} is not BERT-family")
        if raw.get("hidden_act", "gelu") not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
            raise ModelError(f"{path}: activation {raw.get('hidden_act')!r} is not supported natively")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ModelError(f"{path}: only absolute position embeddings are supported natively")
        fields = {f: raw[f] for f in cls.__dataclass_fields__ if f in raw}
        return cls(**fields)


class Embeddings(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        B, T = ids.shape
        pos = torch.arange(T, device=ids.device)
        # Single-segment input: token type 0 everywhere.
        x = self.word_embeddings(ids) + self.position_embeddings(pos)[None] + self.token_type_embeddings.weight[0]
        return self.LayerNorm(x)  # (B, T, D)


def onednn_fused_linear_available() -> bool:
    """Whether this torch has oneDNN's prepacked linear with fused epilogues (bias, GELU, residual
    add): the CPU ops torch's own compiler emits. They are not public API, so every use is
    guarded by this check and by BertEncoder.pack_for_cpu's comparison with the plain path."""
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._linear_pointwise
                    and torch.ops.mkldnn._reorder_linear_weight)
    except (AttributeError, RuntimeError):
        return False


def _cuda_sdpa_backends():
    """SDPA's CUDA kernels less cuDNN's. torch prefers cuDNN attention for fp16/bf16 on recent
    GPUs, and cuDNN builds an execution plan for every new (batch, length) shape: with our
    length-bucketed batches that made fp16 on an H100 *slower* than fp32 (1,571 vs 3,020
    SciFact docs/s, scripts/bench/bench_encode.py --device cuda). The memory-efficient kernel takes
    our padding mask and has no per-shape cost. None where this torch cannot choose."""
    try:
        from torch.nn.attention import SDPBackend
    except ImportError:  # torch < 2.3
        return None
    return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


_CUDA_BACKENDS = _cuda_sdpa_backends()


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + bias) v for (B, h, T, d) heads, with an additive (B, 1, 1, T) bias."""
    if q.is_cuda and _CUDA_BACKENDS is not None:
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel(_CUDA_BACKENDS):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


class Layer(nn.Module):
    """One post-norm encoder layer: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        D = cfg.hidden_size
        self.h = cfg.num_attention_heads
        self.qkv = nn.Linear(D, 3 * D)  # W_Q, W_K, W_V fused into one matmul
        self.attn_out = nn.Linear(D, D)
        self.ln1 = nn.LayerNorm(D, eps=cfg.layer_norm_eps)
        self.ff_in = nn.Linear(D, cfg.intermediate_size)
        self.ff_out = nn.Linear(cfg.intermediate_size, D)
        self.ln2 = nn.LayerNorm(D, eps=cfg.layer_norm_eps)
        self.tanh_gelu = cfg.hidden_act != "gelu"
        self.packed: tuple[torch.Tensor, ...] | None = None  # oneDNN-packed weights, see pack_for_cpu

    def forward(self, x: torch.Tensor, attn_bias: torch.Tensor | None) -> torch.Tensor:
        # The packs are bf16 CPU copies of the weights, and the fused ops have no backward.
        if self.packed is not None and x.dtype == torch.bfloat16 and x.device.type == "cpu" and not torch.is_grad_enabled():
            return self._forward_packed(x, attn_bias)
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, D // self.h).permute(2, 0, 3, 1, 4)  # 3 × (B, h, T, d)
        a = attention(q, k, v, attn_bias)  # (B, h, T, d)
        a = a.transpose(1, 2).reshape(B, T, D)
        x = self.ln1(x + self.attn_out(a))
        f = F.gelu(self.ff_in(x), approximate="tanh" if self.tanh_gelu else "none")
        return self.ln2(x + self.ff_out(f))  # (B, T, D)

    def _forward_packed(self, x: torch.Tensor, attn_bias: torch.Tensor | None) -> torch.Tensor:
        """forward() with prepacked weights and the bias, GELU and residual adds fused into the
        matmuls: no weight re-layout per call (a third of a small query's time) and no separate
        passes over the activations."""
        linear = torch.ops.mkldnn._linear_pointwise
        w_qkv, w_out, w_in, w_ff = self.packed
        B, T, D = x.shape
        x2 = x.reshape(B * T, D)
        qkv = linear(x2, w_qkv, self.qkv.bias, "none", [], "")
        q, k, v = qkv.view(B, T, 3, self.h, D // self.h).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias).transpose(1, 2).reshape(B * T, D)
        x2 = self.ln1(linear.binary(a, x2, w_out, self.attn_out.bias, "add"))
        f = linear(x2, w_in, self.ff_in.bias, "gelu", [], "tanh" if self.tanh_gelu else "none")
        return self.ln2(linear.binary(f, x2, w_ff, self.ff_out.bias, "add")).view(B, T, D)


def attention_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """Additive bias (B, 1, 1, T) so that no token attends to padding; None where there is no
    padding (length-sorted batches often have none), for the faster unmasked kernel."""
    if bool(mask.all()):
        return None
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return bias.masked_fill(mask == 0, torch.finfo(dtype).min)[:, None, None, :]


class BertEncoder(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        self.embeddings = Embeddings(cfg)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_hidden_layers))

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Token states (B, T, D) for ids (B, T) and attention mask (B, T), 1 real / 0 pad."""
        x = self.embeddings(ids)
        bias = attention_bias(mask, x.dtype)
        for layer in self.layers:
            x = layer(x, bias)
        return x

    def pack_for_cpu(self, tolerance: float = 0.02) -> bool:
        """Prepack the weights for oneDNN's fused CPU linear (bf16 inference); gives back whether
        the packed path is in use. It is kept only if it gives the plain path's token states on a
        test input, within bf16 rounding; else the plain path stays. Call it again after changing
        the weights in place; moving or casting the model drops the packs by itself."""
        self.unpack_cpu()
        p = next(self.parameters())
        if p.device.type != "cpu" or p.dtype != torch.bfloat16 or not onednn_fused_linear_available():
            return False
        ids = torch.arange(1000, 1000 + 2 * 24).view(2, 24) % self.cfg.vocab_size
        mask = torch.ones_like(ids)
        mask[1, 20:] = 0
        try:
            with torch.inference_mode():
                want = self(ids, mask).float()
                for layer in self.layers:
                    layer.packed = tuple(torch.ops.mkldnn._reorder_linear_weight(lin.weight.detach(), 32)
                                         for lin in (layer.qkv, layer.attn_out, layer.ff_in, layer.ff_out))
                got = self(ids, mask).float()
        except RuntimeError:
            self.unpack_cpu()
            return False
        # bf16 rounding differs between the two kernels by a few steps: compare relative to the
        # states' scale, and the mean-pooled vectors' direction.
        m = mask[..., None].float()
        cos = F.cosine_similarity((got * m).sum(1), (want * m).sum(1), dim=-1)
        if (got - want).abs().max() > tolerance * want.abs().max() or cos.min() < 0.9999:
            self.unpack_cpu()
            return False
        return True

    def unpack_cpu(self) -> None:
        for layer in self.layers:
            layer.packed = None

    def _apply(self, fn, *args, **kwargs):
        # .to() / .float() / .cuda() make new weights: the packs would be stale copies.
        self.unpack_cpu()
        return super()._apply(fn, *args, **kwargs)

    @classmethod
    def from_folder(cls, folder: Path) -> "BertEncoder":
        """Load config.json + model.safetensors (HF BERT names) from a model folder."""
        from safetensors.torch import load_file

        folder = Path(folder)
        cfg = BertConfig.from_file(folder / "config.json")
        weights = folder / "model.safetensors"
        if not weights.exists():
            raise ModelError(f"{folder}: no model.safetensors (only safetensors weights are loaded natively)")
        model = cls(cfg)
        model.load_state_dict(_rename_hf(load_file(str(weights)), cfg))
        return model.eval()


def _rename_hf(sd: dict[str, torch.Tensor], cfg: BertConfig) -> dict[str, torch.Tensor]:
    """Map Hugging Face BERT parameter names onto this module's names, fusing Q, K, V."""
    sd = {k.removeprefix("bert."): v for k, v in sd.items()}
    out: dict[str, torch.Tensor] = {}
    for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        out[f"embeddings.{name}.weight"] = sd[f"embeddings.{name}.weight"]
    for p in ("weight", "bias"):
        out[f"embeddings.LayerNorm.{p}"] = sd[f"embeddings.LayerNorm.{p}"]
    for i in range(cfg.num_hidden_layers):
        src = f"encoder.layer.{i}."
        dst = f"layers.{i}."
        for p in ("weight", "bias"):
            out[dst + "qkv." + p] = torch.cat(
                [sd[src + f"attention.self.{n}.{p}"] for n in ("query", "key", "value")]
            )
            out[dst + "attn_out." + p] = sd[src + "attention.output.dense." + p]
            out[dst + "ln1." + p] = sd[src + "attention.output.LayerNorm." + p]
            out[dst + "ff_in." + p] = sd[src + "intermediate.dense." + p]
            out[dst + "ff_out." + p] = sd[src + "output.dense." + p]
            out[dst + "ln2." + p] = sd[src + "output.LayerNorm." + p]
    return out


def flops_per_token(cfg: BertConfig, T: int) -> float:
    """Approximate forward FLOPs for one token in a sequence of T tokens (matmuls only)."""
    D, Dff, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    dense = 2 * (4 * D * D + 2 * D * Dff)
    attn = 2 * 2 * T * D
    return L * (dense + attn)
