"""The MFCL client module and its mirror decoder (paper Tab. 9 / Tab. 10; spec §2.2, §8 A2).

The client module ``f`` (``ClientAutoencoder.encoder``) is a stack of stride-1 3×3 convolutions,
each followed by a normalisation layer and ReLU. Its mirror decoder ``g`` uses stride-1 3×3
transposed convolutions, each followed by norm + ReLU, and ends in a plain 3×3 convolution whose
output is treated as reconstruction *logits* (spec A6).

* ``arch='resnet18'`` (Tab. 9): conv(in→w), conv(w→w); decoder convT(w→w), convT(w→in), conv(in→in).
  With ``in_channels=3, width=64`` and TN/GN this has 77,853 parameters (encoder 38,976).
  ``width=32`` is the slim CPU-smoke version (20,541 parameters).
* ``arch='resnet50'`` (Tab. 10): conv(in→w), conv(w→w), conv(w→2w), conv(2w→2w); decoder
  convT(2w→2w), convT(2w→w), convT(w→w), convT(w→in), conv(in→in). With ``width=64``: 521,565
  parameters (encoder 260,928), 128 channels at the cut.

**Cut layer** (Tab. 1 sweep, spec §8 A1; ``arch='resnet18'`` only): the client module at cut
``c`` (1..7) is the first ``c`` conv3×3–norm–ReLU layers of the sequence with widths
[w, w, w, w, w, 2w, 2w] and stride 2 at the sixth conv (stride 1 elsewhere), then the MaxPool.
This follows ResNet-18's conv order with its stem as conv 1: convs 2-5 are layer1's two
BasicBlocks, convs 6-7 the first convs of layer2 (the stride-2 one first). The mirror decoder has
one transposed conv per encoder conv, in reverse order; a stride-2 conv is mirrored by a stride-2
transposed conv with ``output_padding=1``, so even-sized inputs are reconstructed at their size.
The rServer then drops the :func:`resnet18_blocks_on_client` ``= (c − 1) // 2`` BasicBlocks whose
convs have all moved to the client. ``cut=2`` is Tab. 9 (the default). At width 64 on a 3×32×32
input the representation is 64×16×16 for cuts 1-5 and 128×8×8 for cuts 6-7.

Both tables put a MaxPool(2, 2) after the encoder. No layer undoes that pool, so a mirror decoder
behind it cannot return to the input resolution (spec §8 A2). ``ae_pool`` chooses:

* ``'outside'`` (default): the autoencoder works at full resolution (``forward`` never pools) and
  the MaxPool is applied only when exporting representations (:meth:`ClientAutoencoder.encode`).
* ``'upsample'``: MaxPool, then nearest ×2 upsampling before the decoder.
* ``'downsampled_target'``: MaxPool in the path; the decoder works at half resolution and the
  target is the 2×2 average-pooled image (see :meth:`ClientAutoencoder.reconstruction_target`).

Batches for TN must be twin-ordered ``[view-1 ; view-2]``
(see :class:`~fedssl.models.norms.TwinNorm`).
"""

from __future__ import annotations

from typing import Literal

import torch.nn.functional as F
from torch import Tensor, nn

from .norms import make_norm

AE_ARCHS = ("resnet18", "resnet50")
AE_POOLS = ("outside", "upsample", "downsampled_target")
#: (width multiplier, stride) of the client convs a ResNet-18 cut takes its first ``cut`` from.
RESNET18_CONVS = ((1, 1), (1, 1), (1, 1), (1, 1), (1, 1), (2, 2), (2, 1))
#: Tab. 10's fixed 4-conv ResNet-50 client module.
RESNET50_CONVS = ((1, 1), (1, 1), (2, 1), (2, 1))
DEFAULT_CUT = 2


def resnet18_blocks_on_client(cut: int) -> int:
    """ResNet-18 BasicBlocks (of 8) whose two convs all sit in a cut-``cut`` client module:
    conv 1 is the stem, block b holds convs 2b and 2b + 1."""
    return (cut - 1) // 2


def _conv_block(
    conv: nn.Module, out_channels: int, norm: str, channels_per_group: int, tn_variance: str
) -> list[nn.Module]:
    return [
        conv,
        make_norm(norm, out_channels, channels_per_group, tn_variance=tn_variance),
        # not in place: Twin Norm returns a channels-last batch as a view, and an in-place op
        # on a view makes autograd copy every activation back (the step ran 0.88x)
        nn.ReLU(),
    ]


def _check_arguments(arch: str, in_channels: int, width: int, ae_pool: str, cut: int) -> None:
    """A clear error for an autoencoder that cannot be built (before any layer is)."""
    if arch not in AE_ARCHS:
        raise ValueError(f"unknown arch '{arch}' (expected one of: {', '.join(AE_ARCHS)})")
    if arch == "resnet50" and cut != DEFAULT_CUT:
        raise ValueError(
            f"cut applies to arch resnet18 only (resnet50 has Tab. 10's fixed "
            f"module), got cut={cut}"
        )
    if not 1 <= cut <= len(RESNET18_CONVS):
        raise ValueError(f"cut must be in 1..{len(RESNET18_CONVS)}, got {cut}")
    if ae_pool not in AE_POOLS:
        raise ValueError(f"unknown ae_pool '{ae_pool}' (expected one of: {', '.join(AE_POOLS)})")
    if in_channels < 1 or width < 1:
        raise ValueError("in_channels and width must be positive")


