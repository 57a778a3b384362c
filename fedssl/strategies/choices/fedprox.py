"""FedProx (:mod:`fedssl.strategies.fedprox`) as a params choice."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat

from fedssl.strategies.choices import StrategyParams, register


@register
class FedProxParams(StrategyParams):
    """FedProx: the local objective plus (mu / 2) ||w - w^t||^2 towards the round-start
    model, over the method's own strategy."""

    kind: Literal["fedprox"] = "fedprox"
    mu: NonNegativeFloat = Field(description="weight of the proximal term (0: FedAvg's steps)")
    title = "FedProx"

    def mixin(self) -> type:
        from fedssl.strategies.fedprox import FedProx

        return FedProx

    def options(self, block) -> dict:
        return {"mu": self.mu}

    def label(self) -> str:
        return f"FedProx (μ={self.mu:g})"
