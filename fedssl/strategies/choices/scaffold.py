"""SCAFFOLD (:mod:`fedssl.strategies.scaffold`) as a params choice."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat

from fedssl.strategies.choices import StrategyParams, register


@register
class ScaffoldParams(StrategyParams):
    """SCAFFOLD: control variates correct every local step (option II), over the method's
    own strategy; K, a client's local steps, follows the block's ``local_epochs`` and
    ``batch_size``."""

    kind: Literal["scaffold"] = "scaffold"
    eta_g: PositiveFloat = Field(1.0, description="the server's step size on the mean update")
    title = "SCAFFOLD"
    needs = ("local_epochs", "batch_size")

    def mixin(self) -> type:
        from fedssl.strategies.scaffold import Scaffold

        return Scaffold

    def options(self, block) -> dict:
        return {
            "local_epochs": block.local_epochs,
            "batch_size": block.batch_size,
            "eta_g": self.eta_g,
        }

    def label(self) -> str:
        return f"SCAFFOLD (η_g={self.eta_g:g})"
