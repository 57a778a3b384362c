"""Ditto (Li et al., 2021): the global model w trains as in FedAvg; each client also trains its
personal model v (:class:`~fedssl.strategies.personal.PersonalModel`) on the very batches w
stepped on, each SGD step of v followed by the exact proximal step towards the round-start
global model w^t: v <- (v + ηλ w^t) / (1 + ηλ), stable for any ηλ. A client is scored with v."""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedssl.strategies.personal import network_ce, part


def ditto_prox(lam: float, lr: float, anchor_of: Callable[[str], str | None]):
    """The trainer's ``after_step``: Ditto's proximal step on every trained entry whose
    round-start global value ``anchor_of(key)`` names (None: not a personal entry). η is the
    configured lr (a constant schedule)."""
    k_ = lr * lam

    @torch.no_grad()
    def after(trained, frozen, buffers) -> None:
        fixed = {**frozen, **buffers}
        for k, v in trained.items():
            anchor = anchor_of(k)
            if anchor is not None:
                v.add_(fixed[anchor], alpha=k_).div_(1 + k_)

    return after


def personal_ce(of: str = "net", name: str = "personal"):
    """The loss of Ditto's personal steps: the cross-entropy of the network ``of`` run with
    the companion ``name``'s weights, v."""
    ce = network_ce(of)

    def loss(model, params, buffers, batch):
        v = part({**params, **buffers}, name)
        return ce(model, v, batch.views[0], batch.labels, batch.valid)

    return loss


def anchor_of(name: str = "personal", anchor: str = "anchor") -> Callable[[str], str | None]:
    """Ditto's proximal point of a companion entry ``name.k``: the round-start network's
    ``anchor.k`` (None for any other entry)."""
    prefix = name + "."
    return lambda key: anchor + "." + key[len(prefix) :] if key.startswith(prefix) else None
