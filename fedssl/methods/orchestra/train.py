"""Orchestra's recipe: its network, views and EMA target (:mod:`.model`), its loss
(:mod:`.loss`), its memory and clustering rounds (:mod:`.strategy`), round 0 a setup round
that only exchanges; the network is saved whole."""

from __future__ import annotations

from fedssl.methods.federated import contrastive_recipe
from fedssl.methods.orchestra.loss import orchestra_forward, orchestra_loss
from fedssl.methods.orchestra.model import seeded_orchestra_model, target_ema, views
from fedssl.methods.orchestra.strategy import OrchestraStrategy
from fedssl.rounds.recipe import Recipe


def recipe(p) -> Recipe:
    return contrastive_recipe(
        p,
        model=lambda shape, device: seeded_orchestra_model(p, shape, device),
        views=lambda size: views(p, size),
        forward=orchestra_forward,
        loss=orchestra_loss(p),
        strategy=lambda cfg, model, data: OrchestraStrategy(cfg, model, p, data),
        after_step=lambda model: target_ema(model, p),
        setup_rounds=1,
    )
