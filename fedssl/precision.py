"""One precision policy for every forward pass that trains or evaluates: which autocast dtype a
device runs under and whether image batches go channels-last.

``auto`` (today's only setting) means bf16 autocast and channels-last on CUDA, plain fp32 on
the CPU, so CPU results are those of the fp32 code. ``fp32`` and ``bf16`` force one or the
other; they are the values a per-experiment ``precision`` setting will take.
"""

from __future__ import annotations

from typing import Literal

import torch

Precision = Literal["auto", "fp32", "bf16"]


def _device(where: torch.device | torch.Tensor | str) -> torch.device:
    if isinstance(where, torch.Tensor):
        return where.device
    return torch.device(where)


def autocast_dtype(
    where: torch.device | torch.Tensor | str, precision: Precision = "auto"
) -> torch.dtype | None:
    """The dtype autocast runs in on ``where`` (a device or a tensor on it), None for fp32."""
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    if precision != "auto":
        raise ValueError(f"precision {precision!r}: expected auto, fp32 or bf16")
    return torch.bfloat16 if _device(where).type == "cuda" else None


def autocast(where: torch.device | torch.Tensor | str, precision: Precision = "auto"):
    """The autocast context of the policy: ``with autocast(x): out = model(x)``. Disabled (a
    no-op) where the policy says fp32."""
    device = _device(where)
    dtype = autocast_dtype(device, precision)
    return torch.autocast(device.type, dtype or torch.bfloat16, enabled=dtype is not None)


def channels_last(where: torch.device | torch.Tensor | str, precision: Precision = "auto") -> bool:
    """Whether convolution models and image batches use the channels-last memory format: on
    CUDA, where bf16 convolutions run fastest in it; never on the CPU."""
    return _device(where).type == "cuda" and precision != "fp32"
