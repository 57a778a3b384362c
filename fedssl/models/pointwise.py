"""The strided 1x1 convolution of a ResNet's projection shortcut, safe on every x86 CPU.

oneDNN's AVX2 kernel for a strided 1x1 convolution's weight gradient (the kernel a CPU without
AVX-512 runs) writes past its buffer when the input is channels-last and its channel count is
not a multiple of 8 (an AVX2 register's fp32 lanes): the heap is corrupted and the process
aborts (torch 2.14; ``tests/models/test_pointwise.py``). There the same sums are computed as the
stride-1 convolution of the subsampled input. Every preset's widths are multiples of 8, where
the plain strided convolution runs, bit for bit as before."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedssl.layout import is_channels_last

VECTOR_CHANNELS = 8


def subsampled(conv: nn.Conv2d, x: torch.Tensor) -> bool:
    """Whether ``conv`` on ``x`` is computed on the subsampled input (see the module)."""
    return (
        conv.kernel_size == (1, 1)
        and conv.stride != (1, 1)
        and conv.padding == (0, 0)
        and conv.groups == 1
        and conv.in_channels % VECTOR_CHANNELS != 0
        and is_channels_last(x)
    )


def convolve(conv: nn.Conv2d, x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """``conv``'s convolution of ``x`` with ``weight`` (its own, or one derived from it)."""
    if subsampled(conv, x):
        sh, sw = conv.stride
        return F.conv2d(x[:, :, ::sh, ::sw], weight, bias)
    return conv._conv_forward(x, weight, bias)


class StridedPointwise(nn.Conv2d):
    """``nn.Conv2d(cin, cout, 1, stride, bias=False)``, computed by :func:`convolve`."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__(cin, cout, 1, stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return convolve(self, x, self.weight)
