"""Global supervised FL's defining rules (spec baselines.md §1, §6): FedAvg of the whole network
weighted by data size; FedProx adds (μ/2)‖w − W_g‖² and reduces to FedAvg at μ = 0; MOON adds
μ·ℓ_con with the global model's projection as the positive and the client's previous local
model's as the negative, has no negative in its first round, and reduces to FedAvg at μ = 0."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedssl.fl.cohort import Batch, LocalData
from fedssl.fl.state import nbytes
from fedssl.methods import federated_supervised as runtime
from fedssl.methods.supervised import SupervisedParams
from fedssl.methods.supervised import train as sup
from fedssl.methods.supervised.costs import step_costs, step_loss
from fedssl.params import ModelParams
from fedssl.strategies.aggregation import fedavg, stacked
from tests.fixtures import cloned, federation_changed, method_params
from tests.fl.test_engine import SHAPE, toy_data

pytestmark = pytest.mark.usefixtures("one_thread")
CLASSES = 3


def params(variant: str, mu: float = 0.0, rounds: int = 2, norm: str = "bn") -> SupervisedParams:
    """The row ``variant`` with its mu; ``fedprox``: FedAvg under the library's FedProx."""
    model = ModelParams(arch="small_cnn", norm=norm, channels_per_group=2, width=4)
    model = model.model_copy(update={"proj_hidden": 16, "proj_dim": 8})
    row = {"variant": variant, "mu": mu}
    if variant == "fedprox":
        row = {"variant": "fedavg", "strategy": {"kind": "fedprox", "mu": mu}}
    return method_params(
        SupervisedParams,
        {**row, "model": model, "rounds": rounds, "lr": 0.05, "local_epochs": 1, "batch_size": 16},
    )


def held_out() -> LocalData:
    d = toy_data(30, seed=1)
    return LocalData(d.images, d.labels, [np.arange(30)])


def federation(p, path, rounds=None):
    if rounds is not None:
        p = federation_changed(p, rounds=rounds)
    model = runtime.build_model(p, SHAPE, CLASSES, torch.device("cpu"))
    return runtime.make_federation(p, model, toy_data(), held_out(), path, "fp"), model


def run(p, path, rounds=None):
    fed, model = federation(p, path, rounds)
    return fed.run(fed.start(model))


def assert_same_run(a, b):
    assert a.log == [
        {**r, "seconds": s["seconds"], "images_per_s": s["images_per_s"]}
        for r, s in zip(b.log, a.log)
    ]
    for k, v in a.server["global"].items():
        assert torch.equal(v, b.server["global"][k]), k


def test_moon_and_fedprox_with_mu_0_are_fedavg_bit_for_bit_over_2_rounds(tmp_path):
    fedavg_run = run(params("fedavg"), tmp_path / "a.pt")
    assert_same_run(run(params("moon", 0.0), tmp_path / "m.pt"), fedavg_run)
    assert_same_run(run(params("fedprox", 0.0), tmp_path / "p.pt"), fedavg_run)


def test_moon_has_no_negative_in_its_first_round_and_departs_from_fedavg_after(tmp_path):
    fedavg_run = run(params("fedavg"), tmp_path / "a.pt")
    moon = run(params("moon", 5.0), tmp_path / "m.pt")
    assert moon.log[0]["loss"] == fedavg_run.log[0]["loss"]  # round 1: l_con = 0
    assert moon.log[1]["loss"] != fedavg_run.log[1]["loss"]
    prox = run(params("fedprox", 1.0), tmp_path / "p.pt")
    assert prox.log[0]["loss"] != fedavg_run.log[0]["loss"]