class ClientAutoencoder(nn.Module):
    """Client module (encoder) + mirror decoder of MFCL phase 1.

    Args:
        arch: ``'resnet18'`` (Tab. 9, ``cut``-conv encoder) or ``'resnet50'`` (Tab. 10, 4-conv
            encoder).
        in_channels: image channels (3 for CIFAR/Tiny-ImageNet, 1 for grey-scale data sets).
        width: channels of the first conv (64 in the paper; 32 for the slim smoke model). The
            ResNet-50 encoder doubles it for its last two convs.
        norm: ``'tn'``, ``'gn'`` or ``'bn'``, used after every conv / transposed conv except the
            final output conv.
        channels_per_group: Λ for TN / GN (a layer with fewer channels uses one group).
        tn_variance: ``'joint'`` (Eq. 2) or ``'avg_of_views'`` (Tab. 18 snippet).
        ae_pool: where the encoder's MaxPool sits during autoencoder training (module docstring).
        cut: number of client convs, 1..7 (ResNet-18 only; module docstring). ResNet-50 has
            Tab. 10's fixed module and takes only the default.

    Attributes:
        encoder: ``nn.Sequential`` f_pre (convs + norms + ReLUs, no pooling).
        pool: the ``MaxPool2d(2, 2)`` that ends the client module.
        decoder: ``nn.Sequential`` g; its output is logits.
        rep_channels: channels of the exported representation.
    """

    def __init__(
        self,
        arch: Literal["resnet18", "resnet50"] = "resnet18",
        in_channels: int = 3,
        width: int = 64,
        norm: str = "tn",
        channels_per_group: int = 16,
        tn_variance: str = "joint",
        ae_pool: Literal["outside", "upsample", "downsampled_target"] = "outside",
        cut: int = DEFAULT_CUT,
    ) -> None:
        super().__init__()
        _check_arguments(arch, in_channels, width, ae_pool, cut)
        self.arch, self.in_channels, self.width = arch, in_channels, width
        self.norm_kind, self.ae_pool, self.cut = norm, ae_pool, cut
        convs = RESNET18_CONVS[:cut] if arch == "resnet18" else RESNET50_CONVS
        nkw = dict(norm=norm, channels_per_group=channels_per_group, tn_variance=tn_variance)
        # (in, out, stride) of every encoder conv; the decoder walks this list backwards.
        layers, c_in = [], in_channels
        for mult, stride in convs:
            layers.append((c_in, mult * width, stride))
            c_in = mult * width

        self.encoder = nn.Sequential(
            *[m for ci, co, s in layers for m in _conv_block(nn.Conv2d(ci, co, 3, s, 1), co, **nkw)]
        )
        self.rep_channels = c_in
        self.pool = nn.MaxPool2d(2, 2)

        # output_padding = stride - 1 makes a stride-2 transposed conv exactly double the size.
        dec = [
            m
            for ci, co, s in reversed(layers)
            for m in _conv_block(
                nn.ConvTranspose2d(co, ci, 3, s, 1, output_padding=s - 1), ci, **nkw
            )
        ]
        dec.append(nn.Conv2d(in_channels, in_channels, 3, 1, 1))
        self.decoder = nn.Sequential(*dec)

    def forward(self, x: Tensor) -> Tensor:
        """Reconstruction logits for the twin-ordered batch ``x`` (same shape as
        :meth:`reconstruction_target` of ``x``)."""
        h = self.encoder(x)
        if self.ae_pool == "upsample":
            h = F.interpolate(self.pool(h), scale_factor=2, mode="nearest")
        elif self.ae_pool == "downsampled_target":
            h = self.pool(h)
        return self.decoder(h)

    def encode(self, x: Tensor) -> Tensor:
        """The exported representation: MaxPool(f_pre(x)), e.g. 64×16×16 for a 3×32×32 input."""
        return self.pool(self.encoder(x))

    def prepool_shape(self, height: int, width: int) -> tuple[int, int, int]:
        """(C, H, W) of f_pre's output (before the MaxPool) for a ``height``×``width`` input,
        from the convs' geometry (no forward pass: that would touch BN running stats)."""
        for conv in self.encoder:
            if isinstance(conv, nn.Conv2d):
                (k, _), (s, _), (p, _) = conv.kernel_size, conv.stride, conv.padding
                height, width = ((n + 2 * p - k) // s + 1 for n in (height, width))
        return self.rep_channels, height, width

    def reconstruction_target(self, x: Tensor) -> Tensor:
        """What ``forward(x)`` should reconstruct: ``x`` itself, or its 2×2 average pool for
        ``ae_pool='downsampled_target'``."""
        return F.avg_pool2d(x, 2) if self.ae_pool == "downsampled_target" else x

    def num_parameters(self, part: Literal["all", "encoder", "decoder"] = "all") -> int:
        module = {"all": self, "encoder": self.encoder, "decoder": self.decoder}[part]
        return sum(p.numel() for p in module.parameters())


def reconstruction_loss(
    logits: Tensor,
    target: Tensor,
    kind: Literal["bce", "mse"] = "bce",
    reduction: Literal["mean", "none"] = "mean",
) -> Tensor:
    """Phase-1 loss (Eq. 1, App. B.2.2), averaged over pixels, channels and images.

    ``'bce'``: ``binary_cross_entropy_with_logits(logits, target)``; the target must lie in [0, 1].
    ``'mse'``: mean squared error between ``sigmoid(logits)`` and the target.
    ``reduction='none'`` keeps the per-element losses (for masking padded samples).
    """
    if logits.shape != target.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and target {tuple(target.shape)} differ")
    if kind == "bce":
        return F.binary_cross_entropy_with_logits(logits, target, reduction=reduction)
    if kind == "mse":
        return F.mse_loss(logits.sigmoid(), target, reduction=reduction)
    raise ValueError(f"unknown reconstruction loss '{kind}' (expected 'bce' or 'mse')")
