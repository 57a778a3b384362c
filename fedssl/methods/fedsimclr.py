"""FedSimCLR: SimCLR (two augmented views, NT-Xent, projection head) trained on every client and
averaged with FedAvg. Also the 'none' method: the seeded random initialisation, untouched."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.func import functional_call

from fedssl.data.augment import BatchAugment
from fedssl.fl.cohort import CohortTrainer, OptimizerConfig
from fedssl.fl.engine import Federation, FederationConfig
from fedssl.losses import nt_xent
from fedssl.models.encoders import ContrastiveModel
from fedssl.params import ExperimentParams
from fedssl.runtime import derive_seed


def build_model(exp: ExperimentParams, image_shape, device) -> ContrastiveModel:
    """The seeded initial model: every method and reference row starts from the same weights."""
    torch.manual_seed(derive_seed(exp.pretrain.seed, "init"))
    model = ContrastiveModel(exp.model, tuple(image_shape)).to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    return model


def simclr_loss(temperature: float):
    def loss(model, params, buffers, views, valid):
        x = torch.cat(views)
        with torch.autocast(x.device.type, torch.bfloat16, enabled=x.device.type == "cuda"):
            z = functional_call(model, (params, buffers), (x,))
        z1, z2 = z.float().chunk(2)
        return nt_xent(z1, z2, temperature, valid)
    return loss


def two_views(augment: BatchAugment):
    def make(batch: torch.Tensor, generator: torch.Generator):
        return augment(batch, generator), augment(batch, generator)
    return make


def make_federation(exp: ExperimentParams, model, clients: list[np.ndarray],
                    images: torch.Tensor, ckpt: Path, fingerprint: str) -> Federation:
    p = exp.pretrain
    trainer = CohortTrainer(
        model, two_views(BatchAugment(p.augment, images.shape[-1])),
        simclr_loss(p.temperature),
        OptimizerConfig(kind=p.optimizer, weight_decay=p.weight_decay, momentum=p.momentum),
        batch_size=p.batch_size, local_epochs=p.local_epochs,
        parallel=p.parallel_clients == "on" or (p.parallel_clients == "auto"
                                                  and images.device.type == "cuda"))
    cfg = FederationConfig(rounds=p.rounds, client_fraction=p.client_fraction, lr=p.lr,
                           lr_schedule=p.lr_schedule, seed=p.seed)
    return Federation(trainer, clients, images, cfg, ckpt, fingerprint)
