"""FedAvg (McMahan et al., 2017): the global model down, the whole trained model up, the
data-size weighted mean of the uploads. These are the engine's defaults
(:class:`~fedssl.strategies.base.Strategy`); this class names them. Its aggregation needs only the
mean, so the round sums the uploads as the clients finish (:class:`RunningMean`): memory
O(model), not O(clients)."""

from __future__ import annotations

from fedssl.strategies.aggregation import RunningMean, fedavg, stacked
from fedssl.strategies.base import Strategy

__all__ = ["FedAvg", "RunningMean", "fedavg", "stacked"]


class FedAvg(Strategy):
    """Sample a seeded fraction of the clients, send the global model, average what comes
    back weighted by the clients' data sizes."""
