"""FedSimCLR's recipe: the runtime's defaults (a contrastive model, two views, the chosen
strategy) trained by NT-Xent of the two views' projections."""

from __future__ import annotations

from fedssl.losses import simclr_views
from fedssl.methods.federated import contrastive_recipe
from fedssl.rounds.recipe import Recipe


def recipe(p) -> Recipe:
    return contrastive_recipe(p, loss=lambda outputs, batch: simclr_views(outputs, batch, p))
