"""APFL (Deng et al., 2020): each client keeps a personal model v and its mixing weight α
(:class:`~fedssl.strategies.personal.PersonalModel`); a step trains w on f(w) and v on
f(v̄), v̄ = α v + (1 − α) sg(w) in parameter space; α learns through the same loss (then
projected onto [0, 1]) when adaptive. The global w is averaged as in FedAvg; a client is scored
with its mixture."""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedssl.strategies.personal import network_ce, part


def apfl_mixture(alpha: torch.Tensor, v: dict, w: dict, fedrep_code: bool = False) -> dict:
    """α v + (1 − α) w (FedRep's code: α v + α w)."""
    b = alpha if fedrep_code else 1 - alpha
    return {k: alpha * v[k] + b * w[k] for k in v}


def apfl_loss(ce: Callable, weights_of: Callable, fedrep_code: bool = False):
    """f(w) + f(v̄): w learns from its own loss only (sg(w) in the mixture), v through the
    mixture (gradient α ∇f(v̄)), α from <v − w, ∇f(v̄)> when it trains. ``weights_of(params,
    buffers)`` -> (w, v, α); ``ce(model, weights, x, labels, valid)`` the loss of the model
    with ``weights``."""

    def loss(model, params, buffers, batch):
        x = batch.views[0]
        w, v, a = weights_of(params, buffers)
        mixed = apfl_mixture(a, v, {k: t.detach() for k, t in w.items()}, fedrep_code)
        return ce(model, w, x, batch.labels, batch.valid) + ce(
            model, mixed, x, batch.labels, batch.valid
        )

    return loss


def clip_alpha(key: str = "alpha"):
    """The trainer's ``after_step``: APFL's projection of α onto [0, 1] after each step."""

    def after(trained, frozen, buffers) -> None:
        trained[key].clamp_(0.0, 1.0)

    return after


def companion_apfl_loss(of: str = "net", name: str = "personal", fedrep_code: bool = False):
    """:func:`apfl_loss` of a module whose network ``of`` has the personal companion ``name``
    and a parameter ``alpha``."""

    def w_v_alpha(params, buffers):
        state = {**params, **buffers}
        return part(state, of), part(state, name), params["alpha"]

    return apfl_loss(network_ce(of), w_v_alpha, fedrep_code)
