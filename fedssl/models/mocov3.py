"""MoCo v3 on a (growable) ViT as one module whose forward pass is the training loss, so the
cohort trainer can run it functionally (LW-FedSSL Alg. 2 and Alg. 3, spec lw-fedssl.md §2).

Parts (state-dict prefixes): the online encoder ``encoder`` (F), projector ``projector`` (H) and
predictor ``predictor`` (P); the momentum branch ``target_encoder`` / ``target_projector``
(F_k, H_k: copies of F, H at the start of a round, then their EMA, see :func:`ema_pairs`); and,
with an alignment weight ``alpha`` > 0, the frozen ``global_encoder`` (the encoder the client
received this round, Eq. 3).

Loss: ``moco_v3_loss(q1, q2, k1, k2)`` (Eq. 2, symmetrised) with q = P(H(F(x))) and
k = H_k(F_k(x)), plus ``alpha * moco_v3_loss(z1, z2, g1, g2)`` with z = F(x) and g the global
encoder's outputs. The heads run on each view apart (BatchNorm statistics per view, as MoCo v3).

Frozen prefix: in layer-wise training the input embedding and blocks ``0..frozen_prefix-1`` are
frozen on the client, and they are the same tensors in F, F_k and the global F (the EMA of an
unchanged weight is that weight, and the client does not train what it received). Their output
is therefore computed once, under ``no_grad`` (no activations kept for the backward pass), and
shared by the three branches; only the blocks after it run three times.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from fedssl.losses import moco_v3_loss
from fedssl.models.momentum import momentum_pairs
from fedssl.models.vit import VisionTransformer

ONLINE = ("encoder.", "projector.", "predictor.")


def finish(vit: VisionTransformer, h: Tensor, start: int) -> Tensor:
    """Tokens ``h`` entering block ``start`` through the remaining blocks, the final LayerNorm
    and the pooling: the encoder's representation."""
    for block in vit.blocks[start : vit.depth]:
        h = block(h)
    h = vit.norm(h)
    return h[:, 0] if vit.cls_token is not None else h.mean(dim=1)


def prefix(vit: VisionTransformer, x: Tensor, stop: int) -> Tensor:
    """Tokens after the input embedding and blocks ``0..stop-1``."""
    h = vit.embed(x)
    for block in vit.blocks[:stop]:
        h = block(h)
    return h


class MocoV3Learner(nn.Module):
    """Online F, H, P; momentum F_k, H_k; optional frozen global F. ``forward(v1, v2, valid)``
    returns the loss of one batch of two views."""

    def __init__(
        self,
        encoder: VisionTransformer,
        projector: nn.Module,
        predictor: nn.Module,
        temperature: float,
        alpha: float = 0.0,
        frozen_prefix: int = 0,
    ):
        super().__init__()
        if not 0 <= frozen_prefix < max(1, encoder.depth):
            raise ValueError(
                f"frozen_prefix {frozen_prefix} must leave a block to train (depth {encoder.depth})"
            )
        self.encoder, self.projector, self.predictor = encoder, projector, predictor
        self.target_encoder = copy.deepcopy(encoder)
        self.target_projector = copy.deepcopy(projector)
        self.global_encoder = copy.deepcopy(encoder) if alpha > 0 else None
        for module in (self.target_encoder, self.target_projector, self.global_encoder):
            if module is not None:
                module.requires_grad_(False)
        self.temperature, self.alpha, self.frozen_prefix = temperature, alpha, frozen_prefix

    def heads(self, z: Tensor, n: int) -> Tensor:
        """P(H(z)) for each view of ``z`` (its first ``n`` rows are view 1) apart."""
        return torch.cat([self.predictor(self.projector(part)) for part in z.split(n)])

    def forward(self, v1: Tensor, v2: Tensor, valid: Tensor | None = None) -> Tensor:
        n, p = v1.shape[0], self.frozen_prefix
        x = torch.cat([v1, v2])
        if p > 0:
            with torch.no_grad():
                shared = prefix(self.encoder, x, p)
            h_online = h_target = h_global = shared
        else:
            h_online = self.encoder.embed(x)
            with torch.no_grad():
                h_target = self.target_encoder.embed(x)
                h_global = self.global_encoder.embed(x) if self.global_encoder else None
        z = finish(self.encoder, h_online, p)
        q1, q2 = self.heads(z, n).split(n)
        with torch.no_grad():
            zk = finish(self.target_encoder, h_target, p)
            k1, k2 = (self.target_projector(part) for part in zk.split(n))
        loss = moco_v3_loss(q1, q2, k1, k2, self.temperature, valid)
        if self.global_encoder is not None:
            with torch.no_grad():
                g1, g2 = finish(self.global_encoder, h_global, p).split(n)
            z1, z2 = z.split(n)
            loss = loss + self.alpha * moco_v3_loss(z1, z2, g1, g2, self.temperature, valid)
        return loss


def online_state(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The online part (F, H, P: parameters and buffers) of a learner's state."""
    return {k: v for k, v in state.items() if k.startswith(ONLINE)}


def round_start_state(online: dict[str, Tensor], alpha: bool) -> dict[str, Tensor]:
    """A learner's state at the start of a local round (Alg. 2 l. 2-3): the online weights,
    the momentum branch re-initialised as their copy, and the received encoder frozen as the
    global one when there is an alignment term."""
    state = dict(online)
    for k, v in online.items():
        if k.startswith(("encoder.", "projector.")):
            state["target_" + k] = v.clone()
        if alpha and k.startswith("encoder."):
            state["global_" + k] = v.clone()
    return state


def ema_pairs(names) -> dict[str, str]:
    """Momentum-branch name -> online name, for the given online parameter names of F and H
    (P has no momentum twin)."""
    return momentum_pairs(names, "target_", ("encoder.", "projector."))
