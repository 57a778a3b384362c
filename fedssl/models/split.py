"""Backbones cut between client and server for split federated learning (MocoSFL / MonAcoSFL).

Spec monacosfl.md §2: ResNet-18 and MobileNetV2 in their CIFAR variants (3×3 stride-1 stem, no
max-pool), with GroupNorm and weight-standardised convolutions instead of BatchNorm ([code]
``group_norm=True``; groups of 4 channels). Without BatchNorm there are no running statistics
and no batch coupling, so clients' smashed data do not depend on who else is in the batch.

A network here is a list of *units*; ``split(k)`` gives the first k units to the client and the
rest, plus global average pooling and flatten, to the server:

* :class:`SplitResNet` (ResNet-18 by default): unit 1 is the stem, units 2..9 the 8 BasicBlocks.
  Cut k = stem + (k-1) blocks = the paper's L = 2k-1 weighted layers on the client
  (:meth:`SplitResNet.paper_layer_index`; the 1×1 projection shortcuts are not counted).
* :class:`SplitMobileNetV2`: unit 1 is the stem, units 2..8 the 7 inverted-residual stages,
  unit 9 the final 1×1 conv (to 1280 channels).

``split`` returns modules that *share* their parameters with the full network; give each client
its own copy (``copy.deepcopy``) when clients must differ.
``stem='imagenet'`` (7×7 stride-2 conv + 3×3 stride-2 max-pool for ResNet; stride 2 in the stem
and the second stage for MobileNetV2) is there for the paper's 224-px communication model (Fig. 3).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedssl.models.norms import make_norm
from fedssl.models.pointwise import convolve
from fedssl.models.pooling import GlobalAvgPool

STEMS = ("cifar", "imagenet")


class WSConv2d(nn.Conv2d):
    """Conv2d with weight standardisation: the kernel used is, per output channel,
    (w - mean) / sqrt(var + eps) over that channel's (in_channels / groups) × kh × kw weights
    (biased variance). The layer is therefore invariant to a per-channel affine change of its raw
    weights; the GroupNorm after it takes care of the output scale."""

    def __init__(self, *args, eps: float = 1e-10, **kwargs):
        super().__init__(*args, **kwargs)
        self.eps = eps

    def standardized_weight(self) -> Tensor:
        w = self.weight
        var, mean = torch.var_mean(w, dim=(1, 2, 3), correction=0, keepdim=True)
        return (w - mean) * torch.rsqrt(var + self.eps)

    def forward(self, x: Tensor) -> Tensor:
        return convolve(self, x, self.standardized_weight(), self.bias)


def ws_conv_gn(
    cin: int,
    cout: int,
    kernel: int,
    stride: int,
    cpg: int,
    *,
    groups: int = 1,
    act: type[nn.Module] | None = nn.ReLU,
) -> list[nn.Module]:
    """[WS conv (no bias, 'same'-style padding), GroupNorm, activation (unless ``act=None``)]."""
    layers: list[nn.Module] = [
        WSConv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
        make_norm("gn", cout, cpg),
    ]
    if act is not None:
        layers.append(act(inplace=True))
    return layers


class Unit(nn.Sequential):
    """A piece of the network between two possible cut points. ``out_channels`` and
    ``reduction`` (each spatial side becomes ⌈side / reduction⌉) describe its output."""

    def __init__(self, *layers: nn.Module, out_channels: int, reduction: int):
        super().__init__(*layers)
        self.out_channels, self.reduction = out_channels, reduction


class ServerPart(nn.Sequential):
    """The server's units, then global average pooling and flatten; ``out_dim`` features."""

    def __init__(self, units: Sequence[nn.Module], out_dim: int):
        super().__init__(*units, GlobalAvgPool(), nn.Flatten())
        self.out_dim = out_dim


