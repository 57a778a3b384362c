"""Global average pooling that keeps channels-last training fast on the CPU."""

from __future__ import annotations

import torch
from torch import nn


class GlobalAvgPool(nn.Module):
    """``nn.AdaptiveAvgPool2d(1)``, as a sum over the spatial dimensions divided by their size.
    The two agree in value; they differ in the gradient handed back: the adaptive pool's is a
    contiguous (NCHW) tensor, this one's a broadcast view. Behind a channels-last ReLU, a
    contiguous gradient makes the ReLU's backward mix layouts, tens of times slower than with
    the view (``benchmarks/round_profile.py``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum((2, 3), keepdim=True) / (x.shape[2] * x.shape[3])
