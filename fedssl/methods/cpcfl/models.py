"""CP-CFL's networks, composed from the library: the encoder θ_f (the 4-conv CNN or ResNet-18,
optionally after a bilinear resize of the input), a pool model θ = (θ_f, θ_c), and the
server-side SSL networks (SimCLR, BYOL with an EMA target, SimSiam)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedssl.losses import byol_loss, nt_xent, simsiam_loss
from fedssl.models.cnn import CPCFLEncoder
from fedssl.models.encoders import CifarResNet18
from fedssl.models.heads import (
    CPCFL_HEAD_WIDTHS,
    ClassifierHead,
    byol_predictor,
    byol_projector,
    simclr_projector,
)
from fedssl.models.momentum import ema_update_pairs, momentum_twin, twin_pairs
from fedssl.stage.runtime import derive_seed


class Resize(nn.Module):
    """Bilinear resize to ``size`` x ``size`` (spec §4: small images up to the encoder's size)."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def forward(self, x):
        if x.shape[-1] == self.size and x.shape[-2] == self.size:
            return x
        return F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)


class Encoder(nn.Module):
    """θ_f: images in [0, 1] at their native size -> features [n, out_dim]."""

    def __init__(self, e, image_shape: tuple[int, int, int]):
        super().__init__()
        c = image_shape[0]
        shape = (c, e.input_size, e.input_size) if e.input_size else tuple(image_shape)
        self.resize = Resize(e.input_size) if e.input_size else nn.Identity()
        if e.arch == "cnn4":
            self.net = CPCFLEncoder(shape, e.channels, e.feature_dim, e.padding)
        else:
            self.net = CifarResNet18(c, e.width, e.norm, e.channels_per_group)
        self.out_dim = self.net.out_dim

    def forward(self, x):
        return self.net(self.resize(x))


class PoolModel(nn.Module):
    """A cluster model θ^n = (θ_f, θ_c^n): parameters ``encoder.*`` and ``head.*``."""

    def __init__(self, e, head: str, image_shape, num_classes: int):
        super().__init__()
        self.encoder = Encoder(e, image_shape)
        self.head = ClassifierHead(self.encoder.out_dim, num_classes, CPCFL_HEAD_WIDTHS[head])

    def forward(self, x):
        return self.head(self.encoder(x))


def seeded(build, *seed_parts):
    """``build()`` under a seed derived from ``seed_parts`` (torch's default initialisation)."""
    torch.manual_seed(derive_seed(*seed_parts))
    return build()


def head_keys(model: nn.Module) -> list[str]:
    return [k for k in model.state_dict() if k.startswith("head.")]


def encoder_keys(model: nn.Module) -> list[str]:
    return [k for k in model.state_dict() if k.startswith("encoder.")]


# ============================================================================ server-side SSL
class SSLNet(nn.Module):
    """Encoder + projector (+ predictor) for one of SimCLR, BYOL, SimSiam; ``loss(v1, v2)`` is
    the method's loss on two augmented views, ``after_step()`` BYOL's EMA update of its target
    (θ'_f, θ'_g) with β (Eqs. 10-11)."""

    def __init__(
        self,
        kind: str,
        encoder: Encoder,
        width: int,
        predictor_hidden: int = 64,
        temperature: float = 0.1,
        ema: float = 0.9,
    ):
        super().__init__()
        self.kind, self.temperature, self.ema = kind, temperature, ema
        self.encoder = encoder
        d = encoder.out_dim
        if kind == "simclr":
            self.projector = simclr_projector(d, width, width)
            self.predictor = None
        elif kind in ("byol", "simsiam"):
            self.projector = byol_projector(d, width, width)
            self.predictor = byol_predictor(width, predictor_hidden, width)
        else:
            raise ValueError(f"unknown SSL method {kind!r}")
        self.target = None
        if kind == "byol":  # θ'_f, θ'_g: start as copies of the online branch, no gradients
            self.target = momentum_twin(encoder=encoder, projector=self.projector)
        # BYOL's EMA twins: target.encoder.* / target.projector.* of the online branch
        self.pairs = {} if self.target is None else twin_pairs(self.state_dict(), self.target)

    def online(self):
        """The modules the optimiser trains."""
        return [m for m in (self.encoder, self.projector, self.predictor) if m is not None]

    def loss(self, v1: torch.Tensor, v2: torch.Tensor) -> torch.Tensor:
        n = v1.shape[0]
        z = self.projector(self.encoder(torch.cat([v1, v2])))
        z1, z2 = z[:n], z[n:]
        if self.kind == "simclr":
            return nt_xent(z1, z2, self.temperature)
        p = self.predictor(z)
        p1, p2 = p[:n], p[n:]
        if self.kind == "simsiam":
            return simsiam_loss(p1, p2, z1, z2)
        with torch.no_grad():
            t = self.target["projector"](self.target["encoder"](torch.cat([v1, v2])))
        return byol_loss(p1, p2, t[:n], t[n:])

    @torch.no_grad()
    def after_step(self) -> None:
        state = self.state_dict()
        ema_update_pairs(state, state, self.pairs, self.ema)
