"""Reference copies of a client's network beside the live one (MOON's): the global model the
round starts from (``glob``: MOON's positive) and the client's own model after its previous
local training (``prev``: MOON's negative), frozen, in one module with the live ``net``
(:class:`WithReferences`), as ordinary parameters, so the cohort trainer stacks them per
client like any other weight.

:class:`References` fills them each round: the global network down, ``net`` and ``glob``
start from it and ``prev`` from what the client kept (the global one before its first round,
``has_prev`` 0); the trained ``net`` goes up and, when the previous model is kept, stays with
the client (``FedState.clients``, so a resumed run continues exactly). The references never
train.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from fedssl.fl.state import FedState
from fedssl.models.cnn import LayeredNet
from fedssl.strategies.base import Strategy

REFERENCES = ("glob", "prev")  # the frozen copies beside the live network


class WithReferences(nn.Module):
    """``net`` plus its frozen copies ``glob`` and ``prev`` and ``has_prev`` (0/1: whether the
    client has a previous model yet). The copies always run in eval mode (MOON's code; it
    matters for BatchNorm); with ``references`` (MOON) the forward runs them too."""

    def __init__(self, net: LayeredNet, references: bool):
        super().__init__()
        self.net, self.references = net, references
        for name in REFERENCES:
            setattr(self, name, copy.deepcopy(net).requires_grad_(False))
        self.register_buffer("has_prev", torch.zeros(()))
        self.train()

    def train(self, mode: bool = True):
        super().train(mode)
        for name in REFERENCES:
            getattr(self, name).eval()
        return self

    def forward(self, x: torch.Tensor):
        """(logits, z = P(D(x))) of ``net``; with ``references`` also z of ``glob`` and
        ``prev`` (constants) and ``has_prev`` per row."""
        z = self.net.project(x)
        if not self.references:
            return self.net.output(z), z
        with torch.no_grad():
            z_glob, z_prev = self.glob.project(x), self.prev.project(x)
        return self.net.output(z), z, z_glob, z_prev, self.has_prev.expand(len(x))


def reference_pairs(model: WithReferences, reference: str = "glob") -> list[tuple[str, str]]:
    """(live, reference) key pairs of the network's trainable weights (a proximal term towards
    ``glob``)."""
    return [(f"net.{k}", f"{reference}.{k}") for k, _ in model.net.named_parameters()]


class References(Strategy):
    """Mixed into a strategy over a :class:`WithReferences` model; call :meth:`refer` when
    building it. The server's model is the network alone (keys without ``net.``)."""

    def refer(self, model: WithReferences, keep_previous: bool) -> None:
        """The model's live parameters train; ``keep_previous``: each client keeps its trained
        network as its next ``prev`` (MOON)."""
        self.net_params = {f"net.{k}" for k, _ in model.net.named_parameters()}
        self.keep_previous = keep_previous

    def trainable(self, state: FedState) -> set[str]:
        return self.net_params  # the references stay frozen

    def init_server(self, model: WithReferences) -> dict:
        return {"global": {k: v.detach().clone() for k, v in model.net.state_dict().items()}}

    def local_start(self, state: FedState, client: int, received: dict) -> dict:
        kept = state.clients.get(client, {})
        start = {f"{part}.{k}": v for part in ("net", "glob") for k, v in received.items()}
        start.update({f"prev.{k}": kept.get(k, v) for k, v in received.items()})
        device = next(iter(received.values())).device
        start["has_prev"] = torch.tensor(float(bool(kept)), device=device)
        return start

    def upload(self, state: FedState, client: int, trained: dict) -> dict:
        return {k[len("net.") :]: v for k, v in trained.items() if k.startswith("net.")}

    def keep(self, state: FedState, client: int, trained: dict) -> dict | None:
        return self.upload(state, client, trained) if self.keep_previous else None

    def final_model(self, state: FedState) -> dict:
        """The wrapper's whole state with the global network in every slot."""
        return self.local_start(state, -1, state.server["global"])
