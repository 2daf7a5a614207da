"""Trained query layers: the top layers of the encoder, fine-tuned for queries (semsearch/training
builds them; the encoder applies them to queries, documents keep the base model's layers)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from semsearch.encoder.transformer import Layer, attention_bias as _bias
from semsearch.errors import InputError

KIND = "query-layers"


class QueryTower(nn.Module):
    """The top `n` layers of a BERT encoder, fine-tuned for queries; the layers below stay the
    base model's (shared with documents). Input: the states after layer `first - 1`."""

    def __init__(self, cfg, first: int, n: int):
        super().__init__()
        self.cfg, self.first, self.n = cfg, first, n
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(n))

    @classmethod
    def from_base(cls, model, n: int) -> "QueryTower":
        L = len(model.layers)
        if not 1 <= n <= L:
            raise InputError(f"--train-layers {n}: the model has {L} layers; give 1 to {L}")
        tower = cls(model.cfg, L - n, n)
        for mine, base in zip(tower.layers, model.layers[L - n :]):
            mine.load_state_dict({k: v.detach().float().cpu() for k, v in base.state_dict().items()})
        return tower

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, bias)
        return x


def bottom_states(model, ids: torch.Tensor, mask: torch.Tensor, first: int) -> torch.Tensor:
    """The base model's states after its first `first` layers (the tower's input)."""
    x = model.embeddings(ids)
    bias = _bias(mask, x.dtype)
    for layer in model.layers[:first]:
        x = layer(x, bias)
    return x


def tower_states(model, tower: QueryTower, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token states of queries: the base model's bottom layers, then the tower (fp32)."""
    x = bottom_states(model, ids, mask, tower.first).float()
    return tower(x, _bias(mask, x.dtype))


def pad_ids(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) (B, T) for token id lists, zero-padded to the longest."""
    T = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    mask = torch.zeros(len(seqs), T, dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, : len(s)] = torch.tensor(s)
        mask[r, : len(s)] = 1
    return ids, mask



def load_tower(folder: Path, cfg_model, head_cfg: dict[str, Any]) -> QueryTower:
    """The QueryTower saved in folder, for a base model with config cfg_model."""
    from safetensors.torch import load_file

    from semsearch.errors import ModelError

    first, n = int(head_cfg["first_layer"]), int(head_cfg["layers"])
    if first + n != cfg_model.num_hidden_layers or head_cfg.get("dim") != cfg_model.hidden_size:
        raise ModelError(f"{folder}: query layers {first}..{first + n - 1} of width {head_cfg.get('dim')} do not fit this model "
                         f"({cfg_model.num_hidden_layers} layers of width {cfg_model.hidden_size})")
    tower = QueryTower(cfg_model, first, n)
    try:
        tower.load_state_dict(load_file(str(Path(folder) / "head.safetensors")))
    except (RuntimeError, OSError) as e:
        raise ModelError(f"{folder}: cannot load its query layers ({e})") from e
    return tower.eval()
