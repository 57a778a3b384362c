"""Ditto's proximal step on the personal model, exact for any ηλ."""

from __future__ import annotations

import torch

from fedssl.strategies.ditto import ditto_prox


def test_the_personal_entries_step_exactly_towards_the_round_start_model():
    trained = {"v.w": torch.tensor([3.0, -1.0]), "w": torch.tensor([5.0, 5.0])}
    frozen = {"anchor.w": torch.tensor([1.0, 1.0])}
    after = ditto_prox(lam=2.0, lr=0.5, anchor_of=lambda k: "anchor.w" if k == "v.w" else None)
    after(trained, frozen, {})
    # v <- (v + ηλ w^t) / (1 + ηλ), ηλ = 1: the midpoint; w untouched
    assert torch.equal(trained["v.w"], torch.tensor([2.0, 0.0]))
    assert torch.equal(trained["w"], torch.tensor([5.0, 5.0]))
    for _ in range(60):  # a large ηλ is stable: v contracts onto w^t
        ditto_prox(100.0, 1.0, lambda k: "anchor.w" if k == "v.w" else None)(trained, frozen, {})
    assert torch.allclose(trained["v.w"], frozen["anchor.w"])
