"""The strategy a ``strategy:`` params field names (:mod:`fedssl.strategies.params`)."""

from __future__ import annotations

from fedssl.fl.engine import FederationConfig, Strategy
from fedssl.strategies.fedavg import FedAvg
from fedssl.strategies.fedprox import FedProx
from fedssl.strategies.params import FedAvgChoice, FedProxChoice


def strategy(choice: FedAvgChoice | FedProxChoice, cfg: FederationConfig) -> Strategy:
    if isinstance(choice, FedProxChoice):
        return FedProx(cfg, mu=choice.mu)
    return FedAvg(cfg)