def test_moon_keeps_its_trained_model_as_the_next_negative_fedavg_keeps_nothing(tmp_path):
    fed, model = federation(params("moon", 1.0), tmp_path / "m.pt", rounds=1)
    uploads = {}
    upload = fed.strategy.upload
    fed.strategy.upload = lambda s, c, t: uploads.setdefault(c, cloned(upload(s, c, t)))
    state = fed.run(fed.start(model))
    assert set(state.clients) == {0, 1, 2}
    for c, sent in uploads.items():
        assert all(torch.equal(state.clients[c][k], v) for k, v in sent.items())
    start = fed.strategy.local_start(state, 1, state.server["global"])
    assert start["has_prev"] == 1 and torch.equal(
        start["prev.output.weight"], uploads[1]["output.weight"]
    )
    assert torch.equal(start["glob.output.weight"], state.server["global"]["output.weight"])
    assert run(params("fedavg"), tmp_path / "a.pt", rounds=1).clients == {}


def test_a_round_is_the_size_weighted_fedavg_of_the_whole_network_both_ways(tmp_path):
    fed, model = federation(params("fedprox", 0.1), tmp_path / "p.pt", rounds=1)
    uploads = []
    upload = fed.strategy.upload
    fed.strategy.upload = lambda s, c, t: uploads.append(cloned(upload(s, c, t))) or uploads[-1]
    state = fed.run(fed.start(model))
    assert set(uploads[0]) == set(model.net.state_dict())  # every weight and BN buffer
    expected = fedavg(stacked(uploads), torch.tensor([20.0, 30.0, 40.0], dtype=torch.float64))
    for k, v in expected.items():
        assert torch.equal(state.server["global"][k], v), k
    size = nbytes(state.server["global"])
    assert all(
        r["bytes_up"] == r["bytes_down"] == size for r in state.ledger.summary()["per_client"]
    )


def _batch(n=12):
    d = toy_data()
    x = d.images[:n].float() / 255
    return x, Batch((x,), d.labels[:n], torch.ones(n, dtype=torch.bool))


