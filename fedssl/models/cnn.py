"""Small CNN / MLP networks of CP-CFL, MpFedcon and the iDLG attack (pure torch).

Every network takes the image shape ``(C, H, W)`` at construction and computes the size of its
flatten layer from it, so one definition serves 96×96 STL-10, 32×32 CIFAR and 28×28 MNIST.

* :class:`CPCFLEncoder`: CP-CFL's encoder (spec cp-cfl.md §2, §8.1): four 3×3 convs 64, 128,
  192, 256 with stride 2, 'valid' padding and ReLU, flatten, Dense 256 + ReLU.
* MpFedcon's layered network F = O∘P∘D (spec mpfedcon.md §2, SUG: FedRep's CNNCifar):
  :class:`CNNCifarBase` D, :class:`~fedssl.models.heads.ProjectionHead` P, a Linear O, put
  together by :class:`LayeredNet`; :class:`MLPBase` is the FEMNIST base D.
* :class:`LeNet`: the randomly initialised sigmoid LeNet that DLG / iDLG attack (spec §5).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from fedssl.models.heads import ProjectionHead

PADDINGS = ("valid", "same")


def flat_size(features: nn.Module, image_shape: tuple[int, int, int]) -> int:
    """Number of features ``features`` makes from one image of ``image_shape``, found by running
    a copy of it on the meta device (shapes only: no memory, no compute)."""
    meta_copy = copy.deepcopy(features).to("meta")
    return meta_copy(torch.empty(1, *image_shape, device="meta")).flatten(1).shape[1]


class CPCFLEncoder(nn.Module):
    """CP-CFL's 4-conv encoder; ``out_dim`` = ``feature_dim`` (256).

    ``padding='valid'`` is the spec's inference (2,378,304 parameters at 96×96×3, as in the
    paper's ≈2.4M); ``'same'`` (pad 1, output ⌈H/2⌉ per conv) is the alternative the spec rules
    out at 96 px (3.1M) but the only one that fits 28×28 inputs, where four valid stride-2 convs
    run out of pixels (they need at least 31×31).
    """

    def __init__(
        self,
        image_shape: tuple[int, int, int] = (3, 96, 96),
        channels: Sequence[int] = (64, 128, 192, 256),
        feature_dim: int = 256,
        padding: str = "valid",
    ):
        super().__init__()
        if padding not in PADDINGS:
            raise ValueError(
                f"unknown padding {padding!r} (expected one of: {', '.join(PADDINGS)})"
            )
        pad = 0 if padding == "valid" else 1
        layers: list[nn.Module] = []
        cin = image_shape[0]
        size = min(image_shape[1:])
        for cout in channels:
            size = (size + 2 * pad - 3) // 2 + 1
            if size < 1:
                raise ValueError(
                    f"{padding!r} stride-2 convs shrink a {image_shape[1]}x"
                    f"{image_shape[2]} image to nothing; use a larger input or "
                    f"padding='same'"
                )
            layers += [nn.Conv2d(cin, cout, 3, stride=2, padding=pad), nn.ReLU(inplace=True)]
            cin = cout
        self.features = nn.Sequential(*layers, nn.Flatten())
        self.flat_dim = flat_size(self.features, image_shape)
        self.fc = nn.Sequential(nn.Linear(self.flat_dim, feature_dim), nn.ReLU(inplace=True))
        self.out_dim = feature_dim

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.features(x))


class CNNCifarBase(nn.Module):
    """FedRep's CNNCifar without its last layer, MpFedcon's base encoder D: conv k5 (64) - ReLU -
    max-pool 2, conv k5 (64) - ReLU - max-pool 2, flatten, then fc 120 - ReLU, fc 64 - ReLU
    (``hidden``). At 32×32×3 the flatten has 64·5·5 = 1600 features; ``out_dim`` = 64."""

    def __init__(
        self,
        image_shape: tuple[int, int, int] = (3, 32, 32),
        conv_channels: Sequence[int] = (64, 64),
        kernel_size: int = 5,
        hidden: Sequence[int] = (120, 64),
    ):
        super().__init__()
        layers: list[nn.Module] = []
        cin = image_shape[0]
        for cout in conv_channels:
            layers += [nn.Conv2d(cin, cout, kernel_size), nn.ReLU(inplace=True), nn.MaxPool2d(2)]
            cin = cout
        self.features = nn.Sequential(*layers, nn.Flatten())
        self.flat_dim = flat_size(self.features, image_shape)
        self.fc = relu_mlp(self.flat_dim, hidden)
        self.out_dim = hidden[-1] if hidden else self.flat_dim

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.features(x))


def relu_mlp(in_dim: int, widths: Sequence[int]) -> nn.Sequential:
    """Linear layers of the given widths, each followed by a ReLU (the base encoders' fc part,
    whose output feeds another network, hence the final ReLU)."""
    layers: list[nn.Module] = []
    for width in widths:
        layers += [nn.Linear(in_dim, width), nn.ReLU(inplace=True)]
        in_dim = width
    return nn.Sequential(*layers)


class MLPBase(nn.Module):
    """MpFedcon's FEMNIST base encoder D: flatten, fc 784→512 - ReLU, fc 512→256 - ReLU;
    ``out_dim`` = 256."""

    def __init__(
        self, image_shape: tuple[int, int, int] = (1, 28, 28), hidden: Sequence[int] = (512, 256)
    ):
        super().__init__()
        c, h, w = image_shape
        self.flatten = nn.Flatten()
        self.fc = relu_mlp(c * h * w, hidden)
        self.out_dim = hidden[-1]

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.flatten(x))


class LayeredNet(nn.Module):
    """F = O∘P∘D: the shared ``base`` D, the personal projection head ``projector`` P and output
    layer ``output`` O. The parameter names start with ``base.``, ``projector.`` and ``output.``,
    so a method can choose by prefix which of them travel."""

    def __init__(self, base: nn.Module, projector: nn.Module, output: nn.Module):
        super().__init__()
        self.base, self.projector, self.output = base, projector, output

    def project(self, x: Tensor) -> Tensor:
        """P(D(x)): the space MpFedcon's class centres and contrastive loss live in."""
        return self.projector(self.base(x))

    def forward(self, x: Tensor) -> Tensor:
        return self.output(self.project(x))


