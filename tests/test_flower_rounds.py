"""A round split between a server and clients that each hold their own copy of the method
(what the Flower adapter carries over the network) equals the engine's round: the same global
model bit for bit, the same byte ledger and round log. No Flower needed: the clients are
called in process."""

from __future__ import annotations

import pytest
import torch

from fedssl.flower.rounds import ClientMemory, RemoteRounds, SoloCohort, client_round
from fedssl.methods.fedsimclr import run as simclr
from fedssl.models.encoders import seeded_contrastive_model
from tests.test_engine import toy_data
from tests.test_fedsimclr_rules import SHAPE, tiny_params

pytestmark = pytest.mark.usefixtures("one_thread")


def simclr_federation(tmp_path, name: str, rounds: int = 2):
    p = tiny_params().model_copy(update={"rounds": rounds, "batch_size": 16})
    model = seeded_contrastive_model(p.model, SHAPE, p.seed, torch.device("cpu"))
    fed = simclr.make_federation(p, model, toy_data(), tmp_path / f"{name}.pt", name)
    return model, fed


class InProcessClients:
    """Each client its own federation object (its own device) and its own memory."""

    def __init__(self, make):
        self.make, self.feds, self.memory = make, {}, {}

    def __call__(self, tasks):
        results = []
        for t in tasks:
            fed = self.feds.setdefault(t.client, self.make(f"client{t.client}")[1])
            result, self.memory[t.client] = client_round(
                fed, t, self.memory.get(t.client, ClientMemory())
            )
            results.append(result)
        return results


def run_both(make):
    model, engine = make("engine")
    expected = engine.run(engine.start(model))
    model, remote = make("server")
    remote.trainer = RemoteRounds(InProcessClients(make))
    return expected, remote.run(remote.start(model))


def assert_same_run(expected, got):
    assert got.server["global"].keys() == expected.server["global"].keys()
    for k, v in expected.server["global"].items():
        assert torch.equal(got.server["global"][k], v), k
    assert got.ledger.summary() == expected.ledger.summary()
    timeless = [
        {k: v for k, v in r.items() if k not in ("seconds", "images_per_s")} for r in expected.log
    ]
    assert [{k: r[k] for k in timeless[0]} for r in got.log] == timeless


def test_fedsimclr_split_round_equals_the_engine_bit_for_bit(tmp_path):
    expected, got = run_both(lambda name: simclr_federation(tmp_path, name))
    assert_same_run(expected, got)
    assert got.ledger.summary()["total_bytes_up"] > 0


def test_a_client_that_does_not_replay_the_others_draws_trains_on_other_views(
    tmp_path, monkeypatch
):
    """The replay is what makes the rounds equal: without it client 1 and 2 see other
    augmentations and the global model differs."""
    monkeypatch.setattr(SoloCohort, "skip_draws", lambda *a: None)
    expected, got = run_both(lambda name: simclr_federation(tmp_path, name, rounds=1))
    assert any(
        not torch.equal(got.server["global"][k], v) for k, v in expected.server["global"].items()
    )
