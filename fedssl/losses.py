"""Self-supervised losses, as plain functions."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float,
            valid: torch.Tensor | None = None) -> torch.Tensor:
    """SimCLR's NT-Xent: for each of the 2N projections, cross-entropy of its twin against every
    other projection (self excluded), averaged over anchors. ``valid`` ([N] bool) marks real
    samples in a padded batch: padded rows are neither anchors nor negatives."""
    n = z1.shape[0]
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    logits = (z @ z.T).float() / temperature
    eye = torch.eye(2 * n, dtype=torch.bool, device=z.device)
    logits = logits.masked_fill(eye, float("-inf"))
    target = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(z.device)
    if valid is None:
        return F.cross_entropy(logits, target)
    keep = torch.cat([valid, valid])
    logits = logits.masked_fill(~keep[None, :], float("-inf"))
    logits = torch.where(keep[:, None], logits, 0.0)  # padded anchors: finite, then ignored
    per_anchor = F.cross_entropy(logits, target, reduction="none")
    return (per_anchor * keep).sum() / keep.sum().clamp(min=1)
