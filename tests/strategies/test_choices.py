"""The ``strategy:`` choice: registered params models assembled into every federation block's
union, and the chosen strategy stacked over a method's own (:mod:`fedssl.strategies.compose`)."""

from __future__ import annotations

from typing import Literal

import pytest
import torch
from pydantic import ValidationError

from fedssl.methods import registry
from fedssl.strategies import choices
from fedssl.strategies.choices.fedprox import FedProxParams
from fedssl.strategies.choices.scaffold import ScaffoldParams
from fedssl.strategies.compose import Over, chosen_over
from fedssl.strategies.fedavg import FedAvg
from fedssl.strategies.fedprox import FedProx
from fedssl.strategies.scaffold import Scaffold
from tests.strategies.toy import federation, toy_clients


def test_every_federated_method_offers_the_choice_fedavg_by_default():
    offered = {}
    for method in registry.all():
        for block in federation_blocks(method.params):
            assert block.model_fields["strategy"].default.kind == "fedavg", method.name
            offered[method.name] = choice_kinds(block)
    assert offered["fedsimclr"] == offered["fedbyol"] == sorted(choices.choices())
    # MFCL's phase 1 counts batches in pairs, MpFedcon its epochs per phase (no SCAFFOLD K);
    # a LW-FedSSL stage uploads some blocks (no SCAFFOLD server step)
    assert offered["mfcl"] == offered["mpfedcon"] == ["fedavg", "fedprox"]
    assert offered["lw_fedssl"] == offered["prog_fedssl"] == ["fedavg", "fedprox"]
    assert offered["supervised"] == offered["featarc"] == ["fedavg", "fedprox"]
    assert offered["mocosfl"] == offered["cpcfl"] == ["fedavg"]
    assert len(offered) == 16  # every method but none, gradient_leakage and vit_scratch


def federation_blocks(model):
    """The federation blocks in a params model (its own fields or a section's)."""
    if "strategy" in model.model_fields and "rounds" in model.model_fields:
        yield model
    for field in model.model_fields.values():
        if isinstance(field.annotation, type) and hasattr(field.annotation, "model_fields"):
            yield from federation_blocks(field.annotation)


def choice_kinds(block) -> list[str]:
    schema = block.model_json_schema()
    prop = schema["properties"]["strategy"]
    refs = [r["$ref"] for r in prop.get("oneOf", [prop])] if "oneOf" in prop else [prop["$ref"]]
    return sorted(schema["$defs"][r.split("/")[-1]]["properties"]["kind"]["const"] for r in refs)


def test_a_registered_choice_joins_the_union_of_a_new_block_without_a_central_edit(monkeypatch):
    monkeypatch.setattr(choices, "_CHOICES", dict(choices.choices()))

    @choices.register
    class Median(choices.StrategyParams):  # a drop-in declaration file would hold this
        kind: Literal["median"] = "median"
        title = "Median"

    block = choices.federation_block(local_epochs=1, batch_size=4, lr=0.1)
    assert "median" in choices.choices()
    assert choice_kinds(block) == sorted(choices.choices())
    assert block(rounds=1, strategy={"kind": "median"}).strategy == Median()
    with pytest.raises(ValidationError, match="fedprox"):  # the union names what it accepts
        block(rounds=1, strategy={"kind": "fedprx", "mu": 0.1})
    # a choice whose settings the block lacks is not offered (SCAFFOLD counts local steps)
    assert "scaffold" not in choice_kinds(choices.federation_block(lr=0.1))


def test_the_schema_lists_every_choice_with_its_settings():
    import json
    from pathlib import Path

    schema = json.loads(Path("schemas/experiment.schema.json").read_text())
    defs = schema["$defs"]
    for model in choices.choices().values():
        assert model.__name__ in defs, model.__name__
    assert defs["FedProxParams"]["required"] == ["mu"]


def one_round(strategy, tmp_path):
    model, fed = federation(strategy, toy_clients(), tmp_path, rounds=2, steps=3)
    return fed.run(fed.start(model))


def same_state(a, b) -> None:
    assert a.ledger == b.ledger
    assert [r["loss"] for r in a.log] == [r["loss"] for r in b.log]
    for part in a.server:
        for k, v in a.server[part].items():
            assert torch.equal(v, b.server[part][k]), (part, k)
    for c, kept in a.clients.items():
        assert kept.keys() == b.clients[c].keys()
        assert all(torch.equal(v, b.clients[c][k]) for k, v in kept.items())


@pytest.mark.parametrize("mixin", ["fedprox", "scaffold"])
def test_a_choice_over_the_methods_strategy_is_the_mixin_itself(mixin, tmp_path):
    """FedProx or SCAFFOLD stacked over a method's FedAvg through ``Over`` trains the very
    tensors of the library class mixed in directly: every hook reaches the inner strategy."""
    batch = max(toy_clients().sizes())
    block = block_with(mixin, local_epochs=3, batch_size=batch)
    direct = {
        "fedprox": lambda cfg: FedProx(cfg, mu=0.5),
        "scaffold": lambda cfg: Scaffold(cfg, local_epochs=3, batch_size=batch),
    }[mixin]
    stacked = one_round(lambda cfg: chosen_over(FedAvg(cfg), block), tmp_path / "over")
    same_state(stacked, one_round(direct, tmp_path / "direct"))
    assert stacked.log[0]["loss"] != one_round(FedAvg, tmp_path / "plain").log[0]["loss"] or (
        mixin == "scaffold"  # SCAFFOLD's first round: c = c_i = 0, FedAvg's steps
    )


def block_with(kind: str, **settings):
    model = choices.federation_block(**settings, lr=0.1)
    strategy = {"fedprox": {"kind": "fedprox", "mu": 0.5}, "scaffold": {"kind": "scaffold"}}
    return model(rounds=2, strategy=strategy[kind])


def test_over_forwards_what_a_method_reads_of_its_strategy(tmp_path):
    class Own(FedAvg):
        marker = "the method's"

    over = chosen_over(Own(FedAvg(None).cfg), block_with("fedprox"))
    assert isinstance(over, FedProx) and isinstance(over, Over)
    assert over.marker == "the method's" and over.mu == 0.5
    assert not over.needs_uploads()  # FedProx keeps FedAvg's running mean
    scaffold = chosen_over(Own(None), block_with("scaffold", local_epochs=1, batch_size=4))
    assert scaffold.needs_uploads()  # SCAFFOLD's server step reads every upload


def test_default_choice_leaves_the_methods_strategy_as_it_is():
    own = FedAvg(None)
    model = choices.federation_block(lr=0.1)
    assert chosen_over(own, model(rounds=1)) is own
    assert isinstance(FedProxParams(mu=0.1).mixin()(None, mu=0.1), FedProx)
    assert ScaffoldParams().options(block_with("scaffold", local_epochs=2, batch_size=8)) == {
        "local_epochs": 2,
        "batch_size": 8,
        "eta_g": 1.0,
    }
