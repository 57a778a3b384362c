"""The training of a :class:`fedssl.methods.base.SupervisedFederatedMethod` (imported when its
``train`` step runs): the seeded network (in its wrapper) and the recipe of its hooks (the
clients' labelled views, the method's loss, SGD, its strategy under the params' ``strategy``
choice), which the one builder
(:func:`fedssl.rounds.recipe.build_federation`) makes a federation of, resumed from its
checkpoint; then the global network, its test accuracy and the frozen encoder the probes read.
:class:`ScoredFedAvg` is the default strategy."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from fedssl.data.augment import views_of
from fedssl.eval.global_model import global_accuracy, load_saved, num_classes, test_split
from fedssl.fl.cohort import LocalData, LossFn, OptimizerConfig
from fedssl.fl.state import FedState, federation_config
from fedssl.methods import registry
from fedssl.methods.hooks import call_hook, resolve_hook
from fedssl.rounds.loop import Federation
from fedssl.rounds.recipe import Local, Recipe, build_federation
from fedssl.rounds.runner import run_federation, train_data
from fedssl.stage.runtime import derive_seed, torch_save, write_json
from fedssl.strategies.base import Strategy

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext


class ScoredFedAvg(Strategy):
    """The engine's size-weighted FedAvg of the whole model, the global network scored on the
    test split after every round (``global_top1``)."""

    def __init__(self, cfg, p, model: nn.Module, data: LocalData, tests: LocalData):
        super().__init__(cfg, data)
        self.p, self.model, self.tests = p, model, tests

    def evaluate(self, state: FedState, round_: int) -> dict:
        top1 = global_accuracy(network_of(self.model), state.server["global"], self.tests)
        return {"global_top1": round(top1, 4)}


def network_of(model: nn.Module) -> nn.Module:
    """The network the server averages, saves and scores: the wrapper's ``net``, or the model."""
    return getattr(model, "net", model)


def build_network(p, image_shape, classes: int) -> nn.Module:
    """The untrained network of the method whose params are ``p``."""
    return call_hook(registry.get(p.name).network, p, image_shape, classes)


def build_model(p, image_shape, classes: int, device) -> nn.Module:
    """The seeded module the clients train: the network (its own init stream), wrapped."""
    method = registry.get(p.name)
    torch.manual_seed(init_seed(p, method.name))
    model = build_network(p, image_shape, classes)
    if method.wrapper:
        model = call_hook(method.wrapper, p, model)
    return model.to(device)


def init_seed(p, name: str) -> int:
    """The seed the network is drawn under. ``init: encoder`` shares the encoders' stream
    (:func:`fedssl.models.encoders.seeded_contrastive_model`): the network builds its encoder
    first, so a supervised line and its untrained twin start from the same encoder weights."""
    if getattr(p, "init", "own") == "encoder":
        return derive_seed(p.seed, "init")
    return derive_seed(p.seed, "init", f"{name}-net")


def local_pass(p) -> Local:
    """The clients' local training of the method whose params are ``p``: its labelled views,
    its loss (of the outputs, or a whole-step loss), SGD with momentum."""
    method = registry.get(p.name)
    if method.step_loss:
        loss = {"step_loss": call_hook(method.step_loss, p)}
    else:
        of_outputs = resolve_hook(method.loss)
        loss = {"loss": lambda outputs, batch: of_outputs(outputs, batch, p)}
    return Local(
        views=lambda size: views_of(p),
        batch_size=p.federation.batch_size,
        local_epochs=p.federation.local_epochs,
        optimizer=OptimizerConfig(
            "sgd", weight_decay=p.federation.weight_decay, momentum=p.federation.momentum
        ),
        **loss,
    )


def trainer_loss(p) -> LossFn:
    """The cohort trainer's loss (before the strategy's local objective)."""
    return local_pass(p).objective()


def recipe(p, tests: LocalData) -> Recipe:
    """The federation's recipe: the method's strategy (scoring on ``tests``), its local pass."""
    strategy = registry.get(p.name).strategy
    return Recipe(
        config=federation_config(p.federation, p.seed),
        strategy=lambda cfg, model, data: call_hook(strategy, cfg, p, model, data, tests),
        local=local_pass(p),
        parallel=p.federation.parallel_clients,
        choice=p.federation,
    )


def make_federation(p, model, data: LocalData, tests: LocalData, ckpt, fingerprint) -> Federation:
    """The federation of the method whose params are ``p``, over ``data``, training ``model``."""
    return build_federation(recipe(p, tests), model, data, ckpt, fingerprint)


def train(ctx: StepContext) -> None:
    """The ``train`` step: the federation (resumable), then the global network (``model.pt``,
    with its image shape and classes) and its test accuracy (``global.json``)."""
    p, method = ctx.exp.method, ctx.method
    data, tests = train_data(ctx), test_split(ctx)
    classes = num_classes(data, tests)
    model = build_model(p, ctx.image_shape, classes, ctx.device)
    fed = make_federation(p, model, data, tests, ctx.resume_path, ctx.fingerprint)
    state = run_federation(ctx, fed, model)
    net = network_of(model)
    save_network(net, ctx.out / "model.pt", ctx.image_shape, classes)
    top1 = global_accuracy(net, state.server["global"], tests)
    write_json(ctx.results_dir / "global.json", {"global_top1": round(top1, 4)})
    ctx.info.update(classes=classes, parameters=sum(q.numel() for q in net.parameters()))
    if method.describe:
        ctx.info.update(call_hook(method.describe, fed, p))


def save_network(net: nn.Module, path, image_shape, classes: int) -> None:
    """The global network as the ``train`` step's ``model.pt`` (weights, image shape, classes)."""
    saved = {"model": net.state_dict(), "image_shape": tuple(image_shape), "classes": classes}
    torch_save(saved, path)


def load_network(ctx: StepContext, device=None) -> nn.Module:
    """The ``train`` step's global network (on ``device``, default the stage's)."""
    saved = load_saved(ctx, device)
    net = build_network(ctx.exp.method, saved["image_shape"], saved["classes"])
    net.load_state_dict(saved["model"])
    return net.to(device or ctx.device)


def encoder(ctx: StepContext) -> nn.Module:
    """The frozen global encoder for the shared probes (``features.layer``)."""
    projection = ctx.exp.features.layer == "projection"
    return call_hook(ctx.method.encoder_of, load_network(ctx), projection)


def untrained_encoder(p, image_shape, projection: bool = False) -> nn.Module:
    """The module :func:`encoder` returns, untrained (what an export loads into)."""
    network = build_network(p, image_shape, 1)
    return call_hook(registry.get(p.name).encoder_of, network, projection)
