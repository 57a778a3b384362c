"""A method's hooks are typed references (:mod:`fedssl.methods.hooks`), checked when the plugin
registers from the named module's source: a misspelt attribute or a signature its field's
protocol cannot call stops the import, naming the method and the field."""

from __future__ import annotations

import ast
import inspect
from typing import Literal

import pytest

from fedssl.methods import registry
from fedssl.methods.base import FederatedMethod, MethodParams, Step, check_hooks
from fedssl.methods.hooks import (
    Hook,
    Signature,
    arity,
    as_hook,
    definition,
    hook_fields,
    resolve_hook,
    signature,
)
from fedssl.methods.registry import register

RECIPE = Hook("fedssl.methods.fedsimclr.train", "recipe")


class TypoParams(MethodParams):
    name: Literal["typo"] = "typo"


def plugin(**fields) -> type:
    """A plugin declared as FedSimCLR is, with ``fields`` in its declaration."""
    attrs = {"name": "typo", "label": "Typo", "params": TypoParams, "recipe": RECIPE}
    attrs |= {"package": "fedssl.methods.fedsimclr", "costs_module": "fedssl.costs.end_to_end"}
    return type("Typo", (FederatedMethod,), {**attrs, **fields})


def refused(cls: type) -> str:
    with pytest.raises(TypeError) as failure:
        register(cls)
    assert "typo" not in [m.name for m in registry.all()]
    return str(failure.value)


def test_a_misspelt_attribute_fails_at_import_naming_the_method_and_field():
    tables = Hook("fedssl.methods.mfcl.tables", "tabels")
    assert refused(plugin(report_tables=tables)) == (
        "method 'typo': Typo.report_tables = fedssl.methods.mfcl.tables:tabels: "
        "module fedssl.methods.mfcl.tables defines no 'tabels'"
    )
    nowhere = plugin(recipe=Hook("fedssl.methods.nowhere", "recipe"))
    assert "Typo.recipe = fedssl.methods.nowhere:recipe: " in refused(nowhere)
    assert "is not a project module" in refused(nowhere)
    check_hooks(plugin())  # the declaration it was copied from passes


def test_a_wrong_signature_fails_at_import_naming_the_method_and_field():
    figures = Hook("fedssl.methods.mocosfl.report", "figures")  # (rows, out_dir)
    assert refused(plugin(report_tables=figures)) == (
        "method 'typo': Typo.report_tables = fedssl.methods.mocosfl.report:figures: called as a "
        "ReportTables, with 1 positional argument, but it requires 2 (rows, out_dir)"
    )
    # a step's runner gets the stage context and then the step's args: LW-FedSSL's grow(ctx, s)
    grow = Hook("fedssl.methods.lwfedssl.run", "grow")
    attack = Step("attack", reads=("method",), runner=grow)
    message = refused(plugin(later_steps=(attack,)))
    assert message.startswith("method 'typo': Typo.steps[attack].runner = ")
    assert message.endswith(
        "called as a StepRunner, with 1 positional argument, but it requires 2 (ctx, s)"
    )
    check_hooks(plugin(later_steps=(Step("attack", reads=("method",), runner=grow, args=(1,)),)))
    flower = plugin(flower_steps={"pretrain": figures})
    assert "Typo.flower_steps[pretrain] = " in refused(flower)
    # a hook in a field no base types is refused rather than left unchecked
    assert refused(plugin(report_table=figures)) == (
        "method 'typo': Typo.report_table: a Hook in a field no base types as Hook[protocol]"
    )


def test_a_string_is_refused_in_every_hook_field_and_cost_hooks_are_checked_alike():
    """Every hook field, the cost hooks included, wants a Hook: a ``"module:function"`` string
    escapes the type checker."""
    message = refused(plugin(recipe="fedssl.methods.fedsimclr.train:recipe"))
    assert message == (
        "method 'typo': Typo.recipe = 'fedssl.methods.fedsimclr.train:recipe': "
        "expected a Hook(module, name), a RecipeOf"
    )
    costs = plugin()  # its base names its costs as Hooks; one of them the wrong function
    assert costs.client_costs_hook == Hook("fedssl.costs.end_to_end", "client_costs")
    check_hooks(costs)
    costs.client_costs_hook = "fedssl.costs.end_to_end:client_costs"
    assert refused(costs).endswith("expected a Hook(module, name), a ClientCosts")
    costs.client_costs_hook = Hook("fedssl.costs.end_to_end", "contrastive_client_costs")
    assert "called as a ClientCosts, with 1 positional argument, but it requires 5" in refused(
        costs
    )


def test_signatures_are_read_from_the_source():
    def of(source: str) -> Signature:
        return Signature.of_arguments(ast.parse(source).body[0].args)

    assert of("def f(a, b=1, *rest): ...").refuses(5) is None
    assert of("def f(a, b=1): ...").refuses(3) == "it takes 2 (a, b)"
    assert of("def f(a, b, /): ...").refuses(1) == "it requires 2 (a, b)"
    assert of("def f(a, *, key): ...").refuses(1) == "it also requires keyword-only key"
    # a class by its own __init__, a dataclass by its fields, a name imported from elsewhere
    classifier = signature(definition("fedssl.methods.fsl.train", "SplitClassifier"))
    assert classifier.positional == ("p", "image_shape", "classes")
    step = signature(definition("fedssl.methods.base", "Step"))
    assert (step.positional[:3], step.required) == (("name", "reads", "inputs"), 2)
    builder = definition("fedssl.methods.federated_supervised", "build_federation")
    assert builder.name == "build_federation" and builder.lineno > 1  # in fedssl.rounds.recipe
    assert definition("fedssl.methods.federated_supervised", "torch") is None  # not ours


@pytest.mark.parametrize("method", registry.all(), ids=lambda m: m.name)
def test_every_declared_hook_takes_what_its_field_passes(method):
    """The check reads source; the imported functions agree with it."""
    cls = type(method)
    declared = [(getattr(cls, f), spec, 0) for f, spec in hook_fields(cls).items()]
    declared += [(s.runner, None, len(s.args)) for s in cls.steps if s.runner]
    for ref, spec, extra in declared:
        if ref is not None:
            n = (arity(spec) if spec else 1) + extra
            inspect.signature(resolve_hook(ref)).bind(*range(n))  # TypeError if it cannot
            assert as_hook(str(ref)) == as_hook(ref)  # what plan records and cards write
