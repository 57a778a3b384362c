"""A personal model per client beside the global one (Ditto's and APFL's v, APFL's α): the
entries of ``initial`` start each client's state, and each client keeps its trained values
across rounds (``FedState.clients``, so a resumed run continues exactly).

The personal model lives in the trained module as a *companion*: a second network of the
shape of the module's network ``of`` (by default ``net``) under its own name
(:func:`with_companion`), so the cohort trainer stacks it per client like any other weight.
Any module that holds its classifier as an attribute takes one; the losses of Ditto, APFL,
Per-FedAvg and SCAFFOLD's companion correction read the network through :func:`network_ce`.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from fedssl.fl.cohort import Tensors, forward
from fedssl.fl.state import FedState
from fedssl.losses import masked_cross_entropy
from fedssl.strategies.base import Strategy


def with_companion(
    model: nn.Module, name: str, of: str = "net", alpha: float | None = None
) -> nn.Module:
    """``model`` with a copy of its network ``model.<of>`` under ``name`` (the personal model
    v, or SCAFFOLD's step correction c − c_i) and, for APFL, the mixing weight ``alpha``."""
    model.add_module(name, copy.deepcopy(getattr(model, of)))
    if alpha is not None:
        model.alpha = nn.Parameter(torch.tensor(float(alpha)))
    return model


def part(tensors: dict, prefix: str) -> dict:
    """The ``prefix.*`` entries of a state, without the prefix."""
    n = len(prefix) + 1
    return {k[n:]: v for k, v in tensors.items() if k.startswith(prefix + ".")}


def network_ce(of: str = "net"):
    """``ce(model, weights, x, labels, valid)``: the masked cross-entropy of the network
    ``model.<of>`` run with ``weights`` (keys without the prefix), under the precision policy."""

    def ce(model, weights: dict, x: torch.Tensor, labels, valid) -> torch.Tensor:
        return masked_cross_entropy(forward(getattr(model, of), weights, x), labels, valid)

    return ce


class PersonalModel(Strategy):
    """Mixed into a strategy; set ``initial`` (the personal entries' starting values, e.g. the
    untrained network's, as a client that trained alone would start) before the first round."""

    initial: Tensors = {}

    def local_start(self, state: FedState, client: int, received: Tensors) -> Tensors:
        start = super().local_start(state, client, received)
        return {**start, **self.own(state, client)}

    def keep(self, state: FedState, client: int, trained: Tensors) -> Tensors | None:
        kept = super().keep(state, client, trained) or {}
        return {**kept, **{k: trained[k] for k in self.initial}}

    def own(self, state: FedState, client: int) -> Tensors:
        """The client's personal entries now (the initial ones before it first trained)."""
        kept = state.clients.get(client, {})
        return {k: kept.get(k, v) for k, v in self.initial.items()}

    def final_model(self, state: FedState) -> Tensors:
        return {**super().final_model(state), **self.initial}
