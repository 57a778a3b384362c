"""A personal model per client: it starts from ``initial``, and each client gets back what it
kept, across rounds and a resume."""

from __future__ import annotations

import torch

from fedssl.fl.state import FederationConfig, FedState, Ledger
from fedssl.strategies.fedavg import FedAvg
from fedssl.strategies.personal import PersonalModel


class WithPersonal(PersonalModel, FedAvg):
    pass


def test_each_client_keeps_its_personal_entries():
    s = WithPersonal(FederationConfig(1, 1.0, 0.1))
    s.initial = {"v": torch.zeros(2)}
    state = FedState(0, {"global": {"w": torch.ones(2)}}, {}, Ledger.empty([1, 1]))
    start = s.local_start(state, 0, {"w": torch.ones(2)})
    assert torch.equal(start["v"], torch.zeros(2)) and torch.equal(start["w"], torch.ones(2))
    kept = s.keep(state, 0, {"w": torch.ones(2), "v": torch.full((2,), 3.0)})
    assert list(kept) == ["v"]  # only the personal entries stay with the client
    state.clients[0] = kept
    assert torch.equal(s.local_start(state, 0, {"w": torch.ones(2)})["v"], torch.full((2,), 3.0))
    assert torch.equal(s.local_start(state, 1, {"w": torch.ones(2)})["v"], torch.zeros(2))
    assert torch.equal(s.final_model(state)["v"], torch.zeros(2))  # the model keeps its own v
