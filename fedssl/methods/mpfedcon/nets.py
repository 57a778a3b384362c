"""MpFedcon's layered network F = O∘P∘D built from params, and the wrapper local training uses.

:class:`Anchored` holds the party's live network ``net`` beside a frozen copy ``anchor`` (the
model the party started the round from: MpFedcon's negative z_con = P_d(x), FedProx's proximal
point) and the global class centres it received (``centres`` [C, d] with ``has_centre`` [C]),
all as ordinary parameters and buffers, so the cohort trainer stacks them per client and the
losses read them under ``vmap`` like any other weight. Parameter names of the network are
``net.base.*``, ``net.projector.*``, ``net.output.*``: the layers a method shares or keeps are
chosen by these prefixes.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from fedssl.models.cnn import CNNCifarBase, LayeredNet, MLPBase, layered_net
from fedssl.strategies.personal import part  # noqa: F401 - the parts of a state, for the method

LAYERS = ("base", "projector", "output")  # D, P, O, input to output


def build_net(p, image_shape: tuple[int, int, int], num_classes: int) -> LayeredNet:
    """The layered network of ``p.net`` (a :class:`~fedssl.methods.mpfedcon.NetParams`)."""
    n = p.net
    if n.base == "cnn":
        base: nn.Module = CNNCifarBase(image_shape, n.conv_channels, n.kernel_size, n.hidden)
    else:
        base = MLPBase(image_shape, n.hidden)
    return layered_net(base, num_classes, tuple(n.projection) if n.projection else None)


def projection_dim(net: LayeredNet) -> int:
    return net.output.in_features


class Anchored(nn.Module):
    """``net`` plus its round-start copy ``anchor`` and the received class centres."""

    def __init__(self, net: LayeredNet, num_classes: int):
        super().__init__()
        self.net = net
        self.anchor = copy.deepcopy(net).requires_grad_(False)
        self.register_buffer("centres", torch.zeros(num_classes, projection_dim(net)))
        self.register_buffer("has_centre", torch.zeros(num_classes))  # 0/1: vmap-friendly

    def forward(self, x: Tensor, contrast: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
        """(logits, z = P(D(x)), and with ``contrast`` the anchor's z_con = P_d(D_d(x)))."""
        z = self.net.project(x)
        z_con = self.anchor.project(x).detach() if contrast else None
        return self.net.output(z), z, z_con


def layer_of(key: str) -> str:
    """``net.base.0.weight`` -> ``base`` (a key of the network, with or without ``net.``)."""
    parts = key.split(".")
    return parts[1] if parts[0] == "net" else parts[0]


def net_keys(model: Anchored) -> list[str]:
    """The network's parameter and buffer names (``net.*``), in order."""
    return [k for k in model.state_dict() if k.startswith("net.")]
