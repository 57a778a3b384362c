"""A round split between a server and clients that each hold their own copy of the method
(what the Flower adapter carries over the network) equals the engine's round, for every method
that maps: the same server state bit for bit (global model, centres), the same per-client
state, byte ledger and round log. No Flower needed: the clients are called in process."""

from __future__ import annotations

import pytest
import torch

from fedssl.flower.rounds import Client, ClientMemory, RemoteRounds, SoloCohort
from fedssl.methods import federated, registry
from fedssl.methods.fedbyol import FedEMAParams, FedUParams
from fedssl.methods.hooks import Hook
from fedssl.methods.mfcl import run as mfcl
from fedssl.models.encoders import seeded_contrastive_model
from tests.fixtures import federation_changed
from tests.fl.test_engine import toy_data
from tests.methods.fedbyol import test_fedbyol_rules as byol
from tests.methods.fedsimclr.test_fedsimclr_rules import SHAPE, tiny_params
from tests.methods.mfcl import test_mfcl
from tests.methods.mpfedcon import test_mpfedcon as mpf
from tests.methods.orchestra import test_orchestra_rules as orchestra_rules

pytestmark = pytest.mark.usefixtures("one_thread")


def simclr_federation(folder, name: str, rounds: int = 2):
    p = federation_changed(tiny_params(), rounds=rounds, batch_size=16)
    model = seeded_contrastive_model(p.model, SHAPE, p.seed, torch.device("cpu"))
    return model, federated.make_federation(p, model, toy_data(), folder / f"{name}.pt", name)


def byol_federation(folder, name: str, cls=byol.FedBYOLParams):
    fed, model = byol.federation(byol.params(cls, rounds=2), folder, f"{name}.pt")
    return model, fed


def mfcl_federation(folder, name: str, secure: bool = False):
    p = test_mfcl.tiny_exp("gn", secure, rounds=2).method
    model = mfcl.build_client_module(p, (1, 28, 28), torch.device("cpu"))
    return model, mfcl.make_phase1_federation(
        p, model, test_mfcl.toy_data(), folder / f"{name}.pt", name
    )


def mpfedcon_federation(folder, name: str, variant: str = "mpfedcon"):
    fed, model = mpf.toy_federation(folder, mpf.params(variant, rounds=2), f"{name}.pt")
    return model, fed


def runtime_federation(p):
    """The federation builder of a method on the shared runtime, with params ``p``."""

    def make(folder, name: str):
        model = federated.build_model(p, SHAPE, torch.device("cpu"))
        return model, federated.make_federation(p, model, toy_data(), folder / f"{name}.pt", name)

    return make


# method -> (its federation builder, the round-log columns the clients record that do not
# reach the server: the BYOL family's diagnostics are kept by the client's strategy)
METHODS = {
    "fedsimclr": (simclr_federation, ()),
    "fedbyol": (byol_federation, ("divergence",)),
    "fedema": (
        lambda f, n: byol_federation(f, n, FedEMAParams),
        ("divergence", "decay"),
    ),
    "fedu": (
        lambda f, n: byol_federation(f, n, FedUParams),
        ("divergence", "local_predictor"),
    ),
    "mfcl_phase1": (mfcl_federation, ()),
    "mfcl_phase1_secure": (lambda f, n: mfcl_federation(f, n, secure=True), ()),
    "fedrep": (lambda f, n: mpfedcon_federation(f, n, "fedrep"), ()),
    "mpfedcon": (mpfedcon_federation, ()),
    # a setup round (clustering only) before its training round; the memory stays on the client
    "orchestra": (runtime_federation(orchestra_rules.tiny_params()), ()),
}
# MpFedcon's other variants (its Tab. 1 baselines) map the same way; SCAFFOLD does not (below)
OTHER_VARIANTS = (
    "fedper", "lg_fedavg", "fedavg", "fedavg_ft", "fedprox", "solo", "apfl", "ditto", "perfedavg"
)  # fmt: skip