def _perturbed(seed: int, variant="moon", mu=2.0):
    """A model whose net, glob and prev all differ (so a swapped role changes the loss)."""
    p = params(variant, mu, norm="gn").model_copy(update={"temperature": 0.3})
    model = runtime.build_model(p, SHAPE, CLASSES, torch.device("cpu"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in ("glob", "prev"):
            for w in getattr(model, name).parameters():
                w.add_(0.3 * torch.randn(w.shape, generator=g))
    model.has_prev.fill_(1.0)
    return p, model


def _loss(p, model, batch):
    """A step's loss with FedProx's term towards ``glob`` if chosen (what the costs count)."""
    fn = step_loss(p, model)
    return fn(model, dict(model.named_parameters()), dict(model.named_buffers()), batch)


def test_moons_loss_is_ce_plus_mu_times_the_model_contrastive_term():
    p, model = _perturbed(0)
    x, batch = _batch()
    with torch.no_grad():
        logits = model.net(x)
        z, z_glob, z_prev = model.net.project(x), model.glob.project(x), model.prev.project(x)
    pos = F.cosine_similarity(z, z_glob) / p.temperature
    neg = F.cosine_similarity(z, z_prev) / p.temperature
    l_con = -(pos.exp() / (pos.exp() + neg.exp())).log().mean()
    expected = F.cross_entropy(logits, batch.labels) + p.mu * l_con
    assert torch.allclose(_loss(p, model, batch), expected, atol=1e-5)
    model.has_prev.fill_(0.0)  # no previous model yet: CE alone
    assert torch.allclose(_loss(p, model, batch), F.cross_entropy(logits, batch.labels))


def test_l_con_is_log_2_when_the_global_and_previous_models_agree():
    p, model = _perturbed(1)
    model.prev.load_state_dict(model.glob.state_dict())
    x, batch = _batch()
    ce = F.cross_entropy(model.net(x), batch.labels)
    assert torch.allclose(_loss(p, model, batch), ce + p.mu * math.log(2), atol=1e-5)


def test_fedprox_adds_half_mu_times_the_squared_distance_to_the_global_model():
    p, model = _perturbed(2, "fedprox", 0.7)
    x, batch = _batch()
    dist = sum(
        ((w - g) ** 2).sum() for w, g in zip(model.net.parameters(), model.glob.parameters())
    )
    expected = F.cross_entropy(model.net(x), batch.labels) + 0.5 * p.federation.strategy.mu * dist
    assert torch.allclose(_loss(p, model, batch), expected, atol=1e-5)


def test_the_reference_models_run_in_eval_mode_and_stay_frozen(tmp_path):
    p = params("moon", 1.0)
    model = runtime.build_model(p, SHAPE, CLASSES, torch.device("cpu"))
    model.train()
    assert model.net.training and not model.glob.training and not model.prev.training
    fed, model = federation(p, tmp_path / "m.pt", rounds=1)
    trainable = fed.strategy.trainable(None)
    assert trainable == {f"net.{k}" for k, _ in model.net.named_parameters()}


def test_the_round_log_holds_the_global_models_test_accuracy(tmp_path):
    fed, model = federation(params("fedavg"), tmp_path / "a.pt", rounds=1)
    state = fed.run(fed.start(model))
    net = sup.build_net(params("fedavg"), SHAPE, CLASSES)
    net.load_state_dict(state.server["global"])
    t = held_out()
    with torch.no_grad():
        correct = (net.eval()(t.images.float() / 255).argmax(1) == t.labels).float().mean()
    assert state.log[0]["global_top1"] == round(100 * float(correct), 4)


def test_a_resumed_moon_run_equals_an_uninterrupted_one(tmp_path):
    p = params("moon", 1.0)
    whole = run(p, tmp_path / "whole.pt")
    run(p, tmp_path / "part.pt", rounds=1)  # killed after round 1: its checkpoint remains
    fed, model = federation(p, tmp_path / "part.pt")
    state = fed.start(model)
    assert state.round == 1 and set(state.clients) == {0, 1, 2}
    assert_same_run(fed.run(state), whole)


def test_a_step_costs_more_flops_and_memory_with_more_reference_models():
    c = {
        v: step_costs(params(v, 1.0 if v != "fedavg" else 0.0), SHAPE, CLASSES)
        for v in ("fedavg", "fedprox", "moon")
    }
    assert c["moon"]["flops_per_sample"] > c["fedprox"]["flops_per_sample"]
    assert c["fedprox"]["flops_per_sample"] >= c["fedavg"]["flops_per_sample"]
    # the frozen copies a step holds (FedProx: W_g; MOON: W_g and the previous model)
    assert c["moon"]["peak_step_bytes"] > c["fedavg"]["peak_step_bytes"]
    assert c["fedprox"]["peak_step_bytes"] > c["fedavg"]["peak_step_bytes"]


def test_fedavg_has_no_mu():
    with pytest.raises(ValueError, match="mu"):
        params("fedavg", 0.1)


def test_the_report_row_names_the_variant_and_its_mu():
    from fedssl.methods import registry

    method = registry.get("supervised")
    labels = [
        method.row_label(params(v, mu)) for v, mu in (("fedavg", 0), ("moon", 1), ("fedprox", 0.01))
    ]
    assert labels == ["FedAvg", "MOON (μ=1)", "FedProx (μ=0.01)"]


@pytest.mark.parametrize("seed", [0, 3])
def test_the_network_starts_from_its_untrained_twins_encoder(seed):
    """init: encoder: D's first weights are the untrained reference's (and every SSL line's)
    encoder at the same seed; init: own draws another network."""
    from fedssl.models.encoders import seeded_contrastive_model

    p = params("moon", mu=1.0).model_copy(update={"seed": seed})
    twin = seeded_contrastive_model(p.model, SHAPE, seed, torch.device("cpu")).backbone
    shared = runtime.network_of(runtime.build_model(p, SHAPE, CLASSES, torch.device("cpu")))
    own = p.model_copy(update={"init": "own"})
    apart = runtime.network_of(runtime.build_model(own, SHAPE, CLASSES, torch.device("cpu")))
    expected = twin.state_dict()
    for name, tensor in shared.base.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    assert not torch.equal(apart.base.state_dict()["0.0.weight"], expected["0.0.weight"])
