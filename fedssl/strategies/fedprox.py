"""FedProx (Li et al., 2020): the clients minimise their local objective plus the proximal term
(mu / 2) ||w - w^t||^2 towards the model w^t the round started from; the server averages as
FedAvg does.

The term is a wrapper around any local loss (:func:`proximal`), so it composes with a
supervised, a self-supervised or a personalised objective alike. A model that already carries
its round-start copy (MOON's and MpFedcon's networks) names the (trained, anchor) pairs itself;
for any other, :class:`FedProx` sends the round-start weights along as ``fedprox.*`` entries of
the client's starting state and strips them from what the client uploads and keeps, so
"FedSimCLR + FedProx" is a params choice (``federation.strategy: {kind: fedprox, mu: ...}``),
not code.
"""

from __future__ import annotations

import torch
from torch import nn

from fedssl.fl.cohort import LossFn, Tensors
from fedssl.fl.state import FedState
from fedssl.strategies.base import Strategy, trained_parameters

ANCHOR = "fedprox."  # the round-start weights in a client's state


def proximal_term(params: Tensors, pairs) -> torch.Tensor:
    """||w - w_g||^2 over (trained key, anchor key) pairs of one dict; the anchor (the
    round-start global model) gets no gradient."""
    return sum(((params[w] - params[g].detach()) ** 2).sum() for w, g in pairs)


def proximal(loss: LossFn, mu: float, pairs) -> LossFn:
    """``loss`` + (mu / 2) ||w - w_g||^2, w and w_g the (trained, anchor) ``pairs`` of keys,
    found among the parameters or the buffers the trainer passes."""

    def objective(model, params, buffers, batch):
        both = {**params, **buffers}
        return loss(model, params, buffers, batch) + 0.5 * mu * proximal_term(both, pairs)

    return objective


def without(prefix: str, tensors: Tensors) -> Tensors:
    return {k: v for k, v in tensors.items() if not k.startswith(prefix)}


class FedProx(Strategy):
    """FedProx over any strategy it is mixed into (``class X(FedProx, Other)``; alone: over
    FedAvg): each client gets its round-start parameters as anchors, trains on
    :meth:`local_objective` and uploads and keeps what the strategy below says, anchors
    stripped."""

    def __init__(self, *args, mu: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.mu = mu
        self.anchored: list[str] | None = None

    def local_objective(self, loss: LossFn, model: nn.Module) -> LossFn:
        self.anchored = trained_parameters(model)

        def plain(model, params, buffers, batch):  # the method's loss never sees the anchors
            return loss(model, params, without(ANCHOR, buffers), batch)

        pairs = [(k, ANCHOR + k) for k in self.anchored]
        return super().local_objective(proximal(plain, self.mu, pairs), model)

    def local_start(self, state: FedState, client: int, received: Tensors) -> Tensors:
        if self.anchored is None:
            raise RuntimeError("FedProx: build the clients' loss with local_objective first")
        start = super().local_start(state, client, received)
        return {**start, **{ANCHOR + k: start[k] for k in self.anchored}}

    def upload(self, state: FedState, client: int, trained: Tensors) -> Tensors:
        return super().upload(state, client, without(ANCHOR, trained))

    def keep(self, state: FedState, client: int, trained: Tensors) -> Tensors | None:
        return super().keep(state, client, without(ANCHOR, trained))
