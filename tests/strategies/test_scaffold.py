"""SCAFFOLD: its server step, and the mixin over FedAvg in a federation, which reaches the
optimum of the clients' mean objective where FedAvg stops short (client drift)."""

from __future__ import annotations

import torch

from fedssl.strategies.fedavg import FedAvg
from fedssl.strategies.scaffold import CONTROL, Scaffold, option_two, scaffold_server
from tests.strategies.toy import federation, global_optimum, toy_clients


def test_option_two_and_the_server_step_average_over_all_clients():
    c_i, c = {"w": torch.tensor([1.0])}, {"w": torch.tensor([0.5])}
    x, y = {"w": torch.tensor([2.0])}, {"w": torch.tensor([1.0])}
    assert option_two(c_i, c, x, y, steps=4, lr=0.25)["w"].item() == 1.0 - 0.5 + 1.0
    new_x, new_c = scaffold_server(
        x, c, [y, {"w": torch.tensor([4.0])}], [{"w": torch.tensor([3.0])}] * 2, 0.5, n=6
    )
    assert new_x["w"].item() == 2.0 + 0.5 * 0.5  # eta_g * mean(y - x)
    assert new_c["w"].item() == 0.5 + 6.0 / 6  # / N = 6 clients, not the 2 sampled


STEPS = 10  # local epochs, each one full batch


def distance_after(strategy, tmp_path, rounds=40):
    data = toy_clients()
    model, fed = federation(strategy, data, tmp_path, rounds=rounds, lr=0.3, steps=STEPS)
    state = fed.run(fed.start(model))
    g = state.server["global"]
    fit = torch.cat([g["weight"].flatten(), g["bias"]]).double()
    return float((fit - global_optimum(data)).norm()), state


def test_scaffold_over_fedavg_reaches_the_optimum_fedavg_misses(tmp_path):
    fedavg, _ = distance_after(FedAvg, tmp_path / "a")
    batch = max(toy_clients().sizes())  # the toy federation's full batch
    scaffold, state = distance_after(
        lambda cfg: Scaffold(cfg, local_epochs=STEPS, batch_size=batch), tmp_path / "b"
    )
    assert fedavg > 0.5 and scaffold < 0.05 * fedavg  # measured 13.5 and 0.5 at 30 rounds
    assert set(state.server["global"]) == {"weight", "bias"}  # no correction left in the model
    assert set(state.server["control"]) == {"weight", "bias"}
    for kept in state.clients.values():  # each client keeps its c_i, nothing else
        assert set(kept) == {CONTROL + "weight", CONTROL + "bias"}
    sent = state.ledger.up[0]
    assert set(sent) == {"model", "control"} and sent["control"] == sent["model"]
