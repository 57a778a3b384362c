"""Projection heads, predictors and classifier heads (pure torch; no params layer).

* :class:`ProjectionHead`: SimCLR's MLP, Linear-ReLU-Linear (also MpFedcon's projection head P
  and CP-CFL's SimCLR projector, Dense256-ReLU-Dense256).
* :class:`BNMLP`: Linear layers with BatchNorm1d (and ReLU between them); the building block of
  the MoCo v3 and BYOL / SimSiam heads below.
* MoCo v3 (LW-FedSSL spec §2): :func:`moco_v3_projector` H = Linear-BN-ReLU, Linear-BN-ReLU,
  Linear-BN and :func:`moco_v3_predictor` P = Linear-BN-ReLU-Linear. Following MoCo v3 the
  Linear layers carry no bias (a BN follows most of them) and the last BN of H has no affine
  parameters.
* BYOL / SimSiam as CP-CFL uses them (spec §2): projector Dense512-BN-ReLU-Dense512-BN and
  predictor Dense64-BN-ReLU-Dense512. The authors used Keras, whose Dense and BN layers have a
  bias and affine parameters by default, so these keep them.
* :class:`ClassifierHead`: CP-CFL's θ_c, θ_{c-1}, θ_{c-2}, θ_{c-3} (ReLU hidden layers, then the
  output layer producing logits); :func:`cpcfl_classifier` picks one by name.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


class ProjectionHead(nn.Sequential):
    """SimCLR's MLP head (Linear-ReLU-Linear); used by the loss only, dropped for evaluation."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int):
        super().__init__(
            nn.Linear(in_dim, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, out_dim)
        )
        self.out_dim = out_dim


class BNMLP(nn.Sequential):
    """``len(hidden) + 1`` Linear layers; each hidden one is followed by BatchNorm1d and ReLU.

    ``last_bn`` adds a BatchNorm1d after the output layer (``last_bn_affine`` says whether it
    learns a scale and shift). ``bias`` applies to every Linear layer.
    """

    def __init__(
        self,
        in_dim: int,
        hidden: Sequence[int],
        out_dim: int,
        *,
        last_bn: bool,
        last_bn_affine: bool = True,
        bias: bool = True,
    ):
        layers: list[nn.Module] = []
        cin = in_dim
        for width in hidden:
            layers += [
                nn.Linear(cin, width, bias=bias),
                nn.BatchNorm1d(width),
                nn.ReLU(inplace=True),
            ]
            cin = width
        layers.append(nn.Linear(cin, out_dim, bias=bias))
        if last_bn:
            layers.append(nn.BatchNorm1d(out_dim, affine=last_bn_affine))
        super().__init__(*layers)
        self.out_dim = out_dim


def moco_v3_projector(in_dim: int, hidden: int = 4096, out_dim: int = 256) -> BNMLP:
    """MoCo v3's 3-layer projector H (no Linear bias; the final BN has no affine parameters)."""
    return BNMLP(in_dim, [hidden, hidden], out_dim, last_bn=True, last_bn_affine=False, bias=False)


def moco_v3_predictor(in_dim: int = 256, hidden: int = 4096, out_dim: int = 256) -> BNMLP:
    """MoCo v3's 2-layer predictor P: Linear-BN-ReLU-Linear (no Linear bias)."""
    return BNMLP(in_dim, [hidden], out_dim, last_bn=False, bias=False)


def byol_projector(in_dim: int, hidden: int = 512, out_dim: int = 512) -> BNMLP:
    """CP-CFL's BYOL / SimSiam projector: Dense-BN-ReLU-Dense-BN (Keras defaults: biases and
    affine BN)."""
    return BNMLP(in_dim, [hidden], out_dim, last_bn=True)


def byol_predictor(in_dim: int = 512, hidden: int = 64, out_dim: int = 512) -> BNMLP:
    """CP-CFL's BYOL / SimSiam predictor: Dense64-BN-ReLU-Dense512 (a bottleneck)."""
    return BNMLP(in_dim, [hidden], out_dim, last_bn=False)


# CP-CFL uses the same projector and predictor shapes for SimSiam as for BYOL (spec §2).
simsiam_projector = byol_projector
simsiam_predictor = byol_predictor


def simclr_projector(in_dim: int, hidden: int = 256, out_dim: int = 256) -> ProjectionHead:
    """CP-CFL's SimCLR projector Dense256-ReLU-Dense256 (the shared SimCLR MLP)."""
    return ProjectionHead(in_dim, hidden, out_dim)


class ClassifierHead(nn.Sequential):
    """Hidden Linear-ReLU layers of the given widths, then Linear to ``num_classes`` logits
    (the softmax belongs to the loss)."""

    def __init__(self, in_dim: int, num_classes: int, hidden: Sequence[int] = ()):
        layers: list[nn.Module] = []
        cin = in_dim
        for width in hidden:
            layers += [nn.Linear(cin, width), nn.ReLU(inplace=True)]
            cin = width
        layers.append(nn.Linear(cin, num_classes))
        super().__init__(*layers)
        self.hidden = tuple(hidden)
        self.num_classes = num_classes


# CP-CFL head widths: the paper only draws them (Fig. 6); spec §2 [Sug], θ_{c-3} ≈ 0.1M params.
CPCFL_HEAD_WIDTHS: dict[str, tuple[int, ...]] = {
    "c": (),
    "c-1": (256,),
    "c-2": (256, 128),
    "c-3": (256, 128, 64),
}


def cpcfl_classifier(name: str, in_dim: int = 256, num_classes: int = 10) -> ClassifierHead:
    """CP-CFL's classifier head θ_c / θ_{c-1} / θ_{c-2} / θ_{c-3} by name ('c', 'c-1', ...)."""
    if name not in CPCFL_HEAD_WIDTHS:
        raise ValueError(
            f"unknown CP-CFL head {name!r} (expected one of: {', '.join(CPCFL_HEAD_WIDTHS)})"
        )
    return ClassifierHead(in_dim, num_classes, CPCFL_HEAD_WIDTHS[name])