def layered_net(
    base: nn.Module, num_classes: int, projection: tuple[int, int] | None = (128, 128)
) -> LayeredNet:
    """D + P + O on top of ``base``: P = Linear-ReLU-Linear with (hidden, out) = ``projection``,
    or no projection head (``None``, O reads D's output: FedRep's original network)."""
    if projection is None:
        projector: nn.Module = nn.Identity()
        proj_dim = base.out_dim
    else:
        projector = ProjectionHead(base.out_dim, *projection)
        proj_dim = projection[1]
    return LayeredNet(base, projector, nn.Linear(proj_dim, num_classes))


def mpfedcon_cifar_net(
    num_classes: int,
    image_shape: tuple[int, int, int] = (3, 32, 32),
    projection: tuple[int, int] | None = (128, 128),
) -> LayeredNet:
    """MpFedcon's CIFAR network: CNNCifar base D (→64), P 64→128→128, O 128→C."""
    return layered_net(CNNCifarBase(image_shape), num_classes, projection)


def mpfedcon_femnist_net(
    num_classes: int = 10,
    image_shape: tuple[int, int, int] = (1, 28, 28),
    projection: tuple[int, int] | None = (128, 128),
) -> LayeredNet:
    """MpFedcon's FEMNIST network: MLP base D (→256), P 256→128→128, O 128→C."""
    return layered_net(MLPBase(image_shape), num_classes, projection)


class LeNet(nn.Module):
    """The LeNet of DLG / iDLG: three conv k5 layers of 12 channels (strides 2, 2, 1, padding 2)
    with sigmoid activations, flatten (768 features at 32×32), optional sigmoid hidden fc layers
    (``hidden``, for the 'cl / at' hidden-layer study), then fc → ``num_classes``.

    Sigmoid keeps it twice differentiable, which gradient matching needs. ``init_range``: weights
    and biases drawn uniformly from ±init_range, as in iDLG (0.5); ``None`` keeps torch's init.
    """

    def __init__(
        self,
        num_classes: int,
        image_shape: tuple[int, int, int] = (3, 32, 32),
        channels: int = 12,
        hidden: Sequence[int] = (),
        init_range: float | None = 0.5,
    ):
        super().__init__()
        layers: list[nn.Module] = []
        cin = image_shape[0]
        for stride in (2, 2, 1):
            layers += [nn.Conv2d(cin, channels, 5, stride=stride, padding=2), nn.Sigmoid()]
            cin = channels
        self.features = nn.Sequential(*layers, nn.Flatten())
        self.flat_dim = flat_size(self.features, image_shape)
        fc: list[nn.Module] = []
        width = self.flat_dim
        for h in hidden:
            fc += [nn.Linear(width, h), nn.Sigmoid()]
            width = h
        fc.append(nn.Linear(width, num_classes))
        self.classifier = nn.Sequential(*fc)
        if init_range is not None:
            with torch.no_grad():
                for p in self.parameters():
                    p.uniform_(-init_range, init_range)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))
