"""Per-FedAvg's Hessian-free meta-step computes g = ∇f(w̃; D') once (it used to differentiate
f(w̃; D') through w̃ and again for the finite difference): the training must be the very same.
The reference below is the former loss, kept here as the definition to compare with."""

from __future__ import annotations

import pytest
import torch
from torch.func import grad

from fedssl.methods.mpfedcon import personalised as P
from fedssl.methods.mpfedcon import run as R
from fedssl.strategies import perfedavg
from fedssl.strategies.personal import network_ce, part
from tests.methods.mpfedcon.test_mpfedcon import CPU, params, run
from tests.methods.mpfedcon.test_mpfedcon_personalised import meta_gradient, meta_setup, toy_batch

pytestmark = pytest.mark.usefixtures("one_thread")


def former_perfedavg_loss(alpha: float, order: str, delta: float):
    """The HF loss before the change: the outer loss differentiated through w̃, plus
    −α <w, sg(hvp)>, with g recomputed at sg(w̃) for the finite difference."""
    assert order == "hessian_free"

    def loss(model, params, buffers, batch):
        def f(weights, data):
            return network_ce("net")(model, weights, *data)

        d, d1, d2 = perfedavg.slices(batch, 3)
        w = part({**params, **buffers}, "net")
        g_in = grad(f)(w, d)
        adapted = {k: w[k] - alpha * g_in[k].detach() for k in w}
        outer = f(adapted, d1)
        g = grad(f)({k: v.detach() for k, v in adapted.items()}, d1)
        up = grad(f)({k: w[k].detach() + delta * g[k] for k in w}, d2)
        down = grad(f)({k: w[k].detach() - delta * g[k] for k in w}, d2)
        hvp = {k: (up[k] - down[k]) / (2 * delta) for k in w}
        return outer - alpha * sum((w[k] * hvp[k].detach()).sum() for k in w)

    return loss


def hf_run(tmp_path, monkeypatch, loss_fn, parallel: str, name: str):
    monkeypatch.setattr(P, "perfedavg_loss", loss_fn)
    p = params(
        "perfedavg",
        rounds=2,
        perfedavg_order="hessian_free",
        perfedavg_alpha=0.05,
        parallel_clients=parallel,
        client_fraction=2 / 3,
    )
    _, state = run(tmp_path, p, name)
    return state


@pytest.mark.parametrize("parallel", ["off", "on"])  # plain autograd / vmap over the clients
def test_hessian_free_training_is_bit_for_bit_that_of_the_former_loss(
    tmp_path, monkeypatch, parallel
):
    new = hf_run(tmp_path, monkeypatch, P.perfedavg_loss, parallel, "new.pt")
    old = hf_run(tmp_path, monkeypatch, former_perfedavg_loss, parallel, "old.pt")
    glob_new, glob_old = new.server["global"], old.server["global"]
    assert glob_new.keys() == glob_old.keys()
    for k in glob_new:
        assert torch.equal(glob_new[k], glob_old[k]), k
    assert [r["loss"] for r in new.log] == [r["loss"] for r in old.log]  # the logged value too
    initial = R.seeded_model(params("perfedavg"), (1, 28, 28), 4, CPU).state_dict()
    assert any(not torch.equal(initial[k], glob_new[k]) for k in glob_new)  # training moved it


def test_the_hessian_free_step_computes_g_at_the_adapted_weights_once(monkeypatch):
    """Four network backward passes a step (∇f(w; D); g with its value at w̃; the two finite
    difference gradients), none through w̃ again: the former loss made five."""
    calls = []
    for name in ("grad", "grad_and_value"):
        real = getattr(perfedavg, name)
        monkeypatch.setattr(
            perfedavg, name, lambda fn, _r=real, _n=name: calls.append(_n) or _r(fn)
        )
    p, model, state, buffers = meta_setup("hessian_free")
    meta_gradient(p, model, state, buffers, toy_batch(30))
    assert sorted(calls) == ["grad", "grad", "grad", "grad_and_value"]
