"""The training of a :class:`fedssl.methods.base.FederatedMethod` (imported when its step runs):
the seeded model, the clients' views, the cohort trainer running the method's loss under the
precision policy, the method's strategy under the params' ``strategy`` choice, the federation
resumed from its checkpoint; and the default hooks (a contrastive model under FedAvg)."""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from fedssl.data.augment import BatchAugment, multi_view
from fedssl.fl.cohort import (
    CohortTrainer,
    LocalData,
    OptimizerConfig,
    on_outputs,
    vectorise_clients,
)
from fedssl.fl.state import federation_config
from fedssl.methods import registry
from fedssl.methods.base import call_hook, resolve_hook
from fedssl.models.encoders import load_encoder, save_contrastive_model, seeded_contrastive_model
from fedssl.rounds.loop import Federation, LocalTraining, Phase
from fedssl.rounds.runner import run_federation, train_data
from fedssl.strategies.compose import chosen_over
from fedssl.strategies.fedavg import FedAvg


def make_federation(p, model: nn.Module, data: LocalData, ckpt, fingerprint) -> Federation:
    """The federation of the method whose params are ``p``, over ``data``, training ``model``."""
    method = registry.get(p.name)
    cfg = federation_config(p, p.seed, p.lr_schedule)
    cfg = replace(cfg, rounds=cfg.rounds + method.setup_rounds)
    strategy = chosen_over(call_hook(method.strategy, cfg, model, p, data), p)
    loss = trainer_loss(p)
    cohort = CohortTrainer(
        model,
        views_of(p, data.images.shape[-1]),
        strategy.local_objective(loss, model),
        OptimizerConfig.of(p),
        batch_size=p.batch_size,
        local_epochs=p.local_epochs,
        parallel=vectorise_clients(p.parallel_clients, data.device),
        after_step=call_hook(method.after_step, model, p) if method.after_step else None,
    )
    training = local_training(cohort, method.setup_rounds)
    return Federation(strategy, training, data, cfg, ckpt, fingerprint)


def views_of(p, size: int):
    """The cohort's view builder of the method whose params are ``p``, for images of ``size``."""
    method = registry.get(p.name)
    if method.make_views:
        return call_hook(method.make_views, p, size)
    return multi_view(BatchAugment(p.augment, size), views=method.views)


def local_training(cohort: CohortTrainer, setup_rounds: int) -> LocalTraining:
    """Every round trains ``cohort``, but the first ``setup_rounds``, which train nothing."""
    if not setup_rounds:
        return LocalTraining(cohort)
    return LocalTraining(phases=lambda s: [Phase(cohort)] if s.round >= setup_rounds else [])


def trainer_loss(p):
    """The cohort trainer's loss of the method whose params are ``p``: its whole-step loss, or
    its loss of the model's outputs, the forward run under the precision policy."""
    method = registry.get(p.name)
    if method.step_loss:
        return call_hook(method.step_loss, p)
    loss = resolve_hook(method.loss)
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
    state = run_federation(ctx, fed, model)
    method = ctx.method
    call_hook(method.save, model, ctx.out / "model.pt", ctx.image_shape)
    if method.describe:
        ctx.info.update(call_hook(method.describe, model))
    if method.save_state:
        ctx.info.update(call_hook(method.save_state, fed.strategy, state, ctx.out))


# ---------------------------------------------------------------------- the default hooks
def contrastive_model(p, image_shape, device) -> nn.Module:
    return seeded_contrastive_model(p.model, image_shape, p.seed, device)


def chosen_strategy(cfg, model, p, data):
    """The strategy of a method that names none: FedAvg, under the params' ``strategy``
    choice (which :func:`make_federation` stacks over every method's own)."""
    return FedAvg(cfg)


def save_contrastive(model, path, image_shape) -> None:
    """The whole model's state and the image shape."""
    save_contrastive_model(model, path, image_shape)


def parameter_count(model) -> dict:
    return {"parameters": sum(q.numel() for q in model.parameters())}


def contrastive_encoder(ctx) -> nn.Module:
    """The frozen backbone (or backbone + projection) of the saved model, for the probes."""
    projection = ctx.exp.features.layer == "projection"
    path = ctx.input("pretrain") / "model.pt"
    return load_encoder(ctx.exp.method.model, path, ctx.device, projection)
