"""Self-supervised losses, as plain functions."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def nt_xent(
    z1: torch.Tensor, z2: torch.Tensor, temperature: float, valid: torch.Tensor | None = None
) -> torch.Tensor:
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


def masked_mean(per_row: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """Mean over the real rows of a padded batch; 0 when there is none. ``torch.where`` (not a
    product) so a non-finite padded row cannot leak into the value; no Python branch on tensor
    values, so it runs under ``vmap``."""
    if valid is None:
        return per_row.mean()
    kept = torch.where(valid, per_row, torch.zeros_like(per_row))
    return kept.sum() / valid.sum().clamp(min=1)


def masked_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """Classification cross-entropy (in float32) averaged over the real rows of a padded batch;
    padded rows may carry any label (e.g. -1), they are clamped to a valid class and dropped."""
    per_row = F.cross_entropy(logits.float(), labels.clamp(min=0), reduction="none")
    return masked_mean(per_row, valid)


def _cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise cosine similarity in float32 (bf16 cosines are too coarse for a loss)."""
    return (F.normalize(a.float(), dim=-1) * F.normalize(b.float(), dim=-1)).sum(-1)


def byol_loss(
    p1: torch.Tensor,
    p2: torch.Tensor,
    z1: torch.Tensor,
    z2: torch.Tensor,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """BYOL (CP-CFL Eqs. 9-11): (2 - 2 cos(p1, sg z2)) + (2 - 2 cos(p2, sg z1)), batch mean.
    ``p`` are online predictions, ``z`` the target projections of the same views: view 1's
    prediction regresses view 2's target and vice versa. The targets are detached here so the
    loss is right whether or not the caller ran the target branch under no_grad."""
    per_row = (2 - 2 * _cos(p1, z2.detach())) + (2 - 2 * _cos(p2, z1.detach()))
    return masked_mean(per_row, valid)


def simsiam_loss(
    p1: torch.Tensor,
    p2: torch.Tensor,
    z1: torch.Tensor,
    z2: torch.Tensor,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """SimSiam (CP-CFL Eq. 12 with the original paper's 1/2, so it lies in [-1, 1]):
    -(cos(p1, sg z2) + cos(p2, sg z1)) / 2, batch mean. The stop-gradient is what keeps SimSiam
    from collapsing, so it is applied here, not left to the caller."""
    per_row = -0.5 * (_cos(p1, z2.detach()) + _cos(p2, z1.detach()))
    return masked_mean(per_row, valid)


def infonce(
    q: torch.Tensor, k: torch.Tensor, temperature: float, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """MoCo v3's InfoNCE with in-batch negatives (LW-FedSSL Eq. 2): row i of q/τ·kᵀ (rows
    L2-normalised) is a softmax whose target is k_i; the other keys of the batch are its K = B-1
    negatives. Batch mean, without MoCo v3's ×2τ factor (lw-fedssl spec §8.3). Keys are targets
    (momentum encoder, frozen global model) and get no gradient. Padded rows (``valid`` False)
    are neither anchors nor negatives."""
    q, k = F.normalize(q.float(), dim=1), F.normalize(k.detach().float(), dim=1)
    logits = q @ k.T / temperature
    target = torch.arange(q.shape[0], device=q.device)
    if valid is None:
        return F.cross_entropy(logits, target)
    logits = logits.masked_fill(~valid[None, :], float("-inf"))
    logits = torch.where(valid[:, None], logits, 0.0)  # padded anchors: finite, then ignored
    return masked_mean(F.cross_entropy(logits, target, reduction="none"), valid)


def moco_v3_loss(
    q1: torch.Tensor,
    q2: torch.Tensor,
    k1: torch.Tensor,
    k2: torch.Tensor,
    temperature: float,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Symmetrised MoCo v3 loss (LW-FedSSL Alg. 2): each view's query against the other view's
    key. Also the form of LW-FedSSL's alignment term, with the global encoder's outputs as keys."""
    return infonce(q1, k2, temperature, valid) + infonce(q2, k1, temperature, valid)


def moco_queue_loss(
    q: torch.Tensor,
    k: torch.Tensor,
    queue: torch.Tensor,
    temperature: float,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """MoCo v2's InfoNCE with a memory of negatives (MonAcoSFL Eq. 1): for each row the positive
    is q·k and the negatives are q·m for every m in ``queue`` [K, d]; cross-entropy with target
    0, batch mean. q and k are L2-normalised here; the queue is assumed to hold unit vectors
    already (``FeatureQueue`` does). Keys and queue get no gradient."""
    q, k = F.normalize(q.float(), dim=1), F.normalize(k.detach().float(), dim=1)
    positive = (q * k).sum(1, keepdim=True)
    negatives = q @ queue.detach().float().T
    logits = torch.cat([positive, negatives], dim=1) / temperature
    target = torch.zeros(q.shape[0], dtype=torch.long, device=q.device)
    return masked_mean(F.cross_entropy(logits, target, reduction="none"), valid)


def model_contrastive_loss(
    z: torch.Tensor,
    z_pos: torch.Tensor,
    z_neg: torch.Tensor,
    temperature: float,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """MpFedcon's l_con (Eq. 5): -log softmax over [cos(z, z_pos), cos(z, z_neg)] / τ at the
    positive, i.e. cross-entropy with target 0 and one negative per row. ``z_pos`` is each row's
    global class centre, ``z_neg`` the frozen round-start model's projection; both are
    constants. ``valid`` drops rows, e.g. padding and rows whose class has no centre yet
    (A4: give those a zero centre and mask them); with no row left the loss is 0."""
    logits = torch.stack([_cos(z, z_pos.detach()), _cos(z, z_neg.detach())], dim=1) / temperature
    target = torch.zeros(z.shape[0], dtype=torch.long, device=z.device)
    return masked_mean(F.cross_entropy(logits, target, reduction="none"), valid)


# ---------------------------------------------------------------------- on a model's outputs
# Pure losses of a model's fp32 outputs on a batch of views concatenated along dim 0 (view 1's
# rows, then view 2's), the batch (``batch.valid``: which rows are real) and the method's params:
# what a FederatedMethod names as its ``loss``.
def simclr_views(z: torch.Tensor, batch, p) -> torch.Tensor:
    """NT-Xent between the two views' projections (FedSimCLR)."""
    z1, z2 = z.chunk(2)
    return nt_xent(z1, z2, p.temperature, batch.valid)


def byol_views(outputs: tuple[torch.Tensor, torch.Tensor], batch, p) -> torch.Tensor:
    """BYOL's symmetric loss: each view's prediction regresses the other view's target (spec
    §2.2: the sum of both directions)."""
    predictions, targets = outputs
    return byol_loss(*predictions.chunk(2), *targets.chunk(2), batch.valid)
