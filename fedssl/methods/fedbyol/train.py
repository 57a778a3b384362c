"""The BYOL family's recipe: the online/target network of :mod:`.model`, BYOL's symmetric
loss, the target following the online encoder after every step, the family member's strategy;
the online network is saved (the probes' encoder: :func:`.model.load_online_encoder`)."""

from __future__ import annotations

from fedssl.losses import byol_views
from fedssl.methods.fedbyol.model import (
    describe,
    family_strategy,
    save_online,
    seeded_byol,
    target_ema,
)
from fedssl.methods.federated import contrastive_recipe
from fedssl.rounds.recipe import Recipe


def recipe(p) -> Recipe:
    return contrastive_recipe(
        p,
        model=lambda shape, device: seeded_byol(p.model, shape, p.seed, device),
        loss=lambda outputs, batch: byol_views(outputs, batch, p),
        strategy=lambda cfg, model, data: family_strategy(cfg, model, p, data),
        after_step=lambda model: target_ema(model, p),
        save=save_online,
        describe=describe,
    )
