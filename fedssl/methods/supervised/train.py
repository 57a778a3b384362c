"""Global supervised FL's network, loss and strategy, the hooks of
:class:`~fedssl.methods.base.SupervisedFederatedMethod` (imported when the ``train`` step runs;
its costs: :mod:`.costs`).

:class:`~fedssl.strategies.references.WithReferences` (the library's) holds the client's live
network ``net`` beside two frozen copies, the global model the round starts from (``glob``:
MOON's positive) and the client's previous local model (``prev``: MOON's negative), as
ordinary parameters, so the cohort trainer stacks them per client like any other weight.
:class:`GlobalFedAvg` sends the global network down, takes the trained one back, keeps
``prev`` on MOON's clients (the library's
:class:`~fedssl.strategies.references.References`) and scores the global model on the test
split after every round.

A MOON client that has not trained yet has no previous model and no contrastive term
(``has_prev`` 0). The authors' code gives it its initial network as the negative instead. At
full participation (every committed MOON run) the two agree: in round 1 that negative is the
global model itself, so the term is log 2 with zero gradient. Under partial participation they
differ: a client first sampled after round 1 trains on CE alone here, against the initial
network there (``tests/methods/test_baseline_mechanisms.py``).
"""

from __future__ import annotations

from torch import nn

from fedssl.losses import masked_cross_entropy, model_contrastive_loss
from fedssl.methods.federated_supervised import ScoredFedAvg
from fedssl.models.cnn import LayeredNet, layered_net
from fedssl.models.encoders import build_backbone, frozen
from fedssl.strategies.references import References, WithReferences


# ------------------------------------------------------------------ the network
def build_net(p, image_shape, num_classes: int) -> LayeredNet:
    """MOON's ModelFedCon on the encoder of ``p.model``: D, P = Linear-ReLU-Linear, O on P."""
    m = p.model
    return layered_net(
        build_backbone(m, tuple(image_shape)), num_classes, (m.proj_hidden, m.proj_dim)
    )


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


# ------------------------------------------------------------------ the protocol
class GlobalFedAvg(References, ScoredFedAvg):
    """The whole network down and up, size-weighted FedAvg (the engine's defaults) on the
    network's own keys, the references filled by the library's
    :class:`~fedssl.strategies.references.References`; MOON's clients keep their trained model
    as next round's ``prev``."""

    def __init__(self, cfg, p, model: WithReferences, data, tests):
        super().__init__(cfg, p, model, data, tests)
        self.refer(model, keep_previous=p.variant == "moon")


def describe(fed, p) -> dict:
    return {"variant": p.variant}


def global_encoder(net: LayeredNet, projection: bool = False) -> nn.Module:
    """The frozen encoder the probes read: D, or with ``projection`` P∘D."""
    return frozen(nn.Sequential(net.base, net.projector) if projection else net.base)
