"""The MFCL rServer side (spec methods/mfcl.md §2.6-2.7) and the deployed MFCL encoder.

* :class:`RServerModule`: the residual stages of the backbone, taking the client module's pooled
  representation (``in_channels`` channels) as input; BatchNorm throughout; global average pool.
  ``arch='resnet18'``: four stages of two BasicBlocks at widths w, 2w, 4w, 8w (strides 1, 2, 2,
  2); ``skip_blocks`` leaves out that many leading BasicBlocks, those whose convs a deeper client
  cut holds (:func:`~fedssl.models.autoencoder.resnet18_blocks_on_client`), and the blocks that
  remain keep their strides. ``arch='resnet50'``: stages of 3, 4, 6, 3 bottlenecks (expansion 4)
  at w, 2w, 4w, 8w; the first block's 1×1 conv and projection shortcut take ``in_channels``.
* :class:`MfclProjectionHead` (Tab. 11): Dense-BN-ReLU, Dense-BN-ReLU, Dense-BN (no final bias).
* :class:`MfclEncoder`: x -> client module -> MaxPool -> rServer module (-> head), for linear
  evaluation. Twin Norm needs a twin (spec §8 A5): by default the image is paired with itself,
  which makes TN equal to GroupNorm for that image; ``tn_eval_pair='hflip'`` pairs it with its
  horizontal flip instead.
"""

from __future__ import annotations

import torch
from torch import nn

from fedssl.models.autoencoder import ClientAutoencoder
from fedssl.models.encoders import BasicBlock
from fedssl.models.pointwise import StridedPointwise
from fedssl.models.pooling import GlobalAvgPool


class Bottleneck(nn.Module):
    """ResNet-50 bottleneck (1×1, 3×3 with the stride, 1×1 to 4·width), BN, projection shortcut
    when the shape changes."""

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = 4 * width
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(StridedPointwise(cin, cout, stride), nn.BatchNorm2d(cout))

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


class RServerModule(nn.Sequential):
    """The remaining ResNet stages after the client module; ``out_dim`` features per view."""

    def __init__(self, arch: str, in_channels: int, width: int, skip_blocks: int = 0):
        widths = [width, 2 * width, 4 * width, 8 * width]
        layers: list[nn.Module] = []
        cin = in_channels
        if skip_blocks and arch != "resnet18":
            raise ValueError(f"skip_blocks is for arch resnet18 only, got {arch!r}")
        if arch == "resnet18":
            # (width, stride) of the 8 BasicBlocks; the first skip_blocks run on the client.
            blocks = [(w, s) for i, w in enumerate(widths) for s in (1 if i == 0 else 2, 1)]
            if not 0 <= skip_blocks < len(blocks):
                raise ValueError(f"skip_blocks must be in 0..{len(blocks) - 1}, got {skip_blocks}")
            for w, stride in blocks[skip_blocks:]:
                layers.append(BasicBlock(cin, w, stride, "bn", 1))
                cin = w
        elif arch == "resnet50":
            for i, (w, blocks) in enumerate(zip(widths, (3, 4, 6, 3))):
                for b in range(blocks):
                    layers.append(Bottleneck(cin, w, 2 if (i > 0 and b == 0) else 1))
                    cin = 4 * w
        else:
            raise ValueError(f"unknown rServer arch {arch!r} (expected resnet18 or resnet50)")
        super().__init__(*layers, GlobalAvgPool(), nn.Flatten())
        self.out_dim = cin


class MfclProjectionHead(nn.Sequential):
    """Tab. 11: Dense-BN-ReLU, Dense-BN-ReLU, Dense-BN; hidden layers keep their bias, the last
    Dense has none."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int):
        super().__init__(
            nn.Linear(in_dim, hidden),
            nn.BatchNorm1d(hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, hidden),
            nn.BatchNorm1d(hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, out_dim, bias=False),
            nn.BatchNorm1d(out_dim),
        )


class Restandardize(nn.Module):
    """What the rServer does to each received view before its first block: nothing, standardise
    it per (view, group of ``channels_per_group`` channels), or subtract each channel's spatial
    mean. Either of the last two removes a view's group means, where pairwise normalisation
    (Twin Norm) leaves a signature shared by the two views of a pair."""

    def __init__(self, mode: str = "none", channels_per_group: int = 16):
        super().__init__()
        if mode not in ("none", "group", "channel_mean"):
            raise ValueError(f"unknown restandardize mode {mode!r}")
        self.mode, self.channels_per_group = mode, channels_per_group

    def forward(self, z):
        if self.mode == "group":
            groups = max(1, z.shape[1] // min(self.channels_per_group, z.shape[1]))
            return nn.functional.group_norm(z.float(), groups).to(z.dtype)
        if self.mode == "channel_mean":
            return z - z.mean(dim=(2, 3), keepdim=True)
        return z


class RServerModel(nn.Module):
    """rServer module + projection head; ``forward`` maps representations to projections."""

    def __init__(
        self,
        arch: str,
        in_channels: int,
        width: int,
        proj_hidden: int,
        proj_dim: int,
        skip_blocks: int = 0,
        restandardize: str = "none",
        channels_per_group: int = 16,
    ):
        super().__init__()
        self.inputs = Restandardize(restandardize, channels_per_group)
        self.backbone = RServerModule(arch, in_channels, width, skip_blocks)
        self.head = MfclProjectionHead(self.backbone.out_dim, proj_hidden, proj_dim)

    def embed(self, z):
        """The representation the probes read (before the projection head)."""
        return self.backbone(self.inputs(z))

    def forward(self, z):
        return self.head(self.embed(z))


class MfclEncoder(nn.Module):
    """The deployed model for evaluation: frozen client module, MaxPool, rServer module and,
    with ``projection=True``, the projection head. Twin Norm pairs each image with itself
    (``tn_eval_pair='self'``) or with its horizontal flip (``'hflip'``), never with another
    image of the batch."""

    def __init__(
        self,
        client: ClientAutoencoder,
        rserver: RServerModel,
        projection: bool,
        tn_eval_pair: str = "self",
    ):
        super().__init__()
        if tn_eval_pair not in ("self", "hflip"):
            raise ValueError(f"unknown tn_eval_pair {tn_eval_pair!r} (expected self or hflip)")
        self.client, self.rserver, self.projection = client, rserver, projection
        self.tn_eval_pair = tn_eval_pair

    def forward(self, x):
        if self.client.norm_kind == "tn":
            twin = x.flip(-1) if self.tn_eval_pair == "hflip" else x
            z = self.client.encode(torch.cat([x, twin]))[
                : x.shape[0]
            ]  # len() would fix the batch in an export
        else:
            z = self.client.encode(x)
        h = self.rserver.embed(z.to(x.dtype))
        return self.rserver.head(h) if self.projection else h
