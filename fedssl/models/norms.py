"""Normalisation layers selectable by name: BatchNorm ('bn'), GroupNorm ('gn') and Twin Norm ('tn').

Twin Normalization (MFCL paper, Eqs. 2-3; spec ``methods/mfcl.md`` §2.4) normalises each group of
``channels_per_group`` (Λ) contiguous channels with statistics pooled over the *two augmented views
of the same sample*. It never mixes different samples, keeps no running statistics and therefore
behaves identically in train and eval mode -- but it always needs the twin view (spec §8 A5).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedssl.layout import is_channels_last

NORM_KINDS = ("bn", "gn", "tn")
TN_VARIANCES = ("joint", "avg_of_views")


def _group_size(channels: int, channels_per_group: int) -> int:
    """Channels per group actually used: Λ, or a single group when the layer has fewer channels."""
    if channels < 1 or channels_per_group < 1:
        raise ValueError(
            f"channels ({channels}) and channels_per_group ({channels_per_group}) must be positive"
        )
    per_group = min(channels_per_group, channels)
    if channels % per_group:
        raise ValueError(f"{channels} channels do not split into groups of {per_group}")
    return per_group


class TwinNorm(nn.Module):
    """Twin Normalization for twin-ordered batches.

    Input ``x`` has shape ``[2K, C, *spatial]`` (normally ``[2K, C, H, W]``) and is ordered
    ``[all view-1 ; all view-2]``: rows ``k`` and ``k + K`` are the two augmented views of sample
    ``k``. The channels are split into ``G = C / Λ`` contiguous groups (one group when ``C < Λ``).
    For every (sample pair k, group g) the mean μ and biased variance σ² are taken over the
    ``2 · Λ · H · W`` values of both views, and

        y[j, c] = γ_c · (x[j, c] − μ_{k(j), g(c)}) / sqrt(σ²_{k(j), g(c)} + eps) + β_c,
        k(j) = j mod K.

    ``variance`` selects how σ² is formed:

    * ``'joint'`` (default, Eq. 2): the variance of the pooled 2ΛHW values,
      σ² = (σ₁² + σ₂²)/2 + ((μ₁ − μ₂)/2)².
    * ``'avg_of_views'`` (the paper's Tab. 18 TensorFlow snippet): the mean of the two per-view
      (GroupNorm-style) variances, (σ₁² + σ₂²)/2, i.e. without the between-view term. Kept as an
      ablation; the mean is the same in both variants.

    γ and β are per channel (shape ``[C]``), initialised to 1 and 0. There are no running
    statistics. An odd batch size, a channel count that differs from ``channels``, or a channel
    count not divisible by the group size raise ``ValueError``. Note that on the pair ``(x, x)``
    TN reduces exactly to ``nn.GroupNorm(C / Λ, C)`` on ``x``.
    """

    def __init__(
        self,
        channels: int,
        channels_per_group: int = 16,
        eps: float = 1e-5,
        variance: str = "joint",
        affine: bool = True,
    ) -> None:
        super().__init__()
        if variance not in TN_VARIANCES:
            raise ValueError(
                f"unknown TN variance '{variance}' (expected one of: {', '.join(TN_VARIANCES)})"
            )
        self.channels = channels
        self.channels_per_group = channels_per_group
        self.group_size = _group_size(channels, channels_per_group)
        self.num_groups = channels // self.group_size
        self.eps = eps
        self.variance = variance
        self.affine = affine
        if affine:
            self.weight = nn.Parameter(torch.ones(channels))
            self.bias = nn.Parameter(torch.zeros(channels))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() < 2:
            raise ValueError(f"TwinNorm expects [2K, C, ...] input, got shape {tuple(x.shape)}")
        n, c = x.shape[0], x.shape[1]
        if c != self.channels:
            raise ValueError(f"TwinNorm built for {self.channels} channels got {c}")
        if n % 2:
            raise ValueError(
                f"TwinNorm needs an even batch of twin views ordered "
                f"[view-1 ; view-2], got batch size {n}"
            )
        k = n // 2
        if self.variance == "joint":
            # Lay each pair's two views side by side, [K, C, 2·spatial], so that GroupNorm's
            # per-(sample, group) statistics are exactly TN's per-(pair, group) ones; the fused
            # kernel is ~3x faster (forward + backward, CPU) than var_mean over dims (0, 3).
            if is_channels_last(x):
                return self._joint_channels_last(x)
            pairs = x.reshape(2, k, c, -1).permute(1, 2, 0, 3).reshape(k, c, -1)
            y = F.group_norm(pairs, self.num_groups, self.weight, self.bias, self.eps)
            return y.reshape(k, c, 2, -1).permute(2, 0, 1, 3).reshape(x.shape)
        # avg_of_views (Tab. 18 snippet): average the per-view moments; [2, K, G, Λ·spatial]
        xg = x.reshape(2, k, self.num_groups, -1)
        var_v, mean_v = torch.var_mean(xg, dim=3, correction=0, keepdim=True)
        mean = mean_v.mean(dim=0, keepdim=True)
        var = var_v.mean(dim=0, keepdim=True)
        y = ((xg - mean) * torch.rsqrt(var + self.eps)).reshape_as(x)
        if self.affine:
            shape = (1, c) + (1,) * (x.dim() - 2)
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y

    def _joint_channels_last(self, x: Tensor) -> Tensor:
        """The joint path in the input's channels-last layout: the two views of a pair stacked
        along the height, [K, C, 2H, W], and the result back as [2K, C, H, W], both
        channels-last (the layout-blind path hands a contiguous tensor to the next
        convolution; its step ran 0.88x of contiguous under the AVX2 cap)."""
        n, c, h, w = x.shape
        k = n // 2
        pixels = x.permute(0, 2, 3, 1).reshape(2, k, h, w, c).transpose(0, 1)
        pairs = pixels.reshape(k, 2 * h, w, c).permute(0, 3, 1, 2)
        y = F.group_norm(pairs, self.num_groups, self.weight, self.bias, self.eps)
        y = y.permute(0, 2, 3, 1).reshape(k, 2, h, w, c).transpose(0, 1)
        return y.reshape(n, h, w, c).permute(0, 3, 1, 2)

    def extra_repr(self) -> str:
        return (
            f"{self.channels}, channels_per_group={self.group_size}, eps={self.eps}, "
            f"variance={self.variance}, affine={self.affine}"
        )


def make_norm(
    kind: str, channels: int, channels_per_group: int = 16, *, tn_variance: str = "joint"
) -> nn.Module:
    """A 2-d normalisation layer by name.

    * ``'bn'``: ``nn.BatchNorm2d(channels)``.
    * ``'gn'``: ``nn.GroupNorm`` whose groups hold ``channels_per_group`` contiguous channels
      (a single group when the layer has fewer channels than that).
    * ``'tn'``: :class:`TwinNorm` with the same grouping rule; ``tn_variance`` picks ``'joint'``
      (Eq. 2) or ``'avg_of_views'`` (Tab. 18 snippet).
    """
    if kind == "bn":
        return nn.BatchNorm2d(channels)
    if kind == "gn":
        per_group = _group_size(channels, channels_per_group)
        return nn.GroupNorm(channels // per_group, channels)
    if kind == "tn":
        return TwinNorm(channels, channels_per_group, variance=tn_variance)
    raise ValueError(f"unknown norm '{kind}' (expected one of: {', '.join(NORM_KINDS)})")


def has_running_stats(module: nn.Module) -> bool:
    """True when the model keeps BatchNorm running statistics (no vmapped clients then)."""
    return any(
        isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
        for m in module.modules()
    )
