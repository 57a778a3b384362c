"""The training of a :class:`fedssl.methods.base.FederatedMethod` (imported when its step runs):
the seeded model, the clients' views, the cohort trainer running the method's loss under the
precision policy, the method's strategy, the federation resumed from its checkpoint."""

from __future__ import annotations

from torch import nn

from fedssl.data.augment import BatchAugment, multi_view
from fedssl.fl.cohort import (
    CohortTrainer,
    LocalData,
    OptimizerConfig,
    on_outputs,
    vectorise_clients,
)
from fedssl.fl.engine import Federation, LocalTraining, federation_config
from fedssl.fl.runner import run_federation, train_data
from fedssl.methods import registry


def make_federation(p, model: nn.Module, data: LocalData, ckpt, fingerprint) -> Federation:
    """The federation of the method whose params are ``p``, over ``data``, training ``model``."""
    method = registry.get(p.name)
    cfg = federation_config(p, p.seed, p.lr_schedule)
    strategy = method.strategy(cfg, model, p)
    loss = on_outputs(lambda outputs, batch: method.loss(outputs, batch, p))
    cohort = CohortTrainer(
        model,
        multi_view(BatchAugment(p.augment, data.images.shape[-1]), views=method.views),
        strategy.local_objective(loss, model),
        OptimizerConfig.of(p),
        batch_size=p.batch_size,
        local_epochs=p.local_epochs,
        parallel=vectorise_clients(p.parallel_clients, data.device),
        after_step=method.after_step(model, p),
    )
    return Federation(strategy, LocalTraining(cohort), data, cfg, ckpt, fingerprint)


def federation(ctx) -> tuple[nn.Module, Federation]:
    """The pretraining stage's model and federation (what a Flower client builds too)."""
    p, method = ctx.exp.method, ctx.method
    model = method.build_model(p, ctx.image_shape, ctx.device)
    fed = make_federation(p, model, train_data(ctx), ctx.resume_path, ctx.fingerprint)
    return model, fed


def pretrain(ctx) -> None:
    model, fed = federation(ctx)
    run_federation(ctx, fed, model)
    ctx.method.save(model, ctx.out / "model.pt", ctx.image_shape)
    ctx.info.update(ctx.method.describe(model))


def encoder(ctx) -> nn.Module:
    return ctx.method.load_encoder(ctx)
