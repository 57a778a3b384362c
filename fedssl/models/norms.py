"""Normalisation layers selectable by name (BN, GN; Twin Norm lives here too)."""
from __future__ import annotations

from torch import nn


def make_norm(kind: str, channels: int, channels_per_group: int = 16) -> nn.Module:
    """A 2-d normalisation layer; GN groups hold ``channels_per_group`` contiguous channels
    (a single group when the layer has fewer channels than that)."""
    if kind == "bn":
        return nn.BatchNorm2d(channels)
    if kind == "gn":
        per_group = min(channels_per_group, channels)
        if channels % per_group:
            raise ValueError(f"{channels} channels do not split into groups of {per_group}")
        return nn.GroupNorm(channels // per_group, channels)
    raise ValueError(f"unknown norm '{kind}' (expected one of: bn, gn)")


def has_running_stats(module: nn.Module) -> bool:
    """True when the model keeps BatchNorm running statistics (no vmapped clients then)."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
               for m in module.modules())
