"""Contrastive loss: multiple-negatives ranking (InfoNCE) over in-batch and hard negatives."""
from __future__ import annotations

import torch
from torch.nn import functional as F


def mnr_loss(q: torch.Tensor, d: torch.Tensor, scale: float = 20.0, symmetric: bool = False,
             exclude: torch.Tensor | None = None) -> torch.Tensor:
    """InfoNCE for queries q (B, D) against passages d (B + N, D), where d[i] is q[i]'s positive
    and every other row (other positives, hard negatives) is a negative for it, except where
    exclude (B, B + N) is True: those passages (other labelled positives of the same query) are
    left out of q[i]'s softmax instead of being pushed away.

    Inputs need not be normalised; similarities are cosines times `scale` (1 / temperature).
    """
    B = q.shape[0]
    qn, dn = F.normalize(q, dim=-1), F.normalize(d, dim=-1)
    logits = scale * qn @ dn.T  # (B, B + N)
    if exclude is not None:
        exclude = exclude.clone()
        exclude[torch.arange(B), torch.arange(B)] = False  # never a query's own target
        logits = logits.masked_fill(exclude, float("-inf"))
    target = torch.arange(B, device=q.device)
    loss = F.cross_entropy(logits, target)
    if symmetric:
        # passage -> query direction over the positives only
        loss = (loss + F.cross_entropy(logits[:, :B].T, target)) / 2
    return loss


def positive_mask(queries: list[int], passages: list[int], positives: dict[int, set[int]]) -> torch.Tensor:
    """(B, B + N) bool: True where passage j is a labelled positive of query i other than its target j == i."""
    m = torch.zeros(len(queries), len(passages), dtype=torch.bool)
    for i, q in enumerate(queries):
        pos = positives.get(q, ())
        for j, p in enumerate(passages):
            if j != i and p in pos:
                m[i, j] = True
    return m
