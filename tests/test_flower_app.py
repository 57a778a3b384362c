"""FedSimCLR as a Flower app in Flower's simulation engine (Ray): 2 rounds on tiny data equal
the engine's 2 rounds on the same seeds, global model bit for bit, ledger and round log."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("flwr")

from fedssl.flower.app import simulate  # noqa: E402
from tests.test_flower_rounds import assert_same_run, simclr_federation  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def client_federation():
    return simclr_federation(Path("unused"), "client")[1]


def test_fedsimclr_in_flower_simulation_equals_the_engine(tmp_path):
    model, engine = simclr_federation(tmp_path, "engine")
    expected = engine.run(engine.start(model))
    model, server = simclr_federation(tmp_path, "server")
    runs = []

    def run(trainer):
        server.trainer = trainer
        runs.append(server.run(server.start(model)))

    simulate(run, client_federation, clients=3)
    assert_same_run(expected, runs[0])


def test_a_client_memory_round_trips_through_the_node_state():
    import torch
    from flwr.app import RecordDict

    from fedssl.flower.app import load_memory, save_memory
    from fedssl.flower.rounds import ClientMemory

    kept = {"w": torch.randn(2, 3), "n": torch.tensor(7)}
    memo = {"divergence": {0: 0.5, 12: 1.25}, "label": "x"}
    state = RecordDict()
    save_memory(ClientMemory(kept, memo), state)
    back = load_memory(state)
    assert back.memo == memo
    assert back.kept.keys() == kept.keys()
    assert all(
        torch.equal(back.kept[k], v) and back.kept[k].dtype == v.dtype for k, v in kept.items()
    )
    assert load_memory(RecordDict()) == ClientMemory()
