"""MpFedcon's mechanism diagnostic (issue 22): the round log carries, every round, the fraction
of alive ReLU units of D's output and of the personal projection head's hidden layer, measured
on the parties' own data, without changing the training by a bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.func import functional_call

from fedssl.fl.cohort import LocalData
from fedssl.methods.mpfedcon import train as T
from fedssl.methods.mpfedcon.nets import build_net, part
from tests.methods.mpfedcon.test_mpfedcon import params, run

pytestmark = pytest.mark.usefixtures("one_thread")


def positive_net():
    """A network whose every pre-activation is positive on non-negative images: positive
    weights and biases throughout."""
    net = build_net(params(), (1, 28, 28), 4)
    with torch.no_grad():
        for v in net.parameters():
            v.copy_(v.abs() + 0.01)
    return net


def images(n: int = 16) -> LocalData:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, 1, 28, 28), generator=g, dtype=torch.uint8)
    return LocalData(x, torch.zeros(n, dtype=torch.int64), [np.arange(n)])


def weights_of(net) -> dict:
    return dict(net.state_dict())


def test_every_unit_of_a_network_with_positive_pre_activations_is_alive():
    net, data = positive_net(), images()
    got = T.alive_fractions(net, weights_of(net), data, torch.arange(16))
    assert got == {"alive_base": 1.0, "alive_head": 1.0}


def test_a_very_negative_bias_kills_the_head_units_it_is_set_on_and_only_those():
    net, data = positive_net(), images()
    w = weights_of(net)
    bias = w["projector.0.bias"].clone()
    bias[: len(bias) // 4] = -1e6  # a quarter of P's hidden units can never fire
    got = T.alive_fractions(net, {**w, "projector.0.bias": bias}, data, torch.arange(16))
    assert got == {"alive_base": 1.0, "alive_head": 0.75}
    dead_base = w["base.fc.0.bias"].clone().fill_(-1e6)  # D's last layer dead: so is all of P
    got = T.alive_fractions(net, {**w, "base.fc.0.bias": dead_base}, data, torch.arange(16))
    assert got == {"alive_base": 0.0, "alive_head": 1.0}  # P's bias alone keeps it positive


def test_a_unit_alive_on_a_single_image_counts_as_alive():
    """P's hidden biases shifted to the midpoint of two images' pre-activations: every unit
    fires on exactly one of the two."""
    net, data = positive_net(), images()
    w = weights_of(net)
    with torch.no_grad():
        h = functional_call(net.base, part(w, "base"), (data.images[:2].float() / 255,))
        pre = functional_call(net.projector[0], part(w, "projector.0"), (h,))
    assert (pre[0] - pre[1]).abs().min() > 1e-3
    bias = w["projector.0.bias"] - pre.mean(0)
    got = T.alive_fractions(net, {**w, "projector.0.bias": bias}, data, torch.arange(2))
    assert got["alive_head"] == 1.0
    alone = [
        T.alive_fractions(net, {**w, "projector.0.bias": bias}, data, torch.tensor([one]))
        for one in range(2)
    ]
    assert alone[0]["alive_head"] + alone[1]["alive_head"] == pytest.approx(1.0)  # one image each


def test_the_round_log_carries_the_mean_over_parties(tmp_path):
    fed, state = run(tmp_path, params("mpfedcon", rounds=2))
    s = fed.strategy
    for row in state.log:
        assert set(row) >= {"alive_base", "alive_head"}
        assert 0.0 < row["alive_head"] <= 1.0 and 0.0 < row["alive_base"] <= 1.0
    per_party = [
        T.alive_fractions(
            s.model.net, s.party_state(state, c), s.data, torch.as_tensor(s.data.clients[c])
        )["alive_head"]
        for c in range(3)
    ]
    assert state.log[-1]["alive_head"] == round(float(np.mean(per_party)), 4)


def test_a_network_without_projection_head_logs_only_the_base(tmp_path):
    net = {**params().net.model_dump(), "projection": None}
    _, state = run(tmp_path, params("fedrep", rounds=1, net=net))
    assert "alive_base" in state.log[0] and "alive_head" not in state.log[0]


@pytest.mark.parametrize("variant", ["mpfedcon", "apfl"])
def test_the_diagnostic_changes_no_weight_of_a_two_round_run(tmp_path, monkeypatch, variant):
    _, with_it = run(tmp_path, params(variant, rounds=2), "a.pt")
    monkeypatch.setattr(T.SplitStrategy, "alive_units", lambda self, state: {})
    _, without = run(tmp_path, params(variant, rounds=2), "b.pt")
    assert "alive_head" not in without.log[0]
    for a, b in (
        (with_it.server["global"], without.server["global"]),
        *((with_it.clients[c], without.clients[c]) for c in with_it.clients),
    ):
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), k
    assert [r["loss"] for r in with_it.log] == [r["loss"] for r in without.log]


# ------------------------------------------------------------------ the paper-regime grid
def regime_runs() -> dict:
    from fedssl.presets import Presets
    from tests.fixtures import REPO

    presets = Presets(REPO / "params")
    names = presets.pipeline_experiments("mpfedcon_paper_regime")
    return {n: presets.load("experiment", n) for n in names}


def test_the_paper_regime_grid_runs_the_papers_local_schedule_for_every_row():
    runs = regime_runs()
    rows = {(e.method.variant, e.partition, e.method.mu) for e in runs.values()}
    assert len(runs) == 3 * len(rows) == 3 * 2 * 7  # 5 variants + 2 more mu, S = 2 / 5, 3 seeds
    for name, e in runs.items():
        m, f = e.method, e.method.federation
        assert (f.lr, f.batch_size, f.momentum, f.rounds) == (0.01, 10, 0.5, 30), name
        assert e.precision == "fp32" and e.partition in ("fmnist_s2_m20", "fmnist_s5_m20")
        if m.variant in ("mpfedcon", "fedrep"):  # tau_h head epochs, then tau_0 base epochs
            assert (m.head_epochs, m.body_epochs) == (10, 1), name
        else:  # the whole network at once for as many epochs (FedRep's code's local_ep)
            assert m.body_epochs == 11, name
        assert f.client_fraction == (1.0 if m.variant == "solo" else 0.5), name
    assert {e.method.mu for e in runs.values() if e.method.variant == "mpfedcon"} == {
        0.5,
        5.0,
        10.0,
    }
