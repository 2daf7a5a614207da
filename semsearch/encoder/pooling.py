"""Pooling: token states (B, T, D) + mask (B, T) -> one vector per text (B, D).

Pure, mask-aware functions that never modify their inputs, plus the trainable attention head.
"""
from __future__ import annotations

import torch
from torch import nn

from semsearch.errors import InputError

POOLINGS = ("cls", "mean", "max")


def cls_pool(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return states[:, 0]  # (B, D)


def mean_pool(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(states.dtype)  # (B, T, 1)
    # Divide by the number of real tokens, never by T.
    return (states * m).sum(1) / m.sum(1).clamp(min=1.0)  # (B, D)


def max_pool(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    filled = states.masked_fill(mask.unsqueeze(-1) == 0, torch.finfo(states.dtype).min)  # a copy
    return filled.max(1).values  # (B, D)


_FUNCS = {"cls": cls_pool, "mean": mean_pool, "max": max_pool}


def check_pooling(name: str) -> str:
    """The pooling name itself, or an InputError listing the valid ones."""
    if name not in _FUNCS:
        raise InputError(f"unknown pooling {name!r}; valid poolings are: {', '.join(POOLINGS)}")
    return name


def pool(name: str, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Pooled (B, D) vectors with the named pooling."""
    return _FUNCS[check_pooling(name)](states, mask)


class AttentionHead(nn.Module):
    """Attention pooling: a learned score per token, softmax over real tokens, weighted sum,
    then an optional linear projection.

    Initialised with zero scoring weights, so every real token gets the same weight and the head
    reproduces mean pooling exactly before training; the projection starts as the identity.
    """

    def __init__(self, dim: int, out_dim: int | None = None):
        super().__init__()
        self.dim = dim
        self.score = nn.Linear(dim, 1)
        nn.init.zeros_(self.score.weight)
        nn.init.zeros_(self.score.bias)
        self.proj: nn.Linear | None = None
        if out_dim is not None:
            self.proj = nn.Linear(dim, out_dim, bias=False)
            with torch.no_grad():
                self.proj.weight.copy_(torch.eye(out_dim, dim))

    @property
    def out_dim(self) -> int:
        return self.proj.out_features if self.proj is not None else self.dim

    def forward(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        states = states.to(self.score.weight.dtype)
        s = self.score(states).squeeze(-1)  # (B, T)
        s = s.masked_fill(mask == 0, float("-inf"))
        w = torch.softmax(s, dim=1).unsqueeze(-1)  # (B, T, 1), zero on padding
        v = (w * states).sum(1)  # (B, D)
        return self.proj(v) if self.proj is not None else v
