"""The split network of MocoSFL / MonAcoSFL: the GN + WS backbone cut into the clients' bottom
units and the server's top (remaining units, pooling, projector). The modules are templates
for functional calls; the weights the federation trains live in dicts of tensors."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn
from torch.func import functional_call

from fedssl.models.heads import ProjectionHead
from fedssl.models.split import ServerPart, SplitMobileNetV2, SplittableNet, split_resnet18
from fedssl.stage.runtime import derive_seed

Tensors = dict[str, torch.Tensor]


class ServerTop(nn.Module):
    """The server's side: the remaining units + pooling (``backbone``), then the projector."""

    def __init__(self, backbone: ServerPart, proj_hidden: int, proj_dim: int):
        super().__init__()
        self.backbone = backbone
        self.projector = ProjectionHead(backbone.out_dim, proj_hidden, proj_dim)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.projector(self.backbone(h))


def build_backbone(b, in_channels: int) -> SplittableNet:
    """The GN + WS network of params ``b`` (:class:`SflBackbone`)."""
    if b.arch == "resnet18":
        return split_resnet18(
            b.width or 64,
            in_channels=in_channels,
            channels_per_group=b.channels_per_group,
            stem=b.stem,
        )
    return SplitMobileNetV2(
        b.width_mult or 1.0,
        in_channels=in_channels,
        channels_per_group=b.channels_per_group,
        stem=b.stem,
    )


class SplitNets(nn.Module):
    """The model a MocoSFL recipe trains: the template modules for functional calls (the
    clients' bottom ``cut`` units, ``client``; the server's ``top``) holding the seeded initial
    weights."""

    def __init__(self, net: SplittableNet, client: nn.Sequential, top: ServerTop, cut: int):
        super().__init__()
        self.client, self.top, self.cut = client, top, cut
        # the whole net is not a submodule (its units are client's and top's): only its shapes
        self._activation_shape = partial(net.cut_activation_shape, cut)

    def client_state(self) -> Tensors:
        return {k: v.detach().clone() for k, v in self.client.named_parameters()}

    def top_state(self) -> Tensors:
        return {k: v.detach().clone() for k, v in self.top.named_parameters()}

    def activation_shape(self, image_shape) -> tuple[int, int, int]:
        return self._activation_shape(image_shape)

    def client_numel(self) -> int:
        return sum(p.numel() for p in self.client.parameters())

    @torch.no_grad()
    def features(
        self, client: Tensors, server: Tensors, x: torch.Tensor, projection: bool = False
    ) -> torch.Tensor:
        """Pooled backbone features (or projections) of float images ``x``."""
        h = functional_call(self.client, client, (x,))
        if projection:
            return functional_call(self.top, server, (h,))
        backbone = {
            k[len("backbone.") :]: v for k, v in server.items() if k.startswith("backbone.")
        }
        return functional_call(self.top.backbone, backbone, (h,))

    def embedding(self, model: dict | None) -> Callable[[torch.Tensor], torch.Tensor]:
        """The k-NN monitor's feature function (:class:`fedssl.eval.monitor.KnnMonitor`): the
        pooled features of the federation's final model, ``{"client": ..., "server": ...}``
        (the latest synced client part and the server's top)."""
        if model is None:
            raise ValueError("the split model's monitor reads a trained model, not the template")
        return lambda x: self.features(model["client"], model["server"], x)


def build_nets(p, image_shape, device) -> SplitNets:
    """The seeded initial network of MocoSFL params ``p``, cut at ``p.cut``."""
    torch.manual_seed(derive_seed(p.seed, "init", "mocosfl"))
    net = build_backbone(p.backbone, image_shape[0])
    client, server = net.split(p.cut)
    top = ServerTop(server, p.backbone.proj_hidden, p.backbone.proj_dim)
    for module in (client, top):
        module.to(device)
        if any(True for _ in module.buffers()):
            raise ValueError("split learning here needs models without buffers (GN + WS)")
    return SplitNets(net, client, top, p.cut)


class SplitEncoder(nn.Module):
    """The deployed model for the probes: client part + server backbone (+ projector)."""

    def __init__(self, nets: SplitNets, client: Tensors, server: Tensors, projection: bool = False):
        super().__init__()
        nets.client.load_state_dict(client)
        nets.top.load_state_dict(server)
        self.client, self.top, self.projection = nets.client, nets.top, projection

    def forward(self, x):
        h = self.top.backbone(self.client(x))
        return self.top.projector(h) if self.projection else h
