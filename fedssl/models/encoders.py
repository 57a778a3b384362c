"""Encoders (backbones) built from ModelParams, and the SimCLR contrastive model (its projection
head, :class:`~fedssl.models.heads.ProjectionHead`, lives in heads.py, free of the params layer)."""

from __future__ import annotations

import torch
from torch import nn

from fedssl.models.heads import ProjectionHead
from fedssl.models.norms import make_norm
from fedssl.models.pointwise import StridedPointwise
from fedssl.models.pooling import GlobalAvgPool
from fedssl.params import ModelParams
from fedssl.precision import channels_last
from fedssl.stage.runtime import derive_seed


def conv_norm_relu(cin: int, cout: int, stride: int, norm: str, cpg: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
        make_norm(norm, cout, cpg),
        nn.ReLU(inplace=True),
    )


class SmallCNN(nn.Sequential):
    """Smoke-scale encoder: four 3x3 conv blocks (w, 2w, 2w stride 2, 4w stride 2), global
    average pool. ``out_dim`` = 4w."""

    def __init__(self, in_channels: int, width: int, norm: str, cpg: int):
        w = width
        super().__init__(
            conv_norm_relu(in_channels, w, 1, norm, cpg),
            conv_norm_relu(w, 2 * w, 2, norm, cpg),
            conv_norm_relu(2 * w, 2 * w, 1, norm, cpg),
            conv_norm_relu(2 * w, 4 * w, 2, norm, cpg),
            GlobalAvgPool(),
            nn.Flatten(),
        )
        self.out_dim = 4 * w


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, norm: str, cpg: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
            make_norm(norm, cout, cpg),
            nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
            make_norm(norm, cout, cpg),
        )
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                StridedPointwise(cin, cout, stride), make_norm(norm, cout, cpg)
            )

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


class CifarResNet18(nn.Sequential):
    """ResNet-18 for small images: 3x3 stride-1 stem, no max-pool, stages of 2 BasicBlocks at
    widths w, 2w, 4w, 8w (w = 64 is the standard network), global average pool."""

    def __init__(self, in_channels: int, width: int, norm: str, cpg: int):
        widths = [width, 2 * width, 4 * width, 8 * width]
        layers: list[nn.Module] = [conv_norm_relu(in_channels, width, 1, norm, cpg)]
        cin = width
        for i, w in enumerate(widths):
            stride = 1 if i == 0 else 2
            layers += [BasicBlock(cin, w, stride, norm, cpg), BasicBlock(w, w, 1, norm, cpg)]
            cin = w
        super().__init__(*layers, GlobalAvgPool(), nn.Flatten())
        self.out_dim = widths[-1]


class Pixels(nn.Flatten):
    """No encoder: the flattened image in [0, 1] is the representation."""

    def __init__(self, image_shape: tuple[int, int, int]):
        super().__init__()
        c, h, w = image_shape
        self.out_dim = c * h * w


def build_backbone(params: ModelParams, image_shape: tuple[int, int, int]) -> nn.Module:
    in_channels = image_shape[0]
    if params.arch == "small_cnn":
        return SmallCNN(in_channels, params.width, params.norm, params.channels_per_group)
    if params.arch == "resnet18":
        return CifarResNet18(in_channels, params.width, params.norm, params.channels_per_group)
    if params.arch == "pixels":
        return Pixels(image_shape)
    raise ValueError(f"unknown arch {params.arch!r}")


class ContrastiveModel(nn.Module):
    """Backbone + projection head; ``forward`` returns the projections."""

    def __init__(self, params: ModelParams, image_shape: tuple[int, int, int]):
        super().__init__()
        self.backbone = build_backbone(params, image_shape)
        self.head = ProjectionHead(self.backbone.out_dim, params.proj_hidden, params.proj_dim)

    def forward(self, x):
        return self.head(self.backbone(x))


def seeded_contrastive_model(
    params: ModelParams, image_shape, seed: int, device: torch.device
) -> ContrastiveModel:
    """The seeded initial network: every method and reference row with these settings starts
    from the same weights."""
    torch.manual_seed(derive_seed(seed, "init"))
    model = ContrastiveModel(params, tuple(image_shape)).to(device)
    if channels_last():
        model = model.to(memory_format=torch.channels_last)
    return model


def frozen(module: nn.Module) -> nn.Module:
    """``module`` in eval mode with no parameter requiring gradients (for feature extraction)."""
    module.eval()
    for p in module.parameters():
        p.requires_grad_(False)
    return module


def save_contrastive_model(model: ContrastiveModel, path, image_shape) -> None:
    from fedssl.stage.runtime import torch_save

    torch_save({"model": model.state_dict(), "image_shape": tuple(image_shape)}, path)


def contrastive_encoder(method, image_shape, projection: bool = False) -> nn.Module:
    """The untrained module :func:`load_encoder` returns, for method params holding ``model``
    (what :mod:`fedssl.export` loads exported weights into)."""
    model = ContrastiveModel(method.model, tuple(image_shape))
    return frozen(model if projection else model.backbone)


def load_encoder(
    params: ModelParams, path, device: torch.device, projection: bool = False
) -> nn.Module:
    """The frozen encoder of a saved ContrastiveModel: its backbone, or with ``projection``
    the backbone and head."""
    ckpt = torch.load(path, map_location=device, weights_only=True)
    model = seeded_contrastive_model(params, ckpt["image_shape"], 0, device)
    model.load_state_dict(ckpt["model"])
    return frozen(model if projection else model.backbone)
