"""FeatARC's network, views and local loss (spec §5.2; its clustering: :mod:`.strategy`).

A client trains SimCLR from its cluster's model G_a plus s·L_align, the pull of its features
toward h_a, the normalised backbone feature of the same un-augmented images by a frozen copy of
G_a's backbone (BN in eval mode, fixed for the round, as the authors' bank). The network is the
project's SimCLR model (its head has no BN, the authors' has one after the hidden layer), so
C = 1, s = 0 is FedSimCLR with uniform FedAvg exactly.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedssl.data.augment import BatchAugment, multi_view, to_float
from fedssl.losses import masked_mean, nt_xent
from fedssl.models.encoders import ContrastiveModel, frozen, seeded_contrastive_model


class FeatARCModel(nn.Module):
    """The trained SimCLR network and a frozen eval-mode copy of the round's cluster backbone
    (the alignment target)."""

    def __init__(self, net: ContrastiveModel):
        super().__init__()
        self.net = net
        self.anchor = frozen(copy.deepcopy(net.backbone))

    def forward(self, x, branch: str = "train"):
        """(projections, backbone features) of ``x``; ``branch`` "anchor": h(x)."""
        if branch == "anchor":
            return F.normalize(self.anchor(x).float(), dim=1)
        features = self.net.backbone(x)
        return self.net.head(features), features


def alignment_loss(targets: torch.Tensor, y1: torch.Tensor, y2: torch.Tensor, valid=None):
    """L_align = -(mean <h, normalize(y1)> + mean <h, normalize(y2)>) / 2, in [-1, 1]."""
    per_row = (targets * F.normalize(y1.float(), dim=1)).sum(1) + (
        targets * F.normalize(y2.float(), dim=1)
    ).sum(1)
    return masked_mean(-0.5 * per_row, valid)


def featarc_forward(model, state, batch):
    """The projections and backbone features of the two views and the anchor's targets for
    the raw images (no gradient): the runtime runs them in one precision region."""
    v1, v2, raw = batch.views
    z, features = functional_call(model, state, (torch.cat([v1, v2]),))
    with torch.no_grad():
        targets = functional_call(model, state, (raw,), {"branch": "anchor"})
    return z, features, targets


def featarc_loss(p):
    """The loss of :func:`featarc_forward`'s outputs: NT-Xent of the two views plus
    s·L_align."""
    temperature, scale, align_space = p.temperature, p.align_scale, p.align_space

    def loss(outputs, batch):
        z, features, targets = outputs
        z1, z2 = z.float().chunk(2)
        ssl = nt_xent(z1, z2, temperature, batch.valid)
        aligned = z if align_space == "proj_to_backbone" else features
        return ssl + scale * alignment_loss(targets, *aligned.float().chunk(2), batch.valid)

    return loss


# ---------------------------------------------------------------------- the recipe's parts
def seeded_model(p, image_shape, device) -> FeatARCModel:
    """The shared seeded SimCLR network (cluster 0's start) with its anchor."""
    net = seeded_contrastive_model(p.model, image_shape, p.seed, device)
    if p.align_space == "proj_to_backbone" and p.model.proj_dim != net.backbone.out_dim:
        raise ValueError(
            f"method.align_space 'proj_to_backbone' needs model.proj_dim ({p.model.proj_dim}) "
            f"= the backbone's width ({net.backbone.out_dim}): use 'backbone_to_backbone'"
        )
    return FeatARCModel(net)


def views(p, size: int):
    """Two augmented views and the un-augmented images (the anchor's input)."""
    two_views = multi_view(BatchAugment(p.augment, size), views=2)

    def make(batch, generator):
        return (*two_views(batch, generator), to_float(batch))

    return make


def save_network(model: FeatARCModel, path, image_shape) -> None:
    """The evaluated cluster's SimCLR network (the anchor stays behind)."""
    from fedssl.models.encoders import save_contrastive_model

    save_contrastive_model(model.net, path, image_shape)
