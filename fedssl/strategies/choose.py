"""The strategy a ``strategy:`` params field names (:data:`fedssl.params.StrategyChoice`)."""

from __future__ import annotations

from fedssl.fl.state import FederationConfig
from fedssl.params import FedAvgChoice, FedProxChoice
from fedssl.strategies.base import Strategy
from fedssl.strategies.fedavg import FedAvg
from fedssl.strategies.fedprox import FedProx


def strategy(choice: FedAvgChoice | FedProxChoice, cfg: FederationConfig) -> Strategy:
    if isinstance(choice, FedProxChoice):
        return FedProx(cfg, mu=choice.mu)
    return FedAvg(cfg)