class InProcessClients:
    """Each client its own federation object (its own device) and its own memory."""

    def __init__(self, make):
        self.make, self.clients, self.memory = make, {}, {}

    def __call__(self, tasks):
        results = []
        for t in tasks:
            if t.client not in self.clients:
                self.clients[t.client] = Client(*self.make(f"client{t.client}"))
            result, self.memory[t.client] = self.clients[t.client].round(
                t, self.memory.get(t.client, ClientMemory())
            )
            results.append(result)
        return results


def run_both(make):
    model, engine = make("engine")
    expected = engine.run(engine.start(model))
    model, remote = make("server")
    remote.trainer = RemoteRounds(InProcessClients(make))
    return expected, remote.run(remote.start(model))


def assert_equal_tensors(got: dict, expected: dict, where: str) -> None:
    assert got.keys() == expected.keys(), where
    for k, v in expected.items():
        if isinstance(v, dict):
            assert_equal_tensors(got[k], v, f"{where}.{k}")
        else:
            assert torch.equal(got[k], v), f"{where}.{k}"


def assert_same_run(expected, got, client_side=()):
    assert_equal_tensors(got.server, expected.server, "server")
    assert_equal_tensors(got.clients, expected.clients, "clients")
    assert got.ledger.summary() == expected.ledger.summary()
    skip = {"seconds", "images_per_s", *client_side}
    assert [{k: v for k, v in r.items() if k not in skip} for r in got.log] == [
        {k: v for k, v in r.items() if k not in skip} for r in expected.log
    ]
    assert len(got.log) == 2


@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_split_round_equals_the_engine_bit_for_bit(tmp_path, method):
    make, client_side = METHODS[method]
    expected, got = run_both(lambda name: make(tmp_path, name))
    assert_same_run(expected, got, client_side)
    assert got.ledger.summary()["total_bytes_up"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("variant", OTHER_VARIANTS)
def test_mpfedcon_baselines_split_equal_the_engine(tmp_path, variant):
    expected, got = run_both(lambda name: mpfedcon_federation(tmp_path, name, variant))
    assert_same_run(expected, got)


def test_scaffold_does_not_map_its_clients_read_the_servers_current_state(tmp_path):
    """SCAFFOLD's client computes c_i+ from the server's current global model and control
    variate (engine state), not from what it received: a client that knows only the initial
    server state ends up elsewhere (so the Flower hook refuses the variant)."""
    expected, got = run_both(lambda name: mpfedcon_federation(tmp_path, name, "scaffold"))
    assert got.ledger.summary() == expected.ledger.summary()
    control = expected.server["control"]
    assert any(not torch.equal(got.server["control"][k], v) for k, v in control.items())


def test_a_client_that_does_not_replay_the_others_draws_trains_on_other_views(
    tmp_path, monkeypatch
):
    """The replay is what makes the rounds equal: without it the clients after the first see
    other augmentations and the global model differs."""
    monkeypatch.setattr(SoloCohort, "skip_draws", lambda *a: None)
    expected, got = run_both(lambda name: simclr_federation(tmp_path, name, rounds=1))
    assert any(
        not torch.equal(got.server["global"][k], v) for k, v in expected.server["global"].items()
    )


def test_featarc_does_not_split_its_server_scores_the_clients_data():
    """FeatARC's server assigns each client a cluster from the client's own images, which a
    server of the split does not hold: it declares no Flower step (the runtime's default)."""
    assert registry.get("featarc").flower_steps == {}
    runtime = Hook(federated.__name__, "federation")
    assert registry.get("orchestra").flower_steps == {"pretrain": runtime}


def test_every_flower_step_is_a_federated_step_of_its_method():
    from fedssl.methods import registry

    mapped = {m.name: m for m in registry.all() if m.flower_steps}
    assert {"fedsimclr", "fedbyol", "fedema", "fedu", "mfcl", "mpfedcon"} <= set(mapped)
    for method in mapped.values():
        assert set(method.flower_steps) <= {s.name for s in method.steps}, method.name