class SplittableNet(nn.Module):
    """A chain of :class:`Unit`-like modules, then global average pooling (``out_dim``)."""

    def __init__(self, in_channels: int, units: Sequence[nn.Module]):
        super().__init__()
        self.in_channels = in_channels
        self.units = nn.ModuleList(units)
        self.pool = nn.Sequential(GlobalAvgPool(), nn.Flatten())
        self.out_dim = units[-1].out_channels

    @property
    def num_cuts(self) -> int:
        """The deepest cut: every unit on the client (the server only pools)."""
        return len(self.units)

    def _check_cut(self, cut: int) -> None:
        if not 0 <= cut <= self.num_cuts:
            raise ValueError(f"cut must be in 0..{self.num_cuts}, got {cut}")

    def split(self, cut: int) -> tuple[nn.Sequential, ServerPart]:
        """(client, server): the first ``cut`` units, and the others + pooling. ``cut=0`` puts
        everything on the server (centralised training)."""
        self._check_cut(cut)
        units = list(self.units)
        return nn.Sequential(*units[:cut]), ServerPart(units[cut:], self.out_dim)

    def cut_activation_shape(self, cut: int, image_shape: Sequence[int]) -> tuple[int, int, int]:
        """(C, H, W) of the client's output (the smashed data) for one image of
        ``image_shape`` = (C, H, W), computed from the architecture without running it."""
        self._check_cut(cut)
        channels, h, w = image_shape
        for unit in list(self.units)[:cut]:
            channels = unit.out_channels
            h, w = -(-h // unit.reduction), -(-w // unit.reduction)  # ceil division
        return channels, h, w

    def forward(self, x: Tensor) -> Tensor:
        for unit in self.units:
            x = unit(x)
        return self.pool(x)


class GNBasicBlock(nn.Module):
    """ResNet BasicBlock with WS convs and GroupNorm: two 3×3 convs (the first with the stride)
    plus the input, through a 1×1 projection ``shortcut`` when the shape changes; ReLU."""

    def __init__(self, cin: int, cout: int, stride: int, cpg: int):
        super().__init__()
        self.out_channels, self.reduction = cout, stride
        self.body = nn.Sequential(
            *ws_conv_gn(cin, cout, 3, stride, cpg), *ws_conv_gn(cout, cout, 3, 1, cpg, act=None)
        )
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(*ws_conv_gn(cin, cout, 1, stride, cpg, act=None))

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


def _check_stem(stem: str) -> None:
    if stem not in STEMS:
        raise ValueError(f"unknown stem {stem!r} (expected one of: {', '.join(STEMS)})")


def resnet_stem(in_channels: int, width: int, cpg: int, stem: str) -> Unit:
    _check_stem(stem)
    if stem == "cifar":
        return Unit(*ws_conv_gn(in_channels, width, 3, 1, cpg), out_channels=width, reduction=1)
    return Unit(
        *ws_conv_gn(in_channels, width, 7, 2, cpg),
        nn.MaxPool2d(3, 2, 1),
        out_channels=width,
        reduction=4,
    )


class SplitResNet(SplittableNet):
    """GN + WS ResNet with stages of ``blocks_per_stage`` BasicBlocks at widths w, 2w, 4w, 8w
    (strides 1, 2, 2, 2); (2, 2, 2, 2) is ResNet-18, and ``out_dim`` = 8w."""

    def __init__(
        self,
        width: int = 64,
        in_channels: int = 3,
        blocks_per_stage: Sequence[int] = (2, 2, 2, 2),
        channels_per_group: int = 4,
        stem: str = "cifar",
    ):
        units: list[nn.Module] = [resnet_stem(in_channels, width, channels_per_group, stem)]
        cin = width
        for stage, n_blocks in enumerate(blocks_per_stage):
            cout = width * 2**stage
            for b in range(n_blocks):
                stride = 2 if stage > 0 and b == 0 else 1
                units.append(GNBasicBlock(cin, cout, stride, channels_per_group))
                cin = cout
        super().__init__(in_channels, units)

    def paper_layer_index(self, cut: int) -> int:
        """The paper's cut index L: weighted layers on the client (stem 1 + 2 per block)."""
        if not 1 <= cut <= self.num_cuts:
            raise ValueError(f"cut must be in 1..{self.num_cuts}, got {cut}")
        return 2 * cut - 1

    def cut_for_paper_layer(self, layer: int) -> int:
        """The cut k whose client holds the paper's L = ``layer`` weighted layers (L odd)."""
        if layer % 2 == 0 or not 1 <= layer <= 2 * self.num_cuts - 1:
            raise ValueError(f"L must be odd in 1..{2 * self.num_cuts - 1}, got {layer}")
        return (layer + 1) // 2


def split_resnet18(width: int = 64, **kwargs) -> SplitResNet:
    """GN + WS CIFAR ResNet-18 (11,168,832 parameters at width 64)."""
    return SplitResNet(width, blocks_per_stage=(2, 2, 2, 2), **kwargs)


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1×1 expansion by ``expansion`` (left out when it is 1), 3×3 depthwise
    conv with the stride, 1×1 linear projection (no activation); the input is added back when
    the shape is unchanged. WS convs, GroupNorm, ReLU6."""

    def __init__(self, cin: int, cout: int, stride: int, expansion: int, cpg: int):
        super().__init__()
        hidden = cin * expansion
        layers: list[nn.Module] = []
        if expansion != 1:
            layers += ws_conv_gn(cin, hidden, 1, 1, cpg, act=nn.ReLU6)
        layers += ws_conv_gn(hidden, hidden, 3, stride, cpg, groups=hidden, act=nn.ReLU6)
        layers += ws_conv_gn(hidden, cout, 1, 1, cpg, act=None)
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: Tensor) -> Tensor:
        out = self.body(x)
        return out + x if self.residual else out


# MobileNetV2 stages: (expansion t, channels c, blocks n, stride s) from Sandler et al., Table 2.
# The CIFAR variant uses stride 1 in the second stage (and in the stem).
MOBILENETV2_STAGES = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def round_channels(channels: float, multiple: int = 8) -> int:
    """Nearest multiple of ``multiple`` (at least one), never more than 10% below ``channels``
    (keeps width-multiplied MobileNets hardware- and GroupNorm-friendly)."""
    rounded = max(multiple, int(channels + multiple / 2) // multiple * multiple)
    return rounded + multiple if rounded < 0.9 * channels else rounded


class SplitMobileNetV2(SplittableNet):
    """GN + WS MobileNetV2: stem (3×3 conv to 32·m), 7 inverted-residual stages, final 1×1 conv
    to 1280·m (m = ``width_mult``; channels rounded to multiples of 8); ``out_dim`` = 1280·m.

    Unlike Sandler et al., who keep 1280 channels for m < 1, the final conv scales with m too, so
    small test networks stay small.
    """

    def __init__(
        self,
        width_mult: float = 1.0,
        in_channels: int = 3,
        channels_per_group: int = 4,
        stem: str = "cifar",
        last_channels: int = 1280,
    ):
        _check_stem(stem)
        cpg, cifar = channels_per_group, stem == "cifar"
        cin = round_channels(32 * width_mult)
        units: list[nn.Module] = [
            Unit(
                *ws_conv_gn(in_channels, cin, 3, 1 if cifar else 2, cpg, act=nn.ReLU6),
                out_channels=cin,
                reduction=1 if cifar else 2,
            )
        ]
        for i, (t, c, n, s) in enumerate(MOBILENETV2_STAGES):
            stride = 1 if (cifar and i == 1) else s
            cout = round_channels(c * width_mult)
            blocks = [
                InvertedResidual(cin if b == 0 else cout, cout, stride if b == 0 else 1, t, cpg)
                for b in range(n)
            ]
            units.append(Unit(*blocks, out_channels=cout, reduction=stride))
            cin = cout
        last = round_channels(last_channels * width_mult)
        units.append(
            Unit(*ws_conv_gn(cin, last, 1, 1, cpg, act=nn.ReLU6), out_channels=last, reduction=1)
        )
        super().__init__(in_channels, units)
