"""Global supervised FL on the engine's hooks (imported when the ``train`` step runs; its costs:
:mod:`.costs`).

:class:`WithReferences` holds the client's live network ``net`` beside two frozen copies, the
global model the round starts from (``glob``: FedProx's proximal point, MOON's positive) and the
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
from torch.func import functional_call

from fedssl.data.augment import views_of
from fedssl.eval.global_model import global_accuracy, load_saved, num_classes, test_split
from fedssl.fl.cohort import CohortTrainer, LocalData, OptimizerConfig, vectorise_clients
from fedssl.fl.engine import Federation, FedState, LocalTraining, Strategy, federation_config
from fedssl.fl.runner import run_federation, train_data
from fedssl.losses import masked_cross_entropy, model_contrastive_loss
from fedssl.models.cnn import LayeredNet, layered_net
from fedssl.models.encoders import build_backbone, frozen
from fedssl.precision import autocast
from fedssl.runtime import derive_seed, torch_save, write_json
from fedssl.strategies.fedprox import proximal

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
    matters for BatchNorm)."""

    def __init__(self, net: LayeredNet):
        super().__init__()
        self.net = net
        for name in REFERENCES:
            setattr(self, name, copy.deepcopy(net).requires_grad_(False))
        self.register_buffer("has_prev", torch.zeros(()))
        self.train()

    def train(self, mode: bool = True):
        super().train(mode)
        for name in REFERENCES:
            getattr(self, name).eval()
        return self

    def forward(self, x: torch.Tensor, references: bool = False):
        """(logits, z = P(D(x))) of ``net``; with ``references`` also z of ``glob`` and
        ``prev`` (constants)."""
        z = self.net.project(x)
        if not references:
            return self.net.output(z), z
        with torch.no_grad():
            z_glob, z_prev = self.glob.project(x), self.prev.project(x)
        return self.net.output(z), z, z_glob, z_prev


def seeded_model(p, image_shape, num_classes: int, device) -> WithReferences:
    torch.manual_seed(derive_seed(p.seed, "init", "supervised-net"))
    return WithReferences(build_net(p, image_shape, num_classes)).to(device)


# ------------------------------------------------------------------ the local losses
def local_loss(p, model: WithReferences):
    """The variant's loss(model, params, buffers, batch): CE, plus FedProx's proximal term
    towards ``glob`` (:func:`~fedssl.strategies.fedprox.proximal`) or MOON's model-contrastive
    term (spec §1, §6.2)."""
    moon = p.variant == "moon"

    def loss(model, params, buffers, batch):
        x = batch.views[0]
        with autocast(x):
            out = functional_call(model, (params, buffers), (x, moon))
        ce = masked_cross_entropy(out[0], batch.labels, batch.valid)
        if moon:
            _, z, z_glob, z_prev = (t.float() for t in out)
            rows = batch.valid & (buffers["has_prev"] > 0)  # no previous model: l_con = 0
            return ce + p.mu * model_contrastive_loss(z, z_glob, z_prev, p.temperature, rows)
        return ce

    if p.variant == "fedprox":
        return proximal(
            loss, p.mu, [(f"net.{k}", f"glob.{k}") for k, _ in model.net.named_parameters()]
        )
    return loss


# ------------------------------------------------------------------ the protocol
class GlobalFedAvg(Strategy):
    """The whole network down and up, size-weighted FedAvg (the engine's defaults) on the
    network's own keys; MOON's clients keep their trained model as next round's ``prev``."""

    def __init__(self, cfg, p, model: WithReferences, tests: LocalData):
        super().__init__(cfg)
        self.p, self.model, self.tests = p, model, tests
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

    def evaluate(self, state: FedState, round_: int) -> dict:
        return {
            "global_top1": round(
                global_accuracy(self.model.net, state.server["global"], self.tests), 4
            )
        }


def make_federation(
    p, model: WithReferences, data: LocalData, tests: LocalData, ckpt, fingerprint: str
) -> Federation:
    cohort = CohortTrainer(
        model,
        views_of(p),
        local_loss(p, model),
        OptimizerConfig("sgd", weight_decay=p.weight_decay, momentum=p.momentum),
        p.batch_size,
        p.local_epochs,
        vectorise_clients(p.parallel_clients, data.device),
    )
    cfg = federation_config(p, p.seed)
    strategy = GlobalFedAvg(cfg, p, model, tests)
    return Federation(strategy, LocalTraining(cohort), data, cfg, ckpt, fingerprint)


# ------------------------------------------------------------------ the stage
def train(ctx) -> None:
    """The ``train`` step: the federation (resumable), then the global network (``model.pt``)
    and its test accuracy (``global.json``)."""
    p = ctx.exp.method
    data, tests = train_data(ctx), test_split(ctx)
    classes = num_classes(data, tests)
    model = seeded_model(p, ctx.image_shape, classes, ctx.device)
    fed = make_federation(p, model, data, tests, ctx.resume_path, ctx.fingerprint)
    state = run_federation(ctx, fed, model)
    torch_save(
        {
            "model": model.net.state_dict(),
            "image_shape": tuple(ctx.image_shape),
            "classes": classes,
        },
        ctx.out / "model.pt",
    )
    top1 = global_accuracy(model.net, state.server["global"], tests)
    write_json(ctx.results_dir / "global.json", {"global_top1": round(top1, 4)})
    ctx.info.update(
        variant=p.variant,
        classes=classes,
        parameters=sum(q.numel() for q in model.net.parameters()),
    )


def global_encoder(net: LayeredNet, projection: bool = False) -> nn.Module:
    """The frozen encoder the probes read: D, or with ``projection`` P∘D."""
    return frozen(nn.Sequential(net.base, net.projector) if projection else net.base)


def untrained_encoder(method, image_shape, projection: bool = False) -> nn.Module:
    """The module :func:`encoder` returns, untrained (what an export loads into)."""
    return global_encoder(build_net(method, image_shape, 1), projection)


def encoder(ctx) -> nn.Module:
    """The frozen global encoder for the shared probes (``features.layer``)."""
    ckpt = load_saved(ctx)
    net = build_net(ctx.exp.method, ckpt["image_shape"], ckpt["classes"]).to(ctx.device)
    net.load_state_dict(ckpt["model"])
    return global_encoder(net, ctx.exp.features.layer == "projection")
