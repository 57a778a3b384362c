"""Global supervised FL's network, loss and strategy, the hooks of
:class:`~fedssl.methods.base.SupervisedFederatedMethod` (imported when the ``train`` step runs;
its costs: :mod:`.costs`).

:class:`WithReferences` holds the client's live network ``net`` beside two frozen copies, the
global model the round starts from (``glob``: MOON's positive) and the
client's previous local model (``prev``: MOON's negative), as ordinary parameters, so the cohort
trainer stacks them per client like any other weight. :class:`GlobalFedAvg` sends the global
network down, takes the trained one back, keeps ``prev`` on MOON's clients (in
``FedState.clients``, so the engine's checkpoint resumes a run exactly) and scores the global
model on the test split after every round.

A MOON client that has not trained yet has no previous model and no contrastive term
(``has_prev`` 0). The authors' code gives it its initial network as the negative instead. At
full participation (every committed MOON run) the two agree: in round 1 that negative is the
global model itself, so the term is log 2 with zero gradient. Under partial participation they
differ: a client first sampled after round 1 trains on CE alone here, against the initial
network there (``tests/methods/test_baseline_mechanisms.py``).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from fedssl.fl.state import FedState
from fedssl.losses import masked_cross_entropy, model_contrastive_loss
from fedssl.methods.federated_supervised import ScoredFedAvg
from fedssl.models.cnn import LayeredNet, layered_net
from fedssl.models.encoders import build_backbone, frozen

REFERENCES = ("glob", "prev")  # the frozen copies beside the live network


# ------------------------------------------------------------------ the network
def build_net(p, image_shape, num_classes: int) -> LayeredNet:
    """MOON's ModelFedCon on the encoder of ``p.model``: D, P = Linear-ReLU-Linear, O on P."""
    m = p.model
    return layered_net(
        build_backbone(m, tuple(image_shape)), num_classes, (m.proj_hidden, m.proj_dim)
    )


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


def with_references(p, net: LayeredNet) -> WithReferences:
    return WithReferences(net, references=p.variant == "moon")


# ------------------------------------------------------------------ the local losses
def supervised_loss(outputs, batch, p):
    """CE, plus for MOON μ times the model-contrastive term (spec §1, §6.2)."""
    ce = masked_cross_entropy(outputs[0], batch.labels, batch.valid)
    if p.variant != "moon":
        return ce
    _, z, z_glob, z_prev, has_prev = outputs
    rows = batch.valid & (has_prev > 0)  # no previous model: l_con = 0
    return ce + p.mu * model_contrastive_loss(z, z_glob, z_prev, p.temperature, rows)


def reference_pairs(model: WithReferences, reference: str = "glob") -> list[tuple[str, str]]:
    """(live, reference) key pairs of the network's trainable weights (FedProx's term towards
    ``glob``, in the step the cost counters run)."""
    return [(f"net.{k}", f"{reference}.{k}") for k, _ in model.net.named_parameters()]


# ------------------------------------------------------------------ the protocol
class GlobalFedAvg(ScoredFedAvg):
    """The whole network down and up, size-weighted FedAvg (the engine's defaults) on the
    network's own keys; MOON's clients keep their trained model as next round's ``prev``."""

    def __init__(self, cfg, p, model: WithReferences, data, tests):
        super().__init__(cfg, p, model, data, tests)
        self.net_params = {f"net.{k}" for k, _ in model.net.named_parameters()}

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
        return self.upload(state, client, trained) if self.p.variant == "moon" else None

    def final_model(self, state: FedState) -> dict:
        """The wrapper's whole state with the global network in every slot."""
        return self.local_start(state, -1, state.server["global"])


def describe(fed, p) -> dict:
    return {"variant": p.variant}


def global_encoder(net: LayeredNet, projection: bool = False) -> nn.Module:
    """The frozen encoder the probes read: D, or with ``projection`` P∘D."""
    return frozen(nn.Sequential(net.base, net.projector) if projection else net.base)
