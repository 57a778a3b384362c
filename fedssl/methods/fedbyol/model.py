"""The BYOL network of the family (EasyFL's layout, spec §2.3): an online encoder (backbone +
projector), a predictor, and the target, an EMA twin of the online encoder that never gets
gradients. Parameter names: ``encoder.*``, ``predictor.*`` (what travels) and
``target.encoder.*`` (what stays on the client)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from fedssl.models.encoders import build_backbone, frozen
from fedssl.models.heads import BNMLP
from fedssl.models.momentum import momentum_twin, twin_pairs
from fedssl.params import ModelParams
from fedssl.precision import channels_last
from fedssl.stage.runtime import derive_seed
from fedssl.strategies.byol import TARGET

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext


def mlp(in_dim: int, hidden: int, out_dim: int) -> BNMLP:
    """EasyFL's BYOL projector / predictor: Linear-BN-ReLU-Linear."""
    return BNMLP(in_dim, [hidden], out_dim, last_bn=False)


class ByolEncoder(nn.Module):
    """Backbone + projector; ``forward`` gives the projection."""

    def __init__(self, params: ModelParams, image_shape):
        super().__init__()
        self.backbone = build_backbone(params, tuple(image_shape))
        self.projector = mlp(self.backbone.out_dim, params.proj_hidden, params.proj_dim)

    def forward(self, x):
        return self.projector(self.backbone(x))


class ByolNet(nn.Module):
    """``forward(x)`` -> (online predictions, target projections) of the same images."""

    def __init__(self, params: ModelParams, image_shape):
        super().__init__()
        self.encoder = ByolEncoder(params, image_shape)
        self.predictor = mlp(params.proj_dim, params.proj_hidden, params.proj_dim)
        self.target = momentum_twin(encoder=self.encoder)

    def forward(self, x):
        return self.predictor(self.encoder(x)), self.target["encoder"](x)


def seeded_byol(params: ModelParams, image_shape, seed: int, device: torch.device) -> ByolNet:
    torch.manual_seed(derive_seed(seed, "init"))
    model = ByolNet(params, image_shape).to(device)
    if channels_last():
        model = model.to(memory_format=torch.channels_last)
    return model


def byol_encoder(method, image_shape, projection: bool = False) -> nn.Module:
    """The untrained module the probes (and :mod:`fedssl.export`) load the global online encoder
    into: its backbone, or with ``projection`` backbone and projector."""
    enc = ByolEncoder(method.model, image_shape)
    return frozen(enc if projection else enc.backbone)


def load_online_encoder(ctx: StepContext) -> nn.Module:
    """The global online encoder's backbone (or backbone + projector) a pretraining stage saved,
    for the probes."""
    ckpt = torch.load(
        ctx.input("pretrain") / "model.pt", map_location=ctx.device, weights_only=True
    )
    projection = ctx.exp.features.layer == "projection"
    module = byol_encoder(ctx.exp.method, ckpt["image_shape"], projection)
    prefix = "encoder." if projection else "encoder.backbone."
    module.load_state_dict(
        {k[len(prefix) :]: v for k, v in ckpt["model"].items() if k.startswith(prefix)}
    )
    return module.to(ctx.device)


def target_ema(model: ByolNet, p):
    """The cohort's after-step hook: the target follows the online encoder by EMA."""
    from fedssl.models.momentum import ema_after_step

    names = [k for k, _ in model.named_parameters()]
    return ema_after_step(twin_pairs(names, model.target), p.target_ema)


def save_online(model: ByolNet, path, image_shape) -> None:
    """The online network and predictor (the target stays behind)."""
    from fedssl.stage.runtime import torch_save

    online = {k: v for k, v in model.state_dict().items() if not k.startswith(TARGET)}
    torch_save({"model": online, "image_shape": tuple(image_shape)}, path)


def describe(model: ByolNet) -> dict:
    return {
        "parameters": sum(q.numel() for q in model.encoder.parameters()),
        "predictor_parameters": sum(q.numel() for q in model.predictor.parameters()),
    }


def family_strategy(cfg, model: ByolNet, p, data):
    """The family member's strategy from the library (FedBYOL, FedEMA or FedU, by name)."""
    from fedssl.strategies import byol

    if p.name == "fedu":
        return byol.FedUStrategy(cfg, model, threshold=p.dapu_threshold)
    if p.name == "fedema":
        return byol.FedEMAStrategy(cfg, model, tau=p.tau, divergence=p.divergence)
    return byol.FedBYOLStrategy(cfg, model)
