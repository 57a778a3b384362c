"""FedProx: the proximal term around any loss (value and gradient), and FedProx over a method
that has no round-start copy of its own (FedSimCLR), chosen in its params."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from fedssl.fl.state import FederationConfig
from fedssl.methods import federated
from fedssl.methods.fedsimclr import FedSimCLRParams
from fedssl.strategies.fedavg import FedAvg
from fedssl.strategies.fedprox import ANCHOR, FedProx, proximal
from tests.fl.test_engine import ReadsEveryUpload, make_fed, tiny_model, toy_data


def test_the_proximal_term_adds_mu_half_the_squared_distance_and_pulls_only_w():
    w = torch.tensor([1.0, -2.0], requires_grad=True)
    anchor = torch.tensor([0.5, 1.0], requires_grad=True)

    def base(model, params, buffers, batch):
        return (params["w"] ** 2).sum()

    loss = proximal(base, 0.4, [("w", "w0")])
    value = loss(None, {"w": w}, {"w0": anchor}, None)
    assert value.item() == pytest.approx(5.0 + 0.2 * (0.25 + 9.0))
    value.backward()
    assert torch.allclose(w.grad, 2 * w.detach() + 0.4 * (w.detach() - anchor.detach()))
    assert anchor.grad is None  # the round-start model is a constant


def round_of(strategy_cls, tmp_path, **kwargs):
    """One round of three clients on the toy model; the clients' uploads and the new model."""
    model, data = tiny_model(), toy_data()
    build = lambda cfg: strategy_cls(cfg, **kwargs)  # noqa: E731
    fed = make_fed(model, data, tmp_path, strategy=build, opt="sgd", lr=0.05)
    cohort = fed.trainer.cohort
    cohort.loss_fn = fed.strategy.local_objective(cohort.loss_fn, model)
    state = fed.start(model)
    start = {k: v.clone() for k, v in state.server["global"].items()}
    updates = fed.trainer.train_round(fed, state, [0, 1, 2], 0, 0.05)
    return start, updates


class ProxEveryUpload(FedProx, ReadsEveryUpload):
    """FedProx mixed into another strategy: the uploads reach its ``aggregate``."""


def test_fedprox_pulls_each_client_towards_the_round_start_model(tmp_path):
    start, plain = round_of(ReadsEveryUpload, tmp_path / "a")
    _, prox = round_of(ProxEveryUpload, tmp_path / "b", mu=10.0)

    def drift(updates):
        return [
            sum(float((u[k] - start[k]).norm() ** 2) for k in start if k.endswith("weight"))
            for u in updates.uploads
        ]

    assert all(a < 0.8 * b for a, b in zip(drift(prox), drift(plain)))  # measured 0.43-0.72
    assert all(not k.startswith(ANCHOR) for u in prox.uploads for k in u)
    assert list(prox.uploads[0]) == list(plain.uploads[0])


def test_fedprox_over_fedavg_streams_and_leaves_no_anchor_in_the_model(tmp_path):
    start, updates = round_of(FedProx, tmp_path, mu=0.1)
    assert updates.uploads == [] and list(updates.mean) == list(start)


def test_fedsimclr_plus_fedprox_is_a_params_choice(tmp_path):
    base = {"name": "fedsimclr", "model": {"arch": "small_cnn"}}
    block = {"rounds": 1, "lr": 0.1}
    assert isinstance(
        make(FedSimCLRParams.model_validate({**base, "federation": block}), tmp_path), FedAvg
    )
    fedprox = {**block, "strategy": {"kind": "fedprox", "mu": 0.01}}
    p = FedSimCLRParams.model_validate({**base, "federation": fedprox})
    strategy = make(p, tmp_path)
    assert isinstance(strategy, FedProx) and strategy.mu == 0.01
    assert strategy.anchored == [k for k, _ in tiny_model().named_parameters()]
    with pytest.raises(ValidationError, match="federation.strategy.fedprox.mu"):
        FedSimCLRParams.model_validate(
            {**base, "federation": {**block, "strategy": {"kind": "fedprox"}}}
        )
    with pytest.raises(ValidationError, match="strategy"):
        FedSimCLRParams.model_validate(
            {**base, "federation": {**block, "strategy": {"kind": "fedsgd"}}}
        )


def make(p, tmp_path):
    model = tiny_model()
    return federated.make_federation(p, model, toy_data(), tmp_path / "c.pt", "fp").strategy


def test_fedprox_refuses_a_client_before_its_objective_is_built():
    strategy = FedProx(FederationConfig(1, 1.0, 0.1), mu=1.0)
    with pytest.raises(RuntimeError, match="local_objective"):
        strategy.local_start(None, 0, {"w": torch.zeros(1)})
