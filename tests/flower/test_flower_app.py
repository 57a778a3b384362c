"""Every mapped method as a Flower app in Flower's simulation engine (Ray, one SuperNode per
client): 2 rounds on tiny data equal the engine's 2 rounds on the same seeds, bit for bit
(server state, per-client state, byte ledger, round log). Needs ``pip install -e
'.[flower]'``; skipped without it."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("flwr")

from fedssl.flower.app import simulate  # noqa: E402
from tests.flower.test_flower_rounds import METHODS, assert_same_run  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.timeout(600)]


class ClientBuild:
    """What each SuperNode builds (pickled by name into Ray's workers)."""

    def __init__(self, method: str):
        self.method = method

    def __call__(self, context):
        from fedssl import precision

        precision.use("fp32")  # as the engine's run in this process (tests run in fp32)
        return METHODS[self.method][0](Path("unused"), "client")


@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_method_in_flower_simulation_equals_the_engine(tmp_path, method):
    make, client_side = METHODS[method]
    model, engine = make(tmp_path, "engine")
    expected = engine.run(engine.start(model))
    model, server = make(tmp_path, "server")
    runs = []

    def run(trainer):
        server.trainer = trainer
        runs.append(server.run(server.start(model)))

    simulate(run, ClientBuild(method), clients=len(server.data.clients))
    assert_same_run(expected, runs[0], client_side)


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
