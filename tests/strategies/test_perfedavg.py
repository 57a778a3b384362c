"""Per-FedAvg: the batch's slices, the first-order meta-gradient and the personal α-step."""

from __future__ import annotations

import torch

from fedssl.fl.cohort import Batch
from fedssl.strategies.perfedavg import adapted, perfedavg_loss, slices


def quadratic(model, weights, x, labels, valid):
    """f(w; D) = mean over D's rows of (w·x - y)^2."""
    return ((x @ weights["w"] - labels.float()) ** 2).mean()


def batch(n: int = 6) -> Batch:
    x = torch.arange(2.0 * n).view(n, 2) / 10
    return Batch((x,), torch.arange(n), torch.ones(n, dtype=torch.bool))


def test_slices_interleave_the_rows():
    d, d1 = slices(batch(), 2)
    assert d[1].tolist() == [0, 2, 4] and d1[1].tolist() == [1, 3, 5]


def test_the_first_order_gradient_is_the_outer_gradient_at_the_adapted_model():
    alpha, b = 0.1, batch()
    w = torch.tensor([0.5, -0.5], requires_grad=True)
    loss = perfedavg_loss(quadratic, lambda p, _: {"w": p["w"]}, alpha, "first_order", 0.0)
    loss(None, {"w": w}, {}, b).backward()
    d, d1 = slices(b, 2)
    f = lambda weights, data: quadratic(None, weights, *data)  # noqa: E731
    inner = adapted(f, {"w": w.detach()}, d, alpha)["w"].requires_grad_(True)
    f({"w": inner}, d1).backward()
    assert torch.allclose(w.grad, inner.grad)  # first order: no gradient through the inner step


def test_the_personal_model_is_one_alpha_step():
    w, b = {"w": torch.tensor([1.0, 1.0])}, batch()
    data = (b.views[0], b.labels, b.valid)
    f = lambda weights, data: quadratic(None, weights, *data)  # noqa: E731
    x, y = data[0], data[1].float()
    g = 2 * x.T @ (x @ w["w"] - y) / len(y)
    assert torch.allclose(adapted(f, w, data, 0.3)["w"], w["w"] - 0.3 * g)
