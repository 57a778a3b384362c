"""LARS optimiser and warmup + cosine learning-rate schedule for the SimCLR-style training of the
rServer module (spec ``methods/mfcl.md`` §2.7; settings follow the SimCLR reference code).

No LARS ships with torch or the other installed packages, so a small one is written here.

LARS update for one parameter ``w`` with gradient ``g`` (group options ``lr``, ``momentum`` m,
``weight_decay`` λ, ``trust_coefficient`` η, ``lars_adapt``)::

    d = g + λ·w
    ratio = η·‖w‖ / ‖d‖      if lars_adapt and ‖w‖ > 0 and ‖d‖ > 0, else 1
    v ← m·v + lr·ratio·d
    w ← w − v

i.e. the momentum buffer accumulates *learning-rate-scaled* steps (as in the SimCLR code). Groups
with ``lars_adapt=False`` and ``weight_decay=0`` therefore do plain SGD with momentum,
``v ← m·v + lr·g; w ← w − v``. :func:`lars_param_groups` puts normalisation parameters and biases
in such a group.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn
from torch.optim import Optimizer

from fedssl.models.norms import TwinNorm

#: Modules whose parameters are excluded from weight decay and LARS adaptation.
_NORM_TYPES: tuple[type, ...] = (
    nn.modules.batchnorm._NormBase,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.LocalResponseNorm,
    TwinNorm,
)


class LARS(Optimizer):
    """Layer-wise Adaptive Rate Scaling (You et al., 2017) as used by SimCLR.

    Args:
        params: parameters or parameter groups (see :func:`lars_param_groups`).
        lr: learning rate (set it per step, e.g. from :func:`warmup_cosine`).
        momentum: momentum m (0.9).
        weight_decay: λ, added to the gradient before the trust ratio.
        trust_coefficient: η (0.001).
        lars_adapt: whether to apply the trust ratio (per group).
        eps: guards the norm ratio against division by a tiny gradient norm.
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 1.0,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        trust_coefficient: float = 0.001,
        lars_adapt: bool = True,
        eps: float = 0.0,
    ) -> None:
        if lr < 0 or momentum < 0 or weight_decay < 0 or trust_coefficient <= 0 or eps < 0:
            raise ValueError(
                "lr, momentum, weight_decay, eps must be >= 0 and trust_coefficient > 0"
            )
        defaults = dict(
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            trust_coefficient=trust_coefficient,
            lars_adapt=lars_adapt,
            eps=eps,
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, m, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                d = p.grad
                if wd:
                    d = d.add(p, alpha=wd)
                step = d.mul(lr)
                if group["lars_adapt"]:
                    w_norm = torch.linalg.vector_norm(p)
                    d_norm = torch.linalg.vector_norm(d)
                    ratio = torch.where(
                        (w_norm > 0) & (d_norm > 0),
                        group["trust_coefficient"] * w_norm / (d_norm + group["eps"]),
                        torch.ones_like(w_norm),
                    )
                    step.mul_(ratio)
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = step.clone()
                else:
                    buf.mul_(m).add_(step)
                p.sub_(buf)
        return loss


def lars_param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two parameter groups for :class:`LARS`:

    * weights of non-normalisation layers: ``weight_decay`` and LARS adaptation;
    * parameters of normalisation layers (BN/GN/LN/TN γ, β) and every bias: no weight decay and
      no adaptation (plain SGD with momentum), as in the SimCLR code.

    Empty groups are dropped.
    """
    excluded_ids: set[int] = set()
    for module in model.modules():
        if isinstance(module, _NORM_TYPES):
            excluded_ids.update(id(p) for p in module.parameters(recurse=False))
    decay, plain = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if id(p) in excluded_ids or name.split(".")[-1] == "bias":
            plain.append(p)
        else:
            decay.append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay, "lars_adapt": True},
        {"params": plain, "weight_decay": 0.0, "lars_adapt": False},
    ]
    return [g for g in groups if g["params"]]


def warmup_cosine(step: int, total_steps: int, warmup_steps: int, peak_lr: float) -> float:
    """Learning rate at ``step`` (0-based): linear warmup ``peak · step / warmup_steps`` up to
    ``peak_lr`` at ``step = warmup_steps``, then cosine decay to 0 at ``step = total_steps``
    (0 afterwards). ``warmup_steps = 0`` starts directly at the peak."""
    if total_steps <= 0 or warmup_steps < 0 or warmup_steps > total_steps:
        raise ValueError(
            f"need 0 <= warmup_steps ({warmup_steps}) <= total_steps ({total_steps}) "
            "and total_steps > 0"
        )
    if step < warmup_steps:
        return peak_lr * step / warmup_steps
    if step >= total_steps:
        return 0.0
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return peak_lr * 0.5 * (1.0 + math.cos(math.pi * progress))


def scaled_peak_lr(base_lr: float, batch_size: int, scaling: str = "none") -> float:
    """Peak learning rate from a base rate (spec §8 A9): ``'none'`` keeps it, ``'linear'`` gives
    ``base · batch / 256`` (SimCLR convention), ``'sqrt'`` gives ``base · sqrt(batch)``."""
    if scaling == "none":
        return base_lr
    if scaling == "linear":
        return base_lr * batch_size / 256
    if scaling == "sqrt":
        return base_lr * math.sqrt(batch_size)
    raise ValueError(f"unknown lr scaling '{scaling}' (expected none, linear or sqrt)")


def set_lr(optimizer: Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group."""
    for group in optimizer.param_groups:
        group["lr"] = lr
