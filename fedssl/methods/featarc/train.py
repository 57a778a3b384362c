"""FeatARC's recipe: SimCLR plus alignment (:mod:`.model`) under its clustering strategy
(:mod:`.strategy`); the evaluated cluster's network is saved, every cluster beside it."""

from __future__ import annotations

from fedssl.methods.featarc.model import (
    featarc_forward,
    featarc_loss,
    save_network,
    seeded_model,
    views,
)
from fedssl.methods.featarc.strategy import FeatARCStrategy, save_clusters
from fedssl.methods.federated import contrastive_recipe
from fedssl.rounds.recipe import Recipe


def recipe(p) -> Recipe:
    return contrastive_recipe(
        p,
        model=lambda shape, device: seeded_model(p, shape, device),
        views=lambda size: views(p, size),
        forward=featarc_forward,
        loss=featarc_loss(p),
        strategy=lambda cfg, model, data: FeatARCStrategy(cfg, model, p, data),
        save=save_network,
        outputs=save_clusters,
        describe=None,  # no parameter count in its report rows (as its committed ones)
    )
