"""The runtime of every :class:`fedssl.methods.base.FederatedMethod` (imported when its step
runs): the method's recipe (:class:`fedssl.rounds.recipe.Recipe`), its seeded model and the
federation the one builder makes of them, resumed from its checkpoint, logged by the recipe's
monitor (or the library's); then what the recipe saves and writes of the finished run. And the
defaults a recipe starts from (:func:`contrastive_recipe`): a contrastive model under the
strategy the params choose, two augmented views, the whole model saved."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from fedssl.data.augment import BatchAugment, multi_view
from fedssl.fl.cohort import LocalData, LossFn, OptimizerConfig
from fedssl.fl.state import federation_config
from fedssl.methods import registry
from fedssl.methods.hooks import resolve_hook
from fedssl.models.encoders import load_encoder, save_contrastive_model, seeded_contrastive_model
from fedssl.rounds.loop import Federation
from fedssl.rounds.recipe import FinishedRun, Local, Recipe, build_federation
from fedssl.rounds.runner import run_federation, train_data
from fedssl.strategies.fedavg import FedAvg

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext


def recipe_of(p) -> Recipe:
    """The recipe of the method whose params are ``p``."""
    return resolve_hook(registry.get(p.name).recipe)(p)


def make_federation(p, model: nn.Module, data: LocalData, ckpt, fingerprint) -> Federation:
    """The federation of the method whose params are ``p``, over ``data``, training ``model``."""
    return build_federation(recipe_of(p), model, data, ckpt, fingerprint)


def trainer_loss(p) -> LossFn:
    """The cohort trainer's loss of the method whose params are ``p`` (its local pass's), before
    the strategy's local objective."""
    return recipe_of(p).local.objective()


def build_model(p, image_shape, device) -> nn.Module:
    """The seeded initial model of the method whose params are ``p``."""
    return recipe_of(p).model(image_shape, device)


def federation(ctx: StepContext) -> tuple[nn.Module, Federation]:
    """The pretraining stage's model and federation (what a Flower client builds too)."""
    p = ctx.exp.method
    recipe = recipe_of(p)
    model = recipe.model(ctx.image_shape, ctx.device)
    fed = build_federation(recipe, model, train_data(ctx), ctx.resume_path, ctx.fingerprint)
    return model, fed


def pretrain(ctx: StepContext) -> None:
    recipe = recipe_of(ctx.exp.method)
    model, fed = federation(ctx)
    state = run_federation(ctx, fed, model, monitor=recipe.monitor)
    if recipe.save:
        recipe.save(model, ctx.out / "model.pt", ctx.image_shape)
    if recipe.describe:
        ctx.info.update(recipe.describe(model))
    if recipe.outputs:
        ctx.info.update(recipe.outputs(FinishedRun(ctx, model, fed.strategy, state, fed.data)))


# ---------------------------------------------------------------------- the defaults
def contrastive_recipe(p, **parts) -> Recipe:
    """The recipe of a method on a federation block ``p`` (``rounds``, ``lr``, ``lr_schedule``,
    ``batch_size``, ``local_epochs``, the optimiser, ``parallel_clients``, ``augment``,
    ``seed``, ``strategy``): a seeded contrastive model, two augmented views, FedAvg under the
    params' strategy choice, the whole model saved, its parameter count recorded. ``parts``:
    the method's own, the fields of :class:`Local` (``loss`` at least) and of :class:`Recipe`
    by name."""
    local_fields = set(Local.__dataclass_fields__)
    local = {k: v for k, v in parts.items() if k in local_fields}
    local.setdefault("views", lambda size: multi_view(BatchAugment(p.augment, size), views=2))
    defaults = {
        "model": lambda shape, device: seeded_contrastive_model(p.model, shape, p.seed, device),
        "strategy": lambda cfg, model, data: chosen_strategy(cfg, model, p, data),
        "save": save_contrastive_model,
        "describe": parameter_count,
        **{k: v for k, v in parts.items() if k not in local_fields},
    }
    return Recipe(
        config=federation_config(p.federation, p.seed, p.federation.lr_schedule),
        local=Local(
            batch_size=p.federation.batch_size,
            local_epochs=p.federation.local_epochs,
            optimizer=OptimizerConfig.of(p.federation),
            **local,
        ),
        parallel=p.federation.parallel_clients,
        choice=p.federation,
        **defaults,
    )


def chosen_strategy(cfg, model, p, data):
    """The strategy of a method that names none: FedAvg, under the params' ``strategy``
    choice (which the builder stacks over every method's own)."""
    return FedAvg(cfg)


def parameter_count(model) -> dict:
    return {"parameters": sum(q.numel() for q in model.parameters())}


def contrastive_encoder(ctx: StepContext) -> nn.Module:
    """The frozen backbone (or backbone + projection) of the saved model, for the probes."""
    projection = ctx.exp.features.layer == "projection"
    path = ctx.input("pretrain") / "model.pt"
    return load_encoder(ctx.exp.method.model, path, ctx.device, projection)
