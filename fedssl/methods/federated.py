"""The training of a :class:`fedssl.methods.base.FederatedMethod` (imported when its step runs):
the seeded model, the clients' views, the cohort trainer running the method's loss under the
precision policy, the method's strategy, the federation resumed from its checkpoint; and the
default hooks (a contrastive model under the strategy the params choose)."""

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
from fedssl.methods.base import call_hook, resolve_hook
from fedssl.models.encoders import load_encoder, save_contrastive_model, seeded_contrastive_model


def make_federation(p, model: nn.Module, data: LocalData, ckpt, fingerprint) -> Federation:
    """The federation of the method whose params are ``p``, over ``data``, training ``model``."""
    method = registry.get(p.name)
    cfg = federation_config(p, p.seed, p.lr_schedule)
    strategy = call_hook(method.strategy, cfg, model, p)
    loss = trainer_loss(p)
    cohort = CohortTrainer(
        model,
        multi_view(BatchAugment(p.augment, data.images.shape[-1]), views=method.views),
        strategy.local_objective(loss, model),
        OptimizerConfig.of(p),
        batch_size=p.batch_size,
        local_epochs=p.local_epochs,
        parallel=vectorise_clients(p.parallel_clients, data.device),
        after_step=call_hook(method.after_step, model, p) if method.after_step else None,
    )
    return Federation(strategy, LocalTraining(cohort), data, cfg, ckpt, fingerprint)


def trainer_loss(p):
    """The cohort trainer's loss of the method whose params are ``p``: its loss of the model's
    outputs, the forward run under the precision policy."""
    loss = resolve_hook(registry.get(p.name).loss)
    return on_outputs(lambda outputs, batch: loss(outputs, batch, p))


def build_model(p, image_shape, device) -> nn.Module:
    """The seeded initial model of the method whose params are ``p``."""
    return call_hook(registry.get(p.name).model, p, image_shape, device)


def federation(ctx) -> tuple[nn.Module, Federation]:
    """The pretraining stage's model and federation (what a Flower client builds too)."""
    p = ctx.exp.method
    model = build_model(p, ctx.image_shape, ctx.device)
    fed = make_federation(p, model, train_data(ctx), ctx.resume_path, ctx.fingerprint)
    return model, fed


def pretrain(ctx) -> None:
    model, fed = federation(ctx)
    run_federation(ctx, fed, model)
    method = ctx.method
    call_hook(method.save, model, ctx.out / "model.pt", ctx.image_shape)
    ctx.info.update(call_hook(method.describe, model))


# ---------------------------------------------------------------------- the default hooks
def contrastive_model(p, image_shape, device) -> nn.Module:
    return seeded_contrastive_model(p.model, image_shape, p.seed, device)


def chosen_strategy(cfg, model, p):
    """The library strategy the params' ``strategy`` field chooses (FedAvg, FedProx, ...)."""
    from fedssl.strategies import choose

    return choose.strategy(p.strategy, cfg)


def save_contrastive(model, path, image_shape) -> None:
    save_contrastive_model(model, path, image_shape)


def parameter_count(model) -> dict:
    return {"parameters": sum(q.numel() for q in model.parameters())}


def contrastive_encoder(ctx) -> nn.Module:
    """The frozen backbone (or backbone + projection) of the saved model, for the probes."""
    projection = ctx.exp.features.layer == "projection"
    path = ctx.input("pretrain") / "model.pt"
    return load_encoder(ctx.exp.method.model, path, ctx.device, projection)
