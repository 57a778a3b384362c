"""The family's federated step (imported when it runs; its costs: :mod:`.costs`)."""

from __future__ import annotations

import torch
from torch.func import functional_call

from fedssl.data.augment import BatchAugment, multi_view
from fedssl.fl.cohort import CohortTrainer, LocalData, OptimizerConfig, vectorise_clients
from fedssl.fl.engine import Federation, LocalTraining, federation_config
from fedssl.fl.momentum import ema_after_step, momentum_pairs
from fedssl.fl.runner import run_federation, train_data
from fedssl.losses import byol_loss
from fedssl.methods.fedbyol.model import TARGET, ByolNet, byol_encoder, seeded_byol
from fedssl.methods.fedbyol.strategy import STRATEGIES
from fedssl.precision import autocast
from fedssl.runtime import torch_save


def byol_objective(model, params, buffers, batch):
    """BYOL's symmetric loss on the batch's two views (spec §2.2: the sum of both directions)."""
    x = torch.cat(batch.views)
    with autocast(x):
        p, t = functional_call(model, (params, buffers), (x,))
    p1, p2 = p.float().chunk(2)
    t1, t2 = t.float().chunk(2)
    return byol_loss(p1, p2, t1, t2, batch.valid)


def make_federation(p, model: ByolNet, data: LocalData, ckpt, fingerprint: str) -> Federation:
    """BYOL on every client (the target follows the online encoder after every step), the
    family member's strategy on the server."""
    params = [k for k, _ in model.named_parameters()]
    cohort = CohortTrainer(
        model,
        multi_view(BatchAugment(p.augment, data.images.shape[-1]), views=2),
        byol_objective,
        OptimizerConfig(kind=p.optimizer, weight_decay=p.weight_decay, momentum=p.momentum),
        batch_size=p.batch_size,
        local_epochs=p.local_epochs,
        parallel=vectorise_clients(p.parallel_clients, data.device),
        after_step=ema_after_step(momentum_pairs(params, TARGET, ("encoder.",)), p.target_ema),
    )
    cfg = federation_config(p, p.seed, p.lr_schedule)
    strategy = STRATEGIES[p.name](cfg, model, p)
    return Federation(strategy, LocalTraining(cohort), data, cfg, ckpt, fingerprint)


def federation(ctx) -> tuple[ByolNet, Federation]:
    """The pretraining stage's model and federation (what a Flower client builds too)."""
    p = ctx.exp.method
    model = seeded_byol(p.model, ctx.image_shape, p.seed, ctx.device)
    return model, make_federation(p, model, train_data(ctx), ctx.resume_path, ctx.fingerprint)


def pretrain(ctx) -> None:
    model, fed = federation(ctx)
    run_federation(ctx, fed, model)
    online = {k: v for k, v in model.state_dict().items() if not k.startswith(TARGET)}
    torch_save({"model": online, "image_shape": tuple(ctx.image_shape)}, ctx.out / "model.pt")
    ctx.info["parameters"] = sum(q.numel() for q in model.encoder.parameters())
    ctx.info["predictor_parameters"] = sum(q.numel() for q in model.predictor.parameters())


def encoder(ctx):
    """The global online encoder's backbone (or backbone + projector) for the probes."""
    ckpt = torch.load(
        ctx.input("pretrain") / "model.pt", map_location=ctx.device, weights_only=True
    )
    module = byol_encoder(
        ctx.exp.method, ckpt["image_shape"], ctx.exp.features.layer == "projection"
    )
    prefix = "encoder." if ctx.exp.features.layer == "projection" else "encoder.backbone."
    module.load_state_dict(
        {k[len(prefix) :]: v for k, v in ckpt["model"].items() if k.startswith(prefix)}
    )
    return module.to(ctx.device)
