"""FedAvg: the method's own strategy as it is (every method's default)."""

from __future__ import annotations

from typing import Literal

from fedssl.strategies.choices import StrategyParams, register


@register
class FedAvgParams(StrategyParams):
    """FedAvg: the data-size weighted mean of the clients' models (or the method's own rule)."""

    kind: Literal["fedavg"] = "fedavg"
    title = "FedAvg"

    def mixin(self) -> None:
        return None
