"""One declaration for the methods whose training is one federated `pretrain` step
(:class:`fedssl.methods.base.PretrainStepMethod`): a plugin names its package and the step, the
probes' encoder and the client costs point into that package's `run` and `costs` modules."""

from __future__ import annotations

import pytest

from fedssl.methods import registry
from fedssl.methods.base import (
    DATA,
    PARTITION,
    FederatedMethod,
    MethodParams,
    PretrainStepMethod,
    Step,
)
from fedssl.methods.hooks import Hook, hook_module, resolve_hook


class _Shared(PretrainStepMethod):
    """A base of several plugins that does not name a package: nothing is filled in."""


class Toy(_Shared):
    name = "toy_step"
    label = "Toy"
    params = MethodParams
    package = "somewhere.toy"


def test_the_step_and_hooks_point_into_the_named_package():
    (step,) = Toy.steps
    assert (step.name, step.reads, step.inputs, step.plots) == (
        "pretrain",
        ("partition", "method"),
        (DATA, PARTITION),
        ("rounds.tsv",),
    )
    assert step.runner == Hook("somewhere.toy.run", "pretrain")
    assert Toy.encoder_hook == Hook("somewhere.toy.run", "encoder")
    assert Toy.client_costs_hook == Hook("somewhere.toy.costs", "client_costs")
    assert Toy.projected_costs_hook == Hook("somewhere.toy.costs", "projected_costs")
    assert Toy.encoder_inputs == Toy.costs_inputs == ("pretrain",)
    assert _Shared.steps == () and _Shared.encoder_hook is None


class ToyWithAttack(_Shared):
    """Training that reads less than every param, logs more, and a step after it."""

    name = "toy_attack"
    label = "Toy attack"
    params = MethodParams
    package = "somewhere.attack"
    pretrain_reads = ("partition", "method.training")
    pretrain_plots = ("rounds.tsv", "steps.tsv")
    later_steps = (
        Step(
            "attack",
            reads=("method.attack",),
            inputs=(DATA, PARTITION, "pretrain"),
            runner=Hook("a", "b"),
        ),
    )


def test_training_reads_what_it_declares_and_later_steps_follow_it():
    pretrain, attack = ToyWithAttack.steps
    assert (pretrain.name, pretrain.reads, pretrain.plots) == (
        "pretrain",
        ("partition", "method.training"),
        ("rounds.tsv", "steps.tsv"),
    )
    assert pretrain.runner == Hook("somewhere.attack.run", "pretrain")
    assert attack is ToyWithAttack.later_steps[0]
    assert ToyWithAttack.client_costs_hook == Hook("somewhere.attack.costs", "client_costs")


def test_a_step_of_its_own_code_depends_on_run_and_costs_on_costs_only():
    toy = Toy()
    assert toy.hook_modules(None, "pretrain") == ["somewhere.toy.run"]
    assert toy.hook_modules(None, "costs") == ["somewhere.toy.costs"]
    assert toy.hook_modules(None, "features") == ["somewhere.toy.run"]


@pytest.mark.parametrize("name", ["fedsimclr", "featarc", "orchestra", "fedbyol", "fedema", "fedu"])
def test_every_hook_of_the_plugins_names_a_function_of_their_package(name):
    """Costs live in the method's package or the library's (``costs_module``: FedSimCLR's
    end-to-end recipe); training in its package too or, for a FederatedMethod, in the one
    runtime every such method shares; the encoder in either."""
    method = registry.get(name)
    assert isinstance(method, PretrainStepMethod)
    runtime = "fedssl.methods.federated"
    runs_in = runtime if isinstance(method, FederatedMethod) else method.package
    homes = {
        method.steps[0].runner: (runs_in,),
        method.encoder_hook: (runs_in, method.package),
        method.client_costs_hook: (method.package, "fedssl.costs"),
        method.projected_costs_hook: (method.package, "fedssl.costs"),
    }
    for hook, allowed in homes.items():
        module = hook_module(hook)
        assert any(module == h or module.startswith(h + ".") for h in allowed), hook
        assert callable(resolve_hook(hook))


def test_a_federated_method_is_a_recipe_on_the_shared_runtime():
    """FedSimCLR and the BYOL family declare one recipe, not a training module; their training
    stage depends on the runtime and the recipe's module (whose imports bring the loss)."""
    for name in ("fedsimclr", "fedbyol", "fedema", "fedu"):
        method = registry.get(name)
        assert isinstance(method, FederatedMethod)
        assert method.steps[0].runner == Hook("fedssl.methods.federated", "pretrain")
        assert method.flower_steps == {"pretrain": Hook("fedssl.methods.federated", "federation")}
        modules = method.hook_modules(None, "pretrain")
        assert modules == ["fedssl.methods.federated", f"{method.package}.train"]
        assert method.hook_modules(None, "costs") == [
            method.costs_module or f"{method.package}.costs"
        ]
    assert registry.get("fedsimclr").hook_modules(None, "costs") == ["fedssl.costs.end_to_end"]
