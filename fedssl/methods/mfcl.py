"""MFCL (modular federated contrastive learning), phase 1: clients train a small autoencoder
(client module + mirror decoder, Twin/Group/Batch Norm) on twin-ordered augmented views, averaged
by the gServer with FedAvg. Composes the shared augmentation, cohort trainer and engine."""
from __future__ import annotations

import torch
from torch.func import functional_call

from fedssl.models.autoencoder import reconstruction_loss


def twin_batch(augment):
    """Two independent views of every sample, as one batch ordered [all view-1; all view-2]
    (rows k and k+K are twins, the layout Twin Norm expects)."""
    def make(batch: torch.Tensor, generator: torch.Generator):
        return augment(batch, generator), augment(batch, generator)
    return make


def autoencoder_loss(kind: str = "bce"):
    """Reconstruction of each augmented view from itself (Eq. 1). Padded samples of a short
    batch are dropped as whole pairs, so Twin Norm still sees intact twins."""
    def loss(model, params, buffers, views, valid):
        v1, v2 = views
        x = torch.cat([v1, v2])
        with torch.autocast(x.device.type, torch.bfloat16, enabled=x.device.type == "cuda"):
            logits = functional_call(model, (params, buffers), (x,))
        per_pixel = reconstruction_loss(logits.float(), model.reconstruction_target(x), kind,
                                        reduction="none")
        keep = torch.cat([valid, valid]).float()
        per_image = per_pixel.flatten(1).mean(1)
        return (per_image * keep).sum() / keep.sum().clamp(min=1)
    return loss
