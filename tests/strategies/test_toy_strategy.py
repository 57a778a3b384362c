"""The drop-in test of the how-to's toy strategy: its rule on a real round, checked against
FedAvg's round on the same clients."""

from __future__ import annotations

import torch

from fedssl.strategies.fedavg import FedAvg
from tests.strategies.toy import federation, toy_clients
from tests.strategies.toy_strategy import FedAvgM


def one_round(strategy, tmp_path):
    model, fed = federation(strategy, toy_clients(), tmp_path)
    state = fed.start(model)
    x0 = {k: v.clone() for k, v in state.server["global"].items()}
    fed.run_round(state)
    return x0, state


def test_server_momentum_steps_from_the_fedavg_mean(tmp_path):
    x0, plain = one_round(FedAvg, tmp_path / "fedavg")
    mean = plain.server["global"]  # the same clients, seeds and start: the same mean
    _, state = one_round(lambda cfg: FedAvgM(cfg, beta=0.5, server_lr=2.0), tmp_path / "m")
    for k in x0:
        m = x0[k] - mean[k]  # first round: m = Δ
        assert torch.allclose(state.server["momentum"][k], m)
        assert torch.allclose(state.server["global"][k], x0[k] - 2.0 * m)


def test_it_keeps_no_clients_model(tmp_path):
    model, fed = federation(lambda cfg: FedAvgM(cfg), toy_clients(), tmp_path)
    state = fed.start(model)
    updates = fed.trainer.train_round(fed, state, [0, 1, 2], 0, 0.1)
    assert updates.uploads == [] and set(updates.mean) == {"weight", "bias"}
