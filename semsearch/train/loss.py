"""Contrastive loss: multiple-negatives ranking (InfoNCE) over in-batch and hard negatives."""
from __future__ import annotations

import torch
from torch.nn import functional as F


def mnr_loss(q: torch.Tensor, d: torch.Tensor, scale: float = 20.0, symmetric: bool = False) -> torch.Tensor:
    """InfoNCE for queries q (B, D) against passages d (B + N, D), where d[i] is q[i]'s positive
    and every other row (other positives, hard negatives) is a negative for it.

    Inputs need not be normalised; similarities are cosines times `scale` (1 / temperature).
    """
    B = q.shape[0]
    qn, dn = F.normalize(q, dim=-1), F.normalize(d, dim=-1)
    logits = scale * qn @ dn.T  # (B, B + N)
    target = torch.arange(B, device=q.device)
    loss = F.cross_entropy(logits, target)
    if symmetric:
        # passage -> query direction over the positives only
        loss = (loss + F.cross_entropy(logits[:, :B].T, target)) / 2
    return loss
