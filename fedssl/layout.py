"""Memory layouts as a convolution reads them (pure torch: models and the precision policy
both ask)."""

from __future__ import annotations

import torch


def is_channels_last(tensor: torch.Tensor) -> bool:
    """A 4-D tensor whose strides say channels-last (channel stride 1), as a convolution reads
    them: with one channel the NCHW strides are channels-last contiguous too, and read NCHW."""
    return (
        tensor.dim() == 4
        and tensor.stride(1) == 1
        and tensor.is_contiguous(memory_format=torch.channels_last)
    )
