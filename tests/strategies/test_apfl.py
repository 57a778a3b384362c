"""APFL: the parameter-space mixture, and a loss whose gradients train w on f(w) alone, v
through the mixture and α by <v − w, ∇f(v̄)>."""

from __future__ import annotations

import torch

from fedssl.fl.cohort import Batch
from fedssl.strategies.apfl import apfl_loss, apfl_mixture, clip_alpha


def test_the_mixture_is_alpha_v_plus_one_minus_alpha_w():
    v, w, a = {"x": torch.tensor([4.0])}, {"x": torch.tensor([0.0])}, torch.tensor(0.25)
    assert apfl_mixture(a, v, w)["x"].item() == 1.0
    assert apfl_mixture(a, v, w, fedrep_code=True)["x"].item() == 1.0  # α v + α w, w = 0


def test_apfl_loss_gradients():
    """f(u) = (u - t)^2 summed: ∂/∂w = 2(w - t); ∂/∂v = 2α(v̄ - t); ∂/∂α = <v − w, 2(v̄ - t)>."""
    t = torch.tensor([1.0, 2.0])

    def ce(model, weights, x, labels, valid):
        return ((weights["x"] - t) ** 2).sum()

    w = torch.tensor([0.0, 1.0], requires_grad=True)
    v = torch.tensor([3.0, -1.0], requires_grad=True)
    a = torch.tensor(0.25, requires_grad=True)
    loss = apfl_loss(ce, lambda p, b: ({"x": p["w"]}, {"x": p["v"]}, p["alpha"]))
    batch = Batch((torch.zeros(1),), torch.zeros(1), torch.ones(1, dtype=torch.bool))
    loss(None, {"w": w, "v": v, "alpha": a}, {}, batch).backward()
    mixed = (a * v + (1 - a) * w).detach()
    assert torch.allclose(w.grad, 2 * (w.detach() - t))  # nothing through the mixture
    assert torch.allclose(v.grad, 2 * a.detach() * (mixed - t))
    assert torch.allclose(a.grad, ((v - w).detach() * 2 * (mixed - t)).sum())


def test_alpha_is_projected_onto_the_unit_interval():
    trained = {"alpha": torch.tensor(1.7)}
    clip_alpha()(trained, {}, {})
    assert trained["alpha"].item() == 1.0
