"""FedSimCLR's training (imported when its step runs; its costs: :mod:`.costs`)."""

from __future__ import annotations

import torch
from torch.func import functional_call

from fedssl.data.augment import BatchAugment, multi_view
from fedssl.fl.cohort import CohortTrainer, LocalData, OptimizerConfig, vectorise_clients
from fedssl.fl.engine import Federation, LocalTraining, federation_config
from fedssl.fl.runner import run_federation, train_data
from fedssl.losses import nt_xent
from fedssl.models.encoders import (
    ContrastiveModel,
    load_encoder,
    save_contrastive_model,
    seeded_contrastive_model,
)
from fedssl.precision import autocast
from fedssl.strategies import choose


def simclr_loss(temperature: float):
    def loss(model, params, buffers, batch):
        x = torch.cat(batch.views)
        with autocast(x):
            z = functional_call(model, (params, buffers), (x,))
        z1, z2 = z.float().chunk(2)
        return nt_xent(z1, z2, temperature, batch.valid)

    return loss


def make_federation(
    p, model: ContrastiveModel, data: LocalData, ckpt, fingerprint: str
) -> Federation:
    """SimCLR on every client, aggregated by the params' ``strategy`` (FedAvg of the whole
    model weighted by data size, or FedProx)."""
    cfg = federation_config(p, p.seed, p.lr_schedule)
    strategy = choose.strategy(p.strategy, cfg)
    cohort = CohortTrainer(
        model,
        multi_view(BatchAugment(p.augment, data.images.shape[-1]), views=2),
        strategy.local_objective(simclr_loss(p.temperature), model),
        OptimizerConfig(kind=p.optimizer, weight_decay=p.weight_decay, momentum=p.momentum),
        batch_size=p.batch_size,
        local_epochs=p.local_epochs,
        parallel=vectorise_clients(p.parallel_clients, data.device),
    )
    return Federation(strategy, LocalTraining(cohort), data, cfg, ckpt, fingerprint)


def federation(ctx) -> tuple[ContrastiveModel, Federation]:
    """The pretraining stage's model and federation (what a Flower client builds too)."""
    p = ctx.exp.method
    model = seeded_contrastive_model(p.model, ctx.image_shape, p.seed, ctx.device)
    return model, make_federation(p, model, train_data(ctx), ctx.resume_path, ctx.fingerprint)


def pretrain(ctx) -> None:
    model, fed = federation(ctx)
    run_federation(ctx, fed, model)
    save_contrastive_model(model, ctx.out / "model.pt", ctx.image_shape)
    ctx.info["parameters"] = sum(q.numel() for q in model.parameters())


def encoder(ctx):
    """The frozen encoder the probes read: the pretrained backbone (or its projection)."""
    return load_encoder(
        ctx.exp.method.model,
        ctx.input("pretrain") / "model.pt",
        ctx.device,
        ctx.exp.features.layer == "projection",
    )
