"""The one federation builder (:mod:`fedssl.rounds.recipe`): what it does for every method's
recipe (the strategy's local objective around each pass, the params' strategy choice stacked
over the method's strategy, a method's own forward under the precision policy, a per-round
schedule of passes), what a recipe must say, and the momentum twin models share."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.func import functional_call

from fedssl.fl.cohort import Batch, on_outputs
from fedssl.fl.state import FederationConfig, FedState
from fedssl.methods import federated, registry
from fedssl.models.momentum import momentum_twin, twin_pairs
from fedssl.precision import policy
from fedssl.rounds.recipe import Local, Recipe, Schedule, build_federation
from fedssl.strategies.base import Strategy
from fedssl.strategies.fedprox import FedProx
from tests.fl.test_engine import SHAPE, noisy_views, simclr_loss, tiny_model, toy_data

CFG = FederationConfig(rounds=2, client_fraction=1.0, lr=0.01, seed=0)


class Marking(Strategy):
    """A strategy whose local objective marks the losses it wraps."""

    def local_objective(self, loss, model):
        def marked(*args):
            return loss(*args)

        marked.wrapped = loss
        return marked


def local(epochs: int = 1, **phase) -> Local:
    return Local(lambda size: noisy_views, 16, epochs, step_loss=simclr_loss(0.5), **phase)


def test_every_pass_trains_the_strategys_local_objective_but_one_that_holds_its_own(tmp_path):
    """A pass whose loss already holds the strategy's term (MpFedcon's SCAFFOLD baseline, its
    correction in a companion network) is not wrapped twice."""
    passes = [
        local(1),
        local(2, trainable=lambda s: {"head.0.weight"}),
        local(1, own_objective=True),
    ]
    recipe = Recipe(CFG, lambda cfg, model, data: Marking(cfg), phases=lambda m, s: passes)
    fed = build_federation(recipe, tiny_model(), toy_data(), tmp_path / "ck.pt", "fp")
    phases = fed.trainer.phases
    assert [ph.cohort.local_epochs for ph in phases] == [1, 2, 1]
    assert [hasattr(ph.cohort.loss_fn, "wrapped") for ph in phases] == [True, True, False]
    assert phases[1].trainable(None) == {"head.0.weight"}


def test_the_params_strategy_choice_stacks_over_the_methods_strategy(tmp_path):
    """FedSimCLR with ``strategy: fedprox``: the builder stacks FedProx over the method's
    FedAvg and trains FedProx's objective, not the bare loss."""
    p = registry.get("fedsimclr").params.model_validate(
        {
            "name": "fedsimclr",
            "model": {"arch": "small_cnn", "width": 4, "proj_hidden": 16, "proj_dim": 8},
            "federation": {
                "rounds": 1,
                "local_epochs": 1,
                "batch_size": 16,
                "lr": 0.01,
                "strategy": {"kind": "fedprox", "mu": 0.1},
            },
        }
    )
    model = federated.build_model(p, SHAPE, torch.device("cpu"))
    fed = federated.make_federation(p, model, toy_data(), tmp_path / "ck.pt", "fp")
    assert isinstance(fed.strategy, FedProx)
    assert fed.strategy.anchored  # its local objective wraps the cohort's loss


def test_a_schedule_picks_the_rounds_passes(tmp_path):
    schedule = Schedule({"one": [local(1)], "two": [local(1), local(1)]}, lambda s: "one")
    recipe = Recipe(CFG, lambda cfg, m, d: Strategy(cfg), phases=lambda m, s: schedule)
    fed = build_federation(recipe, tiny_model(), toy_data(), tmp_path / "ck.pt", "fp")
    state = FedState(0, {}, {}, None)
    assert len(fed.trainer.phases_of(state)) == 1


def test_a_recipe_says_one_way_its_clients_train_and_a_pass_one_loss():
    with pytest.raises(ValueError, match="one local pass, phases or a trainer"):
        Recipe(CFG, lambda cfg, m, d: Strategy(cfg))
    with pytest.raises(ValueError, match="one local pass, phases or a trainer"):
        Recipe(CFG, lambda cfg, m, d: Strategy(cfg), local=local(), phases=lambda m, s: [])
    with pytest.raises(ValueError, match="either a loss of the outputs or a step loss"):
        Local(lambda size: noisy_views, 16, 1)
    with pytest.raises(ValueError, match="a forward goes with a loss of its outputs"):
        Local(lambda size: noisy_views, 16, 1, step_loss=simclr_loss(0.5), forward=print)


def test_a_methods_own_forward_runs_under_the_precision_policy():
    """The builder's one region: a method's forward computes in bf16 where the policy says so
    (its outputs reach the loss as computed), in fp32 under ``fp32``."""
    net = nn.Linear(4, 2)
    batch = Batch((torch.rand(3, 4),), torch.zeros(3), torch.ones(3, dtype=torch.bool))
    seen = []

    def own(model, state, batch):
        return functional_call(model, state, (batch.views[0],))

    loss = on_outputs(lambda out, b: seen.append(out.dtype) or out.float().sum(), own)
    weights = dict(net.named_parameters())
    for setting in ("bf16", "fp32"):
        with policy(setting):
            loss(net, weights, {}, batch)
    assert seen == [torch.bfloat16, torch.float32]


def test_a_momentum_twin_is_a_frozen_copy_paired_by_name():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder, self.head = nn.Linear(3, 3), nn.Linear(3, 1)
            self.target = momentum_twin(encoder=self.encoder)

    net = Net()
    assert torch.equal(net.target["encoder"].weight, net.encoder.weight)
    assert net.target["encoder"].weight is not net.encoder.weight
    assert not any(q.requires_grad for q in net.target.parameters())
    names = [k for k, _ in net.named_parameters()]
    assert twin_pairs(names, net.target) == {
        "target.encoder.weight": "encoder.weight",
        "target.encoder.bias": "encoder.bias",
    }


@pytest.mark.parametrize("setting,vectorised", [("on", True), ("off", False), ("auto", False)])
def test_a_trainer_of_its_own_gets_the_model_strategy_data_and_the_parallel_setting(
    tmp_path, setting, vectorised
):
    """Split learning's slot: the builder hands the trainer what it trains (the recipe's
    model), its strategy (the one the federation drives), the clients' data, and whether to
    vectorise them as ``parallel`` says on their device (``auto``: not on the CPU)."""
    seen = []

    class Trainer:
        def train_round(self, fed, state, chosen, round_, lr):
            raise AssertionError("not trained here")

    def trainer(model, strategy, data, parallel):
        seen.append((model, strategy, data, parallel))
        return Trainer()

    model, data = tiny_model(), toy_data()
    recipe = Recipe(CFG, lambda cfg, m, d: Strategy(cfg, d), trainer=trainer, parallel=setting)
    fed = build_federation(recipe, model, data, tmp_path / "ck.pt", "fp")
    assert isinstance(fed.trainer, Trainer)
    assert seen == [(model, fed.strategy, data, vectorised)]


def test_only_the_builder_constructs_a_federation():
    """One builder: no module of the library but the recipe's calls ``Federation(...)``, so
    every method's federation gets the strategy choice and the precision policy one way."""
    root = Path(federated.__file__).parents[1]
    callers = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            func = getattr(node, "func", None) if isinstance(node, ast.Call) else None
            name = getattr(func, "id", None) or getattr(func, "attr", None)
            if name == "Federation":
                callers.add(path.relative_to(root.parent).as_posix())
    assert callers == {"fedssl/rounds/recipe.py"}
