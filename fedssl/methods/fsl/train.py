"""FSL's network, loss and strategy, the hooks of
:class:`~fedssl.methods.base.SupervisedFederatedMethod` (imported when the ``train`` stage
runs; its costs: :mod:`.costs`).

Because no gradient goes back to the client, a client's step and its server copy's step on the
same smashed batch s are independent: one optimizer step on CE(a_c(s), y) + CE(w_s(sg(s)), y)
updates w_c and a_c by the local loss only and w_s by the server loss only. So a round is the
engine's local training of :class:`SplitClassifier` (clients vectorised as usual) followed by
the size-weighted FedAvg of all its parts; :class:`FSLTraffic` counts what crosses the network:
the client part and auxiliary head both ways, and each step's smashed data and labels up, with
the shape and dtype of the client part's real output (the server copies never travel).
"""

from __future__ import annotations

import torch
from torch import nn

from fedssl.fl.state import FedState
from fedssl.losses import masked_cross_entropy
from fedssl.methods.federated_supervised import ScoredFedAvg
from fedssl.models.encoders import build_backbone, frozen
from fedssl.models.pooling import GlobalAvgPool
from fedssl.training.epochs import encoded

SMASHED, LABELS = "smashed_data", "labels"  # ledger kinds besides the models


class SplitClassifier(nn.Module):
    """``client`` (the first ``cut`` encoder units), ``aux`` (pool + Linear on the cut layer)
    and ``server`` (the other units + the classifier). ``forward`` in training mode is a split
    step's two outputs, (aux(s), server(sg(s))) of s = client(x); in eval mode, inference:
    server∘client."""

    def __init__(self, p, image_shape, classes: int):
        super().__init__()
        backbone = build_backbone(p.model, tuple(image_shape))
        units = list(backbone)
        self.client = nn.Sequential(*units[: p.cut])
        self.server = nn.Sequential(*units[p.cut :], nn.Linear(backbone.out_dim, classes))
        with torch.no_grad():
            channels = self.client.eval()(torch.zeros(1, *image_shape)).shape[1]
        self.client.train()
        self.aux = nn.Sequential(GlobalAvgPool(), nn.Flatten(), nn.Linear(channels, classes))

    def forward(self, x: torch.Tensor):
        if not self.training:
            return self.server(self.client(x))
        s = self.client(x)
        return self.aux(s), self.server(s.detach())  # sg(s): no gradient to the client


def fsl_loss(outputs, batch, p):
    """The client's local loss plus its server copy's loss on the same smashed batch."""
    local, server = outputs
    return masked_cross_entropy(local, batch.labels, batch.valid) + masked_cross_entropy(
        server, batch.labels, batch.valid
    )


def smashed_sample(model: SplitClassifier, images: torch.Tensor) -> torch.Tensor:
    """One sample's smashed data as the client part really emits it (shape, dtype)."""
    x = images[:1].float() / 255
    model.client.eval()  # leaves the BN statistics alone
    try:
        with torch.no_grad():
            (smashed,) = encoded(x.device, model.client, [(x,)])
            return smashed[0]
    finally:
        model.client.train()


class FSLTraffic(ScoredFedAvg):
    """The engine's FedAvg of every part; the ledger sees the client part and auxiliary head
    both ways (the server copies stay on the server) and, per client, the smashed data and
    labels of every local step (their shape and dtype: ``smashed``, the client part's real
    output on one image); the global model is scored on the test split each round."""

    def __init__(self, cfg, p, model: SplitClassifier, data, tests):
        super().__init__(cfg, p, model, data, tests)
        self.smashed = smashed_sample(model, data.images).to("meta")

    def traffic(self, tensors: dict) -> dict[str, dict]:
        return {
            kind: {k: v for k, v in tensors.items() if k.startswith(f"{part}.")}
            for kind, part in (("client_model", "client"), ("aux_model", "aux"))
        }

    def upload(self, state: FedState, client: int, trained: dict) -> dict:
        rows = len(self.data.clients[client]) * self.p.federation.local_epochs  # h = 1
        state.ledger.sent(client, {"s": self.smashed.expand(rows, *self.smashed.shape)}, SMASHED)
        state.ledger.sent(
            client, {"y": torch.empty(rows, dtype=torch.int64, device="meta")}, LABELS
        )
        return trained


def describe(fed, p) -> dict:
    return {"smashed_sample_shape": list(fed.strategy.smashed.shape)}


def global_encoder(model: SplitClassifier, projection: bool = False) -> nn.Module:
    """The frozen encoder: the client part, then the server's units (no classifier; FSL has no
    projection head, so ``features.layer: projection`` reads the same)."""
    return frozen(nn.Sequential(*model.client, *model.server[:-1]))
