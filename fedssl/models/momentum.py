"""Momentum (EMA) encoders, their schedule, MoCo's negative queue, and online/momentum drift.

Shared by BYOL (the FedBYOL family, CP-CFL), Orchestra, MoCo v3 (LW-FedSSL, FedMoCo) and MoCo
v2 in split learning (MocoSFL, MonAcoSFL). A model holds its momentum twin as ``target``
(:func:`momentum_twin`), its pairs come from :func:`twin_pairs`, and a cohort trainer's
``after_step`` (:func:`ema_after_step`) moves it. Parameters are plain dicts of tensors,
optionally stacked along a leading client axis as in ``fedssl.fl.cohort``, so one call updates
every client's momentum model at once.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

TWIN = "target."  # a model's momentum twin: its tensors ``target.<name>.*`` twin ``<name>.*``


def momentum_twin(**online: nn.Module) -> nn.ModuleDict:
    """The momentum twin of a model's online modules (by the names the model holds them
    under): deep copies without gradients, in the order given, which the model keeps as its
    ``target`` attribute (BYOL's, Orchestra's target network)."""
    twin = nn.ModuleDict({name: copy.deepcopy(module) for name, module in online.items()})
    for q in twin.parameters():
        q.requires_grad_(False)
    return twin


def twin_pairs(names, twin: nn.ModuleDict) -> dict[str, str]:
    """The EMA pairs of a model's :func:`momentum_twin` ``twin`` among ``names`` (its parameter
    names, or its state's to move the running statistics too)."""
    return momentum_pairs(names, TWIN, tuple(f"{k}." for k in twin))


Tensors = dict[str, torch.Tensor]


@torch.no_grad()
def ema_update(target: Tensors, online: Tensors, momentum: float | torch.Tensor) -> None:
    """target <- m·target + (1-m)·online, in place (BYOL Eqs. 10-11, MoCo's key encoder).
    ``momentum`` is a float or, for client-stacked tensors, one value per client [C]. Integer
    entries (BatchNorm's batch counter) have no meaningful average and are copied instead."""
    for name, t in target.items():
        o = online[name]
        if not t.is_floating_point():
            t.copy_(o)
            continue
        weight = 1 - momentum
        if isinstance(weight, torch.Tensor):  # per client: broadcast over the trailing axes
            weight = weight.to(t.device, t.dtype).view(-1, *([1] * (t.dim() - 1)))
        t.lerp_(o.to(t.dtype), weight)


def momentum_pairs(names, prefix: str, parts: tuple[str, ...] | None = None) -> dict[str, str]:
    """Which tensors have a momentum twin, as twin name -> online name: ``prefix + name`` for
    each online ``name`` (those starting with one of ``parts``, when given). The one way a
    method declares its pairs (BYOL's ``target.``, MoCo v3's ``target_`` branch)."""
    return {prefix + k: k for k in names if parts is None or k.startswith(parts)}


@torch.no_grad()
def ema_update_pairs(
    momentum: Tensors, online: Tensors, pairs: dict[str, str], m: float | torch.Tensor
) -> None:
    """:func:`ema_update` of each twin in ``momentum`` toward its online tensor in ``online``
    (``pairs`` as :func:`momentum_pairs` gives them); both may be one model's state dict."""
    ema_update({t: momentum[t] for t in pairs}, {t: online[o] for t, o in pairs.items()}, m)


def ema_after_step(pairs: dict[str, str], m: float):
    """A cohort trainer's ``after_step`` hook: after every optimiser step the momentum twins
    (held with the frozen tensors) move by EMA toward the weights just trained."""

    def after_step(trained: Tensors, frozen: Tensors, buffers: Tensors) -> None:
        ema_update_pairs(frozen, trained, pairs, m)

    return after_step


def moco_momentum(step: int, total_steps: int, base: float, cosine: bool = True) -> float:
    """MoCo v3's momentum schedule: rises from ``base`` at step 0 to 1 at ``total_steps`` along
    half a cosine, so the key encoder freezes as training ends. ``cosine=False`` keeps ``base``
    (LW-FedSSL and MonAcoSFL hold it constant)."""
    if not cosine or total_steps <= 0:
        return base
    progress = min(step, total_steps) / total_steps
    return 1 - (1 - base) * (1 + math.cos(math.pi * progress)) / 2


class FeatureQueue:
    """MoCo v2's FIFO memory of negative keys: ``size`` L2-normalised rows in one tensor and a
    write pointer. It starts as random unit vectors from a seeded generator (drawn on the CPU,
    so the start is the same on every device), and ``state_dict`` holds everything, so a
    resumed run sees exactly the negatives an uninterrupted one would."""

    def __init__(self, size: int, dim: int, seed: int, device: torch.device | str = "cpu"):
        g = torch.Generator().manual_seed(seed)
        self.keys = F.normalize(torch.randn(size, dim, generator=g), dim=1).to(device)
        self.ptr = 0

    def __len__(self) -> int:
        return self.keys.shape[0]

    @torch.no_grad()
    def push(self, keys: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        """Overwrite the oldest rows with ``keys`` (normalised here), wrapping around the end;
        ``valid`` drops padded rows. A push longer than the queue keeps only its newest rows."""
        if valid is not None:
            keys = keys[valid]
        n, size = keys.shape[0], len(self)
        newest = keys[-size:]
        start = self.ptr + n - newest.shape[0]  # where the kept rows would have been written
        rows = (start + torch.arange(newest.shape[0], device=self.keys.device)) % size
        self.keys[rows] = F.normalize(newest.detach().to(self.keys.dtype), dim=1)
        self.ptr = (self.ptr + n) % size

    def state_dict(self) -> dict:
        return {"keys": self.keys.clone(), "ptr": self.ptr}

    def load_state_dict(self, state: dict) -> None:
        if state["keys"].shape != self.keys.shape:
            raise ValueError(
                f"queue shape {tuple(state['keys'].shape)} does not match {tuple(self.keys.shape)}"
            )
        self.keys.copy_(state["keys"])
        self.ptr = int(state["ptr"])


@torch.no_grad()
def misalignment(
    online: list[Tensors], momentum: list[Tensors], squared: bool = False
) -> torch.Tensor:
    """MonAcoSFL Eq. 2: Σ_i |φ_i - EMA(φ_i)| / (N · dim φ), the mean absolute difference per
    parameter element over the N clients' online and momentum models (float64, a 0-d tensor).
    ``squared`` gives the mean squared difference instead, which the authors' code logs."""
    total, count = 0.0, 0
    for phi, xi in zip(online, momentum, strict=True):
        for name, p in phi.items():
            diff = p.double() - xi[name].double()
            total = total + (diff.square() if squared else diff.abs()).sum()
            count += diff.numel()
    return torch.as_tensor(total, dtype=torch.float64).cpu() / max(count, 1)
