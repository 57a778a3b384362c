"""FSL on the engine (imported when the ``train`` and ``costs`` stages run).

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
import torch.nn.functional as F
from torch import nn

from fedssl import costs
from fedssl.data.augment import views_of
from fedssl.eval.global_model import global_accuracy, load_saved, num_classes, test_split
from fedssl.fl.cohort import CohortTrainer, OptimizerConfig, forward, vectorise_clients
from fedssl.fl.engine import Federation, FedState, LocalTraining, Strategy, federation_config
from fedssl.fl.runner import run_federation, train_data
from fedssl.losses import masked_cross_entropy
from fedssl.models.encoders import build_backbone, frozen
from fedssl.precision import under_policy
from fedssl.runtime import derive_seed, torch_save, write_json

SMASHED, LABELS = "smashed_data", "labels"  # ledger kinds besides the models


class SplitClassifier(nn.Module):
    """``client`` (the first ``cut`` encoder units), ``aux`` (pool + Linear on the cut layer)
    and ``server`` (the other units + the classifier); ``forward`` is inference, server∘client."""

    def __init__(self, p, image_shape, classes: int):
        super().__init__()
        backbone = build_backbone(p.model, tuple(image_shape))
        units = list(backbone)
        self.client = nn.Sequential(*units[: p.cut])
        self.server = nn.Sequential(*units[p.cut :], nn.Linear(backbone.out_dim, classes))
        with torch.no_grad():
            channels = self.client.eval()(torch.zeros(1, *image_shape)).shape[1]
        self.client.train()
        self.aux = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes)
        )

    def forward(self, x: torch.Tensor, split: bool = False):
        if not split:
            return self.server(self.client(x))
        s = self.client(x)
        return self.aux(s), self.server(s.detach())  # sg(s): no gradient to the client


def seeded_model(p, image_shape, classes: int, device) -> SplitClassifier:
    torch.manual_seed(derive_seed(p.seed, "init", "fsl-net"))
    return SplitClassifier(p, image_shape, classes).to(device)


def fsl_loss(model, params, buffers, batch):
    """The client's local loss plus its server copy's loss on the same smashed batch."""
    local, server = forward(model, (params, buffers), batch.views[0], True)
    return masked_cross_entropy(local, batch.labels, batch.valid) + masked_cross_entropy(
        server, batch.labels, batch.valid
    )


def smashed_sample(model: SplitClassifier, images: torch.Tensor) -> torch.Tensor:
    """One sample's smashed data as the client part really emits it (shape, dtype)."""
    x = images[:1].float() / 255
    model.client.eval()  # leaves the BN statistics alone
    try:
        with torch.no_grad():
            return under_policy(x, model.client, x)[0]
    finally:
        model.client.train()


class FSLTraffic(Strategy):
    """The engine's FedAvg of every part; the ledger sees the client part and auxiliary head
    both ways (the server copies stay on the server) and, per client, the smashed data and
    labels of every local step; the global model is scored on the test split each round."""

    def __init__(self, cfg, p, model: SplitClassifier, smashed: torch.Tensor, tests):
        super().__init__(cfg)
        self.p, self.model, self.smashed, self.tests = p, model, smashed, tests

    def traffic(self, tensors: dict) -> dict[str, dict]:
        return {
            kind: {k: v for k, v in tensors.items() if k.startswith(f"{part}.")}
            for kind, part in (("client_model", "client"), ("aux_model", "aux"))
        }

    def upload(self, state: FedState, client: int, trained: dict) -> dict:
        rows = len(self.fed.data.clients[client]) * self.p.local_epochs  # h = 1
        state.ledger.sent(client, {"s": self.smashed.expand(rows, *self.smashed.shape)}, SMASHED)
        state.ledger.sent(
            client, {"y": torch.empty(rows, dtype=torch.int64, device="meta")}, LABELS
        )
        return trained

    def evaluate(self, state: FedState, round_: int) -> dict:
        top1 = global_accuracy(self.model, state.server["global"], self.tests)
        return {"global_top1": round(top1, 4)}


def make_federation(p, model, data, tests, ckpt, fingerprint: str) -> Federation:
    cohort = CohortTrainer(
        model,
        views_of(p),
        fsl_loss,
        OptimizerConfig("sgd", weight_decay=p.weight_decay, momentum=p.momentum),
        p.batch_size,
        p.local_epochs,
        vectorise_clients(p.parallel_clients, data.device),
    )
    cfg = federation_config(p, p.seed)
    sample = smashed_sample(model, data.images).to("meta")
    strategy = FSLTraffic(cfg, p, model, sample, tests)
    return Federation(strategy, LocalTraining(cohort), data, cfg, ckpt, fingerprint)


def train(ctx) -> None:
    """The ``train`` step: the federation (resumable), the global model and its accuracy."""
    p = ctx.exp.method
    data, tests = train_data(ctx), test_split(ctx)
    classes = num_classes(data, tests)
    model = seeded_model(p, ctx.image_shape, classes, ctx.device)
    fed = make_federation(p, model, data, tests, ctx.resume_path, ctx.fingerprint)
    state = run_federation(ctx, fed, model)
    saved = {"model": model.state_dict(), "image_shape": tuple(ctx.image_shape), "classes": classes}
    torch_save(saved, ctx.out / "model.pt")
    top1 = global_accuracy(model, state.server["global"], tests)
    write_json(ctx.results_dir / "global.json", {"global_top1": round(top1, 4)})
    ctx.info.update(classes=classes, smashed_sample_shape=list(fed.strategy.smashed.shape))


def load_model(ctx) -> SplitClassifier:
    saved = load_saved(ctx)
    model = seeded_model(ctx.exp.method, saved["image_shape"], saved["classes"], ctx.device)
    model.load_state_dict(saved["model"])
    return model


def global_encoder(model: SplitClassifier) -> nn.Module:
    """The frozen encoder: the client part, then the server's units (no classifier; FSL has no
    projection head, so ``features.layer: projection`` reads the same)."""
    return frozen(nn.Sequential(*model.client, *model.server[:-1]))


def untrained_encoder(method, image_shape, projection: bool = False) -> nn.Module:
    """The module :func:`encoder` returns, untrained (what an export loads into)."""
    return global_encoder(SplitClassifier(method, image_shape, 1))


def encoder(ctx) -> nn.Module:
    return global_encoder(load_model(ctx))


def client_costs(ctx) -> list[dict]:
    """Per client: the bytes of its ledger, FLOPs of its own step (client part + auxiliary
    head, counted around a real step; the server's work is not the client's) and that step's
    memory (saved activations + weights, gradients, SGD momentum)."""
    p, model = ctx.exp.method, load_model(ctx).cpu()
    local = nn.Sequential(model.client, model.aux).train()
    x = costs.probe_batch(ctx.image_shape)
    y = torch.arange(len(x)) % model.aux[-1].out_features
    loss = lambda out, _x: F.cross_entropy(out, y)  # noqa: E731
    flops = costs.train_step_flops(local, x, loss) / len(x)
    acts = costs.saved_activation_bytes(local, x, loss) * p.batch_size / len(x)
    peak = int(acts + 3 * costs.tensor_bytes(local.parameters()))
    ledger = costs.ledger_of(ctx.input("train"), [len(c) for c in ctx.clients()])
    return costs.client_rows(ledger, flops * p.local_epochs, peak)
