"""Per-FedAvg (Fallah et al., 2020): each local step is a MAML meta-step on three slices of the
batch (first-order or Hessian-free); the global w is averaged as in FedAvg; a client's
personal model is one α-step from w on a batch of its own data."""

from __future__ import annotations

from collections.abc import Callable

from torch.func import grad, grad_and_value

from fedssl.fl.cohort import Batch
from fedssl.strategies.personal import network_ce, part


def slices(batch: Batch, n: int) -> list[tuple]:
    """The batch's n interleaved slices (D, D', D''): each gets its share of the real rows."""
    x = batch.views[0]
    return [(x[i::n], batch.labels[i::n], batch.valid[i::n]) for i in range(n)]


def perfedavg_loss(ce: Callable, weights_of: Callable, alpha: float, order: str, delta: float):
    """A loss whose gradient is Per-FedAvg's meta-gradient on a batch of 2B (first order) or
    3B (Hessian-free) rows: w̃ = w − α sg(∇f(w; D)); FO: ∇f(w̃; D'); HF: that minus α times
    the finite-difference Hessian-vector product on D'' along g = ∇f(w̃; D').
    ``weights_of(params, buffers)`` -> w; ``ce(model, weights, x, labels, valid)``."""
    parts = 2 if order == "first_order" else 3

    def loss(model, params, buffers, batch):
        def f(weights, data):
            return ce(model, weights, *data)

        d, d1, *rest = slices(batch, parts)
        w = weights_of(params, buffers)
        g_in = grad(f)(w, d)
        if order == "first_order":
            return f({k: w[k] - alpha * g_in[k].detach() for k in w}, d1)
        return hessian_free_surrogate(f, w, g_in, (d1, rest[0]), alpha, delta)

    return loss


def hessian_free_surrogate(f, w: dict, g_in: dict, slices_: tuple, alpha: float, delta: float):
    """HF's meta-step as a surrogate: value f(w̃; D') − α <w, hvp> (the meta-objective's value),
    gradient g − α hvp. g = ∇f(w̃; D') is computed once and serves both the gradient and the
    finite difference (differentiating f(w̃; D') through w̃ = w − const would repeat it)."""
    d1, d2 = slices_  # D' and D''
    fixed = {k: v.detach() for k, v in w.items()}
    g, outer = grad_and_value(f)({k: fixed[k] - alpha * g_in[k].detach() for k in w}, d1)
    up = grad(f)({k: fixed[k] + delta * g[k] for k in w}, d2)
    down = grad(f)({k: fixed[k] - delta * g[k] for k in w}, d2)
    hvp = {k: (up[k] - down[k]) / (2 * delta) for k in w}
    value = outer - alpha * sum((fixed[k] * hvp[k]).sum() for k in w)
    linear = sum((w[k] * (g[k] - alpha * hvp[k])).sum() for k in w)
    return value + (linear - linear.detach())  # adds exactly 0 to the value


def adapted(f: Callable, w: dict, data, alpha: float) -> dict:
    """One SGD step of size α from w on ``data``, ``f(weights, data)`` the loss: a client's
    Per-FedAvg personal model."""
    g = grad(f)(w, data)
    return {k: w[k] - alpha * g[k] for k in w}


def companion_perfedavg_loss(alpha: float, order: str, delta: float, of: str = "net"):
    """:func:`perfedavg_loss` of the network ``of`` of a module."""
    return perfedavg_loss(
        network_ce(of), lambda params, buffers: part({**params, **buffers}, of), alpha, order, delta
    )
