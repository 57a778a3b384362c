"""The toy strategy of docs/how-to/add-a-strategy.md: FedAvg with server momentum (FedAvgM,
Hsu et al., 2019). It reads only the clients' mean, so its round keeps no client's model."""

from __future__ import annotations

import torch

from fedssl.strategies.base import Strategy


class FedAvgM(Strategy):
    """Δ = x − mean_i(y_i);  m <- β m + Δ;  x <- x − η_s m (float entries; the rest: the mean)."""

    def __init__(self, cfg, beta: float = 0.9, server_lr: float = 1.0):
        super().__init__(cfg)
        self.beta, self.server_lr = beta, server_lr

    def needs_uploads(self) -> bool:
        return False  # the clients' weighted mean is all aggregate reads: sum it as they finish

    def init_server(self, model):
        server = super().init_server(model)
        glob = server["global"]
        server["momentum"] = {
            k: torch.zeros_like(v) for k, v in glob.items() if v.is_floating_point()
        }
        return server

    def aggregate(self, state, updates):
        x, m, mean = state.server["global"], state.server["momentum"], updates.mean
        m = {k: self.beta * m[k] + (x[k] - mean[k]) for k in m}
        state.server["momentum"] = m
        state.server["global"] = {k: x[k] - self.server_lr * m[k] if k in m else mean[k] for k in x}
